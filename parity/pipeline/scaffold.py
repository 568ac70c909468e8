"""``parity init``: write ``models/<name>.py`` for a user's model, from what the model itself says.

The model is built and run once in a worker of its framework (a factory that raises, or a model that
rejects the declared input, is an error here, before anything is written); the spec written is short
and meant to be edited: inputs, tolerances, taps.
"""

from __future__ import annotations

import json
import keyword
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from parity.model.user import check_data_size
from parity.platform.errors import UsageError
from parity.platform.safefs import write_text_atomic

DEFAULT_TOLERANCE = (1e-4, 1e-4)  # atol, rtol of outputs; a float32 model against its float64 reference
DEFAULT_GRAD_TOLERANCE = (1e-5, 1e-3)
BUILDERS = {"torch": "torch_factory", "tf": "keras_file", "jax": "jax_function", "onnx": None}
# a known converter limit, declared as the zoo declares it (see models/mlp.py)
JAX_TF_ONNX = ("jax/tf/onnx/*", "jax2tf serialises through XlaCallModule, which tf2onnx cannot convert")
TAP_ORIGIN = {"torch": "the model's top-level submodules (named children)", "tf": "the Keras model's layers",
              "jax": "the names your apply function passes to tap(name, value)",
              "onnx": "none by default (a tap is a layer name the graph's node names carry)"}


@dataclass(frozen=True)
class Request:
    """What ``parity init`` was asked: the source (``kind`` + ``reference``), the input, the data."""

    name: str
    kind: str  # torch, tf, jax, onnx
    reference: str  # module:function, file.py:function, a .keras file or an .onnx file
    params_file: str | None = None  # jax: the weights .npz
    input_name: str | None = None
    input_shape: tuple[int, ...] | None = None  # batch first
    input_dtype: str = "float32"
    input_values: int | None = None  # integer inputs: ids 0 to input_values - 1
    inputs_file: str | None = None
    test_data: str | None = None
    polygraphy_inputs: str | None = None
    polygraphy_outputs: str | None = None
    seed: int = 0
    tolerance: tuple[float, float] = DEFAULT_TOLERANCE  # atol, rtol of the outputs
    builder: str | None = None  # the builder helper (default: the kind's own, e.g. keras_file for tf)


def parse_input(text: str) -> tuple[str, tuple[int, ...], str, int | None]:
    """``x=1x3x32x32``, ``ids=8x128:int64`` or ``ids=8x128:int64:30522`` -> name, shape (batch first), dtype, and
    for integers the number of values (ids 0 to N-1; None: taken from the embedding that reads the input)."""
    match = re.fullmatch(r"([A-Za-z_][\w.:/-]*?)=(\d+(?:x\d+)*)(?::(\w+)(?::(\d+))?)?", text.strip())
    if not match:
        raise UsageError(f"--input {text!r} is not NAME=BATCHxDIMx...[:DTYPE[:VALUES]] (e.g. x=1x3x224x224, or "
                         f"ids=8x128:int64:30522)")
    name, dims, dtype = match.group(1), tuple(int(d) for d in match.group(2).split("x")), match.group(3) or "float32"
    values = int(match.group(4)) if match.group(4) else None
    if any(d < 1 for d in dims):
        raise UsageError(f"--input {text!r}: every dimension must be at least 1")
    if dtype not in ("float32", "int32", "int64"):
        raise UsageError(f"--input {text!r}: dtype {dtype!r} is not float32, int32 or int64")
    if values is not None and (dtype == "float32" or values < 2):
        raise UsageError(f"--input {text!r}: a number of values is for integer inputs, and at least 2")
    return name, dims, dtype, values


def check_name(name: str) -> None:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name) or keyword.iskeyword(name):
        raise UsageError(f"model name {name!r} must be a Python identifier (letters, digits, _), like resnet18")


def workspace_reference(reference: str, root: Path) -> str:
    """A file reference relative to the workspace where it lies inside it (the spec moves with the folder)."""
    file_part, sep, attribute = reference.rpartition(":") if reference.count(":") and ".py:" in reference else (reference, "", "")
    path = Path(file_part)
    if not (file_part.endswith((".py", ".keras", ".onnx", ".npz", ".h5")) or path.is_dir()):
        return reference  # package.module:function
    absolute = path.resolve()
    if not absolute.exists():
        raise UsageError(f"{file_part}: no such file")
    try:
        shown = str(absolute.relative_to(root.resolve()))
    except ValueError:
        shown = str(absolute)
    return f"{shown}{sep}{attribute}"


