"""Golden folders: read and verify (sha256 of every file, the manifest, the spec), and publish atomically.

``golden/<model>/`` holds ``weights.npz`` (canonical float32; the zoo's only: a user model's golden data keeps
no copy of its weights, see ``parity.golden.weights``), ``inputs.npz`` (the fixed input
set and its labels), ``eval.npz`` (the labelled eval split), ``reference.npz`` (float64 outputs,
taps and eval logits), ``gradients.npz`` (float64 gradients of the mean cross-entropy on the
input set) and ``manifest.json`` (sha256, shapes and dtypes of every array, tolerances,
versions, cross-framework agreement, golden metrics). Arrays are ``.npz`` read with
``allow_pickle=False``: golden data never executes code.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from parity import __version__
from parity.golden import weights as golden_weights
from parity.interop.onnx_file import source_digest
from parity.model import batch_axes, containers, feeds, values
from parity.model import manifest as manifest_lib
from parity.platform.errors import GoldenError
from parity.platform.safefs import owned_tempdir, read_npz, replace_dir, sha256_file, sweep, write_json_atomic

if TYPE_CHECKING:  # NumPy loads where arrays are read: a run's planning verifies files, not arrays
    import numpy as np

SCHEMA = manifest_lib.SCHEMA
FILES = ("weights.npz", "inputs.npz", "eval.npz", "reference.npz", "gradients.npz", "shapes.npz")
OPTIONAL = (golden_weights.FILE,)  # a user model's golden data keeps no copy of its weights
MANIFEST = "manifest.json"
# scratch folders of golden builds in golden/: .<model>.build-<owner>-<random> (and older names)
SCRATCH_PATTERN = r"^\.[^/]+\.(build|staging|old)-"


@dataclass
class Golden:
    """Verified golden data of one model: the manifest and every array, checked against it."""

    dir: Path
    manifest: dict
    arrays: dict[str, dict[str, np.ndarray]]

    @property
    def metrics(self) -> dict:
        return self.manifest["metrics"]


def load(golden_dir: Path, spec=None) -> Golden:
    """Verify and load ``golden/<model>/``; raise ``GoldenError`` naming the file (and array) on any problem.

    Checked, in order: the manifest (schema and digest), every file's sha256, every array's name,
    shape and dtype against the manifest, finite values in every floating array, the golden
    metrics against the reference eval logits, and (given ``spec``) the arrays against the model
    spec. Never rebuilds.
    """
    golden_dir = Path(golden_dir)
    manifest = _checked_files(golden_dir)
    arrays: dict = {
        name: _checked_arrays(golden_dir / name, manifest["files"][name]["arrays"]) for name in listed(manifest)
    }
    if not golden_weights.kept(manifest):  # the model's own, read from its source where a task uses them
        arrays[golden_weights.FILE] = golden_weights.ModelWeights(spec, golden_dir)
    golden = Golden(golden_dir, manifest, arrays)
    _check_metrics(golden)
    if spec is not None:
        _check_against_spec(golden, spec)
    return golden


def verify(golden_dir: Path, spec=None) -> dict:
    """``load`` and return the verified manifest."""
    return load(golden_dir, spec).manifest


def verified_manifest(golden_dir: Path, spec=None) -> dict:
    """The manifest, once its schema and digest, every file's sha256 and (given ``spec``) the arrays it describes
    against the model spec are checked, without reading an array (nor importing NumPy): what a run plans with.
    Every task that reads the arrays goes through ``load``, which checks them before anything uses them."""
    golden_dir = Path(golden_dir)
    manifest = _checked_files(golden_dir)
    if spec is not None:
        described = {
            name: {key: _Described(entry) for key, entry in manifest["files"][name]["arrays"].items()}
            for name in listed(manifest)
        }
        _check_against_spec(Golden(golden_dir, manifest, described), spec)  # type: ignore[arg-type]
    return manifest


class _Dtype(str):
    """A dtype as the manifest names it (``str(array.dtype)``), with NumPy's one-letter ``kind``."""

    @property
    def kind(self) -> str:
        for prefix, kind in (("float", "f"), ("uint", "u"), ("int", "i"), ("bool", "b"), ("complex", "c")):
            if self.startswith(prefix):
                return kind
        return self.lstrip("<>|=")[:1] or "O"  # <U7 (text), |S3 (bytes)


