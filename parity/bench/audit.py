"""Audits of a timed series, run in the worker around :func:`parity.bench.measure.measure`'s timed loop.

* **Input rotation**: timed calls cycle through the verified input set (``feeds``), never one array repeated.
* **Output audit**: at a few random points of the series (at least three, never inside a block of timed calls) the
  output of the timed call that just ended is compared with the verified output for its input; one mismatch voids
  the series. This catches a runtime that changes engines, precisions or kernels between warm-up and timing.
* **Repeat probe**: at the same points, a few calls repeating the input of the timed call that just ended give a
  second sample the orchestrator compares with the rotating one
  (:func:`cache_verdict`): a path that gets faster on repeated inputs beyond its noise is flagged (MLPerf forbids
  caching repeated queries; a benchmark that repeats one array cannot see it).

What the audits cost is measured too (``cost_fraction``: audit and probe seconds over timed seconds). NumPy only.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np

from parity.bench.measure import measure
from parity.check.closeness import times

AUDITS_MIN = 3  # output audits a series gets at least (its last timed call is always one more)
PROBE_FRACTION = 0.02  # repeated-input calls per timed call, topped up at each audit point
PROBE_MIN = 3  # repeated-input calls a series gets where they cost under PROBE_CAP of its timed calls
PROBE_CAP = 0.04  # below PROBE_MIN, no more repeated-input calls than this share of the timed calls (one at least)
ORDER_RULE = 5  # fewer repeats than this are judged by the order rule of ``cache_verdict``
COST_SHARE = 0.03  # audits beyond the first ones only while they have cost less than this share of the timed time
MAX_FEEDS = 16  # distinct inputs a series rotates through, at most
CACHE_RATIO = 0.9  # repeats faster than this fraction of the rotating median, with a CI below 1: flagged


def probe_target(timed_runs: int) -> int:
    """Repeated-input calls a series of ``timed_runs`` calls gets in all: ``PROBE_FRACTION`` of them, at least
    ``PROBE_MIN`` where that costs under ``PROBE_CAP`` of the timed calls, and one at least."""
    return max(1, min(PROBE_MIN, int(PROBE_CAP * timed_runs)), math.ceil(PROBE_FRACTION * timed_runs))


def audit_points(min_runs: int, rng: np.random.Generator, audits: int = AUDITS_MIN) -> list[int]:
    """Sample counts after which the audit runs within the first ``min_runs`` timed calls: ``audits`` distinct
    random ones (all of them when there are fewer calls)."""
    k = min(audits, min_runs)
    return sorted(int(p) + 1 for p in rng.choice(min_runs, size=k, replace=False))


def audited_measure(
    run,
    feeds: list,
    verify,
    timing: dict,
    seed: int = 0,
    audits: int = AUDITS_MIN,
    probe: int | None = None,
    final: bool = True,
    clock=time.perf_counter,
    start: int = 0,
) -> dict:
    """Time ``run(feed)`` cycling through ``feeds`` under ``measure``'s rules (``timing``: its keyword arguments),
    with the output audits and repeat probe. ``verify(k, outputs) -> stats`` compares the outputs of ``feeds[k]``
    with its verified outputs (``stats["ok"]``; ``stats["tol_units"]`` how far). ``audits`` random audit points
    fall within the first ``min_runs`` calls, more at stopping checks while their cost allows, and the last timed
    call is audited where ``final``; ``probe`` repeated-input calls in all (None: ``probe_target``), spread over the
    audit points. A series timed in blocks (interleaved
    with others) passes fewer audits and its share of the probe for each block after its first.

    Returns ``measure``'s dict and ``"audit"``: ``{"feeds", "outputs": [{"call", "feed", "ok", "tol_units"}],
    "ok", "probe_ms", "seconds", "cost_fraction"}``; ``ok`` False when any audited output differs (the caller voids
    the series)."""
    rng = np.random.default_rng(seed)
    last = [None]
    order = itertools.count(start)

    def nxt():
        return feeds[next(order) % len(feeds)]

    def timed():
        last[0] = run(nxt())

    records: list[dict] = []
    probe_ms: list[float] = []
    state = {"seconds": 0.0}

    def check(calls: int) -> None:
        k = (start + calls - 1) % len(feeds)
        stats = verify(k, last[0])
        records.append({"call": calls, "feed": k, "ok": bool(stats["ok"]), "tol_units": stats.get("tol_units")})

    def hook(calls: int, timed_runs: int) -> None:
        started = clock()
        if len(feeds) > 1:  # first, right after the timed block: the repeats see what its calls saw
            repeated = feeds[(start + calls - 1) % len(feeds)]
            wanted = probe_target(timed_runs) if probe is None else probe
            for _ in range(wanted - len(probe_ms)):
                t0 = clock()
                run(repeated)
                probe_ms.append(clock() - t0)
        check(calls)
        state["seconds"] += clock() - started

    def more(timed_s: float) -> bool:  # another audit point after a stopping check: at random, within its share
        return rng.random() < 0.5 and state["seconds"] < COST_SHARE * timed_s

    points = audit_points(timing.get("min_runs", 30), rng, audits)
    measured = measure(timed, hook=hook, hook_points=points, extra_hook=more, clock=clock, **timing)
    if final:
        started = clock()
        check(measured["warmup_runs"] + len(measured["samples_ms"]))  # the last timed call
        state["seconds"] += clock() - started
    timed_s = sum(measured["samples_ms"]) / 1e3
    measured["audit"] = {
        "feeds": len(feeds),
        "outputs": records,
        "ok": all(a["ok"] for a in records),
        "probe_ms": [s * 1e3 for s in probe_ms],
        "seconds": state["seconds"],
        "next_feed": next(order) % len(feeds),
        "cost_fraction": state["seconds"] / timed_s if timed_s > 0 else None,
    }
    return measured


def void(entry: dict) -> dict:
    """A series whose audit found outputs that differ from the verified ones: no number survives, only why."""
    bad = next(a for a in entry["audit"]["outputs"] if not a["ok"])
    units = bad.get("tol_units")
    how = times(units) if isinstance(units, (int, float)) else "out of tolerance"
    return {
        "verdict": "invalid",
        "audit": entry["audit"],
        "verified": entry.get("verified"),
        "reason": f"invalid: outputs during timing differ from the verified ones (timed call {bad['call']}, "
        f"input {bad['feed']}: {how})",
    }


def cache_verdict(samples_ms: list[float], probe_ms: list[float]) -> dict:
    """Repeated-input timing against the rotating series (in the orchestrator: it needs SciPy). ``ratio`` =
    median(repeats) / median(rotating). With ``ORDER_RULE`` repeats or more, ``flagged`` when its 95 % CI lies
    below 1 and the ratio below ``CACHE_RATIO``; with fewer (a slow series, whose few repeats must stay cheap),
    when every repeat is faster than ``CACHE_RATIO`` x the fastest rotating call, which a path that does not cache
    shows with probability below ``1 / (n + 1)`` per repeat."""
    if not probe_ms or len(samples_ms) < 2:
        return {"flagged": False, "reason": "not probed: one verified input at this size, nothing to rotate"}
    ratio = float(np.median(probe_ms) / np.median(samples_ms))
    if len(probe_ms) < ORDER_RULE:
        flagged = max(probe_ms) < CACHE_RATIO * min(samples_ms)
        found = {"flagged": bool(flagged), "ratio": ratio, "rule": "order", "repeats": len(probe_ms)}
    else:
        from parity.bench.stats import compare_series

        c = compare_series(probe_ms, samples_ms)
        found = {
            "flagged": bool(c["ci95"][1] < 1.0 and c["ratio"] < CACHE_RATIO),
            "ratio": c["ratio"],
            "ci95": c["ci95"],
            "p": c["p"],
            "rule": "ci",
            "repeats": len(probe_ms),
        }
    if found["flagged"]:
        found["reason"] = (
            f"{1 / ratio:.3g}x faster on a repeated input than on rotating verified inputs (a result "
            "or input cache): its timing does not show the work of new inputs"
        )
    return found
