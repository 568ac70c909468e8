"""Worker tasks of a user model's golden build: describe its own weights, compute its reference, read the data
given with it. Each runs in the worker of the model's framework (``onnx`` for an ONNX file)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from parity.golden import store as golden
from parity.golden import weights as golden_weights
from parity.golden.tasks import detect_batch_axes, reference_arrays
from parity.interop.given import given_feeds
from parity.model import containers, feeds, values
from parity.model.user import UserModelError, native_params
from parity.model.workspace import Workspace
from parity.platform.errors import ParityError, one_line


def describe_weights(workspace: str, model: str) -> dict:
    """The model's own floating-point weights by framework name, as its golden manifest records them (it keeps no
    copy: ``parity.golden.weights``): ``{name: {"trainable": bool, "dtype": str, "shape": [int]}}``. A NaN weight
    is refused: golden data is never built from one."""
    spec = Workspace(workspace).load_spec(model, attach_golden=False)
    weights, trainable = golden_weights.own(spec)
    described = {}
    for name, value in weights.items():  # one weight read at a time
        nan = int(np.count_nonzero(np.isnan(np.asarray(value, dtype=np.float32))))
        if nan:
            raise UserModelError(
                f"weight {name!r} has {nan} NaN value(s) of {np.size(value)}; golden data is never built from a NaN weight"
            )
        described[name] = {"trainable": name in trainable, "dtype": str(value.dtype), "shape": list(np.shape(value))}
    return described


def reference(
    workspace: str, model: str, scratch: str | Path, shapes: dict, params: dict, out_file: str, gradients: bool
) -> dict:
    """Outputs, taps, eval outputs and (with a loss, where ``gradients`` asks for them: what the step's memory is
    estimated for, ``parity.run.estimate``) gradients in float64 where the model runs in float64, else in float32
    with the reason; arrays are stored as float64 either way. Returns the dtype, the reason, every output's and
    tap's batch axis (``batch_axes``), as the model's own run at two batch sizes shows, and for a torch model the
    digests of the weights of every module it was computed with (``weights_sha256``, ``parity.model.identity``)."""
    spec = Workspace(workspace).load_spec(model, attach_golden=False)
    spec.params = native_params(shapes, params)
    if not gradients:
        spec.loss = None
    digests: list[str] = []  # of each module the factory gave, as built: before a source casts it to float64
    if spec.frameworks[0] == "torch" and spec.torch_module is not None:
        spec.torch_module = _digesting(spec.torch_module, digests)
    scratch = Path(scratch)
    weights = golden_weights.for_build(spec, golden_weights.ModelWeights(spec, scratch))  # the model's own
    inputs = golden.load_arrays(scratch, "inputs.npz")
    evals = golden.load_arrays(scratch, "eval.npz")
    framework = spec.frameworks[0]

    structures: dict = {}  # an ONNX graph's sequence and optional outputs: their lengths and presence
    streaming: dict = {}  # how a torch float64 reference ran: {"mode", "why"} (parity.sources.torch_streamed)

    def compute(*args):
        if framework == "onnx":
            return _onnx_reference(spec, *args, structures=structures)
        return reference_arrays(spec, framework, *args, record=streaming)

    reason = None
    try:
        arrays, axes = compute(weights, inputs, evals, "float64")
        dtype = "float64"
    except Exception as error:  # noqa: BLE001 - any float64 failure falls back to float32, with the reason
        said = str(error) if isinstance(error, ParityError) else f"{type(error).__name__}: {error}"
        reason = f"the model does not run in float64 ({one_line(said, 300)})"
        arrays, axes = compute(weights, inputs, evals, "float32")
        dtype = "float32"
    golden.save_npz(Path(out_file), {k: values.golden(v) for k, v in arrays.items()})
    mode = {"mode": streaming.get("mode", "whole"), "mode_reason": streaming.get("why")} if dtype == "float64" else {}
    return {
        "dtype": dtype,
        "reason": reason,
        "batch_axes": axes,
        **mode,
        **({"containers": structures} if structures else {}),
        **({"weights_sha256": sorted(set(digests))} if digests else {}),
    }


def _digesting(builder, digests: list[str]):
    """``builder`` (a spec's ``torch_module``) that also appends the digest of each module it gives to ``digests``,
    as ``parity.model.identity:model_identity`` digests the model it builds."""
    from parity.model import identity

    def torch_module(**kwargs):
        module = builder(**kwargs)
        digests.append(identity.weights_digest(identity._torch_arrays(module), ordered=True))
        return module

    torch_module.__dict__.update(getattr(builder, "__dict__", {}))  # what the builder says of itself (its source)
    return torch_module


def _onnx_reference(spec, _weights, inputs, evals, dtype: str, structures: dict) -> tuple[dict, dict]:
    """The ONNX graph's outputs (a sequence's or optional's elements by key, their structures into ``structures``),
    taps and eval outputs under ``onnx.reference``, and their batch axes."""
    from parity.interop import onnx_file as onnx_source

    model = onnx_source.load_checked(spec.onnx_model_path)
    if spec.taps:  # an ONNX source's taps are tensors of its graph: made outputs of the reference run
        import onnx

        known = {name for node in model.graph.node for name in node.output}
        missing = [tap for tap in spec.taps if tap not in known]
        if missing:
            raise UserModelError(
                f"{spec.onnx_model_path}: no node computes tap {missing[0]!r} (a tap of an ONNX source "
                f"is the name of a tensor its graph computes)"
            )
        model.graph.output.extend(
            onnx.helper.make_empty_tensor_value_info(tap)
            for tap in spec.taps
            if tap not in {o.name for o in model.graph.output}
        )

    def outputs(x, taps: bool = True) -> dict:  # every input in its own dtype
        computed = _reference_run(spec, model, values.typed_inputs(spec, x), dtype, structures)
        found = {name: computed[name] for name in containers.output_keys(spec.outputs, structures)}
        return {**found, **{f"tap/{tap}": values.golden(computed[tap]) for tap in spec.taps}} if taps else found

    class Evaluator:  # the graph's outputs as a runner gives them, for ``feeds.run_batched``
        def __init__(self):
            self.spec = spec

        def run(self, x):
            return outputs(x, taps=False)

    arrays = outputs(feeds.from_arrays(spec, inputs))
    axes = detect_batch_axes(spec, arrays, evals, lambda x, _batch: outputs(x))
    eval_key = containers.eval_key(spec, axes, structures)
    arrays["eval/logits"] = (
        np.zeros(0)
        if eval_key is None
        else feeds.run_batched(Evaluator(), feeds.from_arrays(spec, evals), spec.batch_size, axes)[eval_key]
    )
    return arrays, axes


def _reference_run(spec, model, x: dict, dtype: str, structures: dict) -> dict:
    """``reference_outputs`` by graph name, a sequence input fed as a list (an optional as its value or None), and
    a sequence or optional output's elements by key besides (its structure into ``structures``)."""
    from parity.interop import onnx_file as onnx_source

    if not spec.containers:
        return onnx_source.reference_outputs(model, x, dtype)
    computed = onnx_source.reference_outputs(model, containers.graph_feeds(spec, x), dtype)
    arrays, found = containers.flat_outputs(
        spec.outputs, [computed[name] for name in spec.outputs], containers.output_kinds(spec)
    )
    structures.update(found)
    return {**computed, **arrays}


def given_data(workspace: str, model: str, out_file: str) -> dict:
    """The inputs (as ``inputs.npz`` keys them) and golden outputs (``output/<i>``) given with a user model, all sets
    concatenated along the batch axis (the first set alone for a model without one), checked against the ONNX graph
    when the source is one. A graph's sequence and optional outputs are given by element (``given/<key>``, see
    ``parity.model.containers``); returns their structures (``{"containers": ...}``)."""
    from parity.interop import onnx_file as onnx_source
    from parity.interop import onnx_test_data as interop

    spec = Workspace(workspace).load_spec(model, attach_golden=False)
    graph_inputs = graph_outputs = kinds = None
    if spec.onnx_model is not None:
        graph = onnx_source.load_checked(spec.onnx_model_path)
        graph_inputs, graph_outputs = interop.graph_signature(graph)
        kinds = interop.graph_kinds(graph)
    data = spec.inputs
    sets, outputs = given_feeds(Path(workspace), data.__dict__, graph_inputs, graph_outputs, kinds)
    structures: dict | None = {}
    given: dict = {}
    if spec.containers:  # taken whole, as the first set gives it: sequences and optionals by element
        sets, given, structures = _by_element(
            spec, sets[0], outputs[0] if outputs is not None else None, data.describe()
        )
        outputs = None
    declared = [i.name for i in spec.model_inputs]
    if len(sets[0]) != len(declared) or (set(sets[0]) != set(declared) and graph_inputs is not None):
        raise UserModelError(
            f"{data.describe()} gives inputs {', '.join(sets[0])}; the model takes {', '.join(declared)}"
        )
    by_name = set(sets[0]) == set(declared)  # else in order: test data written without names
    if not any(i.batched for i in spec.model_inputs):  # no batch axis to stack sets along: the first set is the data
        sets, outputs = sets[:1], outputs[:1] if outputs is not None else None

    def stack(arrays: list):
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

    try:
        stacked = {name: stack([s[name if by_name else list(s)[k]] for s in sets]) for k, name in enumerate(declared)}
        # NumPy's .npz cannot hold ml_dtypes arrays without pickles: inputs as raw bits, outputs widened, exactly
        result = feeds.to_arrays(spec, {name: values.storable(value) for name, value in stacked.items()})
        if outputs is not None:
            result.update({f"output/{i}": _widened(stack([o[i] for o in outputs])) for i in range(len(outputs[0]))})
    except ValueError as error:
        raise UserModelError(f"{data.describe()}: the sets do not stack along the batch axis ({error})") from None
    result.update({f"given/{key}": _widened(value) for key, value in given.items()})
    golden.save_npz(Path(out_file), result)
    return {"containers": structures}


def _by_element(spec, feed: dict, outputs: list | None, source: str) -> tuple[list[dict], dict, dict | None]:
    """One set of a graph with sequences or optionals: its inputs by the spec's names (elements), its outputs by
    golden key and their structures (None where no outputs were given)."""
    declared = spec.containers.get("inputs") or {}
    flat = {}
    for name, value in feed.items():
        if name not in declared:
            flat[name] = value
            continue
        arrays, structure = containers.flatten(name, value, containers.kind_of(declared[name]))
        if structure != declared[name]:
            raise UserModelError(
                f"{source}: input {name!r} is {containers.describe(structure)}; the model's spec "
                f"declares {containers.describe(declared[name])} (run `parity init` again)"
            )
        flat.update(arrays)
    if outputs is None:
        return [flat], {}, None
    arrays, structures = containers.flat_outputs(spec.outputs, outputs, containers.output_kinds(spec))
    return [flat], arrays, structures


def _widened(value):
    """A given output of a dtype NumPy holds through ml_dtypes (bfloat16, float8, int4 ...) in float64, exactly."""
    return values.golden(value) if values.low_precision_name(value) else value
