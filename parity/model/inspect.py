"""What a user's model says about itself, for ``parity init``: outputs, their shapes, default taps, the
parameter count, the id range of an integer input. Runs in a worker of the model's framework."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from parity.interop import onnx_file as onnx_source
from parity.interop import onnx_test_data as interop
from parity.interop.given import given_feeds
from parity.model.user import (
    UserModelError,
    check_data_size,
    hf_model,
    jax_function,
    keras_factory,
    keras_file,
    torch_factory,
)
from parity.model.values import ONNX_ELEMENT_TYPES
from parity.platform.errors import one_line
from parity.platform.safefs import read_npz


def _sample(decl: dict, seed: int = 0) -> np.ndarray:
    """A sample of one declared input (``{"name", "shape", "dtype", "values"}``, shape batch first and concrete)."""
    from parity.model.feeds import draw
    from parity.model.spec import Values

    values = decl.get("values")
    if np.dtype(decl["dtype"]).kind in "iub":  # id 0 alone (valid whatever the range, checked later), or a mask
        values = (
            Values("mask") if isinstance(values, dict) and values.get("kind") == "mask" else Values("fixed", value=0)
        )
    elif isinstance(values, dict):
        values = Values(**values)
    else:
        values = Values()
    return draw(values, tuple(decl["shape"]), decl["dtype"], np.random.default_rng(seed))


def _rejects(inputs: list[dict], error: BaseException) -> UserModelError:
    shown = ", ".join(f"{d['name']!r} of shape {tuple(d['shape'])} {d['dtype']}" for d in inputs)
    return UserModelError(
        f"the model does not run on input {shown}: {one_line(f'{type(error).__name__}: {error}', 300)}"
    )


def _outputs(returned, is_tensor, shape) -> dict:
    """Output names (flattened as ``parity.model.outputs`` names them) and shapes."""
    from parity.model.outputs import OutputError, flatten

    try:
        leaves = flatten(returned, is_tensor)
    except OutputError as error:
        raise UserModelError(str(error)) from None
    if not leaves:
        raise UserModelError("the model returns no tensor")
    return {"outputs": [name for name, _ in leaves], "output_shapes": [list(shape(value)) for _, value in leaves]}


def inspect_model(
    kind: str,
    reference: str,
    root: str,
    inputs: list[dict],
    params_file: str | None = None,
    given: dict | None = None,
    names_from: str | None = None,
    builder: str | None = None,
) -> dict:
    """Build the model, run it once on a sample of each declared input (``{"name", "shape", "dtype", "values"}``,
    batch first), and report what a spec needs: output names and shapes, default taps (top-level layers whose
    output is one tensor), parameter count, and the number of ids of each integer input an embedding reads.
    An ONNX file is only read (its graph says it all); ``given`` data (test data, Polygraphy inputs) gives
    its input shapes. ``names_from``: the file the inputs were named after (``--inputs data.npz`` alone), so the names
    must be the model's own (``forward``'s parameters, the Keras inputs, the JAX function's arguments); the
    model's order of them comes back as ``input_names``. ``builder``: ``hf_model`` for a torch model that is a
    transformers folder (``reference``), else the kind's own."""
    if kind == "onnx":
        return _inspect_onnx(reference, root, given or {})
    for decl in inputs:
        check_data_size(f"input {decl['name']!r}", decl["shape"], decl["dtype"])  # before _sample draws it
    if kind == "torch":
        return _inspect_torch(reference, root, inputs, params_file, names_from, builder)
    inspector = {"tf": _inspect_keras, "jax": _inspect_jax}[kind]
    return inspector(reference, root, inputs, params_file, names_from)


