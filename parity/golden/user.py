"""Golden data of a user's model: its declared inputs and one reference framework's outputs; of its own weights
only their names, shapes, dtypes and digest (``parity.golden.weights``).

Where the zoo proves three definitions equal, a user model has one: the reference is that model run in
float64 (torch ``.double()``, a float64 Keras dtype policy, JAX x64, ONNX graph cast to double under
``onnx.reference``) or, where it cannot run in float64, in float32 with the reason recorded and the
spec's tolerances widened by ``FLOAT32_TOLERANCE_FACTOR``. Golden outputs given with the inputs (an
ONNX test-data folder, Polygraphy outputs) are the golden as given, with their distance from that
reference recorded and added to the output atol (``usermodel.widen_for_given``). Against a float64 reference each
output's float32 noise floor is measured and recorded (``parity.golden.floor``): tolerances declared as a factor of
it (``Tolerances.floor``) are derived from it. Runs in the orchestrator: the framework work happens in workers.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np

from parity.golden import store as golden
from parity.golden.shapes import build_shapes
from parity.model import batch_axes, feeds, values
from parity.model import user as usermodel
from parity.model.user import InputData, UserModelError
from parity.platform.errors import NotEnoughMemory, ParityError, TaskFailed, one_line
from parity.platform.safefs import read_npz

FLOAT32_TOLERANCE_FACTOR = usermodel.FLOAT32_TOLERANCE_FACTOR  # derived by usermodel.tolerance_factor


def build(workspace, spec, pool, progress=lambda message: None) -> dict:
    """Inputs, reference and gradients of a user model into ``golden/<model>/``, atomically (its weights: their
    description and digest in the manifest)."""
    spec = workspace.load_spec(spec.name, attach_golden=False)  # tolerances as declared, not as last widened
    for i in spec.model_inputs:
        usermodel.check_data_size(
            "inputs and eval inputs" + (f" {i.name!r}" if len(spec.model_inputs) > 1 else ""),
            spec.input_shape(i.name),
            i.dtype,
            copies=2,
        )
    framework = spec.frameworks[0]
    data = spec.inputs or InputData()
    started = time.perf_counter()
    scratch = golden.new_scratch(workspace, spec)
    try:
        given = _prepare_inputs(workspace, spec, data, pool, scratch)
        progress(f"{spec.name}: reading the {framework} model's weights")
        # their names, shapes and dtypes: the golden data keeps no copy of them (``parity.golden.weights``)
        params = pool.call(
            framework, "parity.golden.user_tasks:describe_weights", workspace=str(workspace.root), model=spec.name
        )
        # what the model computes with and the code it runs: every later run refuses a model whose weights changed
        built_from = pool.call(
            framework, "parity.model.identity:model_identity", workspace=str(workspace.root), model=spec.name
        )
        shapes = {name: described["shape"] for name, described in params.items()}
        spec.params = usermodel.native_params(shapes, params)
        progress(f"{spec.name}: float64 reference in {framework}")
        info = pool.call(
            framework,
            "parity.golden.user_tasks:reference",
            workspace=str(workspace.root),
            model=spec.name,
            scratch=str(scratch),
            shapes=shapes,
            params=params,
            out_file=str(scratch / "reference-source.npz"),
            gradients=spec.loss is not None,
        )
        _same_weights(spec, built_from, info.get("weights_sha256"))
        reference = golden.load_arrays(scratch, "reference-source.npz")
        floors = _float32_floor(workspace, spec, pool, scratch, shapes, params, info["dtype"], progress)
        given_vs_reference = None
        if given is not None:
            given_vs_reference = (
                _replace_elements(spec, reference, given, info.get("containers") or {})
                if spec.containers
                else _replace_outputs(spec, reference, given, info["batch_axes"])
            )
        factor = usermodel.tolerance_factor(info["dtype"])
        for name, units in usermodel.implausible_floors(floors).items():
            progress(
                f"{spec.name}: output {name!r} in float32 is {units:.3g} float32 epsilons of its size off the float64 "
                "reference, more than rounding explains: it is checked at the declared tolerance, not its floor"
            )
        usermodel.resolve_floor(spec, floors)
        usermodel.widen_tolerances(spec, factor)
        usermodel.widen_for_given(spec, given_vs_reference)
        golden.save_npz(scratch / "reference.npz", {k: v for k, v in reference.items() if not k.startswith("grad/")})
        golden.save_npz(scratch / "gradients.npz", {k[5:]: v for k, v in reference.items() if k.startswith("grad/")})
        progress(f"{spec.name}: {info['dtype']} reference at the verification shapes")
        build_shapes(workspace, spec, scratch, pool, framework, info["dtype"], params)
        eval_data = golden.load_arrays(scratch, "eval.npz")
        fields = {
            "reference_framework": framework,
            "frameworks": [framework],
            "cross_framework_fp64_max_abs": 0.0,
            "cross_framework_fp64_grad_max_abs": 0.0,
            "cross_framework_fp64_by_tap": {},
            "metrics": _metrics(spec, reference["eval/logits"], eval_data.get("y")),
            "training": {},
            "data": {
                "dataset": data.describe(),
                "split_seed": data.seed,
                "train": 0,
                "eval": feeds.samples(spec, feeds.from_arrays(spec, eval_data)),
                "inputs": spec.batch_size,
            },
            "reference": {
                "dtype": info["dtype"],
                "reason": info["reason"],
                **{k: info[k] for k in ("mode", "mode_reason") if k in info},  # a float64 reference: whole or streamed
                "tolerance_factor": factor,
                "outputs_from": given["from"] if given is not None else f"{framework} reference",
                "given_vs_reference_max_abs": given_vs_reference,
                "float32_floor": floors,
            },
            "params": params,
            "batch_axes": info["batch_axes"],
        }
        if built_from is not None:  # an ONNX file is known by its own digest (source_sha256)
            fields["built_from"] = built_from
        if info.get("containers"):  # the lengths and presence of a graph's sequence and optional outputs
            fields["containers"] = info["containers"]
        if spec.onnx_model is not None:
            from parity.interop.onnx_file import source_digest

            fields["source_sha256"] = source_digest(spec.onnx_model_path)
        return golden.publish(workspace, spec, scratch, fields, started)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _same_weights(spec, built_from: dict | None, computed_with: list[str] | None) -> None:
    """Refuse a model whose reference was computed with weights other than those its digest (``built_from``) was
    taken of: a factory that does not give the same weights twice, whose golden data every run would refuse."""
    if not built_from or not computed_with:
        return
    if computed_with != [built_from.get("weights_sha256")]:
        raise UserModelError(
            f"model {spec.name!r}: the factory does not give the same weights twice: seed it or load a checkpoint "
            "(its reference was computed with other weights than the model built before it)"
        )


def _float32_floor(workspace, spec, pool, scratch: Path, shapes: dict, params: dict, dtype: str, progress):
    """Each output's float32 noise floor against the float64 reference (``parity.golden.floor``), or None where
    there is no float64 reference to measure it against or the model does not run in float32 (tolerances derived
    from the floor then take the spec's default, said here)."""
    if dtype != "float64":
        return None
    progress(f"{spec.name}: float32 noise floor in {spec.frameworks[0]}")
    try:
        return pool.call(
            spec.frameworks[0],
            "parity.golden.floor:float32_floor",
            workspace=str(workspace.root),
            model=spec.name,
            scratch=str(scratch),
            shapes=shapes,
            params=params,
        )
    except TaskFailed as error:
        if error.kind != "raised":
            raise
        progress(f"{spec.name}: no float32 noise floor, the float32 run failed ({one_line(str(error), 200)})")
        return None
    except NotEnoughMemory as error:  # a model held from its weight files whose float32 copy does not fit
        progress(f"{spec.name}: no float32 noise floor, the float32 run does not fit ({one_line(str(error), 300)})")
        return None


def _prepare_inputs(workspace, spec, data: InputData, pool, scratch: Path) -> dict | None:
    """Write ``inputs.npz`` and ``eval.npz``; return golden outputs given with the inputs, if any."""
    given = None
    if data.test_data or data.polygraphy_inputs:
        found = pool.call(
            "onnx",
            "parity.golden.user_tasks:given_data",
            workspace=str(workspace.root),
            model=spec.name,
            out_file=str(scratch / "given.npz"),
        )
        arrays = golden.load_arrays(scratch, "given.npz")
        x = eval_x = feeds.from_arrays(spec, arrays)
        labels = eval_y = None
        structures = (found or {}).get("containers")
        if any(k.startswith("output/") for k in arrays) or structures is not None:
            given = {"from": data.describe(), "samples": feeds.samples(spec, x), **arrays, "containers": structures}
    elif data.file:
        arrays = read_npz(workspace.root / data.file, UserModelError, ".npz")
        x, eval_x = _file_feeds(spec, data, arrays)
        labels = arrays.get("labels", arrays.get("y"))
        eval_y = arrays.get("eval_labels", labels if eval_x is x else None)
    else:
        x = eval_x = feeds.generate(spec, spec.batch_size, data.values(), np.random.default_rng(data.seed))
        labels = eval_y = None
    _check_samples(spec, x, "inputs")
    _check_samples(spec, eval_x, "eval inputs")
    available = feeds.samples(spec, x)
    if available < spec.batch_size:
        raise ParityError(f"{data.describe()}: {available} samples, fewer than the batch size {spec.batch_size}")
    inputs = feeds.to_arrays(
        spec, {name: _stored(spec, name, value) for name, value in feeds.rows(spec, x, 0, spec.batch_size).items()}
    )
    evals = feeds.to_arrays(spec, {name: _stored(spec, name, value) for name, value in eval_x.items()})
    if spec.loss is not None:
        if labels is None:
            raise ParityError(
                f"model {spec.name!r} declares loss {spec.loss!r}, which needs labels; "
                f"{data.describe()} has none (set loss=None for no gradients)"
            )
        inputs["labels"] = np.asarray(labels[: spec.batch_size], dtype=np.int64)
    if eval_y is not None:
        if len(eval_y) != feeds.samples(spec, eval_x):
            raise ParityError(f"{data.describe()}: {len(eval_y)} labels for {feeds.samples(spec, eval_x)} eval samples")
        evals["y"] = np.asarray(eval_y, dtype=np.int64)
    golden.save_npz(scratch / "inputs.npz", inputs)
    golden.save_npz(scratch / "eval.npz", evals)
    return given


def _file_feeds(spec, data: InputData, arrays: dict) -> tuple[dict, dict]:
    """Inputs and eval inputs from a user's ``.npz``: each input under its name (``x`` for a model with one
    input too), eval inputs under ``eval_<name>`` (``eval_x``; default: the inputs themselves)."""
    single = len(spec.model_inputs) == 1
    x, eval_x = {}, {}
    for i in spec.model_inputs:
        key = i.name if i.name in arrays or not single else "x"
        if key not in arrays:
            alias = " or 'x'" if single and i.name != "x" else ""
            raise ParityError(f"{data.file} has no array {i.name!r}{alias} (it has {', '.join(arrays) or 'none'})")
        x[i.name] = arrays[key]
        eval_key = f"eval_{key}"
        eval_x[i.name] = arrays.get(eval_key, arrays.get("eval_x") if single else None)
    if all(v is None for v in eval_x.values()):
        return x, x
    missing = [name for name, v in eval_x.items() if v is None]
    if missing:
        raise ParityError(f"{data.file} has eval arrays for some inputs but not for {', '.join(missing)}")
    return x, eval_x


def _stored(spec, name: str, value: np.ndarray) -> np.ndarray:
    """An input array in the dtype golden data keeps it in: its declared one (bfloat16 as float32)."""
    dtype = next(i.dtype for i in spec.model_inputs if i.name == name)
    if dtype in values.LOW_PRECISION:  # float8, int4 ...: their raw bits, the spec keeps the dtype's name
        return values.to_bits(values.as_low_precision(value, dtype))
    if dtype == values.TEXT:
        return values.text(value)
    return np.asarray(value, dtype=values.stored_dtype(dtype))


def _check_samples(spec, x: dict, what: str) -> None:
    """Every input of the model, each with the declared rank and sizes (named axes at their golden size, the batch
    axis any), integer inputs given integers, all with one number of samples."""
    for i in spec.model_inputs:
        value = np.asarray(x[i.name])
        want = i.full_shape(value.shape[0] if i.batched and value.ndim else 0, spec.axes)
        if value.shape != want:
            shown = ", ".join(
                map(
                    str,
                    (("batch",) if i.batched else ())
                    + tuple(f"{d}={spec.axes[d]}" if isinstance(d, str) else d for d in i.shape),
                )
            )
            raise ParityError(
                f"{what}: input {i.name!r} has shape {tuple(value.shape)}; model {spec.name!r} takes ({shown})"
            )
        if i.dtype in values.LOW_PRECISION:  # raw bits (uint8), numbers, or an array of the dtype itself
            if value.dtype.kind not in "fiuV":
                raise ParityError(f"{what}: input {i.name!r} is {value.dtype}; model {spec.name!r} takes {i.dtype}")
        elif i.dtype == values.TEXT:
            if value.dtype.kind != "U":
                raise ParityError(f"{what}: input {i.name!r} is {value.dtype}; model {spec.name!r} takes strings")
        elif not i.floating and value.dtype.kind not in "iub":
            raise ParityError(f"{what}: input {i.name!r} is {value.dtype}; model {spec.name!r} takes {i.dtype}")
        if i.floating and value.dtype.kind not in "f" and i.dtype not in values.LOW_PRECISION:
            raise ParityError(f"{what}: input {i.name!r} is {value.dtype}; model {spec.name!r} takes {i.dtype}")
    counts = {i.name: len(x[i.name]) for i in spec.model_inputs if i.batched}
    if len(set(counts.values())) > 1:
        raise ParityError(f"{what}: inputs have different numbers of samples ({counts})")


def _replace_elements(spec, reference: dict, given: dict, structures: dict) -> float:
    """``_replace_outputs`` for a graph with sequences and optionals (taken whole): the outputs as given are the
    golden ones, a sequence's length and an optional's presence too (``structures``, the model's own, updated to
    the given ones: a runtime that computes what the model does then fails naming the output, as it should against
    expected outputs that say otherwise); returns their largest distance from the reference where both agree."""
    from parity.model import containers

    worst = 0.0
    for name in spec.outputs:
        computed_structure, given_structure = structures.get(name), given["containers"].get(name)
        computed_keys = containers.keys(name, computed_structure) if computed_structure else [name]
        given_keys = containers.keys(name, given_structure) if given_structure else [name]
        computed = {key: reference.pop(key) for key in computed_keys}
        for key in given_keys:
            value = values.golden(given[f"given/{key}"])
            if computed_structure == given_structure:
                if value.shape != computed[key].shape or values.is_text(value) != values.is_text(computed[key]):
                    raise ParityError(
                        f"{given['from']}: output {key!r} is {value.dtype} of shape {value.shape}, the "
                        f"model gives {computed[key].dtype} of shape {computed[key].shape}"
                    )
                if not values.is_text(value):
                    worst = max(worst, finite_distance(value, computed[key]))
            reference[key] = value
        if given_structure:
            structures[name] = given_structure
    key = containers.eval_key(spec, {}, structures)
    reference["eval/logits"] = reference[key] if key is not None else np.zeros(0)
    return worst


def _replace_outputs(spec, reference: dict, given: dict, axes: dict) -> float:
    """Golden outputs as given (inputs batch and eval split); returns their largest distance from the reference.
    An output the model computes without a batch axis (``axes``) is given whole, as the first set has it."""
    worst = 0.0
    for i, name in enumerate(spec.outputs):
        key = f"output/{i}"
        if key not in given:
            raise ParityError(f"{given['from']} has no output {i} ({name!r})")
        value = values.golden(given[key])
        batched = any(i.batched for i in spec.model_inputs) and batch_axes.axis_of(axes, name) is not None
        if batched:
            _check_batched_output(spec, f"{given['from']}: output", name, value.shape, given["samples"])
            _check_batched_output(spec, "the model's output", name, reference[name].shape, spec.batch_size)
            fits = value.shape[1:] == reference[name].shape[1:]
        else:
            fits = value.shape == reference[name].shape
        if not fits:
            raise ParityError(
                f"{given['from']}: output {name!r} has shape {np.shape(given[key])}, the model gives "
                f"{reference[name].shape}"
            )
        head = value[: spec.batch_size] if batched else value
        if values.is_text(head) != values.is_text(reference[name]):
            raise ParityError(
                f"{given['from']}: output {name!r} is {head.dtype}, the model gives {reference[name].dtype}"
            )
        if not values.is_text(head):  # text has no distance: the given strings are the golden, compared for equality
            worst = max(worst, finite_distance(head, reference[name]))
        reference[name] = head
        if name == batch_axes.eval_output(spec, axes):
            reference["eval/logits"] = value
    return worst


def finite_distance(a: np.ndarray, b: np.ndarray) -> float:
    """The largest ``|a - b|`` over the elements finite in both (0 where there are none)."""
    both = np.isfinite(a) & np.isfinite(b)
    return float(np.max(np.abs(a[both] - b[both]))) if both.any() else 0.0


def _check_batched_output(spec, what: str, name: str, shape: tuple, samples: int) -> None:
    """Refuse an output that does not follow the inputs' batch axis (batch first, one row per sample)."""
    if len(shape) == 0 or shape[0] != samples:
        inputs = ", ".join(repr(i.name) for i in spec.model_inputs)
        raise ParityError(
            f"{what} {name!r} has shape {tuple(shape)} for {samples} samples of input {inputs}; parity "
            f"needs outputs batched like the input, batch first"
        )


def _metrics(spec, logits: np.ndarray, labels) -> dict:
    from parity.check.metrics import task_metrics

    if labels is None:
        return {}
    if logits.ndim != 2 or logits.shape[1] != spec.num_classes:
        raise ParityError(
            f"labels need a classifier output of shape (batch, num_classes); {spec.outputs[0]!r} has "
            f"shape {logits.shape} and the spec says num_classes={spec.num_classes}"
        )
    return task_metrics(logits, labels, spec.num_classes, spec.metric_rules.top_k)
