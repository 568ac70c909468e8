"""The spec file ``parity init`` writes: what it was asked (``Request``, one ``InputDecl`` per input) and the text of
``models/<name>.py`` (``render``), written atomically (``write``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from parity.check import noise_floor
from parity.model import values as value_kinds
from parity.platform.errors import UsageError
from parity.platform.safefs import write_text_atomic
from parity.report.escape import escaped

DEFAULT_TOLERANCE = (1e-4, 1e-4)  # atol, rtol of outputs where no float32 noise floor is measured
FLOOR_FACTOR = noise_floor.FACTOR  # outputs: this many times the float32 noise floor, the factor a path is flagged at
DEFAULT_GRAD_TOLERANCE = (1e-5, 1e-3)
BUILDERS = {"torch": "torch_factory", "tf": "keras_file", "jax": "jax_function", "onnx": None}
# a known converter limit, declared as the zoo declares it (see models/mlp.py)
JAX_TF_ONNX = ("jax/tf/onnx/*", "jax2tf serialises through XlaCallModule, which tf2onnx cannot convert")
TAP_ORIGIN = {
    "torch": "the model's top-level submodules (named children)",
    "tf": "the Keras model's layers",
    "jax": "the names your apply function passes to tap(name, value)",
    "onnx": "none by default (a tap is a layer name the graph's node names carry)",
}


@dataclass(frozen=True)
class InputDecl:
    """One input as ``--input`` declares it: shape batch first (a string entry names a dynamic axis, sized by
    ``Request.axes``), dtype, and the values generated data takes (``None``; an int: ids 0 to N-1; ``"mask"``:
    an attention mask; ``(low, high)``: a uniform or integer range)."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str = "float32"
    values: int | str | tuple[float, float] | None = None
    batched: bool = True  # False: the shape is the whole shape, with no batch axis (an ONNX graph that fixes it)


@dataclass(frozen=True)
class Request:
    """What ``parity init`` was asked: the source (``kind`` + ``reference``), the inputs, the data."""

    name: str
    kind: str  # torch, tf, jax, onnx
    reference: str  # module:function, file.py:function, a .keras file or an .onnx file
    params_file: str | None = None  # jax: the weights .npz; torch: the safetensors file or folder (--weights)
    inputs: tuple[InputDecl, ...] = ()
    axes: tuple[tuple[str, int], ...] = ()  # golden sizes of named axes
    inputs_file: str | None = None
    test_data: str | None = None
    polygraphy_inputs: str | None = None
    polygraphy_outputs: str | None = None
    seed: int = 0
    opset: int | None = None  # onnx: convert the file to this opset first (onnx.version_converter)
    converted_from: str | None = None  # onnx: the file and opset the converted one was made from
    tolerance: tuple[float, float] = DEFAULT_TOLERANCE  # atol, rtol of the outputs
    floor: float = FLOOR_FACTOR  # outputs at this many times their float32 noise floor; 0: at ``tolerance``
    builder: str | None = None  # the builder helper (default: the kind's own, e.g. keras_file for tf)

    def concrete(self, decl: InputDecl) -> tuple[int, ...]:
        """``decl``'s shape with its named axes at their golden sizes."""
        sizes = dict(self.axes)
        return tuple(sizes[d] if isinstance(d, str) else d for d in decl.shape)

    def worker_inputs(self) -> list[dict]:
        """The declared inputs as a worker task takes them (concrete shapes, values as ``_sample`` reads them)."""
        result = []
        for d in self.inputs:
            values: int | str | tuple[float, float] | dict[str, object] | None = d.values
            if values == "mask":
                values = {"kind": "mask"}
            elif isinstance(values, tuple):
                kind = "integers" if np.dtype(d.dtype).kind in "iu" else "uniform"
                values = {"kind": kind, "low": values[0], "high": values[1]}
            result.append({"name": d.name, "shape": list(self.concrete(d)), "dtype": d.dtype, "values": values})
        return result


