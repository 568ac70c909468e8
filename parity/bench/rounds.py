"""Timed series of different paths interleaved: in rounds, one block of every series still running, in a random
order, so a drift of the machine (a thermal change, another process) falls on every path alike instead of becoming
a difference between paths timed one after the other.

Each series runs in ``processes`` worker processes of its own path (``--processes N``; fresh ones, forked from the
group's template), each a replica with its own runner; its samples are pooled and its process-to-process variation
reported apart from the run-to-run spread. After every round a series stops when its pooled median's 95 % CI is
within the target or its budget is spent (either only once it has ``min_runs``), or at ``max_runs``. A block is a
fixed number of calls (growing from round to round, never much past the budget), timed by
``parity.bench.tasks.time_block``; its first block warms the replica up and holds three of its output audits, every
later block one and its share of the repeat probe. Runs in the orchestrator: no framework imports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from parity.bench import audit, footprint, stats
from parity.bench.measure import ci_within
from parity.platform.errors import TaskFailed

BLOCK_RUNS_MIN = 10
GROWTH = 1.5
TASKS = "parity.bench.tasks"


@dataclass
class Series:
    """One timed series: a path at a batch size (``kind`` batch), at a verification shape (shape) or its training
    step (train_step), with its ``replicas`` (workers) and what they measured."""

    name: str
    path: object
    kind: str
    key: str
    batch: int  # samples per call (a shape's own batch replaces it once opened)
    open_kwargs: dict
    budget_s: float
    replicas: list
    target: dict = field(default_factory=dict)  # the path's timing the entry goes into
    entry: dict = field(default_factory=dict)  # the open result, then the series' final entry
    blocks: list = field(default_factory=list)  # per replica: its measured blocks
    spent_s: float = 0.0
    block_runs: int = BLOCK_RUNS_MIN
    stopped: str | None = None
    artifact_mb: float | None = None  # the size on disk of the artifact it runs (None: a native path has none)

    @property
    def samples(self) -> list[float]:
        return [s for blocks in self.blocks for b in blocks for s in b["samples_ms"]]


def _fail(series: Series, error: TaskFailed) -> None:
    series.entry, series.stopped = {"verdict": "error", "reason": str(error)}, "error"


def open_all(series: list[Series]) -> None:
    """Open every series in each of its replicas (each verifies it there); a failure ends the series untimed."""
    for s in series:
        s.blocks = [[] for _ in s.replicas]
        for worker in s.replicas:
            try:
                opened = worker.call(f"{TASKS}:open_series", {"series": s.name, "kind": s.kind, **s.open_kwargs})
            except TaskFailed as error:
                _fail(s, error)
                break
            if opened.get("verdict") != "pass":
                s.entry, s.stopped = opened, "fail"
                break
            s.entry = s.entry or opened


def run(
    series: list[Series],
    min_runs: int,
    target_rel_ci: float,
    max_runs: int = 100_000,
    seed: int = 0,
    progress=lambda message: None,
) -> None:
    """Time the open series in rounds until each stops; each one's ``entry`` then holds its result."""
    rng = np.random.default_rng(seed)
    active = [s for s in series if s.stopped is None]
    for s in active:
        s.block_runs = max(BLOCK_RUNS_MIN, math.ceil(min_runs / (3 * len(s.replicas))))
    rounds = 0
    while active:
        rounds += 1
        progress(f"round {rounds}: {len(active)} series")
        order = [(s, r) for s in active for r in range(len(s.replicas))]
        for k in rng.permutation(len(order)):
            s, r = order[k]
            if s.stopped is None:
                _block(s, r, int(rng.integers(2**31)))
        for s in active:
            _decide(s, min_runs, target_rel_ci, max_runs)
        active = [s for s in active if s.stopped is None]
    for s in series:
        if s.stopped not in ("fail", "error"):
            s.entry = _entry(s)
        for worker in s.replicas:
            if s.stopped in ("fail", "error"):
                continue
            try:
                extra = worker.call(
                    f"{TASKS}:close_series",
                    {"series": s.name, "timing": {"budget_s": s.budget_s, "min_runs": min_runs}},
                )
            except TaskFailed:
                continue
            if worker is s.replicas[0]:
                s.entry.update(extra)


