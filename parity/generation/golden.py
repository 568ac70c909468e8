"""A generation model's golden data: ``golden/<model>/generation.npz`` (the float64 model's greedy generation on the
prompt set, step by step: tokens and logits per batch, the consistency baselines) and ``manifest.json`` (what it
was built from and with, the file's sha256 and arrays, sealed by a digest). Published atomically; never used
before the manifest's digest, the file's sha256 and the spec's settings are verified.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from parity import __version__
from parity.golden.store import describe_arrays, new_scratch
from parity.model import manifest as manifest_lib
from parity.platform.cache_dir import named_lock
from parity.platform.errors import GoldenError
from parity.platform.safefs import replace_dir, sha256_file, write_json_atomic

SCHEMA = "parity-generation-golden/1"
FILE = "generation.npz"
MANIFEST = "manifest.json"
REFERENCE_KEYS = {"steps", "prompts", "vocab", "tolerances"}  # what a check reads of the reference's record


def settings(spec, workspace_root) -> dict:
    """What the golden data depends on besides the model: the prompts (a prompts file by its sha256) and the number
    of steps."""
    chosen: dict = {"new_tokens": spec.new_tokens}
    file = spec.prompts_file(workspace_root)
    if file is None:
        chosen.update(prompt_lengths=list(spec.prompt_lengths), seed=spec.seed)
    else:
        if not Path(file).is_file():
            raise GoldenError(f"{spec.name}: no prompts file {file}")
        chosen.update(prompts_sha256=sha256_file(Path(file)))
    return chosen


def build(workspace, spec, pool, progress=lambda message: None) -> dict:
    """Run the float64 reference in the torch worker and publish its golden data (``parity.generation.tasks``)."""
    started = time.perf_counter()
    source = spec.source(workspace.root)
    scratch = new_scratch(workspace, spec)
    try:
        progress(f"{spec.name}: digest of the model's files")
        identity = pool.call("torch", "parity.generation.golden:source_identity", source=source)
        progress(f"{spec.name}: float64 greedy generation, {spec.new_tokens} steps")
        info = pool.call(
            "torch",
            "parity.generation.tasks:golden",
            source=source,
            out_file=str(scratch / FILE),
            new_tokens=spec.new_tokens,
            lengths=list(spec.prompt_lengths),
            seed=spec.seed,
            prompts_file=spec.prompts_file(workspace.root),
        )
        manifest = manifest_lib.seal(
            {
                "schema": SCHEMA,
                "model": spec.name,
                "task": spec.task,
                "description": spec.description,
                "settings": settings(spec, workspace.root),
                "built_from": identity,
                "reference": info,
                "files": {FILE: {"sha256": sha256_file(scratch / FILE), "arrays": describe_arrays(scratch / FILE)}},
                "versions": {"parity": __version__},
                "build_seconds": round(time.perf_counter() - started, 1),
            }
        )
        final = scratch / spec.name
        final.mkdir()
        shutil.copyfile(scratch / FILE, final / FILE)
        write_json_atomic(final / MANIFEST, manifest)
        verify(final, spec, workspace.root)
        target = workspace.golden_dir(spec.name)
        with named_lock(f"golden-{target.resolve()}"):
            replace_dir(final, target)
        return manifest
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def verify(golden_dir: Path, spec, workspace_root) -> dict:
    """The manifest, once its digest, its file's sha256 and its settings (the spec's) are verified; a
    ``GoldenError`` naming what is wrong otherwise."""
    path = Path(golden_dir) / MANIFEST
    if not path.is_file():
        raise GoldenError(
            f"no golden data for {spec.name} in {golden_dir}: run parity golden build --model {spec.name}"
        )
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise GoldenError(f"{path} cannot be read: {error}") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        raise GoldenError(f"{path} is not a generation golden manifest ({SCHEMA}): run parity golden build")
    if manifest.get("digest") != manifest_lib.canonical_digest(manifest):
        raise GoldenError(f"{path}: its digest does not match its contents (edited or corrupted)")
    missing = REFERENCE_KEYS - set(manifest.get("reference") or {})
    if missing:
        raise GoldenError(
            f"{path} lacks {', '.join(sorted(missing))} (written by an older parity): run parity golden build "
            f"--model {spec.name}"
        )
    if manifest.get("model") != spec.name:
        raise GoldenError(f"{path} describes model {manifest.get('model')!r}, not {spec.name!r}")
    file = Path(golden_dir) / FILE
    if not file.is_file() or sha256_file(file) != manifest["files"][FILE]["sha256"]:
        raise GoldenError(f"{file}: missing, or its sha256 is not the manifest's (corrupted)")
    now = settings(spec, workspace_root)
    if manifest.get("settings") != now:
        raise GoldenError(
            f"golden data of {spec.name} was built with {manifest.get('settings')}, the spec now says {now}: run "
            f"parity golden build --model {spec.name}"
        )
    return manifest


def source_identity(source: dict) -> dict:
    """Worker task: what the model is now: the sha256 of a ``save_pretrained`` folder's files (name and content),
    or, for a factory, its reference and the digests of the model's weights, its config, its module classes and the
    user code the factory and those classes are defined in."""
    import hashlib

    if "hf" in source:
        folder = Path(source["hf"])
        if not folder.is_dir():
            raise GoldenError(f"{folder} is not a folder (a save_pretrained folder: config.json and safetensors)")
        digest = hashlib.sha256()
        files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
        for file in files:
            digest.update(f"{file.relative_to(folder).as_posix()}\0{sha256_file(file)}\n".encode())
        return {"kind": "hf", "files": len(files), "sha256": digest.hexdigest()}
    from parity.generation.model import load as load_model
    from parity.model.identity import _torch_arrays, code_files, weights_digest
    from parity.model.user import resolve

    model = load_model(source, "float32")
    root = Path(source["root"])
    classes = sorted({_class_name(type(m), root) for m in model.modules()})
    return {
        "kind": "torch",
        "reference": source["torch"],
        "weights_sha256": weights_digest(_torch_arrays(model), ordered=True),
        # what the weights do not say: the config the modules read, the classes they are (a factory may swap one
        # in), and the user code of the factory and of those classes
        "config_sha256": hashlib.sha256(model.config.to_json_string(use_diff=False).encode()).hexdigest(),
        "classes_sha256": hashlib.sha256("\n".join(classes).encode()).hexdigest(),
        "code": code_files([resolve(source["torch"], root), *{type(m) for m in model.modules()}], root),
    }


def _class_name(cls, root: Path) -> str:
    """A class's name the same in every process: its qualified name in its module, the module named by its file
    where it is a user's file (parity imports those under a name that differs from one process to the next)."""
    import sys

    from parity.model.identity import _shown, user_file

    file = getattr(sys.modules.get(cls.__module__), "__file__", None)
    where = _shown(file, root) if file and user_file(file) else cls.__module__
    return f"{where}:{cls.__qualname__}"
