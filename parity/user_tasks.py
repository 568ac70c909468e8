"""Worker tasks for a user's model: look at it (for ``parity init``), read its weights, compute its reference.

Each runs in the worker of the model's framework (``onnx`` for an ONNX file), like every other task.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from parity import golden
from parity.errors import one_line
from parity.tasks import reference_arrays
from parity.usermodel import UserModelError, check_data_size, jax_function, keras_file, native_params, torch_factory
from parity.workspace import Workspace

SKIPPED_TORCH_STATE = ("num_batches_tracked",)


def _sample(shape, dtype: str, values: int | None = None, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":  # ids 0 to values - 1; the smallest id alone until the range is known
        return rng.integers(0, values or 1, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _rejects(input_name: str, shape, error: BaseException) -> UserModelError:
    return UserModelError(f"the model does not run on input {input_name!r} of shape {tuple(shape)}: "
                          f"{one_line(f'{type(error).__name__}: {error}', 300)}")


def _output_names(count: int) -> list[str]:
    return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]


def inspect_model(kind: str, reference: str, root: str, input_name: str, shape: list[int] | None, dtype: str,
                  params_file: str | None = None, given: dict | None = None, values: int | None = None) -> dict:
    """Build the model, run it once on a sample of ``shape`` (batch first), and report what a spec needs:
    output names and shapes, default taps (top-level layers whose output is one tensor), parameter count.
    An ONNX file is only read (its graph says it all); ``given`` data (test data, Polygraphy inputs) gives
    its input shape."""
    if kind == "onnx":
        return _inspect_onnx(reference, root, given or {})
    check_data_size(f"input {input_name!r}", shape, dtype)  # before _sample draws it
    inspector = {"torch": _inspect_torch, "tf": _inspect_keras, "jax": _inspect_jax}[kind]
    return inspector(reference, root, input_name, shape, dtype, params_file, values)


def _inspect_torch(reference, root, input_name, shape, dtype, _params_file, values):
    import torch

    module = torch_factory(reference, root)().eval()
    x = torch.from_numpy(_sample(shape, dtype, values))
    recorded, handles, embedding_sizes = {}, [], []
    for name, child in module.named_children():
        handles.append(child.register_forward_hook(lambda _m, _i, out, n=name: recorded.setdefault(n, out)))
    for child in module.modules():  # an embedding that reads the input itself says how many ids it takes
        if isinstance(child, torch.nn.Embedding):
            handles.append(child.register_forward_pre_hook(
                lambda m, args: embedding_sizes.append(m.num_embeddings) if args and args[0] is x else None))
    try:
        with torch.inference_mode():
            outputs = module(x)
    except Exception as error:  # noqa: BLE001 - the model's own failure on this input
        raise _rejects(input_name, shape, error) from None
    finally:
        for handle in handles:
            handle.remove()
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    if not all(isinstance(o, torch.Tensor) for o in outputs):
        raise UserModelError(f"{reference}: forward returns {type(outputs[0]).__name__}; parity needs a tensor or a tuple of tensors")
    taps = [n for n, _ in module.named_children() if isinstance(recorded.get(n), torch.Tensor)]
    return {"outputs": _output_names(len(outputs)), "output_shapes": [list(o.shape) for o in outputs], "taps": taps,
            "n_params": int(sum(p.numel() for p in module.parameters())),
            "input_values": min(embedding_sizes, default=None)}


def _inspect_keras(reference, root, input_name, shape, dtype, _params_file, values):
    import keras

    model = keras_file(reference, root)("float32")
    if len(model.inputs) != 1:
        raise UserModelError(f"{reference} has {len(model.inputs)} inputs; parity checks models with one input")
    embedding_sizes = [layer.input_dim for layer in model.layers if isinstance(layer, keras.layers.Embedding)
                       and layer.input is model.inputs[0]]
    try:
        outputs = model(_sample(shape, dtype, values), training=False)
    except Exception as error:  # noqa: BLE001
        raise _rejects(input_name, shape, error) from None
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    taps = [layer.name for layer in model.layers if type(layer).__name__ != "InputLayer"
            and not isinstance(layer.output, (list, tuple, dict))]
    return {"outputs": _output_names(len(outputs)), "output_shapes": [list(o.shape) for o in outputs], "taps": taps,
            "n_params": int(model.count_params()), "input_values": min(embedding_sizes, default=None)}


def _inspect_jax(reference, root, input_name, shape, dtype, params_file, values):
    apply = jax_function(reference, params_file, root)
    params = read_npz(apply.params_path)
    names = []
    try:
        outputs = apply(params, _sample(shape, dtype, values), tap=lambda name, _value: names.append(name))
    except Exception as error:  # noqa: BLE001
        raise _rejects(input_name, shape, error) from None
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    return {"outputs": _output_names(len(outputs)), "output_shapes": [list(np.shape(o)) for o in outputs],
            "taps": list(dict.fromkeys(names)), "n_params": int(sum(v.size for v in params.values()))}


def _inspect_onnx(reference, root, given: dict):
    from parity import interop, onnx_source

    model = onnx_source.load_checked(Path(root) / reference)
    inputs, outputs = interop.graph_signature(model)
    if len(inputs) != 1:
        raise UserModelError(f"{reference} has {len(inputs)} inputs ({', '.join(inputs)}); parity checks models with one input")
    (name, (graph_shape, graph_dtype)), = inputs.items()
    feeds = _given_feeds(root, given, inputs, outputs)[0] if any(given.values()) else None
    return {"input_name": name, "input_shape": [d if isinstance(d, int) else None for d in graph_shape],
            "input_dtype": str(np.dtype(graph_dtype)), "given_shape": list(feeds[0].shape) if feeds else None,
            "outputs": list(outputs), "output_shapes": None, "taps": [],
            "n_params": int(sum(np.prod(i.dims) for i in model.graph.initializer))}


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """A user's ``.npz`` (never unpickled); any problem is one line naming the file."""
    return golden.read_npz(path, UserModelError, ".npz")


