"""Timing verified paths: the measurement loop and its stopping rule, statistics, the benchmark plan, its
worker tasks, GPU figures from NVML. Imports stages up to run; never diagnose, report or pipeline.
"""
