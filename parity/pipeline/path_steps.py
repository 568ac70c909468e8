"""One path's steps within a run (``parity.pipeline.orchestrate.Run``): each export, cached and keyed on everything
it comes from (the model file, its weights, parity's code, the steps' package versions; a user model's weights read
as its builder makes them now), the path's check in its runtime's worker, and the diagnosis of a failing one.

It imports no ML framework: every export and check runs in a worker process of its group.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from parity import __version__
from parity.golden import weights as golden_weights
from parity.model import identity
from parity.pipeline.int8_key import int8_parts
from parity.platform import devices
from parity.platform.errors import NotEnoughMemory, ParityError, TaskFailed, one_line
from parity.platform.packages import installed, normalized
from parity.platform.safefs import sha256_file
from parity.run import paths, provenance
from parity.run.cache import META_FILE, ExportCache, content_key
from parity.run.install_names import INSTALL_NAMES

# a check on these runtimes runs an ONNX graph as a diagnosis's plain run does (every optimisation on, the same
# threads, on the CPU): a failing path's diagnosis reads the check's outputs instead of running it again
PLAIN_RUNTIMES = ("ort",)


def _package_version(name: str) -> str | None:
    """Installed version of an import name (``tensorflow`` may come as ``tensorflow-cpu``)."""
    found = installed()
    for candidate in dict.fromkeys((INSTALL_NAMES.get(name, name), name)):
        if normalized(candidate) in found:
            return found[normalized(candidate)]
    return None


def _megabytes(nbytes: int | None) -> float | None:
    """A worker's peak memory in the result JSON: MB, one decimal (None where the task did not run)."""
    return None if nbytes is None else round(nbytes / 1e6, 1)


