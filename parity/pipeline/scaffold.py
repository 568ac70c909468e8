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

from parity.interop.given import npz_facts
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
    params_file: str | None = None  # jax: the weights .npz
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
    builder: str | None = None  # the builder helper (default: the kind's own, e.g. keras_file for tf)

    def concrete(self, decl: InputDecl) -> tuple[int, ...]:
        """``decl``'s shape with its named axes at their golden sizes."""
        sizes = dict(self.axes)
        return tuple(sizes[d] if isinstance(d, str) else d for d in decl.shape)

    def worker_inputs(self) -> list[dict]:
        """The declared inputs as a worker task takes them (concrete shapes, values as ``_sample`` reads them)."""
        result = []
        for d in self.inputs:
            values = d.values
            if values == "mask":
                values = {"kind": "mask"}
            elif isinstance(values, tuple):
                kind = "integers" if np.dtype(d.dtype).kind in "iu" else "uniform"
                values = {"kind": kind, "low": values[0], "high": values[1]}
            result.append({"name": d.name, "shape": list(self.concrete(d)), "dtype": d.dtype, "values": values})
        return result


INPUT_DTYPES = ("float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                "uint64", "bool")
_DIM = r"(?:\d+|[A-Za-z_]\w*)"


def parse_input(text: str) -> InputDecl:
    """``x=1x3x32x32``, ``ids=8x128:int64``, ``ids=8x128:int64:30522``, ``input_ids=2,sequence:int64:30522``,
    ``attention_mask=2,sequence:int64:mask`` or ``x=4x8:float32:-1..1`` -> an ``InputDecl``.

    Dimensions are separated by ``x`` (sizes) or ``,`` (sizes and axis names); the first is the batch. VALUES
    is a number of ids (integers 0 to N-1), ``mask`` (ones with padded tails), or a range ``LOW..HIGH``."""
    match = re.fullmatch(r"([A-Za-z_][\w.:/-]*?)=((?:\d+(?:x\d+)*)|(?:" + _DIM + r"(?:," + _DIM + r")*)|)"
                         r"(?::(\w+)(?::([\w.+-]+))?)?", text.strip())
    if not match:
        raise UsageError(f"--input {text!r} is not NAME=BATCHxDIMx...[:DTYPE[:VALUES]] (e.g. x=1x3x224x224, "
                         f"ids=8x128:int64:30522, or with a named axis input_ids=2,sequence:int64:30522)")
    name, dims_text, dtype, values_text = match.group(1), match.group(2), match.group(3) or "float32", match.group(4)
    dims = tuple(int(d) if d.isdigit() else d
                 for d in re.split(r"[x,]" if "," not in dims_text else ",", dims_text) if d)  # empty: an ONNX scalar
    if any(isinstance(d, int) and d < 1 for d in dims):
        raise UsageError(f"--input {text!r}: every dimension must be at least 1")
    if dims and not isinstance(dims[0], int):
        raise UsageError(f"--input {text!r}: the first dimension is the batch size, a number")
    if dtype not in INPUT_DTYPES:
        raise UsageError(f"--input {text!r}: dtype {dtype!r} is not one of {', '.join(INPUT_DTYPES)}")
    integer = np.dtype(dtype).kind in "iub"
    values: int | str | tuple | None = None
    if values_text == "mask":
        values = "mask"
    elif values_text and ".." in values_text:
        try:
            low, high = (float(v) for v in values_text.split(".."))
        except ValueError:
            raise UsageError(f"--input {text!r}: {values_text!r} is not a range LOW..HIGH") from None
        if not high > low:
            raise UsageError(f"--input {text!r}: the range {values_text} is empty")
        values = (low, high)
    elif values_text:
        if not values_text.isdigit() or not integer or int(values_text) < 2:
            raise UsageError(f"--input {text!r}: a number of values ({values_text}) is for integer inputs, and at least 2")
        values = int(values_text)
    return InputDecl(name, dims, dtype, values)


def parse_axis(text: str) -> tuple[str, int]:
    """``sequence=16`` -> the golden size of a named axis."""
    match = re.fullmatch(r"([A-Za-z_]\w*)=(\d+)", text.strip())
    if not match or int(match.group(2)) < 1:
        raise UsageError(f"--axis {text!r} is not NAME=SIZE with a size of at least 1 (e.g. sequence=16)")
    return match.group(1), int(match.group(2))


def check_name(name: str) -> None:
    """Refuse a model name that is no Python identifier, or that starts with _: ``models/_*.py`` (``__init__.py``
    among them) are helper modules, never listed or loaded as models, so every later command would refuse it."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name) or keyword.iskeyword(name):
        raise UsageError(f"model name {name!r} must be a Python identifier (letters, digits, _), like resnet18")
    if name.startswith("_"):
        raise UsageError(f"model name {name!r} must not start with _: models/_*.py are helper modules, not models "
                         f"(name it like resnet18)")


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
    batch = next((d.shape[0] for d in request.inputs if d.batched), 1)
    labelled = info.get("labelled", False)
    if kind == "onnx":
        source = f"onnx_model={_py(request.reference)}"
    elif kind == "jax":
        source = f"jax_apply=jax_function({_py(request.reference)}, {_py(request.params_file)}, root=WORKSPACE)"
    else:
        source = f"{ {'torch': 'torch_module', 'tf': 'keras_model'}[kind]}={builder}({_py(request.reference)}, root=WORKSPACE)"
    width = info["output_shapes"][0][-1] if info.get("output_shapes") else 0
    specs = [_input_spec(d) for d in request.inputs]
    spec_imports = ["InputSpec", "ModelSpec", "Tolerance", "Tolerances"] + (["MetricRules"] if labelled and width < 3 else [])
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
        f"    description={_py(f'{kind} model {request.reference}' + (f', {request.converted_from}' if request.converted_from else ''))},",
        f"    {source},",
        "    weights_from_model=True,  # the weights are the model's own, checksummed into the golden data",
        *input_lines,
        *([f"    axes={json.dumps(dict(request.axes))},  # golden sizes of the named axes"] if request.axes else []),
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
        *_layer_lines(layers),
        *([f"    expected_errors={{{_py(JAX_TF_ONNX[0])}: {_py(JAX_TF_ONNX[1])}}},"] if kind == "jax" else []),
        f"    tolerances={{\"fp32\": Tolerances(Tolerance(atol={request.tolerance[0]:g}, rtol={request.tolerance[1]:g}))}},",
        (f"    grad_tolerances={{\"fp32\": Tolerances(Tolerance(atol={DEFAULT_GRAD_TOLERANCE[0]:g}, "
         f"rtol={DEFAULT_GRAD_TOLERANCE[1]:g}))}},"),
        ")",
        "",
    ]
    return "\n".join(lines)


def _input_spec(decl: InputDecl) -> str:
    """``InputSpec(...)`` for one declared input (its shape without the batch axis, or whole where it has none)."""
    shape = tuple(decl.shape[1:]) if decl.batched else tuple(decl.shape)
    text = f"InputSpec({_py(decl.name)}, {_py(shape)}, layout=\"native\", dtype={_py(decl.dtype)}"
    if not decl.batched:
        text += ", batched=False"
    integer = np.dtype(decl.dtype).kind in "iub"
    if decl.values == "mask":
        text += ", values=Values(\"mask\")"
    elif isinstance(decl.values, int):
        text += f", values=Values(\"integers\", low=0, high={decl.values})"
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
    labelled, names_from = False, None
    if request.inputs_file and request.kind != "onnx":
        facts = npz_facts(root / request.inputs_file, [d.name for d in request.inputs] or None)
        labelled = facts["labelled"]
        if not request.inputs:  # the file's arrays are the inputs: the model is asked whether it takes them
            request, names_from = _with(request, inputs=_file_inputs(request.inputs_file, facts)), request.inputs_file
    if request.opset is not None:
        if request.kind != "onnx":
            raise UsageError("--opset converts an ONNX file (--onnx); an exporter's opset is the spec's opset field")
        request = _converted(root, request)
    with WorkerPool(threads, cache_root() / "logs", timeout_s) as pool:
        try:
            if request.kind == "onnx":
                graph = pool.call("onnx", "parity.model.inspect:inspect_model", kind="onnx", reference=request.reference,
                                  root=str(root), inputs=[],
                                  given={"test_data": request.test_data, "polygraphy_inputs": request.polygraphy_inputs,
                                         "polygraphy_outputs": None})
                if request.inputs_file and not request.inputs:
                    request = _with(request, inputs=_graph_file_inputs(root, request, graph))
                request = _onnx_inputs(request, graph)
                if request.inputs_file:
                    labelled = npz_facts(root / request.inputs_file, [d.name for d in request.inputs])["labelled"]
            if not request.inputs and not (request.kind == "onnx" and not graph["inputs"]):
                raise UsageError("give the model's inputs with --input NAME=BATCHxDIMx... (e.g. x=1x3x224x224), one "
                                 "--input per input")
            _check_axes(request)
            for decl in request.inputs:
                check_data_size(f"input {decl.name!r}", request.concrete(decl), decl.dtype)
            info = pool.call(request.kind, "parity.model.inspect:inspect_model", kind=request.kind,
                             reference=request.reference, root=str(root), inputs=request.worker_inputs(),
                             params_file=request.params_file, names_from=names_from)
        except TaskFailed as error:
            raise ParityError(str(error)) from None
    if info.get("input_names"):  # the model's own order (a JAX apply takes its inputs by position)
        order = info["input_names"]
        request = _with(request, inputs=tuple(sorted(request.inputs, key=lambda d: order.index(d.name))))
    info = {**info, "labelled": labelled}
    request = _integer_ranges(request, info)
    return write(root, request, info, force), info


def _file_inputs(source: str, facts: dict, batched=lambda name: True) -> tuple[InputDecl, ...]:
    """One declaration per input array of a user's ``.npz``: its shape (at most 32 samples of a batched one) and
    dtype (floating ones as float32), one batch size for all."""
    decls = []
    for name, (shape, dtype) in facts["inputs"].items():
        check_batched(name, shape, source)
        shape = (min(shape[0], 32), *shape[1:]) if batched(name) else shape
        decls.append(InputDecl(name, shape, "float32" if dtype.startswith("float") else dtype, None, batched(name)))
    sizes = {name: shape[0] for name, (shape, _) in facts["inputs"].items() if batched(name)}
    if len(set(sizes.values())) > 1:
        raise UsageError(f"{source}: the input arrays have different numbers of samples ({sizes})")
    return tuple(decls)


def _graph_file_inputs(root: Path, request: Request, graph: dict) -> tuple[InputDecl, ...]:
    """The inputs of an ONNX graph from a user's ``.npz`` named after them (``x`` too for a one-input graph)."""
    expected = [g["name"] for g in graph["inputs"]]
    given = list(npz_facts(root / request.inputs_file, None)["inputs"])
    if len(expected) == 1 and given == ["x"]:
        given = expected
    if sorted(given) != sorted(expected):
        raise UsageError(f"{request.inputs_file} has input arrays {', '.join(given)}; the graph's inputs are "
                         f"{', '.join(expected)}: name each array after the input it feeds")
    facts = npz_facts(root / request.inputs_file, expected)
    dynamic = {g["name"]: bool(g["shape"]) and g["shape"][0] is None for g in graph["inputs"]}
    return _file_inputs(request.inputs_file, facts, lambda name: dynamic[name])


def _converted(root: Path, request: Request) -> Request:
    """The ONNX file converted to ``request.opset`` with ``onnx.version_converter``, written beside the spec as
    ``models/<name>.opset<N>.onnx`` (external data kept beside it), checked; the request now names that file."""
    import onnx
    from onnx import version_converter

    from parity.interop import onnx_file as onnx_source
    from parity.platform.errors import ParityError, one_line

    source = root / request.reference
    model = onnx_source.load_checked(source)
    found = next((e.version for e in model.opset_import if e.domain in ("", "ai.onnx")), None)
    try:
        converted = version_converter.convert_version(model, request.opset)
        onnx.checker.check_model(converted, full_check=True)
    except Exception as error:  # noqa: BLE001 - the converter's own refusal, said in one line
        raise ParityError(f"{request.reference}: onnx.version_converter cannot take opset {found} to "
                          f"{request.opset}: {one_line(f'{type(error).__name__}: {error}', 300)}") from None
    target = root / "models" / f"{request.name}.opset{request.opset}.onnx"
    target.parent.mkdir(parents=True, exist_ok=True)
    large = converted.ByteSize() > 2**31 - 1 - (1 << 20)
    scratch = target.with_name(f".{target.name}.tmp")
    onnx.save_model(converted, str(scratch), save_as_external_data=large,
                    location=f"{target.name}.data" if large else None)
    scratch.replace(target)
    return _with(request, reference=str(target.relative_to(root)),
                 converted_from=f"converted from {request.reference} (opset {found}) to opset {request.opset} by "
                                f"onnx.version_converter")


def _check_axes(request: Request) -> None:
    """Every named axis sized, every size named by an input, one batch size."""
    sizes = dict(request.axes)
    named = {d for decl in request.inputs for d in decl.shape if isinstance(d, str)}
    unsized = sorted(named - set(sizes))
    if unsized:
        raise UsageError(f"axis {unsized[0]!r} has no size: give it with --axis {unsized[0]}=SIZE")
    unused = sorted(set(sizes) - named)
    if unused:
        raise UsageError(f"--axis {unused[0]} names no axis of the inputs")
    batches = {decl.shape[0] for decl in request.inputs if decl.batched}
    if len(batches) > 1:
        raise UsageError(f"the inputs have different batch sizes {sorted(batches)}; give them one batch size")
    names = [decl.name for decl in request.inputs]
    if len(set(names)) != len(names):
        raise UsageError(f"input {next(n for n in names if names.count(n) > 1)!r} is declared twice")


def check_batched(name: str, shape, source: str) -> None:
    """Refuse an input without a batch axis (a 0-d scalar): parity's inputs are batch first."""
    if len(shape) == 0:
        raise UsageError(f"input {name!r} of {source} is a scalar (shape ()); parity checks inputs with a batch axis "
                         f"first and does not support scalar inputs yet")


def _integer_ranges(request: Request, info: dict) -> Request:
    """Each integer input's values: declared; else a mask for a ``*mask*`` input; else the ids an embedding that
    reads it takes (the generated ids must cover its range). Data given with the model needs none."""
    if request.inputs_file or request.test_data or request.polygraphy_inputs:
        return request
    embedding = info.get("input_values") or {}
    decls = []
    for decl in request.inputs:
        if isinstance(decl.values, int) and decl.name in embedding and decl.values > embedding[decl.name]:
            raise UsageError(f"input {decl.name!r}: ids 0 to {decl.values - 1} were declared, but the embedding that "
                             f"reads it has {embedding[decl.name]} rows (ids 0 to {embedding[decl.name] - 1})")
        if np.dtype(decl.dtype).kind in "iub" and decl.values is None:
            if "mask" in decl.name.lower() or decl.dtype == "bool":
                decl = _with(decl, values="mask")
            elif decl.name in embedding:
                decl = _with(decl, values=int(embedding[decl.name]))
            else:
                shape = ",".join(map(str, decl.shape))
                raise UsageError(f"input {decl.name!r} is {decl.dtype} and no embedding reads it directly: give the "
                                 f"number of values its ids take, e.g. --input {decl.name}={shape}:{decl.dtype}:30522 "
                                 f"(ids 0 to 30521), or :mask for an attention mask")
        decls.append(decl)
    return _with(request, inputs=tuple(decls))


def _with(obj, **changes):
    return type(obj)(**{**obj.__dict__, **changes})


def _onnx_inputs(request: Request, graph: dict) -> Request:
    """The ONNX graph's own inputs (names, dtypes), each one's shape from --input, else the data given, else the
    graph's static shape. An input whose first axis the graph leaves dynamic is batched; one the graph fixes
    whole (a scalar too) has no batch axis: parity never assumes one the model does not have."""
    declared = {d.name: d for d in request.inputs}
    names = [g["name"] for g in graph["inputs"]]
    unknown = [name for name in declared if name not in names]
    if unknown:
        raise UsageError(f"--input names {unknown[0]!r}; the graph's inputs are {', '.join(names)}")
    decls = []
    for g in graph["inputs"]:
        name, graph_shape = g["name"], g["shape"]
        decl = declared.get(name)
        shape = decl.shape if decl else g.get("given_shape")
        if shape is None:
            if any(d is None for d in graph_shape):
                raise UsageError(f"the graph's input {name!r} has dynamic dimensions "
                                 f"{[a or d for a, d in zip(g['axis_names'], graph_shape)]}: give its shape with "
                                 f"--input {name}=BATCHxDIMx...")
            shape = tuple(graph_shape)
        concrete = request.concrete(InputDecl(name, tuple(shape)))
        if len(concrete) != len(graph_shape) or any(g_ is not None and g_ != d for g_, d in zip(graph_shape, concrete)):
            raise UsageError(f"input {name!r} of shape {tuple(shape)} does not fit the graph's {graph_shape}")
        if g["dtype"] not in (*INPUT_DTYPES, "str"):  # a string input: an ONNX graph's, fed as NumPy unicode
            raise UsageError(f"{request.reference}: input {name!r} is a {g['dtype']} tensor; parity feeds "
                             f"{', '.join(INPUT_DTYPES)} tensors")
        batched = bool(graph_shape) and graph_shape[0] is None
        decls.append(InputDecl(name, tuple(shape), g["dtype"], decl.values if decl else None, batched))
    return _with(request, inputs=tuple(decls))


def _layer_lines(layers: dict) -> list[str]:
    """``layers={...}``: the kind ``init`` found for each tap, so ``parity diagnose`` tests causes on it; ``params=``
    the prefix of its weights as golden build names them (the tap's own name), for the kinds that read weights."""
    if not layers:
        return []
    lines = ["    # layers: the kind of each tap init recognised; the diagnosis recomputes it and tests known variants",
             "    layers={"]
    for tap, layer in layers.items():
        pairs = ", ".join(f"{_py(k)}: {_py(v)}" for k, v in layer["attrs"].items())
        attrs = f", {{{pairs}}}" if pairs else ""
        params = f", params={_py(layer['params'])}" if layer.get("params") else ""
        lines.append(f"        {_py(tap)}: Layer({_py(layer['kind'])}{attrs}{params}),")
    return [*lines, "    },"]
