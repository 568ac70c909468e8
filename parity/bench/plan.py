"""The benchmark step of a run, after every check: only paths that passed get numbers (the gate).

For each passing path and each batch size: export at that batch (static, cached), verify its outputs
on eval samples against the golden, then time it; a verified training step on differentiable paths
whose gradients passed; time to first result by part and the path's peak memory in a fresh process
(forked from a fresh worker of its group); then each series against its baseline (ratio of medians with
a 95 % CI, Welch's t-test on log-times). Each series stops once its median's CI is within the target or
its budget is spent (``BenchOptions``: a budget per series, optionally a total spread over the series).
Runs in the orchestrator (no framework imports); every measurement runs in a worker.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from itertools import groupby

from parity.bench import stats
from parity.run.worker import TaskFailed, running_first

# the least a series is given when a total budget is nearly spent (``min_runs`` still wins over it)
MIN_SERIES_S = 0.02


@dataclass
class BenchOptions:
    """How to time: the stopping rule of ``parity.bench.measure.measure``, batch sizes, baseline, training step.

    ``budget_s`` caps each series (one path at one batch size, or its training step): its warm-up and its timed
    runs get at most that many seconds each. ``total_budget_s`` (None: no total) is the seconds of warm-up and
    timed runs for the whole benchmark, spread over the series still to time: each gets
    ``min(budget_s, what is left / series left)``, so a series that stops early because its median's CI
    reached ``target_rel_ci`` leaves its share to the ones after it. ``min_runs`` wins over both budgets.
    """

    budget_s: float = 1.0
    min_runs: int = 30
    target_rel_ci: float = 0.02
    batch_sizes: tuple[int, ...] = ()  # empty: each model's spec.timed_batch_sizes
    baseline: str | None = None  # path id; None: each path's native source path
    lr: float = 0.1
    first_result: bool = True
    total_budget_s: float | None = None
    measure: dict = field(init=False)

    def __post_init__(self):
        if not self.budget_s > 0:
            raise ValueError(f"the time budget must be positive, not {self.budget_s:g} s")
        if self.total_budget_s is not None and not self.total_budget_s > 0:
            raise ValueError(f"the total time budget must be positive, not {self.total_budget_s:g} s")
        self.measure = {"budget_s": self.budget_s, "min_runs": self.min_runs, "target_rel_ci": self.target_rel_ci}


class Budget:
    """Seconds for each series of a benchmark: ``per_series_s`` each, or less where a total is spread over them.

    ``allot()`` is the next series' budget; ``spend(seconds)`` books what it took (warm-up and timed runs).
    """

    def __init__(self, per_series_s: float, total_s: float | None, series: int):
        self.per_series_s, self.total_s, self.series_left, self.spent_s = per_series_s, total_s, series, 0.0

    def allot(self) -> float:
        if self.total_s is None:
            return self.per_series_s
        share = max(self.total_s - self.spent_s, 0.0) / max(self.series_left, 1)
        return min(self.per_series_s, max(share, MIN_SERIES_S))

    def spend(self, seconds: float) -> None:
        self.spent_s += max(seconds, 0.0)
        self.series_left = max(self.series_left - 1, 0)

    def to_json(self) -> dict:
        return {"per_series_s": self.per_series_s, "total_s": self.total_s, "spent_s": round(self.spent_s, 3)}


def _measured_s(entry: dict) -> float:
    """Seconds a series took in warm-up and timed runs (0 for one that was not timed)."""
    return (sum(entry.get("warmup_ms") or ()) + sum(entry.get("samples_ms") or ())) / 1e3


def _call(pool, group: str, task: str, **kwargs) -> dict:
    try:
        return pool.call(group, task, **kwargs)
    except TaskFailed as error:
        return {"verdict": "error", "reason": str(error)}


def _trains(path, result) -> bool:
    return bool(path.differentiable and result.get("gradients") and all(s["ok"] for s in result["gradients"].values()))


def hold_fresh_copy(pool, group: str, options: BenchOptions | None) -> None:
    """Before the checks of ``group`` when they are the last of the run: start its worker, fresh, and have it keep
    a copy of itself forked before it runs anything (``parity.bench.tasks.hold_fresh_copy``). The benchmark then
    starts with that group in that same worker: the first results forked from the copy, the timed series in the
    worker itself, without starting it again. Only when the worker starts now anyway (another group's is running,
    or none), on Linux, for a run that times first results."""
    if options is None or not options.first_result or not sys.platform.startswith("linux"):
        return
    if pool.current_group() == group:
        return  # that worker has run other tasks already: the benchmark starts a fresh one instead
    try:
        pool.call(group, "parity.bench.tasks:hold_fresh_copy")
    except TaskFailed:
        pass  # the checks of the group report why its worker cannot run


def bench(run, pool, pending, options: BenchOptions) -> None:
    """Time every passing path of ``pending`` ((spec, manifest, path, result) tuples) into ``result["timing"]``.

    One worker per runtime group: first each of its paths' time to first result, each in a process forked from
    the group's worker while it was fresh, before it had run anything else (nothing of another path loaded; the
    framework import is the fresh worker's own, timed once), then every series of the group's paths in that
    worker. The group whose worker is still running from the checks goes first, reusing it where it kept a copy
    of itself forked while fresh (``hold_fresh_copy``); every other group gets a worker started fresh. Off Linux,
    each path's first result gets a fresh worker of its own instead.
    """
    passing = [item for item in pending if item[3]["verdict"] == "pass"]
    batches = {(spec.name, path.id): options.batch_sizes or spec.timed_batch_sizes for spec, _, path, _ in passing}
    artifacts = {}
    exported = [item for item in passing if item[2].exports]
    for spec, manifest, path, result in running_first(pool, exported, lambda item: item[2].exports[-1].group):
        for batch in batches[(spec.name, path.id)]:
            artifacts[(spec.name, path.id, batch)] = run._export(pool, spec, manifest, path, len(path.exports) - 1, batch)
    series = sum(len(batches[(spec.name, path.id)]) + _trains(path, result) for spec, _, path, result in passing)
    budget = Budget(options.budget_s, options.total_budget_s, series)
    forks = sys.platform.startswith("linux")  # fork after a framework import is only safe to count on there
    current = pool.current_group()  # after the exports above: the worker the timing can start in
    ordered = running_first(pool, passing, lambda item: item[2].runtime.group)
    step = 0
    for group, members in groupby(ordered, key=lambda item: item[2].runtime.group):
        members = list(members)
        firsts = {}
        if options.first_result:
            held = forks and group == current  # the check worker may hold a copy of itself forked while fresh
            started = False  # whether this group's fresh worker is started
            for spec, manifest, path, result in members:
                own = run._export(pool, spec, manifest, path, len(path.exports) - 1) if path.exports else None
                kwargs = _common(run, spec, path) | {"precision": path.precision, "artifact_dir": own and own["dir"],
                                                       "artifact_meta": own and own["meta"]}
                first = _call(pool, group, "parity.bench.tasks:first_result_held", **kwargs) if held else None
                if first is None:  # none held: forked from a worker started fresh for the group
                    held = False
                    task = "parity.bench.tasks:first_result_forked" if forks else "parity.bench.tasks:first_result"
                    first = _call(pool, group, task, fresh=not forks or not started, **kwargs)
                    started = True
                if own is not None and "verdict" not in first:
                    first["export_s"] = own["meta"].get("export_s")
                    first["export_cached"] = bool(own.get("cached"))
                firsts[(spec.name, path.id)] = first
            if held:
                _call(pool, group, "parity.bench.tasks:release_fresh_copy")
        for spec, manifest, path, result in members:
            step += 1
            run.progress(f"{spec.name}: time {path.id}", step, len(passing))
            result["timing"] = _time_path(run, pool, spec, manifest, path, result, options, budget, artifacts,
                                          batches[(spec.name, path.id)])
            result["timing"]["first_result"] = firsts.get((spec.name, path.id))
    for _, _, _, result in passing:
        result["timing"]["budget"] = budget.to_json()
    _compare_to_baselines(pending, options)


def _common(run, spec, path) -> dict:
    return {"workspace": str(run.workspace.root), "model": spec.name, "path_id": path.id,
            "golden_dir": str(run.workspace.golden_dir(spec.name)), "threads": run.options.threads,
            "device": path.device}


def _time_path(run, pool, spec, manifest, path, result, options, budget: Budget, artifacts, batches) -> dict:
    common = _common(run, spec, path)
    timing = {"export": "static batch per exported artifact" if path.exports else None, "batches": {}}
    for batch in batches:
        artifact = artifacts.get((spec.name, path.id, batch))
        if artifact is not None and "error" in artifact:
            timing["batches"][str(batch)] = {"verdict": "error", "reason": artifact["error"]}
            budget.spend(0.0)
            continue
        allotted = budget.allot()
        entry = _call(pool, path.runtime.group, "parity.bench.tasks:time_batch", precision=path.precision,
                      batch_size=batch, timing={**options.measure, "budget_s": allotted},
                      artifact_dir=artifact and artifact["dir"], artifact_meta=artifact and artifact["meta"], **common)
        entry["budget_s"] = allotted
        budget.spend(_measured_s(entry))
        timing["batches"][str(batch)] = entry
    # the artifact the path was checked with (the run already holds it)
    own = run._export(pool, spec, manifest, path, len(path.exports) - 1) if path.exports else None
    timing["train_step"] = None
    if _trains(path, result):
        allotted = budget.allot()
        timing["train_step"] = _call(pool, path.runtime.group, "parity.bench.tasks:time_train_step",
                                     precision=path.precision, lr=options.lr,
                                     timing={**options.measure, "budget_s": allotted},
                                     artifact_dir=own and own["dir"], artifact_meta=own and own["meta"], **common)
        timing["train_step"]["budget_s"] = allotted
        budget.spend(_measured_s(timing["train_step"]))
    return timing


def _compare_to_baselines(pending, options: BenchOptions) -> None:
    """Each timed batch against the same batch of its baseline path (same model)."""
    timed = {(spec.name, path.id): result for spec, _, path, result in pending if result.get("timing")}
    for spec, _, path, result in pending:
        timing = result.get("timing")
        if not timing:
            continue
        baseline_id = options.baseline or path.baseline
        base = timed.get((spec.name, baseline_id))
        for batch, entry in timing["batches"].items():
            if entry.get("verdict") != "pass":
                continue
            if baseline_id == path.id:
                entry["vs_baseline"] = {"baseline": baseline_id, "self": True}
                continue
            other = (base or {}).get("timing", {}).get("batches", {}).get(batch, {}) if base else {}
            if other.get("verdict") != "pass":
                entry["vs_baseline"] = {"baseline": baseline_id,
                                        "reason": "the baseline was not timed at this batch (select it with --path)"}
                continue
            entry["vs_baseline"] = {"baseline": baseline_id, **stats.compare_series(entry["samples_ms"],
                                                                                   other["samples_ms"])}

