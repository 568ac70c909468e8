"""Drift diagnosis: taps on every path, per-tap drift, the first divergent tap, a tested cause, chain links."""
