"""Golden data: build (float64, three frameworks proven equal) and verify (sha256 of every file).

``golden/<model>/`` holds ``weights.npz`` (canonical float32), ``inputs.npz`` (the fixed input
set and its labels), ``eval.npz`` (the labelled eval split), ``reference.npz`` (float64 outputs,
taps and eval logits), ``gradients.npz`` (float64 gradients of the mean cross-entropy on the
input set) and ``manifest.json`` (sha256, shapes and dtypes of every array, tolerances,
versions, cross-framework agreement, golden metrics). Arrays are ``.npz`` read with
``allow_pickle=False``: golden data never executes code.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from parity import __version__
from parity.cache import sha256_file, write_json_atomic
from parity.errors import GoldenError, ParityError

SCHEMA = "parity.golden/1"
FILES = ("weights.npz", "inputs.npz", "eval.npz", "reference.npz", "gradients.npz")
MANIFEST = "manifest.json"
FP64_AGREEMENT = 1e-9



def _read_manifest(golden_dir: Path) -> dict:
    path = golden_dir / MANIFEST
    if not path.is_file():
        raise GoldenError(f"{path}: golden manifest missing; build it with `parity golden build --model {golden_dir.name}`")
    try:
        manifest = json.loads(path.read_text())
    except ValueError as error:
        raise GoldenError(f"{path}: malformed manifest ({error}); rebuild with `parity golden build --model {golden_dir.name}`") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA or not isinstance(manifest.get("files"), dict):
        raise GoldenError(f"{path}: malformed manifest (expected schema {SCHEMA!r} with a 'files' table)")
    return manifest


def verify(golden_dir: Path) -> dict:
    """Check every golden file against ``manifest.json``; return the manifest.

    Raises ``GoldenError`` naming the file (and both hashes on a mismatch). Never rebuilds.
    """
    golden_dir = Path(golden_dir)
    manifest = _read_manifest(golden_dir)
    for name in FILES:
        entry = manifest["files"].get(name)
        path = golden_dir / name
        if not isinstance(entry, dict) or "sha256" not in entry:
            raise GoldenError(f"{golden_dir / MANIFEST}: malformed manifest, no sha256 for {name}")
        if not path.is_file():
            raise GoldenError(f"{path}: golden file missing (listed in the manifest)")
        actual = sha256_file(path)
        if actual != entry["sha256"]:
            raise GoldenError(
                f"{path}: sha256 mismatch: manifest {entry['sha256']}, file {actual}. The golden data changed "
                f"after it was built; parity will not use it. Restore the file, or rebuild deliberately with "
                f"`parity golden build --model {golden_dir.name}`"
            )
    return manifest


def load_arrays(golden_dir: Path, name: str) -> dict[str, np.ndarray]:
    """One golden ``.npz`` as a dict (``allow_pickle=False``)."""
    path = Path(golden_dir) / name
    try:
        with np.load(path, allow_pickle=False) as data:
            return {key: data[key] for key in data.files}
    except (OSError, ValueError) as error:
        raise GoldenError(f"{path}: unreadable golden file ({error})") from None


def _describe_arrays(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as data:
        return {key: {"shape": list(data[key].shape), "dtype": str(data[key].dtype)} for key in data.files}


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def build(workspace, spec, pool, progress=lambda message: None) -> dict:
    """Train the weights, run every framework in float64, prove they agree, write golden atomically.

    ``pool`` is a ``WorkerPool``: training and each framework run in their own processes.
    Raises ``ParityError`` (nothing written) when the definitions disagree beyond ``FP64_AGREEMENT``.
    """
    from parity.data import DATASET, SPLIT_SEED, digits_split
    from parity.env import package_versions

    target_dir = workspace.golden_dir(spec.name)
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f".{spec.name}.build-", dir=target_dir.parent) as scratch:
        scratch = Path(scratch)
        split = digits_split(spec.input.shape)
        _save_npz(scratch / "train.npz", {"x": split.train_x, "y": split.train_y})
        _save_npz(scratch / "eval.npz", {"x": split.eval_x.astype(np.float32), "y": split.eval_y})
        _save_npz(scratch / "inputs.npz", {"x": split.eval_x[:spec.batch_size].astype(np.float32),
                                           "labels": split.eval_y[:spec.batch_size]})
        progress(f"{spec.name}: training ({spec.training.epochs} epochs, torch, seed {spec.training.seed})")
        train_info = pool.call("torch", "parity.tasks:train_weights", workspace=str(workspace.root), model=spec.name,
                               train_file=str(scratch / "train.npz"), eval_file=str(scratch / "eval.npz"),
                               out_file=str(scratch / "weights.npz"))
        references = {}
        for framework in spec.frameworks:
            progress(f"{spec.name}: float64 reference in {framework}")
            out_file = scratch / f"reference-{framework}.npz"
            pool.call(framework, "parity.tasks:fp64_reference", workspace=str(workspace.root), model=spec.name,
                      framework=framework, scratch=str(scratch), out_file=str(out_file))
            references[framework] = load_arrays(scratch, out_file.name)
        agreement = _cross_framework_agreement(spec, references)
        reference = references[spec.frameworks[0]]
        _save_npz(scratch / "reference.npz", {k: v for k, v in reference.items() if not k.startswith("grad/")})
        _save_npz(scratch / "gradients.npz", {k[len("grad/"):]: v for k, v in reference.items() if k.startswith("grad/")})

        from parity.metrics import task_metrics

        eval_y = load_arrays(scratch, "eval.npz")["y"]
        golden_metrics = task_metrics(reference["eval/logits"], eval_y, spec.num_classes, spec.metric_rules.top_k)
        manifest = {
            "schema": SCHEMA,
            "model": spec.name,
            "description": spec.description,
            "files": {name: {"sha256": sha256_file(scratch / name), "arrays": _describe_arrays(scratch / name)} for name in FILES},
            "reference_framework": spec.frameworks[0],
            "frameworks": list(spec.frameworks),
            "cross_framework_fp64_max_abs": agreement["outputs"],
            "cross_framework_fp64_grad_max_abs": agreement["gradients"],
            "cross_framework_fp64_by_tap": agreement["by_tap"],
            "tolerances": {p: t.to_json() for p, t in spec.tolerances.items()},
            "grad_tolerances": {p: t.to_json() for p, t in spec.grad_tolerances.items()},
            "metrics": golden_metrics,
            "training": {**vars(spec.training), **train_info},
            "data": {"dataset": DATASET, "split_seed": SPLIT_SEED, "train": int(len(split.train_y)),
                     "eval": int(len(split.eval_y)), "inputs": spec.batch_size},
            "batch_size": spec.batch_size,
            "versions": {"parity": __version__, **package_versions()},
            "build_seconds": round(time.perf_counter() - started, 1),
        }
        write_json_atomic(scratch / MANIFEST, manifest)
        staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}.staging-", dir=target_dir.parent))
        try:
            for name in (*FILES, MANIFEST):
                shutil.copyfile(scratch / name, staging / name)
            _swap_into_place(staging, target_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return manifest


def _swap_into_place(staging: Path, target_dir: Path) -> None:
    os.chmod(staging, 0o755)
    old = None
    if target_dir.exists():
        old = target_dir.parent / f".{target_dir.name}.old-{os.getpid()}"
        os.rename(target_dir, old)
    os.rename(staging, target_dir)
    if old is not None:
        shutil.rmtree(old)


def _cross_framework_agreement(spec, references: dict[str, dict]) -> dict:
    """Largest float64 disagreement between the definitions; refuse past ``FP64_AGREEMENT``.

    Taps are checked in network order first, so the message names the first layer where the
    definitions part (a definition bug such as a different epsilon or GELU form).
    """
    frameworks = list(references)
    base_name = frameworks[0]
    base = references[base_name]
    by_tap = {}
    worst_outputs = worst_grads = 0.0
    for other_name in frameworks[1:]:
        other = references[other_name]
        for key in [f"tap/{t}" for t in spec.taps] + list(spec.outputs) + ["eval/logits"]:
            diff = float(np.max(np.abs(base[key] - other[key])))
            if key.startswith("tap/"):
                by_tap[key[4:]] = max(by_tap.get(key[4:], 0.0), diff)
            if diff > FP64_AGREEMENT:
                where = f"tap {key[4:]!r}" if key.startswith("tap/") else f"output {key!r}"
                raise ParityError(
                    f"model {spec.name!r}: the {base_name} and {other_name} definitions disagree in float64 at "
                    f"{where} (first divergence in network order): max abs {diff:.3g} > {FP64_AGREEMENT:g}. "
                    f"Check defaults that differ between frameworks there (epsilon, GELU erf/tanh, padding, layout)"
                )
            worst_outputs = max(worst_outputs, diff)
        for key in [k for k in base if k.startswith("grad/")]:
            diff = float(np.max(np.abs(base[key] - other[key])))
            if diff > FP64_AGREEMENT:
                raise ParityError(
                    f"model {spec.name!r}: {base_name} and {other_name} float64 gradients disagree for "
                    f"{key[5:]!r}: max abs {diff:.3g} > {FP64_AGREEMENT:g}"
                )
            worst_grads = max(worst_grads, diff)
    return {"outputs": worst_outputs, "gradients": worst_grads, "by_tap": by_tap}