def _inspect_torch(reference, root, inputs, weights, names_from=None, builder=None):
    import torch

    from parity.model.feeds import call_torch as call

    if builder == "hf_model":  # a transformers folder: its architecture from its config, its weights mapped
        module = hf_model(reference, root)().eval()
    else:
        module = torch_factory(reference, root, weights)().eval()  # ``weights``: its safetensors files, mapped
    order = _file_names_fit(reference, "forward", module.forward, [d["name"] for d in inputs], names_from)
    _check_takes(reference, module.forward, [d["name"] for d in inputs])
    tensors = {d["name"]: torch.from_numpy(_sample(d)) for d in inputs}
    recorded, handles, embedding_sizes, fed = {}, [], {}, {}

    def keep_output(name):
        def hook(_module, _args, output):  # returns None: the output is left as it is
            recorded.setdefault(name, output)

        return hook

    def keep_inputs(name):
        def hook(_module, args, kwargs):  # returns None: the call goes on as it was
            fed.setdefault(name, (args, kwargs))

        return hook

    for name, child in module.named_children():
        handles.append(child.register_forward_hook(keep_output(name)))
        handles.append(child.register_forward_pre_hook(keep_inputs(name), with_kwargs=True))

    def reads(m, args, kwargs):  # an embedding that reads an input (or a view of it) says how many ids it takes
        first = args[0] if args else kwargs.get("input")
        if not isinstance(first, torch.Tensor):
            return
        for name, tensor in tensors.items():
            if first.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr():
                embedding_sizes[name] = min(embedding_sizes.get(name, m.num_embeddings), m.num_embeddings)

    for child in module.modules():
        if isinstance(child, torch.nn.Embedding):
            handles.append(child.register_forward_pre_hook(reads, with_kwargs=True))
    try:
        with torch.inference_mode():
            returned = call(module, tensors)
    except Exception as error:  # noqa: BLE001 - the model's own failure on this input
        raise _rejects(inputs, error) from None
    finally:
        for handle in handles:
            handle.remove()
    taps = [n for n, child in module.named_children() if _torch_tap(child, recorded.get(n))]
    return {
        **_outputs(returned, torch.is_tensor, lambda t: t.shape),
        "taps": taps,
        "n_params": int(sum(p.numel() for p in module.parameters())),
        "input_values": embedding_sizes,
        "layers": _torch_layers(module, taps, recorded, fed, list(tensors.values())),
        "input_names": order,
    }


def _torch_tap(child, output) -> bool:
    """A top-level module is a tap when it returns one tensor, or is a recurrent or attention layer the catalogue
    types (they return a tuple whose first element is the layer's output, which the tap reads)."""
    import torch

    from parity.model.layer_types import torch_layer

    if isinstance(output, torch.Tensor):
        return True
    typed = torch_layer(child) if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor) else None
    return typed is not None and typed[0] in ("recurrent", "attention")


def _torch_layers(module, taps, recorded, fed, inputs) -> dict:
    """``{tap: {"kind", "attrs", "params"}}`` for each tap whose module the catalogue computes and that reads exactly
    the previous tap's output (the model's input for the first): the cause test recomputes it from that."""
    from parity.model.layer_types import WEIGHTED, torch_layer, torch_reads

    children = dict(module.named_children())
    layers, previous = {}, inputs[0] if len(inputs) == 1 else None
    for tap in taps:
        args, kwargs = fed.get(tap) or ((), {})
        typed = torch_layer(children[tap])
        if typed and previous is not None and torch_reads(children[tap], args, kwargs, previous):
            layers[tap] = {"kind": typed[0], "attrs": typed[1], "params": tap if typed[0] in WEIGHTED else None}
        output = recorded[tap]
        previous = output[0] if isinstance(output, tuple) else output
    return layers


def _check_takes(reference: str, forward, names: list[str]) -> None:
    """Several inputs go to ``forward`` as keywords: each must be one of its parameters (a ``**kwargs`` would take
    and ignore a misspelt one) unless it takes nothing but ``*args`` / ``**kwargs``."""
    import inspect

    if len(names) < 2:
        return
    parameters = inspect.signature(forward).parameters.values()
    named = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [name for name in names if name not in named]
    if named and unknown:
        raise UserModelError(f"{reference}: forward takes no input {unknown[0]!r} (its inputs are {', '.join(named)})")


