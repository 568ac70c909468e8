"""The benchmark step of a run, after every check: only paths that passed get numbers (the gate).

For each passing path and each batch size: export at that batch (static, cached), verify its outputs on the eval
samples it will cycle through, then time it, audited; a verified training step on differentiable paths whose
gradients passed; time to first result by part and the path's peak memory in a fresh worker; the series of a
model's paths interleaved in rounds (``parity.bench.rounds``); then each series against its baseline (ratio of
medians with a 95 % CI, Welch's t-test on log-times), withheld where either did not settle. Each series stops once
its median's CI is within the target or its budget is spent (``BenchOptions``: a budget per series, optionally a
total spread over the series).
Runs in the orchestrator (no framework imports); every measurement runs in a worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from parity.bench import footprint, stats
from parity.golden.shapes import describe
from parity.platform.errors import TaskFailed
from parity.run.pool import running_first

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
    processes: int = 1  # fresh worker processes each path's series run in, their samples pooled
    measure: dict = field(init=False)

    def __post_init__(self):
        if not self.budget_s > 0:
            raise ValueError(f"the time budget must be positive, not {self.budget_s:g} s")
        if self.processes < 1:
            raise ValueError(f"the number of processes must be at least 1, not {self.processes}")
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


def _trains(path, result) -> bool:
    return bool(path.differentiable and result.get("gradients") and all(s["ok"] for s in result["gradients"].values()))


class _Replica:
    """A worker of its own for one path's series (``WorkerPool.extra``): a task that fails marks the pool's run as
    failed (its logs are kept), as ``pool.call`` does."""

    def __init__(self, pool, group: str):
        self.pool, self.worker = pool, pool.extra(group)
        self.limits = pool.limits()  # for the model the pool works on now (``Run.sized``)

    def call(self, task: str, kwargs: dict):
        try:
            return self.worker.call(task, kwargs, self.limits)
        except TaskFailed:
            self.pool.failed = True
            raise

    def close(self) -> None:
        self.worker.close()


def bench(run, pool, pending, options: BenchOptions) -> None:
    """Time every passing path of ``pending`` ((spec, manifest, path, result) tuples) into ``result["timing"]``.

    Model by model: each passing path gets ``options.processes`` fresh workers of its own (forked from its group's
    template on Linux, spawned elsewhere) that have run nothing before; the first measures the path's time to first
    result; then the series of every path of the model (batch sizes, other shapes, training steps) are timed in
    rounds, interleaved in random order (``parity.bench.rounds``), each verified in its worker before it is timed.
    No path is timed in a process that checked, exported or timed another path.
    """
    from parity.bench import rounds

    passing = [item for item in pending if item[3]["verdict"] == "pass"]
    batches = {(spec.name, path.id): options.batch_sizes or spec.timed_batch_sizes for spec, _, path, _ in passing}
    artifacts = {}
    exported = [item for item in passing if item[2].exports]
    for spec, manifest, path, _result in running_first(pool, exported, lambda item: item[2].exports[-1].group):
        for batch in batches[(spec.name, path.id)]:
            artifacts[(spec.name, path.id, batch)] = run._export(
                pool, spec, manifest, path, len(path.exports) - 1, batch
            )
    count = sum(
        len(batches[(spec.name, path.id)]) + _trains(path, result) + len(_shapes(spec))
        for spec, _, path, result in passing
    )
    budget = Budget(options.budget_s, options.total_budget_s, count)
    models = list(dict.fromkeys(spec.name for spec, _, _, _ in passing))
    done = 0
    for name in models:
        items = [item for item in passing if item[0].name == name]
        replicas: dict[str, list[_Replica]] = {}
        try:
            series = []
            for spec, manifest, path, result in items:
                done += 1
                run.progress(f"{spec.name}: first result of {path.id}", done, len(passing))
                # the artifact the path was checked with: its first result, training step and other shapes use it
                own = run._export(pool, spec, manifest, path, len(path.exports) - 1) if path.exports else None
                first, replicas[path.id] = _first_result(run, spec, path, own, pool, options)
                result["timing"] = {
                    "export": "static batch per exported artifact" if path.exports else None,
                    "train_step": None,
                    "first_result": first,
                }
                series += _series_of(
                    run,
                    spec,
                    path,
                    result,
                    own,
                    options,
                    budget,
                    artifacts,
                    batches[(spec.name, path.id)],
                    replicas[path.id],
                )
            rounds.open_all(series)
            rounds.run(
                series,
                options.min_runs,
                options.target_rel_ci,
                progress=lambda message, name=name: run.progress(f"{name}: time {message}"),
            )
            for s in series:
                budget.spend(s.spent_s)
                _place(s, options)
        finally:
            for workers in replicas.values():
                for replica in workers:
                    replica.close()
    for _, _, _, result in passing:
        result["timing"]["budget"] = budget.to_json()
    _compare_to_baselines(pending, options)


def _first_result(run, spec, path, own, pool, options: BenchOptions) -> tuple[dict | None, list]:
    """The path's workers (``options.processes``), the first of which measures its time to first result."""
    workers, first = [], None
    try:
        with run.sized(pool, spec):
            for _ in range(options.processes):
                workers.append(_Replica(pool, path.runtime.group))
    except TaskFailed as error:
        for replica in workers:
            replica.close()
        return {"verdict": "error", "reason": str(error)}, []
    if options.first_result:
        try:
            first = workers[0].call(
                "parity.bench.tasks:first_result",
                {
                    **_common(run, spec, path),
                    "precision": path.precision,
                    "artifact_dir": own and own["dir"],
                    "artifact_meta": own and own["meta"],
                },
            )
        except TaskFailed as error:
            first = {"verdict": "error", "reason": str(error)}
        if own is not None and "verdict" not in first:
            first["export_s"] = own["meta"].get("export_s")
            first["export_cached"] = bool(own.get("cached"))
    return first, workers


