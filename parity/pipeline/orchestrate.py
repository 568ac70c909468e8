"""The orchestrator: verify goldens, export (cached), check every path, time the passing ones.

It imports no ML framework: every export and check runs in a worker process of its group.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from parity import __version__
from parity.golden import store as golden
from parity.platform import devices
from parity.platform import precision as precision_lib
from parity.platform.cache_dir import cache_root
from parity.platform.env import environment
from parity.platform.errors import GoldenError, SpecError, UsageError, one_line
from parity.platform.safefs import owned_tempdir, sha256_file, sweep
from parity.run import paths, provenance
from parity.run.cache import META_FILE, ExportCache, content_key
from parity.run.worker import TaskFailed, WorkerPool

NOCACHE_PREFIX = "parity-nocache-"

RESULT_SCHEMA = "parity.result/2"


@dataclass
class Options:
    """What to check and how. ``timing`` (``parity.bench.plan.BenchOptions``) None means check only."""

    threads: int
    patterns: tuple[str, ...] = ()
    precision: str = "fp32"  # one of parity.platform.precision.PRECISIONS
    device: str = "cpu"  # "cpu" or "cuda:N" (parity.platform.precision.parse_device)
    timeout_s: float = 300.0
    use_cache: bool = True
    timing: object | None = None  # BenchOptions
    diagnose: str | None = "failing"  # diagnose layer by layer: "failing" paths, "all" selected paths, or None
    weight_perturbation: dict = field(default_factory=dict)  # (model, path) -> {param: delta}


def _result_skeleton(model: str, path: paths.PathDef, spec_batch: int) -> dict:
    return {"model": model, "path": path.id, "stages": path.stages, "device": path.device, "precision": path.precision,
            "batch_size": spec_batch,
            "verdict": None, "reason": None, "expected": False, "outputs": None, "gradients": None, "metrics": None,
            "deterministic": None, "timing": None, "diagnosis": None}


def _package_version(name: str) -> str | None:
    """Installed version of an import name (``tensorflow`` may come as ``tensorflow-cpu``)."""
    for candidate in dict.fromkeys((paths.INSTALL_NAMES.get(name, name), name)):
        try:
            return metadata.version(candidate)
        except metadata.PackageNotFoundError:
            continue
    return None


class Run:
    """One check or run over models and paths (see ``check``)."""

    def __init__(self, workspace, options: Options, progress=lambda message: None):
        self.workspace = workspace
        self.options = options
        self.progress = progress
        self.results: list[dict] = []
        self.model_errors: list[dict] = []
        # what killed runs left behind: --no-cache scratch, cache staging, golden build scratch
        sweep(tempfile.gettempdir(), rf"^{NOCACHE_PREFIX}")
        sweep(workspace.root / "golden", golden.SCRATCH_PATTERN)
        ExportCache(cache_root()).sweep()
        self._scratch = None if options.use_cache else owned_tempdir(tempfile.gettempdir(), NOCACHE_PREFIX)
        self.cache = ExportCache(self._scratch or cache_root(), notice=progress)
        self.exports: dict[str, dict] = {}  # chain key -> {"dir", "meta", "cached"} or {"error", "cached"}
        self.specs: dict = {}

    def _plan(self, model_names):
        plan = []
        matched = False
        for name in model_names:
            try:  # a model that cannot be loaded, or whose golden data does not verify, is that model's error
                spec = self.workspace.load_spec(name)
                manifest = golden.verify(self.workspace.golden_dir(name), spec)
            except (SpecError, GoldenError) as error:
                self.model_errors.append({"model": name, "reason": str(error)})
                continue
            self._check_batch_sizes(spec, manifest)
            self.specs[name] = spec
            selected = paths.select(self.options.patterns, spec.frameworks, self.options.device, self.options.precision)
            matched = matched or bool(selected)
            for path in selected:
                plan.append((spec, manifest, path))
        if self.options.patterns and not matched and not self.model_errors:
            raise UsageError(f"--path {', '.join(self.options.patterns)} matches no path of the selected models")
        return plan

    def _check_batch_sizes(self, spec, manifest) -> None:
        """Every batch size to time must fit the eval split it is verified on (an input error, before any work)."""
        if self.options.timing is None:
            return
        available = manifest["files"]["eval.npz"]["arrays"]["x"]["shape"][0]
        for batch in self.options.timing.batch_sizes or spec.timed_batch_sizes:
            if batch > available:
                raise UsageError(f"batch size {batch} cannot be verified for model {spec.name!r}: its eval split has "
                                 f"{available} samples (each batch size is checked against them before it is timed)")

    def _key_parts(self, spec, manifest, path: paths.PathDef, depth: int, batch_size: int | None) -> tuple[dict, str]:
        """Everything the artifact after export step ``depth`` is known to come from before it is made (the model
        spec, the files its builders name, its weights, parity's own code, every step's package versions, and
        what the steps are keyed on: precision; for a TensorRT engine the TensorRT version, GPU name and compute
        capability, so an engine for another GPU is never reused), and the slot those parts fill."""
        steps = path.exports[: depth + 1]
        keyed_on = {k for s in steps for k in s.keyed_on}
        slot = {"workspace": str(self.workspace.root), "model": spec.name, "source": path.source,
                "steps": [(s.name, s.target) for s in steps], "batch_size": batch_size or spec.batch_size,
                "precision": path.precision if "precision" in keyed_on else None,
                "device": devices.engine_identity(path.device) if "device" in keyed_on else None}
        parts = {
            "parity": __version__, "parity_code": provenance.parity_digest(), "model": spec.name, "source": path.source,
            "model_file_sha256": sha256_file(Path(spec.source_file)), "builder_files": provenance.builder_files(spec),
            "weights_sha256": manifest["files"]["weights.npz"]["sha256"], "source_sha256": manifest.get("source_sha256"),
            "steps": [{"name": s.name, "target": s.target, "versions": {p: _package_version(p) for p in s.packages}}
                      for s in steps],
            "opset": spec.opset, "batch_size": slot["batch_size"], "precision": slot["precision"], "device": slot["device"],
        }
        return parts, provenance.slot_id(slot)

    def _export(self, pool, spec, manifest, path, depth, batch_size: int | None = None) -> dict:
        """The path's artifact up to export step ``depth`` at a static batch (default the spec's), cached."""
        parent = self._export(pool, spec, manifest, path, depth - 1, batch_size) if depth else None
        if parent is not None and "error" in parent:
            return parent
        parts, slot = self._key_parts(spec, manifest, path, depth, batch_size)
        # the artifact it is made from, by content: an export made again makes everything after it again
        parts["parent"] = sha256_file(Path(parent["dir"]) / META_FILE) if parent else None
        key = content_key(parts)
        if key in self.exports:
            return self.exports[key]
        step = path.exports[depth]
        lock = self.cache.lock(key, timeout_s=self.options.timeout_s + 60)
        try:
            with lock:
                entry = self._export_locked(pool, spec, path, depth, key, step, parent, batch_size, parts, slot)
        except TimeoutError:
            entry = {"error": f"{step.name}: cache entry {key} stayed locked by another run for {lock.timeout:g} s",
                     "cached": False}
        self.exports[key] = entry
        return entry

    def _fresh_hit(self, key: str):
        """The cache entry for ``key`` and None, or None and why it is stale (code it loaded has changed)."""
        hit = self.cache.lookup(key)
        changed = provenance.changed_files((hit.meta or {}).get("code_files", {})) if hit is not None else []
        if changed:
            return None, f"model code changed ({provenance.short_names(changed, self.workspace.root)})"
        return hit, None

    def _export_locked(self, pool, spec, path, depth, key, step, parent, batch_size, parts, slot) -> dict:
        hit, stale = self._fresh_hit(key)
        if hit is not None:
            return {"error": hit.error, "cached": True} if hit.error else {"dir": str(hit.dir), "meta": hit.meta, "cached": True}
        before = provenance.read_slot(self.cache.root, slot)
        rebuilt = stale or (provenance.why_changed(before, parts, self.workspace.root) if before not in (None, parts)
                            else None)
        at = f", batch {batch_size}" if batch_size and batch_size != spec.batch_size else ""
        self.progress(f"{spec.name}: export {path.id} ({step.name}{at})" + (f", again: {rebuilt}" if rebuilt else ""))
        staging = self.cache.staging_dir()
        try:
            meta = pool.call(step.group, "parity.run.tasks:export_step", workspace=str(self.workspace.root),
                             model=spec.name, target=step.target, golden_dir=str(self.workspace.golden_dir(spec.name)),
                             opset=spec.opset, out_dir=str(staging), parent_dir=parent and parent["dir"],
                             parent_meta=parent and parent["meta"], batch_size=batch_size, device=path.device,
                             precision=path.precision)
        except TaskFailed as error:
            shutil.rmtree(staging, ignore_errors=True)
            reason = str(error)
            reason = reason if reason.startswith(step.name) else f"{step.name}: {reason}"
            if error.kind == "raised":  # the converter's own verdict on this input and code: the same next time
                code = pool.call(step.group, "parity.run.provenance:loaded_code_files")
                self.cache.commit_error(key, reason, {"code_files": code})
                provenance.write_slot(self.cache.root, slot, parts)
            return {"error": reason, "cached": False, "rebuilt": rebuilt, "log": error.log}
        entry = {"dir": str(self.cache.commit(key, staging, meta).dir), "meta": meta, "cached": False, "rebuilt": rebuilt}
        provenance.write_slot(self.cache.root, slot, parts)
        return entry

    def execute(self, model_names) -> dict:
        plan = self._plan(model_names)
        pending = []
        for spec, manifest, path in plan:
            result = _result_skeleton(spec.name, path, spec.batch_size)
            self.results.append(result)
            reason = paths.unavailable_reason(path)
            if reason:
                result.update(verdict="skip", reason=reason)
            else:
                pending.append((spec, manifest, path, result))
        try:
            env = precision_lib.worker_environment(self.options.device, self.options.precision)
            with WorkerPool(self.options.threads, cache_root() / "logs", self.options.timeout_s, env) as pool:
                # exports, shallow first and grouped by worker so each framework starts once per depth
                for depth in range(max((len(p.exports) for _, _, p, _ in pending), default=0)):
                    todo = [item for item in pending if len(item[2].exports) > depth]
                    for spec, manifest, path, _ in sorted(todo, key=lambda item: item[2].exports[depth].group):
                        self._export(pool, spec, manifest, path, depth)
                order = sorted(pending, key=lambda item: item[2].runtime.group)
                for spec, manifest, path, result in order:
                    self._check(pool, spec, manifest, path, result)
                if self.options.diagnose:
                    for spec, manifest, path, result in order:
                        self._diagnose(pool, spec, manifest, path, result)
                if self.options.timing is not None:
                    from parity.bench import plan as benchmark

                    benchmark.bench(self, pool, order, self.options.timing)
        finally:
            if self._scratch:
                shutil.rmtree(self._scratch, ignore_errors=True)
        for result in self.results:
            _apply_expectation(self.specs[result["model"]], result)
        return {"schema": RESULT_SCHEMA, "env": environment(self.options.threads), "results": self.results,
                "model_errors": self.model_errors}

    def _check(self, pool, spec, manifest, path, result) -> None:
        artifact = None
        if path.exports:
            artifact = self._export(pool, spec, manifest, path, len(path.exports) - 1)
            export = {"cached": artifact["cached"], "rebuilt": artifact.get("rebuilt")}
            if "error" in artifact:
                result.update(verdict="error", reason=artifact["error"], export=export, log=artifact.get("log"))
                return
            result["export"] = {**export, "export_s": artifact["meta"].get("export_s")}
            if "build_determinism" in artifact["meta"]:  # a TensorRT engine: built twice, both run on the golden inputs
                result["export"]["build_determinism"] = artifact["meta"]["build_determinism"]
        self.progress(f"{spec.name}: check {path.id}")
        try:
            outcome = pool.call(
                path.runtime.group, "parity.run.tasks:check_path", workspace=str(self.workspace.root), model=spec.name,
                path_id=path.id, golden_dir=str(self.workspace.golden_dir(spec.name)), precision=path.precision,
                threads=self.options.threads, artifact_dir=artifact and artifact["dir"],
                artifact_meta=artifact and artifact["meta"],
                export_s=0.0 if artifact is None or artifact["cached"] else artifact["meta"].get("export_s", 0.0),
                weight_perturbation=self.options.weight_perturbation.get((spec.name, path.id)), device=path.device,
            )
        except TaskFailed as error:
            result.update(verdict="error", reason=f"{path.runtime.name}: {error}", log=error.log)
            return
        result.update(outcome)

    def _diagnose(self, pool, spec, manifest, path, result) -> None:
        """Diagnose ``path``'s drift layer by layer into ``result["diagnosis"]`` (options.diagnose says which)."""
        from parity.diagnose import chain

        wanted = self.options.diagnose == "all" or (result["verdict"] == "fail" and spec.expected_error(path.id) is None)
        if not wanted:
            return
        failed = {"model": spec.name, "path": path.id}
        if result["verdict"] == "error":
            result["diagnosis"] = {**failed, "error": f"nothing to diagnose: the path ended in error ({result['reason']})"}
            return
        self.progress(f"{spec.name}: diagnose {path.id}")
        try:
            result["diagnosis"] = chain.diagnose(self, pool, spec, manifest, path)
        except Exception as error:  # noqa: BLE001 - a diagnosis that breaks must not cost the run its results
            reason = one_line(f"{type(error).__name__}: {error}", 300)
            result["diagnosis"] = {**failed, "error": f"the diagnosis itself failed: {reason}"}


def _apply_expectation(spec, result: dict) -> None:
    """Mark declared expected errors; an expected error that passes is an unexpected pass."""
    declared = spec.expected_error(result["path"])
    if declared is None:
        return
    result["expected_reason"] = declared
    if result["verdict"] == "error":
        result["expected"] = True
    elif result["verdict"] == "pass":
        result["unexpected_pass"] = True


def is_unexpected(result: dict) -> bool:
    return (result["verdict"] in ("fail", "error") and not result.get("expected")) or bool(result.get("unexpected_pass"))


def exit_code(report: dict) -> int:
    """0 when everything is as expected, 1 when any path (or model) ended unexpectedly.

    2 when no model could be loaded at all: nothing ran, so it is an input error.
    """
    if report["model_errors"] and not report["results"]:
        return 2
    if report["model_errors"] or any(is_unexpected(r) for r in report["results"]):
        return 1
    return 0


def check(workspace, model_names, options: Options, progress=lambda message: None) -> dict:
    """Verify goldens, export, check every selected path, diagnose failing ones; time passing paths when
    ``options.timing``."""
    return Run(workspace, options, progress).execute(model_names)
