"""Exporters: turn a source model (or an earlier artifact) into an artifact on disk.

Each ``export(job)`` writes into ``job.out_dir`` and returns metadata (a dict) that the
runtime needs: input and output names, the input layout the artifact expects.
"""