class PathSteps:
    """The export, check and diagnosis of one path, as methods of the run (``Run`` holds the state they use)."""

    workspace: Any
    options: Any  # parity.pipeline.orchestrate.Options
    progress: Callable[..., None]
    sized: Callable[..., Any]
    cache: ExportCache
    exports: dict[str, dict]  # chain key -> {"dir", "meta", "cached"} or {"error", "cached"}
    identities: dict[str, dict | None]
    check_outputs: dict[tuple, dict]  # (model, path, device, precision) -> a failing check's outputs, for its diagnosis
    calibrations: dict[str, dict]
    results: list[dict]
    model_errors: list[dict]
    refused: set[str]

    def _key_parts(self, spec, manifest, path: paths.PathDef, depth: int, batch_size: int | None) -> tuple[dict, str]:
        """Everything the artifact after export step ``depth`` is known to come from before it is made (the model
        spec, the files its builders name, its weights, parity's own code, every step's package versions, and
        what the steps are keyed on: precision; for a TensorRT engine the TensorRT version, GPU name and compute
        capability, so an engine for another GPU is never reused), and the slot those parts fill."""
        steps = path.exports[: depth + 1]
        keyed_on = {k for s in steps for k in s.keyed_on}
        slot = {
            "workspace": str(self.workspace.root),
            "model": spec.name,
            "source": path.source,
            "steps": [(s.name, s.target) for s in steps],
            "batch_size": batch_size or spec.batch_size,
            "precision": path.precision if "precision" in keyed_on else None,
            "device": devices.engine_identity(path.device) if "device" in keyed_on else None,
        }
        parts = {
            "parity": __version__,
            "parity_code": provenance.parity_digest(),
            "model": spec.name,
            "source": path.source,
            "model_file_sha256": sha256_file(Path(spec.source_file)),
            "builder_files": provenance.builder_files(spec),
            "weights_sha256": golden_weights.digest(manifest),  # the golden copy's, or the model's at its build
            "source_sha256": manifest.get("source_sha256"),
            # the weights the model's builder holds now (a factory's checkpoint): an export is made from the model
            "model_weights_sha256": (self.identities.get(spec.name) or {}).get("weights_sha256"),
            "steps": [
                {"name": s.name, "target": s.target, "versions": {p: _package_version(p) for p in s.packages}}
                for s in steps
            ],
            "opset": spec.opset,
            "batch_size": slot["batch_size"],
            "precision": slot["precision"],
            "device": slot["device"],
        }
        return parts, provenance.slot_id(slot)

    def _export(self, pool, spec, manifest, path, depth, batch_size: int | None = None, at_step=None) -> dict:
        """The path's artifact up to export step ``depth`` at a static batch (default the spec's), cached.
        ``at_step`` (k, n): where this export is in the run's list of exports, for the progress messages."""
        parent = self._export(pool, spec, manifest, path, depth - 1, batch_size) if depth else None
        if parent is not None and "error" in parent:
            return parent
        parts, slot = self._key_parts(spec, manifest, path, depth, batch_size)
        # the artifact it is made from, by content: an export made again makes everything after it again
        parts["parent"] = sha256_file(Path(parent["dir"]) / META_FILE) if parent else None
        quantizer = int8_parts(pool, self.workspace, spec, path.exports[: depth + 1], self.calibrations)
        if quantizer is not None:  # an int8 model: the rows it calibrates on and the quantizer's settings
            parts["quantizer"] = quantizer
        key = content_key(parts)
        if key in self.exports:
            return self.exports[key]
        step = path.exports[depth]
        with self.sized(pool, spec):  # the lock is waited on as long as the export it waits for may run
            lock = self.cache.lock(key, timeout_s=pool.limits().wall_s + 60)
            try:
                with lock:
                    entry = self._export_locked(
                        pool, spec, path, depth, key, step, parent, batch_size, parts, slot, at_step
                    )
            except TimeoutError:
                entry = {
                    "error": f"{step.name}: cache entry {key} stayed locked by another run for {lock.timeout:g} s",
                    "cached": False,
                }
        self.exports[key] = entry
        return entry

    def _fresh_hit(self, key: str):
        """The cache entry for ``key`` and None, or None and why it is stale (code it loaded has changed)."""
        hit = self.cache.lookup(key)
        changed = provenance.changed_files((hit.meta or {}).get("code_files", {})) if hit is not None else []
        if changed:
            return None, f"model code changed ({provenance.short_names(changed, self.workspace.root)})"
        return hit, None

    def _export_locked(self, pool, spec, path, depth, key, step, parent, batch_size, parts, slot, at_step=None) -> dict:
        hit, stale = self._fresh_hit(key)
        if hit is not None:
            return (
                {"error": hit.error, "cached": True}
                if hit.error
                else {"dir": str(hit.dir), "meta": hit.meta, "cached": True}
            )
        before = provenance.read_slot(self.cache.root, slot)
        rebuilt = stale or (
            provenance.why_changed(before, parts, self.workspace.root) if before not in (None, parts) else None
        )
        at = f", batch {batch_size}" if batch_size and batch_size != spec.batch_size else ""
        self.progress(
            f"{spec.name}: export {path.id} ({step.name}{at})" + (f", again: {rebuilt}" if rebuilt else ""),
            *(at_step or ()),
        )
        staging = self.cache.staging_dir()
        try:
            meta = pool.call(
                step.group,
                "parity.run.tasks:export_step",
                warm=step.warm,
                workspace=str(self.workspace.root),
                model=spec.name,
                target=step.target,
                golden_dir=str(self.workspace.golden_dir(spec.name)),
                opset=spec.opset,
                out_dir=str(staging),
                parent_dir=parent and parent["dir"],
                parent_meta=parent and parent["meta"],
                batch_size=batch_size,
                device=path.device,
                precision=path.precision,
                calibrate=step.quantizes,
                path_id=path.id,
            )
        except TaskFailed as error:
            shutil.rmtree(staging, ignore_errors=True)
            if error.kind == "golden":
                raise
            peak = _megabytes(pool.last_peak_bytes)
            reason = str(error)
            reason = reason if reason.startswith(step.name) else f"{step.name}: {reason}"
            if error.kind == "raised":  # the converter's own verdict on this input and code: the same next time
                code = pool.call(step.group, "parity.run.provenance:loaded_code_files")
                self.cache.commit_error(key, reason, {"code_files": code})
                provenance.write_slot(self.cache.root, slot, parts)
            return {"error": reason, "cached": False, "rebuilt": rebuilt, "log": error.log, "peak_rss_mb": peak}
        except NotEnoughMemory as error:  # refused before it started: this path's error, the others go on
            shutil.rmtree(staging, ignore_errors=True)
            return {"error": f"{step.name}: {error}", "cached": False, "rebuilt": rebuilt}
        pool.retire_if_holding()  # an exporter may keep the model it traced: the next task starts without it
        entry = {
            "dir": str(self.cache.commit(key, staging, meta).dir),
            "meta": meta,
            "cached": False,
            "rebuilt": rebuilt,
            "peak_rss_mb": _megabytes(pool.last_peak_bytes),
        }
        provenance.write_slot(self.cache.root, slot, parts)
        return entry

    def _identify(self, pool, pending) -> None:
        """Each user model as its builder makes it now (``parity.model.identity``): its weights key its exports; a
        change since its golden build is said on every result of the model (``golden_changed``), whose verdict
        stands."""
        for name, (spec, manifest) in {
            s.name: (s, m) for s, m, _, _ in pending if s.weights_from_model and s.frameworks[0] != "onnx"
        }.items():
            self.progress(f"{name}: reading the model's weights")
            try:
                with self.sized(pool, spec):
                    now = pool.call(
                        spec.frameworks[0],
                        "parity.model.identity:model_identity",
                        workspace=str(self.workspace.root),
                        model=name,
                    )
                changed = identity.changes(name, manifest.get("built_from"), now)
            except (TaskFailed, ParityError) as error:  # the checks say why it does not build; here: not compared
                now, changed = None, identity.not_compared(str(error))
            self.identities[name] = now
            # golden data without a copy of the weights checks nothing unless the model's are known to be its own
            if changed and changed["weights"] is not False and not golden_weights.kept(manifest):
                self.refused.add(name)
                reason = (
                    identity.stale(name, changed) if changed["weights"] else changed["message"] + "; nothing is checked"
                )
                self.model_errors.append({"model": name, "reason": reason})
                continue
            for result in (r for r in self.results if r["model"] == name):
                result["golden_changed"] = changed

    def _check(self, pool, spec, manifest, path, result, step=None) -> None:
        artifact = None
        if path.exports:
            artifact = self._export(pool, spec, manifest, path, len(path.exports) - 1)
            # the export's peak memory where it ran in this run (None for a cached one)
            export = {
                "cached": artifact["cached"],
                "rebuilt": artifact.get("rebuilt"),
                "peak_rss_mb": artifact.get("peak_rss_mb"),
            }
            if "error" in artifact:
                result.update(verdict="error", reason=artifact["error"], export=export, log=artifact.get("log"))
                return
            result["export"] = {
                **export,
                "export_s": artifact["meta"].get("export_s"),
                **{
                    key: artifact["meta"][key]
                    for key in ("opset", "axes", "quantization", "calibration_data")
                    if key in artifact["meta"]
                },
            }
            if "build_determinism" in artifact["meta"]:  # a TensorRT engine: built twice, both run on the golden inputs
                result["export"]["build_determinism"] = artifact["meta"]["build_determinism"]
        self.progress(f"{spec.name}: check {path.id}", *(step or ()))
        try:
            outcome = pool.call(
                path.runtime.group,
                "parity.run.tasks:check_path",
                workspace=str(self.workspace.root),
                model=spec.name,
                path_id=path.id,
                golden_dir=str(self.workspace.golden_dir(spec.name)),
                precision=path.precision,
                threads=self.options.threads,
                artifact_dir=artifact and artifact["dir"],
                artifact_meta=artifact and artifact["meta"],
                export_s=0.0 if artifact is None or artifact["cached"] else artifact["meta"].get("export_s", 0.0),
                weight_perturbation=self.options.weight_perturbation.get((spec.name, path.id)),
                device=path.device,
                # a diagnosis of an ONNX graph on the CPU reads the check's run as its own plain run
                keep_outputs=bool(self.options.diagnose)
                and artifact is not None
                and path.runtime.name in PLAIN_RUNTIMES
                and path.device == "cpu",
            )
        except TaskFailed as error:
            if error.kind == "golden":
                raise
            result.update(verdict="error", reason=f"{path.runtime.name}: {error}", log=error.log)
            result["peak_rss_mb"] = _megabytes(pool.last_peak_bytes)
            return
        except NotEnoughMemory as error:  # refused before it started: this path's error, the others go on
            result.update(verdict="error", reason=f"{path.runtime.name}: {error}")
            return
        if "plain_outputs" in outcome:
            self.check_outputs[(spec.name, path.id, path.device, path.precision)] = outcome.pop("plain_outputs")
        result.update(outcome)
        result["peak_rss_mb"] = _megabytes(pool.last_peak_bytes)

    def _diagnose(self, pool, spec, manifest, path, result) -> None:
        """Diagnose ``path``'s drift layer by layer into ``result["diagnosis"]`` (options.diagnose says which)."""
        plain = self.check_outputs.pop((spec.name, path.id, path.device, path.precision), None)
        wanted = self.options.diagnose == "all" or (
            result["verdict"] == "fail" and spec.expected_error(path.id) is None
        )
        if not wanted:
            return
        from parity.diagnose import chain

        failed = {"model": spec.name, "path": path.id}
        if result["verdict"] == "error":
            result["diagnosis"] = {
                **failed,
                "error": f"nothing to diagnose: the path ended in error ({result['reason']})",
            }
            return
        golden_shape_ok = all(
            stats["ok"]
            for part in ("outputs", "eval_outputs", "gradients")
            for stats in (result.get(part) or {}).values()
        )
        if result["verdict"] == "fail" and golden_shape_ok and any(not s["ok"] for s in result.get("shapes") or ()):
            result["diagnosis"] = {
                **failed,
                "error": "nothing to diagnose layer by layer: the path agrees at the golden "
                "shape and fails only at other shapes (see its reason)",
            }
            return
        self.progress(f"{spec.name}: diagnose {path.id}")
        try:
            if path.quantized:  # ranked by the accuracy each layer costs, not tap by tap against tolerances
                from parity.diagnose.precision import int8_chain

                result["diagnosis"] = int8_chain.diagnose(self, pool, spec, manifest, path)
                return
            failing = [name for name, stats in (result.get("outputs") or {}).items() if not stats["ok"]]
            eval_only = not failing and any(not s["ok"] for s in (result.get("eval_outputs") or {}).values())
            floor, bound = result.get("noise_floor") or {}, None
            if result["verdict"] == "pass" and floor.get("noisier"):  # at the floor's bound, as a failure at its own
                from parity.check import noise_floor

                bound = noise_floor.bound(spec, path.precision, floor).to_json()
                failing = [name for name, ratio in floor["outputs"].items() if ratio > floor["factor"]]
                eval_only = False
            result["diagnosis"] = chain.diagnose(
                self,
                pool,
                spec,
                manifest,
                path,
                failing=failing,
                split="eval" if eval_only else "inputs",
                **({"tolerances": bound} if bound else {}),
                plain=None if bound else plain,
            )
        except Exception as error:  # noqa: BLE001 - a diagnosis that breaks must not cost the run its results
            reason = one_line(f"{type(error).__name__}: {error}", 300)
            result["diagnosis"] = {**failed, "error": f"the diagnosis itself failed: {reason}"}
            return
        if self.options.node_data:  # the graph Model Explorer draws it on: read only when its node data is written
            from parity.pipeline import node_data

            node_data.locate(self, pool, spec, manifest, path, result["diagnosis"])