class _Described:
    """An array as the verified manifest describes it: what the spec check reads of one (shape, dtype)."""

    def __init__(self, entry: dict):
        self.shape, self.dtype = tuple(entry["shape"]), _Dtype(entry["dtype"])
        self.ndim = len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]


def listed(manifest: dict) -> list[str]:
    """The golden files the manifest lists (every one of ``FILES``; ``weights.npz`` where the data keeps weights)."""
    return [name for name in FILES if name in manifest["files"]]


def _checked_files(golden_dir: Path) -> dict:
    """The manifest (schema and digest checked), once every file it lists has the sha256 it records."""
    manifest = manifest_lib.read(golden_dir / MANIFEST)
    for name in listed(manifest):
        path = golden_dir / name
        expected = manifest["files"][name]["sha256"]
        try:
            actual = sha256_file(path)
        except FileNotFoundError:
            raise GoldenError(f"{path}: golden file missing (listed in the manifest)") from None
        except OSError as error:
            raise GoldenError(f"{path}: unreadable golden file ({error.strerror or error})") from None
        if actual != expected:
            raise GoldenError(
                f"{path}: sha256 mismatch: manifest {expected}, file {actual}. The golden data changed after it "
                f"was built; parity will not use it. Restore the file, or {manifest_lib.rebuild_hint(golden_dir.name)}"
            )
    return manifest


def _checked_arrays(path: Path, described: dict) -> dict[str, np.ndarray]:
    arrays = load_arrays(path.parent, path.name)
    if set(arrays) != set(described):
        missing, extra = sorted(set(described) - set(arrays)), sorted(set(arrays) - set(described))
        raise GoldenError(f"{path}: arrays do not match the manifest (missing {missing}, not listed {extra})")
    for key, array in arrays.items():
        expected = described[key]
        if list(array.shape) != expected["shape"] or str(array.dtype) != expected["dtype"]:
            raise GoldenError(
                f"{path}: array {key!r} is {array.dtype}{list(array.shape)}, the manifest says "
                f"{expected['dtype']}{expected['shape']}"
            )
        problem = nonfinite_problem(path.name, key, array, expected.get("infinite", 0), expected.get("nan", 0))
        if problem:
            raise GoldenError(f"{path}: {problem}")
    return arrays


def nonfinite_problem(file: str, key: str, array: np.ndarray, declared: int, declared_nan: int = 0) -> str | None:
    """What is wrong with the non-finite values of a golden array, or None: NaN and +-inf where the build found
    them (data given with a model may hold them, a -inf mask in its weights, and what the model computes from
    them), as many as the manifest declares; a weight is never NaN. Every non-finite golden element is compared
    exactly (the same infinity, or NaN, at the same position)."""
    if array.dtype.kind != "f":
        return None
    import numpy as np

    nan = int(np.count_nonzero(np.isnan(array)))
    inf = int(np.count_nonzero(np.isinf(array)))
    what = {"weights.npz": "weight", "reference.npz": "reference output", "gradients.npz": "reference gradient"}.get(
        file, "input"
    )
    if nan and file == "weights.npz":
        return f"array {key!r} ({what}) has {nan} NaN value(s) of {array.size}; a NaN weight is never golden data"
    if inf != declared:
        return f"array {key!r} ({what}) has {inf} infinite value(s), the manifest records {declared}"
    if nan != declared_nan:
        return f"array {key!r} ({what}) has {nan} NaN value(s), the manifest records {declared_nan}"
    return None


