"""``parity repro`` on a path that is no ONNX graph (tf/litert, tf/xla, tf, jax): the leaf layer its diagnosis found,
alone, in the path's own format (``parity.diagnose.repro_native``), written where it fails as the path does."""

from __future__ import annotations

from pathlib import Path

from parity.diagnose import repro_native
from parity.diagnose.repro_native import PATHS

__all__ = ["PATHS", "refusal", "repro"]


def refusal(where: str, path, diagnosis: dict) -> str:
    """Today's one line for a path with no ONNX graph to reduce."""
    split = diagnosis.get("split")
    if split:  # the fixed input set passes: nothing fails there to cut a layer out of
        rows = ", ".join(map(str, sorted(set(split.get("rows") or []))))
        return (
            f"nothing to reduce on the fixed input set: {where} fails on the eval split only"
            + (f" (rows {rows})" if rows else "")
            + "; see its diagnosis"
        )
    if not path.exports:
        link = (diagnosis.get("links") or {}).get("enters_at") or "definition"
        return (
            f"nothing to reduce: {where} is a native path; its diagnosis names the {link} link and there is no "
            f"ONNX graph to reduce"
        )
    return f"nothing to reduce: {where} runs on {path.runtime.name}, not on a CPU ONNX runtime"


def repro(ws, spec, manifest, path, options, diagnosis: dict, out: Path, out_dir: str, command: str, progress):
    """``(exit code, one line)``: 0 with the one-layer reproducer written; 2 with today's refusal and why no
    reproducer could be made (no leaf named, the layer alone does not fail as the path does)."""
    from parity.model import weight_files
    from parity.platform.cache_dir import cache_root
    from parity.platform.env import environment
    from parity.platform.errors import TaskFailed
    from parity.run import paths, watch
    from parity.run.pool import WorkerPool

    where = f"{spec.name} {path.id}"  # a split's failure is refused before (``refusal``)
    if diagnosis.get("error"):
        return 2, f"nothing to reduce: {diagnosis['error']}"
    layer = repro_native.leaf_of(diagnosis)
    if layer is None:
        verdict = (diagnosis.get("tree") or {}).get("note") or (diagnosis.get("tree") or {}).get("reason")
        return 2, f"{refusal(where, path, diagnosis)}; its diagnosis names no leaf layer" + (
            f" ({verdict})" if verdict else ""
        )
    framework = path.source
    progress(f"{spec.name}: {layer} alone on {path.id}")
    with (
        WorkerPool(options.threads, cache_root() / "logs", options.timeout_s) as pool,
        pool.for_model(watch.weights_bytes(manifest), mapped=weight_files.mapped(spec)),
    ):
        try:
            outcome = pool.call(
                paths.by_id(framework).runtime.group,
                "parity.diagnose.repro_native:write",
                workspace=str(ws.root),
                model=spec.name,
                path_id=path.id,
                golden_dir=str(ws.golden_dir(spec.name)),
                precision=path.precision,
                threads=options.threads,
                diagnosis=diagnosis,
                out_dir=str(out),
                environment=environment(options.threads),
                command=command,
                weight_perturbation=options.weight_perturbation.get((spec.name, path.id)),
            )
        except TaskFailed as error:
            return 2, f"{refusal(where, path, diagnosis)}; no one-layer reproducer of {layer}: {error}"
    if not outcome["written"]:
        return 2, f"{refusal(where, path, diagnosis)}; no one-layer reproducer: {outcome['reason']}"
    units = outcome["stats"]["path"].get("tol_units", float("inf"))
    return 0, (
        f"wrote {out_dir}: {where} reduced to one layer, {layer} ({outcome['class'].rsplit('.', 1)[-1]}) in "
        f"{outcome['file']}, {units:.3g}x the tolerance on the path and within it in float64; "
        f"`python {Path(out_dir) / 'repro.py'}` exits 1 while the departure is present"
    )
