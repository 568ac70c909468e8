"""Timing of a verified path: warm-up, repeated runs, order statistics (no framework imports)."""

from __future__ import annotations

import math
import resource
import time

import numpy as np


def median_ci95(sorted_ms: np.ndarray) -> tuple[float, float]:
    """Distribution-free 95 % confidence interval of the median from order statistics."""
    n = len(sorted_ms)
    half_width = 1.96 * math.sqrt(n) / 2
    lo = max(int(math.floor(n / 2 - half_width)), 0)
    hi = min(int(math.ceil(n / 2 + half_width)), n - 1)
    return float(sorted_ms[lo]), float(sorted_ms[hi])


def peak_rss_mb() -> float:
    """Peak resident memory of this (worker) process so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def time_call(fn, batch_size: int, budget_s: float = 1.0, warmup: int = 3, min_runs: int = 10, max_runs: int = 10_000) -> dict:
    """Time ``fn()`` after ``warmup`` calls, until ``budget_s`` is spent (at least ``min_runs``).

    Returns median / p90 / p99 in milliseconds, the 95 % CI of the median, the run count and
    throughput in samples per second at ``batch_size``.
    """
    for _ in range(warmup):
        fn()
    samples = []
    start = time.perf_counter()
    while len(samples) < max_runs and (len(samples) < min_runs or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    ms = np.sort(np.asarray(samples))
    median = float(np.median(ms))
    return {
        "median_ms": median,
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "ci95_ms": list(median_ci95(ms)),
        "runs": len(samples),
        "throughput": {str(batch_size): batch_size / (median / 1e3) if median > 0 else None},
    }
