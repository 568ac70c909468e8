"""Drift diagnosis: taps on every path, per-tap drift, the first divergent tap, a tested cause, chain links;
layers/ holds one NumPy module per layer kind. Imports stages up to run; never bench, report or pipeline.
"""