def _py(value) -> str:
    """A Python literal with double-quoted strings (the style of the zoo's model files)."""
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, tuple):
        return "(" + ", ".join(_py(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def _string(text: str) -> str:
    """``text`` as a double-quoted Python literal that reads back as ``text``: printable characters as they are
    (an emoji too, written as UTF-8, never as a pair of surrogate escapes, which Python reads as two characters),
    others escaped (a lone surrogate, from a file name that is no UTF-8, as ``\\udcXX``, which ``os.fsencode``
    turns back into the name's byte)."""
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        else:
            out.append(char if char.isprintable() else escaped(char))
    return '"' + "".join(out) + '"'


def render(request: Request, info: dict) -> str:
    """The text of ``models/<name>.py``."""
    kind, builder = request.kind, request.builder or BUILDERS[request.kind]
    if kind == "tf" and not request.builder and not request.reference.endswith((".keras", ".h5")):
        builder = "keras_factory"  # ``file.py:make``: a function returning the model (custom layers in its code)
    batch = next((d.shape[0] for d in request.inputs if d.batched), 1)
    labelled = info.get("labelled", False)
    if kind == "onnx":
        source = f"onnx_model={_py(request.reference)}"
    elif kind == "jax":
        source = f"jax_apply=jax_function({_py(request.reference)}, {_py(request.params_file)}, root=WORKSPACE)"
    else:
        weights = f", weights={_py(request.params_file)}" if kind == "torch" and request.params_file else ""
        source = (
            f"{ {'torch': 'torch_module', 'tf': 'keras_model'}[kind] }="
            f"{builder}({_py(request.reference)}, root=WORKSPACE{weights})"
        )
    width = info["output_shapes"][0][-1] if info.get("output_shapes") else 0
    specs = [_input_spec(d) for d in request.inputs]
    spec_imports = ["InputSpec", "ModelSpec", "Tolerance", "Tolerances"] + (
        ["MetricRules"] if labelled and width < 3 else []
    )
    if any("Values(" in text for text in specs):
        spec_imports.append("Values")
    layers = info.get("layers") or {}
    if layers:
        spec_imports.append("Layer")
    if not specs:  # an ONNX graph that takes no input: its outputs are computed and compared whole
        input_lines = ["    input=(),  # the graph takes no input"]
    elif len(specs) == 1:
        input_lines = [f"    input={specs[0]},"]
    else:
        input_lines = ["    input=(", *[f"        {text}," for text in specs], "    ),"]
    lines = [
        f'"""{request.name}: a {kind} model ({_string(request.reference)[1:-1]}), written by `parity init`; edit freely.',
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
        f"    description={_py(f'{kind} model {request.reference}' + (f', {request.converted_from}' if request.converted_from else ''))},",
        f"    {source},",
        "    weights_from_model=True,  # the weights are the model's own, checksummed into the golden data",
        *input_lines,
        *([f"    axes={json.dumps(dict(request.axes))},  # golden sizes of the named axes"] if request.axes else []),
        f"    batch_size={batch},",
        f"    inputs={_input_data(request)},",
        f"    outputs={_py(tuple(info['outputs']))},",
        *(
            [f"    containers={info['containers']!r},  # the graph's sequence and optional inputs and outputs"]
            if info.get("containers")
            else []
        ),
    ]
    if labelled:
        lines.append(f"    num_classes={width},")
        if width < 3:
            lines.append(f"    metric_rules=MetricRules(top_k={width}),")
    loss = '"cross_entropy"' if labelled else "None"
    lines += [
        f'    loss={loss},  # "cross_entropy" of the first output checks gradients; it needs labels',
        f"    # taps: {TAP_ORIGIN[kind]}; `parity diagnose` compares each one",
        f"    taps={_py(tuple(info.get('taps') or ()))},",
        "    # the diagnosis also descends the model's own tree (every module); tree_skip=(...) names modules it leaves out",
        *_layer_lines(layers),
        *([f"    expected_errors={{{_py(JAX_TF_ONNX[0])}: {_py(JAX_TF_ONNX[1])}}},"] if kind == "jax" else []),
        *_tolerance_lines(request),
        (
            f'    grad_tolerances={{"fp32": Tolerances(Tolerance(atol={DEFAULT_GRAD_TOLERANCE[0]:g}, '
            f"rtol={DEFAULT_GRAD_TOLERANCE[1]:g}))}},"
        ),
        ")",
        "",
    ]
    return "\n".join(lines)


def _tolerance_lines(request: Request) -> list[str]:
    """``tolerances=``: the outputs at ``request.floor`` times their float32 noise floor (said in a comment), the
    numbers of ``request.tolerance`` where none is measured; or at those numbers alone (``floor`` 0)."""
    numbers = f"Tolerance(atol={request.tolerance[0]:g}, rtol={request.tolerance[1]:g})"
    if not request.floor:
        return [f'    tolerances={{"fp32": Tolerances({numbers})}},']
    factor = f"{request.floor:g}"
    return [
        f"    # fp32 outputs: each {factor}x its float32 noise floor, which `parity golden build` measures (the model in",
        f"    # float32 against its float64 reference: atol {factor}x its largest error, rtol {factor} float32 epsilons);",
        "    # the numbers where none is measured. Without floor=, the numbers are the tolerance.",
        f'    tolerances={{"fp32": Tolerances({numbers}, floor={factor})}},',
    ]


def _input_spec(decl: InputDecl) -> str:
    """``InputSpec(...)`` for one declared input (its shape without the batch axis, or whole where it has none)."""
    shape = tuple(decl.shape[1:]) if decl.batched else tuple(decl.shape)
    text = f'InputSpec({_py(decl.name)}, {_py(shape)}, layout="native", dtype={_py(decl.dtype)}'
    if not decl.batched:
        text += ", batched=False"
    integer = value_kinds.dtype_kind(decl.dtype) in "iub"
    if decl.values == "mask":
        text += ', values=Values("mask")'
    elif isinstance(decl.values, int):
        text += f', values=Values("integers", low=0, high={decl.values})'
    elif isinstance(decl.values, tuple):
        text += f", values=Values({_py('integers' if integer else 'uniform')}, low={decl.values[0]:g}, high={decl.values[1]:g})"
    return text + ")"


def _input_data(request: Request) -> str:
    if request.inputs_file:
        return f"InputData(file={_py(request.inputs_file)})"
    if request.test_data:
        return f"InputData(test_data={_py(request.test_data)})"
    if request.polygraphy_inputs:
        outputs = f", polygraphy_outputs={_py(request.polygraphy_outputs)}" if request.polygraphy_outputs else ""
        return f"InputData(polygraphy_inputs={_py(request.polygraphy_inputs)}{outputs})"
    return f'InputData(distribution="normal", mean=0.0, std=1.0, seed={request.seed})'


def write(root: Path, request: Request, info: dict, force: bool) -> Path:
    """Write ``models/<name>.py`` (atomically); refuse to replace one unless ``force``."""
    target = root / "models" / f"{request.name}.py"
    if target.exists() and not force:
        raise UsageError(f"{target} exists; pass --force to replace it (its golden data stays until you rebuild it)")
    target.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(target, render(request, info))
    return target


def _layer_lines(layers: dict) -> list[str]:
    """``layers={...}``: the kind ``init`` found for each tap, so ``parity diagnose`` tests causes on it; ``params=``
    the prefix of its weights as golden build names them (the tap's own name), for the kinds that read weights."""
    if not layers:
        return []
    lines = [
        "    # layers: the kind of each tap init recognised; the diagnosis recomputes it and tests known variants",
        "    layers={",
    ]
    for tap, layer in layers.items():
        pairs = ", ".join(f"{_py(k)}: {_py(v)}" for k, v in layer["attrs"].items())
        attrs = f", {{{pairs}}}" if pairs else ""
        params = f", params={_py(layer['params'])}" if layer.get("params") else ""
        lines.append(f"        {_py(tap)}: Layer({_py(layer['kind'])}{attrs}{params}),")
    return [*lines, "    },"]
