"""``parity repro`` of a text-generation model's path: its step-by-step check and diagnosis, then the exported graph
cut at the first divergent step's leaf module, fed the step's own values (``parity.generation.repro``)."""

from __future__ import annotations

from pathlib import Path

from parity.generation import golden as generation_golden
from parity.pipeline import orchestrate
from parity.pipeline.generation import export, selected
from parity.platform.cache_dir import cache_root
from parity.platform.env import environment
from parity.platform.errors import TaskFailed, UsageError
from parity.run.pool import WorkerPool


def repro(
    ws, name: str, path_id: str, out: Path, precision: str, threads: int, timeout_s, command: str, progress
) -> tuple[int, str]:
    """Returns ``(exit code, one line)`` as the forward ``repro`` does."""

    spec = ws.load_spec(name)
    known = selected(spec, ())
    if path_id not in known:
        raise UsageError(f"--path {path_id}: not a path of the text-generation model {name} ({', '.join(known)})")
    options = orchestrate.Options(threads=threads, patterns=(path_id,), precision=precision, timeout_s=timeout_s)
    report = orchestrate.check(ws, [name], options, progress=progress)
    result = next((r for r in report["results"] if r["path"] == path_id), None)
    where = f"{name} {path_id}"
    if result is None:
        errors = "; ".join(str(e.get("reason", e)) for e in report.get("model_errors") or []) or "not checked"
        return 2, f"nothing to reduce: {where} was not checked ({errors})"
    if result["verdict"] == "pass":
        return 0, f"nothing to reduce: {where} passes every step"
    if result["verdict"] != "fail":
        return 2, f"nothing to reduce: {where} is {result['verdict']} ({result.get('reason') or 'no reason'})"
    if path_id != "torch/onnx/ort":
        return 2, f"nothing to reduce: a generation step is cut from torch/onnx/ort's graph; {path_id} has none read"
    diagnosis = result["generation"].get("diagnosis") or {}
    if diagnosis.get("error") or diagnosis.get("step") is None:
        return 2, f"nothing to reduce: {diagnosis.get('error') or diagnosis.get('note') or 'no step diagnosed'}"
    manifest = generation_golden.verify(ws.golden_dir(name), spec, ws.root)
    with WorkerPool(threads, cache_root() / "logs", timeout_s) as pool:
        artifact = export(pool, spec.source(ws.root), manifest, path_id)  # the check's, from the cache
        progress(f"{name}: cut {path_id} at step {diagnosis['step']}")
        try:
            outcome = pool.call(
                "torch",
                "parity.generation.repro:write",
                source=spec.source(ws.root),
                golden_file=str(ws.golden_dir(name) / generation_golden.FILE),
                artifact_dir=artifact["dir"],
                meta=artifact["meta"],
                diagnosis=diagnosis,
                generation=result["generation"],
                out_dir=str(out),
                threads=threads,
                title=where,
                environment=environment(threads),
                command=command,
            )
        except TaskFailed as error:
            return 1, f"the cut of {where} failed: {error}"
    at = f"step {diagnosis['step']} ({diagnosis.get('mode')})"
    if not outcome["written"]:
        return 1, f"no bug report: {where} {at}: {outcome['reason']}"
    worst = max((e["tol_units"] or float("inf") for e in outcome["errors"].values()), default=0.0)
    scope = "the whole step" if outcome["scope"] == "step" else outcome["scope"]
    ops = " -> ".join(outcome["ops"]) if len(outcome["ops"]) <= 12 else f"{len(outcome['ops'])} nodes"
    return 0, (
        f"wrote {out}: {where} {at} cut to {scope}: {ops} ({outcome['nodes_before']} nodes -> "
        f"{outcome['nodes_after']}, {worst:.3g} tolerance units)"
        + (f"; {outcome['note']}" if outcome["note"] else "")
        + f"; `python {out / 'repro.py'}` exits 1 while the bug is present"
    )
