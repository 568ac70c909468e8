"""Timing of a verified path: rule-based warm-up, then timed runs until the median is known well enough.

No framework imports. Statistics live in :mod:`parity.bench.stats`.
"""

from __future__ import annotations

import math
import resource
import time

import numpy as np

from parity.bench.stats import median_ci_ranks

# The stopping rule is checked after blocks of max(_CHECK_MIN, _CHECK_FRACTION * n) runs (fewer when
# the budget is nearly spent), so the checks cost O(n) amortised and nothing runs between two calls
# of ``fn`` inside a block except ``clock() ... append``.
_CHECK_MIN = 5
_CHECK_FRACTION = 0.05


def peak_rss_mb() -> float:
    """Peak resident memory of this (worker) process so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def ci_within(samples: list[float], rel: float, confidence: float) -> bool:
    """Is the distribution-free CI of the median within ``±rel`` of the median? (O(n), no full sort.)"""
    n = len(samples)
    lo, hi = median_ci_ranks(n, confidence)
    if lo == 0 and 0.5 ** (n - 1) > 1.0 - confidence:  # too few runs: [min, max] has less than `confidence`
        return False
    mid = (n - 1) // 2, n // 2
    part = np.partition(np.asarray(samples), sorted({lo, hi, *mid}))
    median = 0.5 * (part[mid[0]] + part[mid[1]])
    return bool(median > 0 and part[lo] >= median * (1.0 - rel) and part[hi] <= median * (1.0 + rel))


def measure(
    fn,
    *,
    min_runs: int = 30,
    target_rel_ci: float = 0.02,
    budget_s: float = 2.0,
    max_runs: int = 100_000,
    warmup_window: int = 5,
    warmup_tolerance: float = 0.05,
    max_warmup_s: float | None = None,
    max_warmup_runs: int = 200,
    confidence: float = 0.95,
    clock=time.perf_counter,
    hook=None,
    hook_points=(),
    extra_hook=None,
) -> dict:
    """Warm ``fn()`` up by a rule, then time it until the median's CI is tight or the budget is spent.

    Warm-up: windows of ``warmup_window`` calls until two consecutive windows' medians ``m1, m2``
    agree, ``|m2 - m1| <= warmup_tolerance * min(m1, m2)``; capped at ``max_warmup_runs`` calls (whole
    windows only) and ``max_warmup_s`` seconds (default: ``budget_s``). ``warmup_converged`` says
    whether the rule was met before a cap.

    Timed runs: at least ``min_runs`` (``min_runs`` wins over the budget), then, checked every few
    runs, stop when the distribution-free ``confidence`` CI of the median lies within
    ``±target_rel_ci`` of the median (``"ci"``; only once ``n`` is large enough for that coverage,
    ``n >= 6`` at 95 %), when ``budget_s`` seconds of timed runs are spent
    (``"budget"``), or at ``max_runs`` calls (``"max_runs"``).

    Each call is timed as ``t0 = clock(); fn(); append(clock() - t0)`` and nothing else; ``clock``
    (seconds) is injectable for tests. ``hook(calls, timed_runs)`` (the audits of ``parity.bench.audit``) runs
    between blocks, never inside one: after each count of timed runs in ``hook_points``, and after a stopping check
    that does not stop where ``extra_hook(timed_seconds)`` says so; its time is not in any sample nor in the budget.
    Returns ``{"samples_ms", "warmup_runs", "warmup_ms",
    "warmup_converged", "stopped"}``.
    """
    if not budget_s > 0:
        raise ValueError(f"budget_s must be > 0, got {budget_s!r}")
    if min_runs < 1:
        raise ValueError(f"min_runs must be >= 1, got {min_runs!r}")
    if max_runs < min_runs:
        raise ValueError(f"max_runs ({max_runs}) must be >= min_runs ({min_runs})")
    if warmup_window < 1:
        raise ValueError(f"warmup_window must be >= 1, got {warmup_window!r}")
    if not warmup_tolerance >= 0 or not target_rel_ci >= 0:
        raise ValueError("warmup_tolerance and target_rel_ci must be >= 0")
    if max_warmup_runs < 0:
        raise ValueError(f"max_warmup_runs must be >= 0, got {max_warmup_runs!r}")
    if max_warmup_s is None:
        max_warmup_s = budget_s

    # Warm-up, in whole windows.
    warm: list[float] = []
    append = warm.append
    converged = False
    previous = None
    start = clock()
    while len(warm) + warmup_window <= max_warmup_runs:
        for _ in range(warmup_window):
            t0 = clock()
            fn()
            append(clock() - t0)
        current = float(np.median(warm[-warmup_window:]))
        if previous is not None and abs(current - previous) <= warmup_tolerance * min(current, previous):
            converged = True
            break
        previous = current
        if clock() - start >= max_warmup_s:
            break

    # Timed runs, in blocks between checks.
    samples: list[float] = []
    append = samples.append
    stopped = "max_runs"
    next_check = min_runs
    points = sorted(p for p in hook_points if 0 < p <= min_runs)
    hooked = 0.0  # seconds spent in the hook: not the series' budget
    start = clock()
    while True:
        target = min([next_check, *points[:1]])
        for _ in range(target - len(samples)):
            t0 = clock()
            fn()
            append(clock() - t0)
        if points and target == points[0]:
            points.pop(0)
            t0 = clock()
            hook(len(warm) + len(samples), len(samples))
            hooked += clock() - t0
            if target < next_check:
                continue
        elapsed = clock() - start - hooked
        n = len(samples)
        if ci_within(samples, target_rel_ci, confidence):
            stopped = "ci"
            break
        if elapsed >= budget_s:
            stopped = "budget"
            break
        if n >= max_runs:
            stopped = "max_runs"
            break
        step = max(_CHECK_MIN, int(n * _CHECK_FRACTION))
        per_run = elapsed / n
        if per_run > 0:  # don't run much past the budget
            step = min(step, max(1, math.ceil((budget_s - elapsed) / per_run)))
        next_check = min(n + step, max_runs)
        if hook is not None and extra_hook is not None and extra_hook(elapsed):
            t0 = clock()
            hook(len(warm) + len(samples), len(samples))
            hooked += clock() - t0

    return {
        "samples_ms": [s * 1e3 for s in samples],
        "warmup_runs": len(warm),
        "warmup_ms": [s * 1e3 for s in warm],
        "warmup_converged": converged,
        "stopped": stopped,
    }