def npz_facts(path: Path, input_name: str) -> dict:
    """Shape and labels of a user's ``.npz`` (never unpickled), for the spec."""
    from parity.model.user import UserModelError
    from parity.platform.safefs import read_npz

    arrays = read_npz(path, UserModelError, ".npz")
    key = input_name if input_name in arrays else "x"
    if key not in arrays:
        raise UsageError(f"{path} has no array {input_name!r} or 'x' (it has {', '.join(arrays) or 'none'})")
    labels = arrays.get("labels", arrays.get("y"))
    return {"shape": tuple(arrays[key].shape), "dtype": str(arrays[key].dtype), "labelled": labels is not None,
            "classes": int(labels.max()) + 1 if labels is not None and labels.size else 0}


def _py(value) -> str:
    """A Python literal with double-quoted strings (the style of the zoo's model files)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, tuple):
        return "(" + ", ".join(_py(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def render(request: Request, info: dict) -> str:
    """The text of ``models/<name>.py``."""
    kind, builder = request.kind, request.builder or BUILDERS[request.kind]
    batch, sample = request.input_shape[0], tuple(request.input_shape[1:])
    labelled = info.get("labelled", False)
    if kind == "onnx":
        source = f"onnx_model={_py(request.reference)}"
    elif kind == "jax":
        source = f"jax_apply=jax_function({_py(request.reference)}, {_py(request.params_file)}, root=WORKSPACE)"
    else:
        source = f"{ {'torch': 'torch_module', 'tf': 'keras_model'}[kind]}={builder}({_py(request.reference)}, root=WORKSPACE)"
    width = info["output_shapes"][0][-1] if info.get("output_shapes") else 0
    spec_imports = ["InputSpec", "ModelSpec", "Tolerance", "Tolerances"] + (["MetricRules"] if labelled and width < 3 else [])
    lines = [
        f'"""{request.name}: a {kind} model ({request.reference}), written by `parity init`; edit freely.',
        "",
        f"Check it with `parity golden build --model {request.name}`, then `parity run --model {request.name}`.",
        "Build the golden data again after changing the model, its inputs or its weights.",
        '"""',
        "",
        "from pathlib import Path",
        "",
        f"from parity.model.spec import {', '.join(sorted(spec_imports))}",
        f"from parity.model.user import {', '.join(['InputData'] + ([builder] if builder else []))}",
        "",
        "WORKSPACE = Path(__file__).resolve().parent.parent",
        "",
        "SPEC = ModelSpec(",
        f"    name={_py(request.name)},",
        f"    description={_py(f'{kind} model {request.reference}')},",
        f"    {source},",
        "    weights_from_model=True,  # the weights are the model's own, checksummed into the golden data",
        (f"    input=InputSpec({_py(info.get('input_name', request.input_name))}, {_py(sample)}, layout=\"native\", "
         f"dtype={_py(request.input_dtype)}),"),
        f"    batch_size={batch},",
        f"    inputs={_input_data(request)},",
        f"    outputs={_py(tuple(info['outputs']))},",
    ]
    if labelled:
        lines.append(f"    num_classes={width},")
        if width < 3:
            lines.append(f"    metric_rules=MetricRules(top_k={width}),")
    loss = '"cross_entropy"' if labelled else "None"
    lines += [
        f"    loss={loss},  # \"cross_entropy\" of the first output checks gradients; it needs labels",
        f"    # taps: {TAP_ORIGIN[kind]}; `parity diagnose` compares each one",
        f"    taps={_py(tuple(info.get('taps') or ()))},",
        *([f"    expected_errors={{{_py(JAX_TF_ONNX[0])}: {_py(JAX_TF_ONNX[1])}}},"] if kind == "jax" else []),
        f"    tolerances={{\"fp32\": Tolerances(Tolerance(atol={request.tolerance[0]:g}, rtol={request.tolerance[1]:g}))}},",
        (f"    grad_tolerances={{\"fp32\": Tolerances(Tolerance(atol={DEFAULT_GRAD_TOLERANCE[0]:g}, "
         f"rtol={DEFAULT_GRAD_TOLERANCE[1]:g}))}},"),
        ")",
        "",
    ]
    return "\n".join(lines)


def _input_data(request: Request) -> str:
    if request.inputs_file:
        return f"InputData(file={_py(request.inputs_file)})"
    if request.test_data:
        return f"InputData(test_data={_py(request.test_data)})"
    if request.polygraphy_inputs:
        outputs = f", polygraphy_outputs={_py(request.polygraphy_outputs)}" if request.polygraphy_outputs else ""
        return f"InputData(polygraphy_inputs={_py(request.polygraphy_inputs)}{outputs})"
    if np.dtype(request.input_dtype).kind in "iu":
        return f"InputData(distribution=\"integers\", low=0, high={request.input_values}, seed={request.seed})"
    return f"InputData(distribution=\"normal\", mean=0.0, std=1.0, seed={request.seed})"


