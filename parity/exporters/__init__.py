"""Exporters: ``export(job)`` turns a source model (or an earlier artifact) into an artifact in ``job.out_dir`` and
returns the metadata its runtime needs. Imports up to sources.
"""
