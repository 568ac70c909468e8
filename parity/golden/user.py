"""Golden data of a user's model: its own weights, declared inputs, one reference framework.

Where the zoo proves three definitions equal, a user model has one: the reference is that model run in
float64 (torch ``.double()``, a float64 Keras dtype policy, JAX x64, ONNX graph cast to double under
``onnx.reference``) or, where it cannot run in float64, in float32 with the reason recorded and the
spec's tolerances widened by ``FLOAT32_TOLERANCE_FACTOR``. Golden outputs given with the inputs (an
ONNX test-data folder, Polygraphy outputs) are the golden as given, with their distance from that
reference recorded. Runs in the orchestrator: the framework work happens in workers.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np

from parity.golden import store as golden
from parity.model import user as usermodel
from parity.model.user import InputData, UserModelError
from parity.platform.errors import ParityError
from parity.platform.safefs import read_npz, sha256_file

FLOAT32_TOLERANCE_FACTOR = usermodel.FLOAT32_TOLERANCE_FACTOR  # derived by usermodel.tolerance_factor


def build(workspace, spec, pool, progress=lambda message: None) -> dict:
    """Inputs, weights, reference and gradients of a user model into ``golden/<model>/``, atomically."""
    spec = workspace.load_spec(spec.name, attach_golden=False)  # tolerances as declared, not as last widened
    usermodel.check_data_size("inputs and eval inputs", (spec.batch_size, *spec.input.shape), spec.input.dtype, copies=2)
    framework = spec.frameworks[0]
    data = spec.inputs or InputData()
    started = time.perf_counter()
    scratch = golden.new_scratch(workspace, spec)
    try:
        given = _prepare_inputs(workspace, spec, data, pool, scratch)
        progress(f"{spec.name}: reading the {framework} model's weights")
        params = pool.call(framework, "parity.golden.user_tasks:read_weights", workspace=str(workspace.root), model=spec.name,
                           out_file=str(scratch / "weights.npz"))
        shapes = {k: list(v.shape) for k, v in golden.load_arrays(scratch, "weights.npz").items()}
        spec.params = usermodel.native_params(shapes, params)
        progress(f"{spec.name}: float64 reference in {framework}")
        info = pool.call(framework, "parity.golden.user_tasks:reference", workspace=str(workspace.root), model=spec.name,
                         scratch=str(scratch), shapes=shapes, params=params,
                         out_file=str(scratch / "reference-source.npz"))
        reference = golden.load_arrays(scratch, "reference-source.npz")
        given_vs_reference = None
        if given is not None:
            given_vs_reference = _replace_outputs(spec, reference, given)
        factor = usermodel.tolerance_factor(info["dtype"], given is not None)
        usermodel.widen_tolerances(spec, factor)
        golden.save_npz(scratch / "reference.npz", {k: v for k, v in reference.items() if not k.startswith("grad/")})
        golden.save_npz(scratch / "gradients.npz", {k[5:]: v for k, v in reference.items() if k.startswith("grad/")})
        eval_data = golden.load_arrays(scratch, "eval.npz")
        fields = {
            "reference_framework": framework,
            "frameworks": [framework],
            "cross_framework_fp64_max_abs": 0.0, "cross_framework_fp64_grad_max_abs": 0.0,
            "cross_framework_fp64_by_tap": {},
            "metrics": _metrics(spec, reference["eval/logits"], eval_data.get("y")),
            "training": {},
            "data": {"dataset": data.describe(), "split_seed": data.seed, "train": 0, "eval": int(len(eval_data["x"])),
                     "inputs": spec.batch_size},
            "reference": {"dtype": info["dtype"], "reason": info["reason"], "tolerance_factor": factor,
                          "outputs_from": given["from"] if given is not None else f"{framework} reference",
                          "given_vs_reference_max_abs": given_vs_reference},
            "params": params,
        }
        if spec.onnx_model is not None:
            fields["source_sha256"] = sha256_file(spec.onnx_model_path)
        return golden.publish(workspace, spec, scratch, fields, started)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _prepare_inputs(workspace, spec, data: InputData, pool, scratch: Path) -> dict | None:
    """Write ``inputs.npz`` and ``eval.npz``; return golden outputs given with the inputs, if any."""
    given = None
    if data.test_data or data.polygraphy_inputs:
        pool.call("onnx", "parity.golden.user_tasks:given_data", workspace=str(workspace.root), model=spec.name,
                  out_file=str(scratch / "given.npz"))
        arrays = golden.load_arrays(scratch, "given.npz")
        x, labels, eval_x, eval_y = arrays["x"], None, arrays["x"], None
        if any(k.startswith("output/") for k in arrays):
            given = {"from": data.describe(), **arrays}
    elif data.file:
        arrays = read_npz(workspace.root / data.file, UserModelError, ".npz")
        key = spec.input.name if spec.input.name in arrays else "x"
        if key not in arrays:
            raise ParityError(f"{data.file} has no array {spec.input.name!r} or 'x' (it has {', '.join(arrays) or 'none'})")
        x, labels = arrays[key], arrays.get("labels", arrays.get("y"))
        eval_x = arrays.get("eval_x", x)
        eval_y = arrays.get("eval_labels", labels if "eval_x" not in arrays else None)
    else:
        x = eval_x = _random(spec, data)
        labels = eval_y = None
    _check_samples(spec, x, "inputs")
    _check_samples(spec, eval_x, "eval inputs")
    if len(x) < spec.batch_size:
        raise ParityError(f"{data.describe()}: {len(x)} samples, fewer than the batch size {spec.batch_size}")
    dtype = spec.input.dtype
    inputs = {"x": x[:spec.batch_size].astype(dtype)}
    evals = {"x": eval_x.astype(dtype)}
    if spec.loss is not None:
        if labels is None:
            raise ParityError(f"model {spec.name!r} declares loss {spec.loss!r}, which needs labels; "
                              f"{data.describe()} has none (set loss=None for no gradients)")
        inputs["labels"] = np.asarray(labels[:spec.batch_size], dtype=np.int64)
    if eval_y is not None:
        if len(eval_y) != len(eval_x):
            raise ParityError(f"{data.describe()}: {len(eval_y)} labels for {len(eval_x)} eval samples")
        evals["y"] = np.asarray(eval_y, dtype=np.int64)
    golden.save_npz(scratch / "inputs.npz", inputs)
    golden.save_npz(scratch / "eval.npz", evals)
    return given


def _random(spec, data: InputData) -> np.ndarray:
    rng = np.random.default_rng(data.seed)
    shape = (spec.batch_size, *spec.input.shape)
    if data.distribution == "integers":
        return rng.integers(int(data.low), int(data.high), size=shape)
    if data.distribution == "uniform":
        return rng.uniform(data.low, data.high, size=shape)
    return rng.normal(data.mean, data.std, size=shape)


def _check_samples(spec, x: np.ndarray, what: str) -> None:
    if x.ndim < 1 or tuple(x.shape[1:]) != tuple(spec.input.shape):
        raise ParityError(f"{what} have shape {tuple(x.shape)}; model {spec.name!r} takes input {spec.input.name!r} "
                          f"of shape (batch, {', '.join(map(str, spec.input.shape))})")
    if (x.dtype.kind in "iu") != (np.dtype(spec.input.dtype).kind in "iu"):
        raise ParityError(f"{what} are {x.dtype}; model {spec.name!r} takes {spec.input.dtype}")


def _replace_outputs(spec, reference: dict, given: dict) -> float:
    """Golden outputs as given (inputs batch and eval split); returns their largest distance from the reference."""
    worst = 0.0
    for i, name in enumerate(spec.outputs):
        key = f"output/{i}"
        if key not in given:
            raise ParityError(f"{given['from']} has no output {i} ({name!r})")
        value = np.asarray(given[key], dtype=np.float64)
        _check_batched_output(spec, f"{given['from']}: output", name, value.shape, len(given["x"]))
        _check_batched_output(spec, "the model's output", name, reference[name].shape, spec.batch_size)
        if value.shape[1:] != reference[name].shape[1:]:
            raise ParityError(f"{given['from']}: output {name!r} has shape {value.shape}, the model gives "
                              f"{reference[name].shape}")
        worst = max(worst, float(np.max(np.abs(value[:spec.batch_size] - reference[name]))))
        reference[name] = value[:spec.batch_size]
        if i == 0:
            reference["eval/logits"] = value
    return worst


def _check_batched_output(spec, what: str, name: str, shape: tuple, samples: int) -> None:
    """Refuse an output that does not follow the inputs' batch axis (batch first, one row per sample)."""
    if len(shape) == 0 or shape[0] != samples:
        sample = ", ".join(map(str, spec.input.shape))
        raise ParityError(f"{what} {name!r} has shape {tuple(shape)} for {samples} samples of input {spec.input.name!r} "
                          f"(shape (batch, {sample})); parity needs outputs batched like the input, batch first")


def _metrics(spec, logits: np.ndarray, labels) -> dict:
    from parity.check.metrics import task_metrics

    if labels is None:
        return {}
    if logits.ndim != 2 or logits.shape[1] != spec.num_classes:
        raise ParityError(f"labels need a classifier output of shape (batch, num_classes); {spec.outputs[0]!r} has "
                          f"shape {logits.shape} and the spec says num_classes={spec.num_classes}")
    return task_metrics(logits, labels, spec.num_classes, spec.metric_rules.top_k)
