"""The benchmark step of a run, after every check: only paths that passed get numbers (the gate).

For each passing path and each batch size: export at that batch (static, cached), verify its outputs
on eval samples against the golden, then time it; a verified training step on differentiable paths
whose gradients passed; time to first result by part and the path's peak memory in a fresh worker;
then each series against its baseline (ratio of medians with a 95 % CI, Welch's t-test on log-times).
Each series stops once its median's CI is within the target or its budget is spent (``BenchOptions``: a
budget per series, optionally a total spread over the series).
Runs in the orchestrator (no framework imports); every measurement runs in a worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from parity.bench import audit, stats
from parity.golden.shapes import describe
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


def bench(run, pool, pending, options: BenchOptions) -> None:
    """Time every passing path of ``pending`` ((spec, manifest, path, result) tuples) into ``result["timing"]``.

    Each path in a fresh worker of its own (forked from its group's template on Linux, where the framework
    import is the template's, timed once; spawned elsewhere), that has run nothing before: first the path's time
    to first result, then its series at every batch size and its training step, on the runner the first result
    built where the batch size is the same. No path is timed in a process that checked, exported or timed
    anything else.
    """
    passing = [item for item in pending if item[3]["verdict"] == "pass"]
    batches = {(spec.name, path.id): options.batch_sizes or spec.timed_batch_sizes for spec, _, path, _ in passing}
    artifacts = {}
    exported = [item for item in passing if item[2].exports]
    for spec, manifest, path, result in running_first(pool, exported, lambda item: item[2].exports[-1].group):
        for batch in batches[(spec.name, path.id)]:
            artifacts[(spec.name, path.id, batch)] = run._export(pool, spec, manifest, path, len(path.exports) - 1,
                                                                 batch)
    series = sum(len(batches[(spec.name, path.id)]) + _trains(path, result) + len(_shapes(spec))
                 for spec, _, path, result in passing)
    budget = Budget(options.budget_s, options.total_budget_s, series)
    ordered = running_first(pool, passing, lambda item: item[2].runtime.group)
    for step, (spec, manifest, path, result) in enumerate(ordered, 1):
        run.progress(f"{spec.name}: time {path.id}", step, len(passing))
        first = None
        if options.first_result:  # in a fresh worker, which then times the path's series on the runner it built
            own = run._export(pool, spec, manifest, path, len(path.exports) - 1) if path.exports else None
            first = _call(pool, path.runtime.group, "parity.bench.tasks:first_result", fresh=True,
                          **_common(run, spec, path), precision=path.precision, artifact_dir=own and own["dir"],
                          artifact_meta=own and own["meta"])
            if own is not None and "verdict" not in first:
                first["export_s"] = own["meta"].get("export_s")
                first["export_cached"] = bool(own.get("cached"))
        result["timing"] = _time_path(run, pool, spec, manifest, path, result, options, budget, artifacts,
                                      batches[(spec.name, path.id)], fresh=first is None or "verdict" in first)
        result["timing"]["first_result"] = first
    for _, _, _, result in passing:
        result["timing"]["budget"] = budget.to_json()
    _compare_to_baselines(pending, options)


def _common(run, spec, path) -> dict:
    return {"workspace": str(run.workspace.root), "model": spec.name, "path_id": path.id,
            "golden_dir": str(run.workspace.golden_dir(spec.name)), "threads": run.options.threads,
            "device": path.device}


def _time_path(run, pool, spec, manifest, path, result, options, budget: Budget, artifacts, batches,
               fresh: bool) -> dict:
    """The path's series: the spec's batch size first (on the runner its first result built), then its training
    step (on that runner again), then every other batch size on a runner of its own; recorded in ``batches``'
    order. ``fresh``: the first series starts a new worker (else it runs in the one that measured the first
    result)."""
    common = _common(run, spec, path)
    timing = {"export": "static batch per exported artifact" if path.exports else None, "train_step": None}

    def series(task: str, **kwargs) -> dict:
        nonlocal fresh
        allotted = budget.allot()
        entry = _call(pool, path.runtime.group, f"parity.bench.tasks:{task}", fresh=fresh, precision=path.precision,
                      timing={**options.measure, "budget_s": allotted}, **kwargs, **common)
        entry["budget_s"], fresh = allotted, False
        budget.spend(_measured_s(entry))
        if entry.get("verdict") == "pass" and entry.get("audit"):
            entry["audit"]["cache"] = audit.cache_verdict(entry["samples_ms"], entry["audit"]["probe_ms"])
        if entry.get("verdict") == "pass":
            entry["stability"] = stats.stability(entry, options.target_rel_ci)
        return entry

    def batch_series(batch: int) -> dict:
        artifact = artifacts.get((spec.name, path.id, batch))
        if artifact is not None and "error" in artifact:
            budget.spend(0.0)
            return {"verdict": "error", "reason": artifact["error"]}
        return series("time_batch", batch_size=batch, artifact_dir=artifact and artifact["dir"],
                      artifact_meta=artifact and artifact["meta"])

    entries = {batch: batch_series(batch) for batch in batches if batch == spec.batch_size}
    if _trains(path, result):
        # the artifact the path was checked with (the run already holds it)
        own = run._export(pool, spec, manifest, path, len(path.exports) - 1) if path.exports else None
        timing["train_step"] = series("time_train_step", lr=options.lr, artifact_dir=own and own["dir"],
                                      artifact_meta=own and own["meta"])
    entries.update({batch: batch_series(batch) for batch in batches if batch != spec.batch_size})
    timing["batches"] = {str(batch): entries[batch] for batch in batches}
    if _shapes(spec):  # the named axes' other sizes, on the artifact the path was checked with (dynamic there)
        own = run._export(pool, spec, manifest, path, len(path.exports) - 1) if path.exports else None
        timing["shapes"] = {describe(shape): series("time_shape", index=k, artifact_dir=own and own["dir"],
                                                    artifact_meta=own and own["meta"])
                            for k, shape in _shapes(spec)}
    return timing


def _shapes(spec) -> list[tuple[int, dict]]:
    """The verification shapes that are timed: every one of a model with named axes (its sequence lengths), by
    index in ``shapes.npz``; none for a model whose only dynamic axis is the batch (its batch sizes are timed)."""
    return list(enumerate(spec.check_shapes())) if spec.axes else []


def _compare_to_baselines(pending, options: BenchOptions) -> None:
    """Each timed batch against the same batch of its baseline path (same model)."""
    timed = {(spec.name, path.id): result for spec, _, path, result in pending if result.get("timing")}
    for spec, _, path, result in pending:
        timing = result.get("timing")
        if not timing:
            continue
        baseline_id = options.baseline or path.baseline
        base = timed.get((spec.name, baseline_id))
        for kind, batch, entry in [(kind, key, entry) for kind in ("batches", "shapes")
                                   for key, entry in (timing.get(kind) or {}).items()]:
            if entry.get("verdict") != "pass":
                continue
            if baseline_id == path.id:
                entry["vs_baseline"] = {"baseline": baseline_id, "self": True}
                continue
            other = (base or {}).get("timing", {}).get(kind, {}).get(batch, {}) if base else {}
            if other.get("verdict") != "pass":
                entry["vs_baseline"] = {"baseline": baseline_id,
                                        "reason": "the baseline was not timed at this batch (select it with --path)"}
                continue
            unsettled = [f"{who}: {(e.get('stability') or {}).get('reason')}" for who, e in
                         (("this series", entry), ("the baseline's", other)) if not (e.get("stability") or {}).get("ok", True)]
            if unsettled:
                entry["vs_baseline"] = {"baseline": baseline_id, "withheld": True,
                                        "reason": "withheld: " + "; ".join(unsettled)}
                continue
            entry["vs_baseline"] = {"baseline": baseline_id, **stats.compare_series(entry["samples_ms"],
                                                                                   other["samples_ms"])}