def read_weights(workspace: str, model: str, out_file: str) -> dict:
    """The model's own floating-point weights by framework name, each in its own dtype (bfloat16 widened to
    float32, exactly), into ``out_file``; returns ``{name: {"trainable": bool, "dtype": str}}``."""
    spec = Workspace(workspace).load_spec(model, attach_golden=False)
    framework = spec.frameworks[0]
    weights, trainable = {"torch": _torch_weights, "tf": _keras_weights, "jax": _jax_weights,
                          "onnx": lambda _spec: ({}, set())}[framework](spec)
    dtypes = {name: str(np.asarray(v).dtype) for name, v in weights.items()}
    golden.save_npz(Path(out_file), {k: np.asarray(v, dtype=np.float32 if dtypes[k] == "bfloat16" else None)
                                     for k, v in weights.items()})
    return {name: {"trainable": name in trainable, "dtype": dtypes[name]} for name in weights}


def _torch_weights(spec):
    module = spec.torch_module()
    trainable = {name for name, p in module.named_parameters() if p.requires_grad}
    state = {k: _torch_array(v) for k, v in module.state_dict().items()
             if not k.endswith(SKIPPED_TORCH_STATE) and v.is_floating_point()}
    return state, trainable


def _torch_array(tensor) -> np.ndarray:
    """A weight as NumPy in its own dtype (bfloat16 through ml_dtypes, which NumPy stores widened)."""
    import ml_dtypes
    import torch

    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.float().numpy().astype(ml_dtypes.bfloat16)
    return tensor.numpy()


def _keras_weights(spec):
    model = spec.keras_model("float32")
    variables = [v for v in model.weights if str(v.dtype).startswith(("float", "bfloat"))]
    names = [v.path for v in variables]
    if len(set(names)) != len(names):
        raise UserModelError("the Keras model has weights with the same path; give its layers unique names")
    return {v.path: np.asarray(v) for v in variables}, {v.path for v in variables if v.trainable}


def _jax_weights(spec):
    params = read_npz(spec.jax_apply.params_path)
    floating = {k: v for k, v in params.items() if v.dtype.kind == "f"}
    return floating, set(floating)