def write(root: Path, request: Request, info: dict, force: bool) -> Path:
    """Write ``models/<name>.py`` (atomically); refuse to replace one unless ``force``."""
    target = root / "models" / f"{request.name}.py"
    if target.exists() and not force:
        raise UsageError(f"{target} exists; pass --force to replace it (its golden data stays until you rebuild it)")
    target.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(target, render(request, info))
    return target


def init(root: Path, request: Request, force: bool, threads: int, timeout_s: float = 600.0) -> tuple[Path, dict]:
    """Look at the model in a worker and write its spec; returns the file written and what was found."""
    from parity.platform.cache_dir import cache_root
    from parity.platform.errors import ParityError
    from parity.run.worker import TaskFailed, WorkerPool

    check_name(request.name)
    target = root / "models" / f"{request.name}.py"
    if target.exists() and not force:
        raise UsageError(f"{target} exists; pass --force to replace it (its golden data stays until you rebuild it)")
    labelled = False
    if request.inputs_file:
        facts = npz_facts(root / request.inputs_file, request.input_name or "x")
        labelled = facts["labelled"]
        if request.input_shape is None:
            check_batched(request.input_name or "x", facts["shape"], request.inputs_file)
            request = _with(request, input_shape=(min(facts["shape"][0], 32), *facts["shape"][1:]),
                            input_dtype="float32" if facts["dtype"].startswith("float") else facts["dtype"])
    with WorkerPool(threads, cache_root() / "logs", timeout_s) as pool:
        try:
            if request.kind == "onnx":
                graph = pool.call("onnx", "parity.model.inspect:inspect_model", kind="onnx", reference=request.reference,
                                  root=str(root), input_name=request.input_name, shape=None, dtype=request.input_dtype,
                                  given={"test_data": request.test_data, "polygraphy_inputs": request.polygraphy_inputs})
                request = _onnx_input(request, graph)
            if request.input_shape is None:
                raise UsageError("give the model's input with --input NAME=BATCHxDIMx... (e.g. x=1x3x224x224)")
            check_data_size(f"input {request.input_name or 'x'!r}", request.input_shape, request.input_dtype)
            info = pool.call(request.kind, "parity.model.inspect:inspect_model", kind=request.kind,
                             reference=request.reference, root=str(root), input_name=request.input_name or "x",
                             shape=list(request.input_shape), dtype=request.input_dtype,
                             params_file=request.params_file, values=request.input_values)
        except TaskFailed as error:
            raise ParityError(str(error)) from None
    info = {**info, "labelled": labelled}
    request = _integer_range(request, info)
    return write(root, request, info, force), info


def check_batched(name: str, shape, source: str) -> None:
    """Refuse an input without a batch axis (a 0-d scalar): parity's inputs are batch first."""
    if len(shape) == 0:
        raise UsageError(f"input {name!r} of {source} is a scalar (shape ()); parity checks inputs with a batch axis "
                         f"first and does not support scalar inputs yet")


def _integer_range(request: Request, info: dict) -> Request:
    """An integer input's range: declared, else the embedding that reads it (the generated ids must cover it)."""
    if np.dtype(request.input_dtype).kind not in "iu" or request.input_values or request.inputs_file \
            or request.test_data or request.polygraphy_inputs:
        return request
    if not info.get("input_values"):
        name = request.input_name or "x"
        raise UsageError(f"input {name!r} is {request.input_dtype} and no embedding reads it directly: give the number "
                         f"of values its ids take, e.g. --input {name}={'x'.join(map(str, request.input_shape))}:"
                         f"{request.input_dtype}:30522 (ids 0 to 30521)")
    return _with(request, input_values=info["input_values"])


def _with(request: Request, **changes) -> Request:
    return Request(**{**request.__dict__, **changes})


def _onnx_input(request: Request, graph: dict) -> Request:
    """The ONNX graph's own input, its shape from --input, else the data given, else the graph's static shape."""
    name, graph_shape = graph["input_name"], graph["input_shape"]
    if request.input_name and request.input_name != name:
        raise UsageError(f"--input names {request.input_name!r}; the graph's input is {name!r}")
    shape = request.input_shape or graph.get("given_shape")
    if shape is None:
        if any(d is None for d in graph_shape):
            raise UsageError(f"the graph's input {name!r} has dynamic dimensions {graph_shape}: give its shape with "
                             f"--input {name}=BATCHxDIMx...")
        shape = tuple(graph_shape)
    check_batched(name, shape, request.reference)
    if len(shape) != len(graph_shape) or any(g is not None and g != d for g, d in zip(graph_shape, shape)):
        raise UsageError(f"input {name!r} of shape {tuple(shape)} does not fit the graph's {graph_shape}")
    return _with(request, input_name=name, input_shape=tuple(shape), input_dtype=graph["input_dtype"])
