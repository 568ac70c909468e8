"""The benchmark step of a run, after every check: only paths that passed get numbers (the gate).

For each passing path and each batch size: export at that batch (static, cached), verify its outputs
on eval samples against the golden, then time it; a verified training step on differentiable paths
whose gradients passed; time to first result by part and the path's peak memory in a fresh worker;
then each series against its baseline (ratio of medians with a 95 % CI, Welch's t-test on log-times).
Runs in the orchestrator (no framework imports); every measurement runs in a worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from parity.bench import stats
from parity.run.worker import TaskFailed


@dataclass
class BenchOptions:
    """How to time: the stopping rule of ``parity.bench.measure.measure``, batch sizes, baseline, training step."""

    budget_s: float = 1.0
    min_runs: int = 30
    target_rel_ci: float = 0.02
    batch_sizes: tuple[int, ...] = ()  # empty: each model's spec.timed_batch_sizes
    baseline: str | None = None  # path id; None: each path's native source path
    lr: float = 0.1
    first_result: bool = True
    measure: dict = field(init=False)

    def __post_init__(self):
        if not self.budget_s > 0:
            raise ValueError(f"the time budget must be positive, not {self.budget_s:g} s")
        self.measure = {"budget_s": self.budget_s, "min_runs": self.min_runs, "target_rel_ci": self.target_rel_ci}


def _call(pool, group: str, task: str, **kwargs) -> dict:
    try:
        return pool.call(group, task, **kwargs)
    except TaskFailed as error:
        return {"verdict": "error", "reason": str(error)}


def bench(run, pool, pending, options: BenchOptions) -> None:
    """Time every passing path of ``pending`` ((spec, manifest, path, result) tuples) into ``result["timing"]``."""
    passing = [item for item in pending if item[3]["verdict"] == "pass"]
    artifacts = {}
    for spec, manifest, path, result in sorted(passing, key=lambda item: item[2].exports[-1].group if item[2].exports else ""):
        for batch in options.batch_sizes or spec.timed_batch_sizes:
            artifacts[(spec.name, path.id, batch)] = (
                run._export(pool, spec, manifest, path, len(path.exports) - 1, batch) if path.exports else None)
    for spec, manifest, path, result in sorted(passing, key=lambda item: item[2].runtime.group):
        run.progress(f"{spec.name}: time {path.id}")
        common = {"workspace": str(run.workspace.root), "model": spec.name, "path_id": path.id,
                  "golden_dir": str(run.workspace.golden_dir(spec.name)), "threads": run.options.threads,
                  "device": path.device}
        timing = {"export": "static batch per exported artifact" if path.exports else None, "batches": {}}
        for batch in options.batch_sizes or spec.timed_batch_sizes:
            artifact = artifacts[(spec.name, path.id, batch)]
            if artifact is not None and "error" in artifact:
                timing["batches"][str(batch)] = {"verdict": "error", "reason": artifact["error"]}
                continue
            timing["batches"][str(batch)] = _call(
                pool, path.runtime.group, "parity.bench.tasks:time_batch", precision=path.precision, batch_size=batch,
                timing=options.measure, artifact_dir=artifact and artifact["dir"],
                artifact_meta=artifact and artifact["meta"], **common)
        # the artifact the path was checked with (the run already holds it)
        own = run._export(pool, spec, manifest, path, len(path.exports) - 1) if path.exports else None
        artifact_kw = {"artifact_dir": own and own["dir"], "artifact_meta": own and own["meta"]}
        timing["train_step"] = None
        if path.differentiable and result.get("gradients") and all(s["ok"] for s in result["gradients"].values()):
            timing["train_step"] = _call(pool, path.runtime.group, "parity.bench.tasks:time_train_step",
                                         precision=path.precision, lr=options.lr, timing=options.measure,
                                         **artifact_kw, **common)
        timing["first_result"] = None
        if options.first_result:
            first = _call(pool, path.runtime.group, "parity.bench.tasks:first_result", fresh=True, precision=path.precision,
                          **artifact_kw, **common)
            if own is not None and "verdict" not in first:
                first["export_s"] = own["meta"].get("export_s")
                first["export_cached"] = bool(own.get("cached"))
            timing["first_result"] = first
        result["timing"] = timing
    _compare_to_baselines(pending, options)


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