def _check_metrics(golden: Golden) -> None:
    """The golden metrics in the manifest must be what the verified eval logits give (none without labels)."""
    from parity.check.metrics import task_metrics

    reference, eval_data = golden.arrays["reference.npz"], golden.arrays["eval.npz"]
    logits, labels = reference.get("eval/logits"), eval_data.get("y")
    if labels is None and not golden.metrics:
        return
    if logits is None or labels is None or logits.ndim != 2 or labels.shape != logits.shape[:1]:
        raise GoldenError(f"{golden.dir / 'reference.npz'}: no eval/logits matching eval.npz y")
    top_k = next((int(k[3:-9]) for k in golden.metrics if k.startswith("top")), None)
    if top_k is None or not 1 <= top_k <= logits.shape[1]:
        raise GoldenError(f"{golden.dir / MANIFEST}: golden metrics name no valid top-k accuracy")
    recomputed = task_metrics(logits, labels, logits.shape[1], top_k)
    for name, value in recomputed.items():
        if golden.metrics.get(name) != value:
            raise GoldenError(
                f"{golden.dir / MANIFEST}: golden metric {name} is {golden.metrics.get(name)!r}, but the "
                f"verified eval logits give {value!r}; {manifest_lib.rebuild_hint(golden.dir.name)}"
            )


def _check_against_spec(golden: Golden, spec) -> None:
    """Golden arrays must fit the model as its spec declares it now (a spec edited since the build)."""
    arrays = golden.arrays
    axes = batch_axes.recorded(golden.manifest)
    problems = []

    def expect(file: str, key: str, shape: tuple | None = None, dtype: str | None = None):
        array = arrays[file].get(key)
        if array is None:
            problems.append(f"{file} has no {key!r}")
        elif shape is not None and tuple(array.shape) != tuple(shape):
            problems.append(f"{file} {key!r} has shape {list(array.shape)}, the spec needs {list(shape)}")
        elif (
            dtype is not None
            and str(array.dtype) != dtype
            and not (dtype == "integer" and array.dtype.kind in "iu")
            and not (dtype in ("unicode", "float64") and array.dtype.kind == "U")
        ):  # text: any width
            problems.append(f"{file} {key!r} is {array.dtype}, golden data needs {dtype}")

    if golden_weights.kept(golden.manifest):
        for name, param in spec.params.items():
            expect("weights.npz", name, param.shape, param.stored_dtype)
        extra = sorted(set(arrays["weights.npz"]) - set(spec.params))
        if extra:
            problems.append(f"weights.npz has parameters the spec does not declare: {extra}")
    elif not spec.weights_from_model:
        problems.append("it holds no weights.npz, which a model whose weights are its golden data's needs")
    elif golden_weights.digest(golden.manifest) is None and spec.onnx_model is None:
        problems.append("it records neither a copy of the model's weights nor their digest")
    first = spec.model_inputs[0] if spec.model_inputs else None  # an ONNX graph may take no input
    n_eval = (
        len(arrays["eval.npz"].get(feeds.key(spec, first.name), ())) if first and first.batched else spec.batch_size
    )
    labelled = not spec.weights_from_model or "y" in arrays["eval.npz"]
    for i in spec.model_inputs:
        stored = values.stored_dtype(i.dtype)
        expect("inputs.npz", feeds.key(spec, i.name), spec.input_shape(i.name), stored)
        expect("eval.npz", feeds.key(spec, i.name), spec.input_shape(i.name, n_eval), stored)
    if labelled:
        expect("eval.npz", "y", (n_eval,), "integer")
    if spec.loss is not None:
        expect("inputs.npz", "labels", (spec.batch_size,), "integer")
    expect("reference.npz", "eval/logits", (n_eval, spec.num_classes) if labelled else None, "float64")
    # a sequence's elements, an optional's value where present (their structures are the manifest's)
    for key in containers.output_keys(spec.outputs, golden.manifest.get("containers") or {}):
        expect("reference.npz", key, None, "float64")
    for key in (f"tap/{t}" for t in spec.taps):
        expect("reference.npz", key, None, "float64")
    if spec.loss is not None:
        for name in spec.trainable_params:
            expect("gradients.npz", name, spec.params[name].shape, "float64")
        for name, grad in spec.input_grad_names.items():
            expect("gradients.npz", grad, spec.input_shape(name), "float64")
    elif arrays["gradients.npz"]:
        problems.append("gradients.npz has gradients but the spec declares no loss")
    if golden.manifest["shapes"] != spec.check_shapes():
        problems.append(
            f"the golden data is verified at shapes {golden.manifest['shapes']}, the spec declares "
            f"{spec.check_shapes()}"
        )
    else:
        for k, shape in enumerate(spec.check_shapes()):
            for i in spec.model_inputs:
                expect(
                    "shapes.npz",
                    f"{k}/input/{i.name}",
                    i.full_shape(shape.get("batch", 1), shape),
                    values.stored_dtype(i.dtype),
                )
            for name in spec.outputs:
                key = f"{k}/output/{name}"
                expect("shapes.npz", key, None, "float64")
                value, golden_output = arrays["shapes.npz"].get(key), arrays["reference.npz"].get(name)
                axis = batch_axes.axis_of(axes, name)
                if (
                    value is not None
                    and golden_output is not None
                    and (
                        value.ndim != golden_output.ndim
                        or (axis is not None and "batch" in shape and value.shape[axis] != shape["batch"])
                    )
                ):
                    problems.append(
                        f"shapes.npz {key!r} has shape {list(value.shape)}, not an output of "
                        f"{golden_output.ndim} dimensions at {shape}"
                    )
    if any(i.batched for i in spec.model_inputs):
        problems += _batch_problems(arrays["reference.npz"], axes, spec.batch_size)
    if labelled and f"top{spec.metric_rules.top_k}_accuracy" not in golden.metrics:
        problems.append(f"the manifest has no top{spec.metric_rules.top_k}_accuracy (the spec's top_k)")
    if spec.onnx_model is not None:
        source = spec.onnx_model_path
        if not source.is_file():
            problems.append(f"the source model {source} is missing")
        elif source_digest(source) != golden.manifest.get("source_sha256"):
            problems.append(f"the source model {source} changed since the golden data was built from it")
    if problems:
        raise GoldenError(
            f"{golden.dir}: golden data does not match the model spec ({spec.source_file}): "
            f"{'; '.join(problems[:4])}{' ...' if len(problems) > 4 else ''}; {manifest_lib.rebuild_hint(golden.dir.name)}"
        )


