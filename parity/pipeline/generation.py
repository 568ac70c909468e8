"""A generation model's paths in a run: which are selected, their exports (kept in the cache, verified before use)
and their step-by-step check in the torch worker (``parity.generation.tasks``), each a result row with its
``generation`` block. Imports no ML framework.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import shutil
from pathlib import Path

from parity import __version__
from parity.generation import golden as generation_golden
from parity.generation.paths import PATHS
from parity.model.generation_spec import PATHS as ORDER
from parity.model.generation_spec import TASK
from parity.pipeline.outcome import skeleton
from parity.platform.cache_dir import cache_root, named_lock
from parity.platform.errors import TaskFailed, one_line
from parity.platform.packages import installed, normalized
from parity.platform.safefs import owned_tempdir, sha256_file, sweep, write_json_atomic
from parity.run.cache import Kind, mark_used

META = "parity-generation-export.json"
EXPORTS = "generation-exports"  # the folder of the cache they are kept in


def is_generation(spec) -> bool:
    return getattr(spec, "task", None) == TASK


def selected(spec, patterns) -> list[str]:
    """The spec's paths matching ``patterns`` (every path of the spec where none are given)."""
    chosen = [p for p in ORDER if p in spec.paths]
    return [p for p in chosen if not patterns or any(fnmatch.fnmatchcase(p, pattern) for pattern in patterns)]


def row(spec, manifest: dict, path_id: str) -> dict:
    """A generation path's result row before it is checked (its batch: the golden's prompts)."""
    row = skeleton(spec.name, path_id, list(PATHS[path_id].stages), "cpu", "fp32", manifest["reference"]["prompts"])
    return {**row, "task": TASK, "generation": None}


def changed(workspace, pool, spec, manifest: dict) -> dict | None:
    """``{"built_from", "now"}`` where the model is no longer the one its golden data was built from, else None."""
    now = pool.call("torch", "parity.generation.golden:source_identity", source=spec.source(workspace.root))
    return None if now == manifest["built_from"] else {"built_from": manifest["built_from"], "now": now}


def check(
    workspace,
    pool,
    spec,
    manifest: dict,
    path_id: str,
    threads: int,
    progress=lambda message: None,
    exports: Path | None = None,
) -> tuple[dict, dict | None]:
    """One path's result row and its export (``{"dir", "meta", "cached"}``, None for ``torch``): the export (cached),
    then prefill and decode steps against the golden."""
    result = row(spec, manifest, path_id)
    source = spec.source(workspace.root)
    try:
        artifact = None
        if PATHS[path_id].export:
            progress(f"{spec.name}: export {path_id}")
            artifact = export(pool, source, manifest, path_id, exports)
            if "unavailable" in artifact["meta"]:
                result.update(verdict="skip", reason=artifact["meta"]["unavailable"])
                return result, artifact
            result["export"] = {"cached": artifact["cached"], "export_s": artifact["meta"].get("export_s")}
        progress(f"{spec.name}: generate on {path_id}")
        outcome = pool.call(
            "torch",
            "parity.generation.tasks:check",
            source=source,
            golden_file=str(workspace.golden_dir(spec.name) / generation_golden.FILE),
            path_id=path_id,
            artifact_dir=artifact and artifact["dir"],
            meta=artifact and artifact["meta"],
            threads=threads,
            tolerances={**manifest["reference"].get("tolerances", {}), **spec.tolerances},
        )
    except TaskFailed as error:
        result.update(verdict="error", reason=f"{path_id}: {one_line(str(error), 400)}", log=error.log)
        return result, artifact
    result.update(outcome)
    return result, artifact


def diagnose(
    workspace, pool, spec, result: dict, artifact: dict | None, threads: int, progress=lambda message: None
) -> None:
    """The module tree of a failing path at its first divergent step (``parity.generation.diagnose``), into its
    ``generation`` block's ``diagnosis``."""
    path_id, artifact = result["path"], artifact or {}
    progress(f"{spec.name}: diagnose {path_id} at its first divergent step")
    try:
        result["generation"]["diagnosis"] = pool.call(
            "torch",
            "parity.generation.diagnose:diagnose",
            source=spec.source(workspace.root),
            golden_file=str(workspace.golden_dir(spec.name) / generation_golden.FILE),
            path_id=path_id,
            artifact_dir=artifact.get("dir"),
            meta=artifact.get("meta"),
            generation=result["generation"],
            threads=threads,
        )
    except TaskFailed as error:
        result["generation"]["diagnosis"] = {"error": one_line(str(error), 400)}