def _file_names_fit(
    reference: str, what: str, function, names: list[str], names_from: str | None, parameters=None
) -> list[str] | None:
    """With inputs named by a file (``names_from``): refuse names the model does not take, or a required input the
    file lacks; return the model's order of them. One array of a model with one required input goes positionally,
    whatever its name."""
    import inspect

    if not names_from:
        return None
    if parameters is None:
        parameters = list(inspect.signature(function).parameters.values())
    named = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    required = [
        p.name
        for p in parameters
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if len(names) == 1 and len(required) <= 1:
        return None
    takes_more = any(p.kind is p.VAR_KEYWORD for p in parameters)
    unknown = [name for name in names if name not in named and not takes_more]
    missing = [name for name in required if name not in names]
    if unknown or missing:
        raise _misnamed(names_from, names, f"{what} of {reference} takes", named, missing)
    return sorted(names, key=lambda name: named.index(name) if name in named else len(named))


def _misnamed(source: str, given: list[str], what: str, expected: list[str], missing=()) -> UserModelError:
    needs = f" ({', '.join(missing)} required)" if missing else ""
    return UserModelError(
        f"{source} has input arrays {', '.join(given)}; {what} {', '.join(expected)}{needs}: name "
        f"each array after the input it feeds, or declare the inputs with --input"
    )


def _inspect_keras(reference, root, inputs, _params_file, names_from=None):
    import keras

    from parity.model.feeds import call_keras as call

    # a function returning the model (``file.py:make_model``, as assert_parity and init's library call give it) is
    # built as its spec builds it (``keras_factory``): a ``.keras`` file cannot hold a custom layer's code
    builder = keras_file if Path(reference).suffix in (".keras", ".h5") else keras_factory
    model = builder(reference, root)("float32")
    names = [t.name for t in model.inputs]
    if names_from and len(inputs) > 1 and sorted(d["name"] for d in inputs) != sorted(names):
        raise _misnamed(names_from, [d["name"] for d in inputs], f"{reference}'s inputs are", names)
    if len(names) != len(inputs):
        raise UserModelError(
            f"{reference} has {len(names)} inputs ({', '.join(names)}); "
            f"{len(inputs)} were declared ({', '.join(d['name'] for d in inputs)})"
        )
    embedding_sizes = {}
    for layer in model.layers:
        if isinstance(layer, keras.layers.Embedding):
            for name, tensor in zip(names, model.inputs):
                if layer.input is tensor:
                    embedding_sizes[name] = layer.input_dim
    try:
        returned = call(model, {d["name"]: _sample(d) for d in inputs})
    except Exception as error:  # noqa: BLE001
        raise _rejects(inputs, error) from None
    taps = [
        layer.name
        for layer in model.layers
        if type(layer).__name__ != "InputLayer" and not isinstance(layer.output, (list, tuple, dict))
    ]
    import tensorflow as tf

    return {
        **_outputs(returned, tf.is_tensor, lambda t: t.shape),
        "taps": taps,
        "n_params": int(model.count_params()),
        "input_values": embedding_sizes,
        "layers": _keras_layers(model, taps),
        "input_names": names if names_from and len(inputs) > 1 else None,
    }


def _keras_layers(model, taps) -> dict:
    """``{tap: {"kind", "attrs", "params"}}`` for each Keras layer the catalogue computes that reads exactly the
    previous tap's output (the model's input for the first), as for torch."""
    from parity.model.layer_types import WEIGHTED
    from parity.model.layer_types_keras import keras_layer, keras_reads

    layers, previous = {}, model.inputs[0] if len(model.inputs) == 1 else None
    for tap in taps:
        layer = model.get_layer(tap)
        typed = keras_layer(layer)
        extra = keras_reads(layer, previous) if typed else None
        if typed and extra is not None:
            layers[tap] = {
                "kind": typed[0],
                "attrs": {**typed[1], **extra},
                "params": tap if typed[0] in WEIGHTED else None,
            }
        previous = layer.output
    return layers


def _inspect_jax(reference, root, inputs, params_file, names_from=None):
    import inspect

    import jax

    from parity.model.user import resolve

    apply = jax_function(reference, params_file, root)
    order = None
    if names_from:  # the function's arguments after params name its inputs (``tap`` is parity's own)
        function = resolve(reference, root)
        arguments = [p for p in list(inspect.signature(function).parameters.values())[1:] if p.name != "tap"]
        order = _file_names_fit(reference, "the function", function, [d["name"] for d in inputs], names_from, arguments)
    if order:  # positionally, in the function's order
        inputs = sorted(inputs, key=lambda d: order.index(d["name"]))
    params = read_npz(apply.params_path, UserModelError, ".npz")
    names = []
    samples = {d["name"]: _sample(d) for d in inputs}
    try:
        returned = apply(
            params,
            tuple(samples.values()) if len(samples) > 1 else next(iter(samples.values())),
            tap=lambda name, _value: names.append(name),
        )
    except Exception as error:  # noqa: BLE001
        raise _rejects(inputs, error) from None
    return {
        **_outputs(returned, lambda v: isinstance(v, (jax.Array, np.ndarray)), np.shape),
        "taps": list(dict.fromkeys(names)),
        "n_params": int(sum(v.size for v in params.values())),
        "input_values": {},
        "input_names": order,
    }


def _inspect_onnx(reference, root, given: dict):
    model = onnx_source.load_checked(Path(root) / reference)
    inputs, outputs = interop.graph_signature(model)
    kinds = interop.graph_kinds(model)
    sets = given_feeds(root, given, inputs, outputs, kinds)[0] if any(given.values()) else None
    containers: dict[str, dict[str, Any]] = {"inputs": {}, "outputs": {}}
    for output, kind in zip(model.graph.output, kinds["output"]):
        if kind is not None and not kind.startswith("unsupported: "):
            containers["outputs"][output.name] = {"kind": kind}  # its length or presence is the golden data's
            continue
        elem_type = output.type.tensor_type.elem_type if kind is None else 0
        if elem_type > max(ONNX_ELEMENT_TYPES.values()):  # uint2 (25), int2, float6 ...: no golden form
            import onnx

            raise UserModelError(
                f"{reference}: output {output.name!r} is a {onnx.TensorProto.DataType.Name(elem_type).lower()} "
                f"tensor; parity does not read 2-bit integer (int2, uint2) or 6-bit float outputs yet"
            )
        if kind is None and elem_type != 0:
            continue
        what = "a tensor of no element type" if kind is None else kind[len("unsupported: ") :]
        raise UserModelError(
            f"{reference}: output {output.name!r} is {what}; parity compares tensors, sequences of "
            f"tensors and optionals of those"
        )
    described = []
    for (name, (graph_shape, graph_dtype)), kind in zip(inputs.items(), kinds["input"]):
        if kind is not None:  # a sequence or optional: its elements are the inputs, as the data given has them
            described += _container_input(reference, name, kind, sets, containers["inputs"])
            continue
        if graph_shape is None and sets:  # rank unknown to the graph: the data given says it
            graph_shape = tuple(sets[0][name].shape)
        if graph_shape is None or graph_dtype is None:
            raise UserModelError(
                f"{reference}: input {name!r} is not a tensor of known rank and type; parity feeds tensors only"
            )
        described.append(
            {
                "name": name,
                "shape": [d if isinstance(d, int) else None for d in graph_shape],
                "axis_names": [d if isinstance(d, str) else None for d in graph_shape],
                "dtype": graph_dtype if graph_dtype == "str" else str(np.dtype(graph_dtype)),
                "given_shape": list(sets[0][name].shape) if sets else None,
            }
        )
    found = {key: value for key, value in containers.items() if value}
    return {
        "inputs": described,
        "outputs": list(outputs),
        "output_shapes": None,
        "taps": [],
        "n_params": int(sum(np.prod(i.dims) for i in model.graph.initializer)),
        "input_values": {},
        **({"containers": found} if found else {}),
    }


def _container_input(reference, name: str, kind: str, sets, declared: dict) -> list[dict]:
    """A sequence or optional input as the inputs its elements are (each fixed whole at the shape the data gives
    it: a sequence has no batch axis), its structure recorded in ``declared``."""
    from parity.model import containers

    if kind.startswith("unsupported: "):
        raise UserModelError(
            f"{reference}: input {name!r} is {kind[len('unsupported: ') :]}; parity feeds tensors, "
            f"sequences of tensors and optionals of those"
        )
    if not sets:
        raise UserModelError(
            f"{reference}: input {name!r} is {'a sequence' if kind == 'sequence' else 'an optional'}; "
            f"its value comes from the data given with the model (--test-data DIR)"
        )
    arrays, declared[name] = containers.flatten(name, sets[0][name], kind)
    return [
        {
            "name": key,
            "shape": list(array.shape),
            "axis_names": [None] * array.ndim,
            "dtype": "str" if array.dtype.kind == "U" else str(array.dtype),
            "given_shape": list(array.shape),
        }
        for key, array in arrays.items()
    ]