def reference(workspace: str, model: str, scratch: str, shapes: dict, params: dict, out_file: str) -> dict:
    """Outputs, taps, eval outputs and (with a loss) gradients in float64 where the model runs in float64,
    else in float32 with the reason; arrays are stored as float64 either way."""
    spec = Workspace(workspace).load_spec(model, attach_golden=False)
    spec.params = native_params(shapes, params)
    scratch = Path(scratch)
    weights = golden.load_arrays(scratch, "weights.npz")
    inputs = golden.load_arrays(scratch, "inputs.npz")
    eval_x = golden.load_arrays(scratch, "eval.npz")["x"]
    framework = spec.frameworks[0]

    def compute(*args):
        return _onnx_reference(spec, *args) if framework == "onnx" else reference_arrays(spec, framework, *args)

    reason = None
    try:
        arrays = compute(weights, inputs, eval_x, "float64")
        dtype = "float64"
    except Exception as error:  # noqa: BLE001 - any float64 failure falls back to float32, with the reason
        reason = f"the model does not run in float64 ({one_line(f'{type(error).__name__}: {error}', 300)})"
        arrays = compute(weights, inputs, eval_x, "float32")
        dtype = "float32"
    golden.save_npz(Path(out_file), {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()})
    return {"dtype": dtype, "reason": reason}


def _onnx_reference(spec, _weights, inputs, eval_x, dtype: str) -> dict:
    from parity import onnx_source
    from parity.tasks import run_batched

    model = onnx_source.load_checked(spec.onnx_model_path)
    input_name = model.graph.input[0].name

    class Evaluator:
        def run(self, x):
            outputs = onnx_source.reference_outputs(model, {input_name: x}, dtype)
            return {name: outputs[name] for name in spec.outputs}

    arrays = Evaluator().run(inputs["x"])
    arrays["eval/logits"] = run_batched(Evaluator(), eval_x, spec.batch_size)[spec.outputs[0]]
    return arrays


def _given_feeds(root, given: dict, graph_inputs: dict | None, graph_outputs: list | None):
    """Inputs (one array per test-data set or Polygraphy iteration) and golden outputs (a list of arrays in
    output order per set; None when none were given) from an ONNX test-data folder or Polygraphy files."""
    from parity import interop

    root = Path(root)
    if given.get("test_data"):
        source = root / given["test_data"]
        sets = interop.read_test_data(source)
    else:
        source = root / given["polygraphy_inputs"]
        feeds = interop.read_polygraphy_inputs(source)
        outputs = (interop.read_polygraphy_outputs(root / given["polygraphy_outputs"])
                   if given.get("polygraphy_outputs") else [{}] * len(feeds))
        if len(outputs) != len(feeds):
            raise UserModelError(f"{given['polygraphy_outputs']} has {len(outputs)} iterations for {len(feeds)} inputs")
        sets = [interop.TestDataSet(source, feed, out) for feed, out in zip(feeds, outputs)]
    if graph_inputs is not None:
        feeds, outputs = interop.match_graph(sets, graph_inputs, graph_outputs, str(source))
    else:
        feeds, outputs = [s.inputs for s in sets], [s.outputs for s in sets]
    if any(len(feed) != 1 for feed in feeds):
        raise UserModelError(f"{source}: parity checks models with one input; a set has {len(feeds[0])}")
    arrays = [next(iter(feed.values())) for feed in feeds]
    golden_outputs = [list(out.values()) for out in outputs] if all(outputs) else None
    return arrays, golden_outputs


def given_data(workspace: str, model: str, out_file: str) -> None:
    """The inputs (``x``) and golden outputs (``output/<i>``) given with a user model, all sets concatenated
    along the batch axis, checked against the ONNX graph when the source is one."""
    from parity import interop, onnx_source

    spec = Workspace(workspace).load_spec(model, attach_golden=False)
    graph_inputs = graph_outputs = None
    if spec.onnx_model is not None:
        graph_inputs, graph_outputs = interop.graph_signature(onnx_source.load_checked(spec.onnx_model_path))
    data = spec.inputs
    arrays, outputs = _given_feeds(Path(workspace), data.__dict__, graph_inputs, graph_outputs)
    try:
        result = {"x": np.concatenate(arrays)}
        if outputs is not None:
            result.update({f"output/{i}": np.concatenate([o[i] for o in outputs]) for i in range(len(outputs[0]))})
    except ValueError as error:
        raise UserModelError(f"{data.describe()}: the sets do not stack along the batch axis ({error})") from None
    golden.save_npz(Path(out_file), result)