def time_paths(run, pool, timing) -> None:
    """Time each generation path that passed (``parity.generation.timing``) into its ``generation`` block's
    ``timing``: time to first token and decode tokens per second at the spec's batch sizes (``--batch`` overrides).
    One sample is a whole generation, so a series gets ten times the per-series budget and at least 5 runs."""
    for result in run.results:
        held = run.generation_artifacts.get((result["model"], result["path"]))
        if held is None or result["verdict"] != "pass":
            continue
        spec, manifest, artifact = held
        run.progress(f"{spec.name}: time {result['path']}")
        try:
            result["generation"]["timing"] = pool.call(
                "torch",
                "parity.generation.timing:time_path",
                source=spec.source(run.workspace.root),
                path_id=result["path"],
                artifact_dir=artifact and artifact["dir"],
                meta={**((artifact and artifact["meta"]) or {}), "vocab": manifest["reference"]["vocab"]},
                threads=run.options.threads,
                prompt_length=spec.bench_prompt_length,
                new_tokens=spec.bench_new_tokens,
                batch_sizes=list(timing.batch_sizes or spec.bench_batch_sizes),
                budget_s=10 * timing.budget_s,
                min_runs=min(timing.min_runs, 5),
                rel_ci=timing.target_rel_ci,
            )
        except TaskFailed as error:
            result["generation"]["timing"] = {"verdict": "error", "reason": one_line(str(error), 400)}


def export(pool, source: dict, manifest: dict, path_id: str, parent: Path | None = None) -> dict:
    """``{"dir", "meta", "cached"}`` of the path's export, made once per model and package versions and kept under
    ``parent`` (default: the cache folder's ``generation-exports``; a run with ``--no-cache`` gives its own scratch
    folder); a kept export whose files are not exactly those it was written with is made again."""
    kind, task, packages = PATHS[path_id].kind, PATHS[path_id].export, PATHS[path_id].packages
    found = installed()
    key = hashlib.sha256(
        json.dumps(
            {
                "kind": kind,
                "built_from": manifest["built_from"],
                "parity": __version__,
                "packages": {name: found.get(normalized(name)) for name in packages},
            },
            sort_keys=True,
        ).encode()
    ).hexdigest()[:32]
    parent = parent or cache_root() / EXPORTS
    parent.mkdir(parents=True, exist_ok=True)
    target = parent / key
    with named_lock(f"generation-export-{key}"):
        kept = _verified(target)
        if kept is not None:
            mark_used(target, META)
            return {"dir": str(target), "meta": kept, "cached": True}
        sweep(parent, ".build-*")
        scratch = owned_tempdir(parent, ".build-")
        try:
            meta = pool.call("torch", task, warm=PATHS[path_id].warm, source=source, out_dir=str(scratch))
            if "unavailable" in meta:  # nothing made, nothing kept: said on the path
                return {"dir": None, "meta": meta, "cached": False}
            files = {
                p.relative_to(scratch).as_posix(): sha256_file(p) for p in sorted(scratch.rglob("*")) if p.is_file()
            }
            meta = {**meta, "files_sha256": files}
            write_json_atomic(scratch / META, meta)
            shutil.rmtree(target, ignore_errors=True)
            scratch.rename(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return {"dir": str(target), "meta": meta, "cached": False}


def export_kind() -> Kind:
    """The generation exports as the export cache's bound counts them (``ExportCache.prune``)."""

    return Kind(cache_root() / EXPORTS, META, lambda entry: named_lock(f"generation-export-{entry.name}", 0))


def _verified(folder: Path) -> dict | None:
    """The meta of a kept export whose every file is the one it was written with, else None."""
    try:
        meta = json.loads((folder / META).read_text())
        files = meta["files_sha256"]
        present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {META}
        if files and present == set(files) and all(sha256_file(folder / n) == d for n, d in files.items()):
            return meta
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def init(root: Path, name: str, hf: str | None, torch_ref: str | None, force: bool, prompts: str | None = None) -> Path:
    """Write ``models/<name>.py`` declaring a ``GenerationSpec`` for a ``save_pretrained`` folder or a factory, on
    seeded random prompts or those of ``prompts`` (a ``.npz``)."""
    from parity.platform.errors import UsageError
    from parity.platform.safefs import write_text_atomic

    if (hf is None) == (torch_ref is None):
        raise UsageError("--task text-generation takes a model from --hf FOLDER or --torch MODULE:FUNCTION")
    if hf is not None and not (Path(hf) / "config.json").is_file():
        raise UsageError(f"--hf {hf}: not a save_pretrained folder (no config.json)")
    target = Path(root) / "models" / f"{name}.py"
    if target.exists() and not force:
        raise UsageError(f"{target} exists; pass --force to replace it")
    if hf is not None:
        folder = Path(hf).resolve()
        inside = folder.is_relative_to(Path(root).resolve())
        source = f"hf={(folder.relative_to(Path(root).resolve()).as_posix() if inside else str(folder))!r}"
    else:
        source = f"torch_factory={torch_ref!r}"
    prompt_lines = (
        f"prompts={prompts!r},  # input_ids and attention_mask, left-padded; batch 1 runs the first row alone"
        if prompts
        else "prompt_lengths=(7, 4),  # batch 1 runs the first prompt alone; the left-padded batch runs them all\n"
        "    seed=0,"
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(
        target,
        f'''"""{name}: a causal language model checked as it generates (greedy, with a key/value cache)."""

from parity.model.generation_spec import GenerationSpec

SPEC = GenerationSpec(
    name={name!r},
    description="greedy generation with a key/value cache, step by step against a float64 golden",
    {source},
    new_tokens=8,  # greedy steps after the prompt (step 0: the prefill)
    {prompt_lines}
)
''',
    )
    return target