def _batch_problems(reference: dict, axes: dict, batch_size: int) -> list[str]:
    """Every reference array with a batch axis (as the manifest records it, axis 0 where it records none) must
    hold ``batch_size`` samples along it; one computed once for the whole batch is taken as it is."""
    problems = []
    for key, array in reference.items():
        axis = batch_axes.axis_of(axes, key)
        if key == "eval/logits" or axis is None:
            continue
        if array.ndim <= axis or array.shape[axis] != batch_size:
            where = f" on axis {axis}" if axis else ""
            problems.append(f"reference.npz {key!r} has shape {list(array.shape)}, not a batch of {batch_size}{where}")
    return problems


def summary(manifest: dict, golden_dir: Path) -> str:
    """One line on what a build proved: cross-framework agreement, or a user model's reference; metrics; size."""
    m = manifest["metrics"]
    metrics = f" | eval accuracy {m['accuracy']:.4f}, macro-F1 {m['macro_f1']:.4f}" if m else ""
    reference = manifest.get("reference")
    if reference is None:
        return (
            f"cross-framework fp64 max abs {manifest['cross_framework_fp64_max_abs']:.3g} (gradients "
            f"{manifest['cross_framework_fp64_grad_max_abs']:.3g}){metrics}"
        )
    size_mb = sum(path.stat().st_size for path in Path(golden_dir).iterdir()) / 1e6
    line = f"{manifest['frameworks'][0]} reference in {reference['dtype']}"
    if reference["reason"]:
        line += f" ({reference['reason']}; tolerances widened x{reference['tolerance_factor']:g})"
    if reference.get("given_vs_reference_max_abs") is not None:
        distance = reference["given_vs_reference_max_abs"]
        line += (
            f"; golden outputs from {reference['outputs_from']} (max abs {distance:.3g} from the reference, "
            f"added to the output atol)"
        )
    return f"{line}; {manifest['data']['dataset']}, {manifest['data']['eval']} samples; {size_mb:.1f} MB{metrics}"


