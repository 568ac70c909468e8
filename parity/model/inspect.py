"""What a user's model says about itself, for ``parity init``: outputs, their shapes, default taps, the
parameter count, the id range of an integer input. Runs in a worker of the model's framework."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from parity.interop import onnx_file as onnx_source
from parity.interop import onnx_test_data as interop
from parity.interop.given import given_feeds
from parity.model.user import UserModelError, check_data_size, jax_function, keras_file, torch_factory
from parity.platform.errors import one_line
from parity.platform.safefs import read_npz


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
    params = read_npz(apply.params_path, UserModelError, ".npz")
    names = []
    try:
        outputs = apply(params, _sample(shape, dtype, values), tap=lambda name, _value: names.append(name))
    except Exception as error:  # noqa: BLE001
        raise _rejects(input_name, shape, error) from None
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    return {"outputs": _output_names(len(outputs)), "output_shapes": [list(np.shape(o)) for o in outputs],
            "taps": list(dict.fromkeys(names)), "n_params": int(sum(v.size for v in params.values()))}


def _inspect_onnx(reference, root, given: dict):
    model = onnx_source.load_checked(Path(root) / reference)
    inputs, outputs = interop.graph_signature(model)
    if len(inputs) != 1:
        raise UserModelError(f"{reference} has {len(inputs)} inputs ({', '.join(inputs)}); parity checks models with one input")
    (name, (graph_shape, graph_dtype)), = inputs.items()
    feeds = given_feeds(root, given, inputs, outputs)[0] if any(given.values()) else None
    return {"input_name": name, "input_shape": [d if isinstance(d, int) else None for d in graph_shape],
            "input_dtype": str(np.dtype(graph_dtype)), "given_shape": list(feeds[0].shape) if feeds else None,
            "outputs": list(outputs), "output_shapes": None, "taps": [],
            "n_params": int(sum(np.prod(i.dims) for i in model.graph.initializer))}