def _block(s: Series, r: int, seed: int) -> None:
    first = not s.blocks[r]
    done = len(s.samples)
    probed = sum(len((b.get("audit") or {}).get("probe_ms") or ()) for b in s.blocks[r])
    want = audit.probe_target(math.ceil((done + s.block_runs) / len(s.replicas)))
    timing = {
        "min_runs": s.block_runs,
        "max_runs": s.block_runs,
        "target_rel_ci": 0.0,
        "budget_s": max(s.budget_s - s.spent_s, 1e-3),
        "max_warmup_s": s.budget_s,
        **({} if first else {"max_warmup_runs": 0}),
    }
    try:
        measured = s.replicas[r].call(
            f"{TASKS}:time_block",
            {
                "series": s.name,
                "timing": timing,
                "seed": seed,
                "audits": audit.AUDITS_MIN if first else 1,
                "probe": max(want - probed, 0),
                "final": first,
            },
        )
    except TaskFailed as error:
        _fail(s, error)
        return
    s.blocks[r].append(measured)
    s.spent_s += (sum(measured["warmup_ms"]) + sum(measured["samples_ms"])) / 1e3


def _decide(s: Series, min_runs: int, target_rel_ci: float, max_runs: int) -> None:
    """Stop ``s`` by the stopping rule on its pooled samples, else size its next block to the budget left."""
    if s.stopped is not None:
        return
    samples = s.samples
    enough = len(samples) >= min_runs  # min_runs wins over the budget
    if enough and ci_within(samples, target_rel_ci, 0.95):
        s.stopped = "ci"
    elif enough and s.spent_s >= s.budget_s:
        s.stopped = "budget"
    elif len(samples) >= max_runs:
        s.stopped = "max_runs"
    else:
        per_call_s = max(float(np.median(samples)) / 1e3, 1e-9)
        replicas = len(s.replicas)
        left = math.floor((s.budget_s - s.spent_s) / per_call_s / replicas)
        floor = max(left, math.ceil((min_runs - len(samples)) / replicas), 1)
        s.block_runs = max(min(math.ceil(s.block_runs * GROWTH), floor, max_runs - len(samples)), 1)


def _entry(s: Series) -> dict:
    """The series' result: pooled statistics, warm-up, the audits of every block (a mismatch voids it), and the
    process-to-process variation where there are several replicas."""
    samples = s.samples
    batch = s.entry["shape"].get("batch", 1) if s.kind == "shape" else s.batch
    first_blocks = [blocks[0] for blocks in s.blocks]
    entry = {
        "verdict": "pass",
        **s.entry,
        **stats.summarize(samples, batch),
        "samples_ms": samples,
        "warmup_runs": sum(b["warmup_runs"] for b in first_blocks),
        "warmup_ms": [t for b in first_blocks for t in b["warmup_ms"]],
        "warmup_converged": all(b["warmup_converged"] for b in first_blocks),
        "stopped": s.stopped,
        "blocks": sum(len(blocks) for blocks in s.blocks),
        "budget_s": s.budget_s,
    }
    entry.update(footprint.summary([b["footprint"] for blocks in s.blocks for b in blocks if b.get("footprint")]))
    audits = [b["audit"] for blocks in s.blocks for b in blocks if b.get("audit")]
    if audits:
        seconds = sum(a["seconds"] for a in audits)
        entry["audit"] = {
            "feeds": audits[0]["feeds"],
            "outputs": [o for a in audits for o in a["outputs"]],
            "ok": all(a["ok"] for a in audits),
            "probe_ms": [t for a in audits for t in a["probe_ms"]],
            "seconds": seconds,
            "cost_fraction": seconds / (sum(samples) / 1e3) if sum(samples) else None,
        }
        entry["audit"]["cache"] = audit.cache_verdict(samples, entry["audit"]["probe_ms"])
        if not entry["audit"]["ok"]:
            return audit.void(entry)
    if len(s.replicas) > 1:
        entry["processes"] = _processes([[t for b in blocks for t in b["samples_ms"]] for blocks in s.blocks])
    if s.kind == "train_step":
        entry.update(steps_per_s=1e3 / entry["median_ms"], samples_per_s=entry["throughput"])
    return entry


def _processes(per_replica: list[list[float]]) -> dict:
    """Process-to-process variation (the spread of the replicas' medians, as a coefficient of variation of their
    logs) apart from run-to-run (the median of the replicas' own interquartile spreads)."""
    medians = [float(np.median(x)) for x in per_replica]
    logs = np.log(medians)
    spreads = [float((np.percentile(x, 75) - np.percentile(x, 25)) / np.median(x)) for x in per_replica]
    return {
        "n": len(per_replica),
        "medians_ms": medians,
        "between_processes_cv": float(np.std(logs, ddof=1)) if len(logs) > 1 else 0.0,
        "within_process_spread": float(np.median(spreads)),
        "runs": [len(x) for x in per_replica],
    }