def reference_fallback(manifest: dict) -> dict | None:
    """How a user model's reference falls short of float64, said on each of its results: ``{"dtype", "reason",
    "tolerance_factor"}`` where the model could not run in float64 (its paths are checked against a float32
    reference with tolerances widened by that factor), else None."""
    reference = manifest.get("reference") or {}
    if reference.get("dtype", "float64") == "float64":
        return None
    return {key: reference.get(key) for key in ("dtype", "reason", "tolerance_factor")}


def load_arrays(golden_dir: Path, name: str) -> dict[str, np.ndarray]:
    """One ``.npz`` as a dict (``allow_pickle=False``), unchecked: golden arrays go through ``load``."""
    return read_npz(Path(golden_dir) / name, GoldenError, "golden file")


def describe_arrays(path: Path) -> dict:
    """Shape and dtype of every array, and how many infinite values it holds (a -inf mask) where it has any."""
    import numpy as np

    described = {}
    for key, array in read_npz(path, GoldenError, "golden file").items():
        infinite = int(np.count_nonzero(np.isinf(array))) if array.dtype.kind == "f" else 0
        nan = int(np.count_nonzero(np.isnan(array))) if array.dtype.kind == "f" else 0
        described[key] = {
            "shape": list(array.shape),
            "dtype": str(array.dtype),
            **({"infinite": infinite} if infinite else {}),
            **({"nan": nan} if nan else {}),
        }
    return described


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    import numpy as np

    with open(path, "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as its allow_pickle flag too


def new_scratch(workspace, spec) -> Path:
    """A private build folder next to ``golden/<model>/`` (left-overs of killed builds swept first)."""
    parent = workspace.golden_dir(spec.name).parent
    parent.mkdir(parents=True, exist_ok=True)
    sweep(parent, SCRATCH_PATTERN)
    return owned_tempdir(parent, f".{spec.name}.build-")


def publish(workspace, spec, scratch: Path, fields: dict, started: float) -> dict:
    """Seal the manifest of the golden files in ``scratch``, verify what is about to be published, and
    swap it in as ``golden/<model>/`` atomically (one build at a time; readers never see it missing)."""
    from parity.platform.cache_dir import named_lock
    from parity.platform.env import package_versions

    written = [name for name in FILES if name not in OPTIONAL or (scratch / name).exists()]
    manifest = manifest_lib.seal(
        {
            "schema": SCHEMA,
            "model": spec.name,
            "description": spec.description,
            "files": {
                name: {"sha256": sha256_file(scratch / name), "arrays": describe_arrays(scratch / name)}
                for name in written
            },
            "tolerances": {p: t.to_json() for p, t in spec.tolerances.items()},
            "grad_tolerances": {p: t.to_json() for p, t in spec.grad_tolerances.items()},
            "batch_size": spec.batch_size,
            "shapes": spec.check_shapes(),
            "versions": {"parity": __version__, **package_versions()},
            **fields,
            "build_seconds": round(time.perf_counter() - started, 1),
        }
    )
    target_dir = workspace.golden_dir(spec.name)
    final = scratch / spec.name  # named like its target: the manifest names its folder
    final.mkdir()
    for name in written:
        shutil.copyfile(scratch / name, final / name)
    write_json_atomic(final / MANIFEST, manifest)
    load(final, spec)  # what is about to be published reads back and verifies
    with named_lock(f"golden-{target_dir.resolve()}"):
        replace_dir(final, target_dir)
    return manifest