def _common(run, spec, path) -> dict:
    return {
        "workspace": str(run.workspace.root),
        "model": spec.name,
        "path_id": path.id,
        "golden_dir": str(run.workspace.golden_dir(spec.name)),
        "threads": run.options.threads,
        "device": path.device,
    }


def _series_of(run, spec, path, result, own, options, budget: Budget, artifacts, batches, workers) -> list:
    """The path's series: every batch size (on its static-batch artifact), the training step where the path
    trains, the named axes' other sizes (on the artifact the path was checked with)."""
    from parity.bench.rounds import Series

    common = {**_common(run, spec, path), "precision": path.precision}
    own_kwargs = {"artifact_dir": own and own["dir"], "artifact_meta": own and own["meta"]}
    made = []

    def add(kind: str, key: str, batch: int, **kwargs):
        name = f"{spec.name}|{path.id}|{kind}|{key}"
        made.append(
            Series(
                name,
                path,
                kind,
                key,
                batch,
                {**common, **kwargs},
                budget.allot(),
                workers,
                result["timing"],
                artifact_mb=footprint.size_mb(kwargs.get("artifact_dir")),
            )
        )
        if not workers:
            made[-1].entry, made[-1].stopped = (
                {"verdict": "error", "reason": result["timing"]["first_result"]["reason"]},
                "error",
            )

    for batch in batches:
        artifact = artifacts.get((spec.name, path.id, batch))
        if artifact is not None and "error" in artifact:
            budget.spend(0.0)
            result["timing"].setdefault("batches", {})[str(batch)] = {"verdict": "error", "reason": artifact["error"]}
            continue
        add(
            "batch",
            str(batch),
            batch,
            batch_size=batch,
            artifact_dir=artifact and artifact["dir"],
            artifact_meta=artifact and artifact["meta"],
        )
    if _trains(path, result):
        add("train_step", "", spec.batch_size, lr=options.lr, **own_kwargs)
    for k, shape in _shapes(spec):
        add("shape", describe(shape), shape.get("batch", 1), index=k, **own_kwargs)
    result["timing"]["batches"] = {str(b): result["timing"].get("batches", {}).get(str(b)) for b in batches}
    return made


def _place(s, options: BenchOptions) -> None:
    """A finished series' entry into its path's timing, with whether it settled enough to be compared."""
    if s.entry.get("verdict") == "pass":
        s.entry["stability"] = stats.stability(s.entry, options.target_rel_ci)
        s.entry["artifact_mb"] = s.artifact_mb
    timing = s.target
    if s.kind == "batch":
        timing["batches"][s.key] = s.entry
    elif s.kind == "train_step":
        timing["train_step"] = s.entry
    else:
        timing.setdefault("shapes", {})[s.key] = s.entry


def _shapes(spec) -> list[tuple[int, dict]]:
    """The verification shapes that are timed: every one of a model with named axes (its sequence lengths), by
    index in ``shapes.npz``; none for a model whose only dynamic axis is the batch (its batch sizes are timed)."""
    return list(enumerate(spec.check_shapes())) if spec.axes else []


def _compare_to_baselines(pending, options: BenchOptions) -> None:
    """Each timed batch against the same batch of its baseline path (same model); a quantized path's also against
    the float path it was quantized from (``vs_float``: its speed-up)."""
    timed = {(spec.name, path.id): result for spec, _, path, result in pending if result.get("timing")}
    for spec, _, path, result in pending:
        timing = result.get("timing")
        if not timing:
            continue
        baseline_id = options.baseline or path.baseline
        for kind, batch, entry in [
            (series, key, entry)
            for series in ("batches", "shapes")
            for key, entry in (timing.get(series) or {}).items()
        ]:
            if entry.get("verdict") != "pass":
                continue
            if baseline_id == path.id:
                entry["vs_baseline"] = {"baseline": baseline_id, "self": True}
            else:
                entry["vs_baseline"] = _versus(entry, timed.get((spec.name, baseline_id)), kind, batch, baseline_id)
            if path.quantized:
                entry["vs_float"] = _versus(
                    entry, timed.get((spec.name, path.float_path)), kind, batch, path.float_path
                )


def _versus(entry: dict, base: dict | None, kind: str, batch: str, baseline_id: str) -> dict:
    """``entry``'s series against the same batch of ``base`` (a timed result, or None): the ratio of medians with
    its CI, or why there is none."""
    other = (base or {}).get("timing", {}).get(kind, {}).get(batch, {}) if base else {}
    if other.get("verdict") != "pass":
        return {"baseline": baseline_id, "reason": "the baseline was not timed at this batch (select it with --path)"}
    unsettled = [
        f"{who}: {(e.get('stability') or {}).get('reason')}"
        for who, e in (("this series", entry), ("the baseline's", other))
        if not (e.get("stability") or {}).get("ok", True)
    ]
    if unsettled:
        return {"baseline": baseline_id, "withheld": True, "reason": "withheld: " + "; ".join(unsettled)}
    return {"baseline": baseline_id, **stats.compare_series(entry["samples_ms"], other["samples_ms"])}
