"""``parity init``: write ``models/<name>.py`` for a user's model, from what the model itself says.

The model is built and run once in a worker of its framework (a factory that raises, or a model that
rejects the declared input, is an error here, before anything is written); the spec written is short
and meant to be edited: inputs, tolerances, taps.
"""

from __future__ import annotations

import keyword
import re
import unicodedata
from pathlib import Path

import numpy as np

from parity.interop.given import npz_facts
from parity.model import values as value_kinds
from parity.model.user import check_data_size
from parity.pipeline.spec_file import InputDecl, Request, write
from parity.platform.errors import UsageError

INPUT_DTYPES = (
    "float32",
    "float64",
    "float16",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
)
_DIM = r"(?:\d+|[A-Za-z_]\w*)"


def parse_input(text: str) -> InputDecl:
    """``x=1x3x32x32``, ``ids=8x128:int64``, ``ids=8x128:int64:30522``, ``input_ids=2,sequence:int64:30522``,
    ``attention_mask=2,sequence:int64:mask`` or ``x=4x8:float32:-1..1`` -> an ``InputDecl``.

    Dimensions are separated by ``x`` (sizes) or ``,`` (sizes and axis names); the first is the batch. VALUES
    is a number of ids (integers 0 to N-1), ``mask`` (ones with padded tails), or a range ``LOW..HIGH``."""
    match = re.fullmatch(
        r"([A-Za-z_][\w.:/-]*?)=((?:\d+(?:x\d+)*)|(?:" + _DIM + r"(?:," + _DIM + r")*)|)"
        r"(?::(\w+)(?::([\w.+-]+))?)?",
        text.strip(),
    )
    if not match:
        raise UsageError(
            f"--input {text!r} is not NAME=BATCHxDIMx...[:DTYPE[:VALUES]] (e.g. x=1x3x224x224, "
            f"ids=8x128:int64:30522, or with a named axis input_ids=2,sequence:int64:30522)"
        )
    name, dims_text, dtype, values_text = match.group(1), match.group(2), match.group(3) or "float32", match.group(4)
    dims = tuple(
        int(d) if d.isdigit() else d for d in re.split(r"[x,]" if "," not in dims_text else ",", dims_text) if d
    )  # empty: an ONNX scalar
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
            raise UsageError(
                f"--input {text!r}: a number of values ({values_text}) is for integer inputs, and at least 2"
            )
        values = int(values_text)
    return InputDecl(name, dims, dtype, values)


def parse_axis(text: str) -> tuple[str, int]:
    """``sequence=16`` -> the golden size of a named axis."""
    match = re.fullmatch(r"([A-Za-z_]\w*)=(\d+)", text.strip())
    if not match or int(match.group(2)) < 1:
        raise UsageError(f"--axis {text!r} is not NAME=SIZE with a size of at least 1 (e.g. sequence=16)")
    return match.group(1), int(match.group(2))


def is_model_name(name: str) -> bool:
    """Whether ``name`` is a Python identifier of at most 64 characters and no keyword, as Python takes them
    (``模型`` too), in Unicode's composed form (NFC: the form ``SPEC.name`` and its file's name compare equal in)."""
    return (
        name.isidentifier()
        and len(name) <= 64
        and not keyword.iskeyword(name)
        and unicodedata.normalize("NFC", name) == name
    )


def check_name(name: str) -> None:
    """Refuse a model name that is no Python identifier, or that starts with _: ``models/_*.py`` (``__init__.py``
    among them) are helper modules, never listed or loaded as models, so every later command would refuse it."""
    if not is_model_name(name):
        raise UsageError(f"model name {name!r} must be a Python identifier (letters, digits, _), like resnet18")
    if name.startswith("_"):
        raise UsageError(
            f"model name {name!r} must not start with _: models/_*.py are helper modules, not models "
            f"(name it like resnet18)"
        )


def workspace_reference(reference: str, root: Path) -> str:
    """A file reference relative to the workspace where it lies inside it (the spec moves with the folder)."""
    file_part, sep, attribute = (
        reference.rpartition(":") if reference.count(":") and ".py:" in reference else (reference, "", "")
    )
    path = Path(file_part)
    if not (file_part.endswith((".py", ".keras", ".onnx", ".npz", ".h5", ".safetensors")) or path.is_dir()):
        return reference  # package.module:function
    absolute = path.resolve()
    if not absolute.exists():
        raise UsageError(f"{file_part}: no such file")
    try:
        shown = str(absolute.relative_to(root.resolve()))
    except ValueError:
        shown = str(absolute)
    return f"{shown}{sep}{attribute}"


def init(
    root: Path, request: Request, force: bool, threads: int, timeout_s: float | None = None, pool=None
) -> tuple[Path, dict]:
    """Look at the model in a worker and write its spec; returns the file written and what was found. ``pool``: a
    ``WorkerPool`` the caller holds and shares with other work (default: one of its own for this call)."""
    from contextlib import nullcontext

    from parity.platform.cache_dir import cache_root
    from parity.platform.errors import ParityError, TaskFailed
    from parity.run.pool import WorkerPool

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
    with nullcontext(pool) if pool is not None else WorkerPool(threads, cache_root() / "logs", timeout_s) as pool:
        try:
            if request.kind == "onnx":
                graph = pool.call(
                    "onnx",
                    "parity.model.inspect:inspect_model",
                    kind="onnx",
                    reference=request.reference,
                    root=str(root),
                    inputs=[],
                    given={
                        "test_data": request.test_data,
                        "polygraphy_inputs": request.polygraphy_inputs,
                        "polygraphy_outputs": None,
                    },
                )
                if request.inputs_file and not request.inputs:
                    request = _with(request, inputs=_graph_file_inputs(root, request, graph))
                request = _onnx_inputs(request, graph)
                if request.inputs_file:
                    labelled = npz_facts(root / request.inputs_file, [d.name for d in request.inputs])["labelled"]
            if not request.inputs and not (request.kind == "onnx" and not graph["inputs"]):
                raise UsageError(
                    "give the model's inputs with --input NAME=BATCHxDIMx... (e.g. x=1x3x224x224), one "
                    "--input per input"
                )
            _check_axes(request)
            for decl in request.inputs:
                check_data_size(f"input {decl.name!r}", request.concrete(decl), decl.dtype)
            # an ONNX graph was read above, with the data given (a sequence input's elements are the data's)
            info = (
                graph
                if request.kind == "onnx"
                else pool.call(
                    request.kind,
                    "parity.model.inspect:inspect_model",
                    kind=request.kind,
                    reference=request.reference,
                    root=str(root),
                    inputs=request.worker_inputs(),
                    params_file=request.params_file,
                    names_from=names_from,
                    builder=request.builder,
                )
            )
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
        if batched(name):  # an input the graph fixes whole (a scalar too) has no batch axis to check
            check_batched(name, shape, source)
        shape = (min(shape[0], 32), *shape[1:]) if batched(name) else shape
        decls.append(InputDecl(name, shape, "float32" if dtype.startswith("float") else dtype, None, batched(name)))
    sizes = {name: shape[0] for name, (shape, _) in facts["inputs"].items() if batched(name)}
    if len(set(sizes.values())) > 1:
        raise UsageError(f"{source}: the input arrays have different numbers of samples ({sizes})")
    return tuple(decls)


def _graph_file_inputs(root: Path, request: Request, graph: dict) -> tuple[InputDecl, ...]:
    """The inputs of an ONNX graph from a user's ``.npz`` named after them (``x`` too for a one-input graph)."""
    if request.inputs_file is None:
        raise TypeError("_graph_file_inputs needs a request with an inputs file")
    expected = [g["name"] for g in graph["inputs"]]
    given = list(npz_facts(root / request.inputs_file, None)["inputs"])
    if len(expected) == 1 and given == ["x"]:
        given = expected
    if sorted(given) != sorted(expected):
        raise UsageError(
            f"{request.inputs_file} has input arrays {', '.join(given)}; the graph's inputs are "
            f"{', '.join(expected)}: name each array after the input it feeds"
        )
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

    if request.opset is None:
        raise TypeError("_converted needs a request with an opset")
    source = root / request.reference
    model = onnx_source.load_checked(source)
    found = next((e.version for e in model.opset_import if e.domain in ("", "ai.onnx")), None)
    try:
        converted = version_converter.convert_version(model, request.opset)
        converted.ir_version = _lowest_ir_version(converted)
        onnx.checker.check_model(converted, full_check=True)
    except Exception as error:  # noqa: BLE001 - the converter's own refusal, said in one line
        raise ParityError(
            f"{request.reference}: onnx.version_converter cannot take opset {found} to "
            f"{request.opset}: {one_line(f'{type(error).__name__}: {error}', 300)}"
        ) from None
    target = root / "models" / f"{request.name}.opset{request.opset}.onnx"
    target.parent.mkdir(parents=True, exist_ok=True)
    large = converted.ByteSize() > 2**31 - 1 - (1 << 20)
    scratch = target.with_name(f".{target.name}.tmp")
    onnx.save_model(
        converted, str(scratch), save_as_external_data=large, location=f"{target.name}.data" if large else None
    )
    scratch.replace(target)
    return _with(
        request,
        reference=str(target.relative_to(root)),
        converted_from=f"converted from {request.reference} (opset {found}) to opset {request.opset} by "
        f"onnx.version_converter",
    )


# the IR version that introduced an element type (float8 9, int4/uint4 10, float4 11, float8e8m0 12)
_TYPE_IR = {17: 9, 18: 9, 19: 9, 20: 9, 21: 10, 22: 10, 23: 11, 24: 12}


def _lowest_ir_version(model) -> int:
    """The lowest IR version ``model``'s opsets and element types allow, never above its own: the version converter
    moves the opset but keeps the file's IR version, which a runtime may not read (ONNX Runtime 1.31 reads IR 13
    at most, onnx 1.23 writes 14)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    types = {v.type.tensor_type.elem_type for v in (*graph.input, *graph.output, *graph.value_info)}
    types |= {t.data_type for t in graph.initializer}
    types |= {
        a.i for node in graph.node for a in node.attribute if node.op_type in ("Cast", "CastLike") and a.name == "to"
    }
    if any(t > max(_TYPE_IR) for t in types):  # a type newer than this table: keep the file's own version
        return model.ir_version
    needed = max(
        [
            onnx.helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True),
            *(_TYPE_IR.get(t, 3) for t in types),
        ]
    )
    return min(model.ir_version, needed)


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
    """Refuse an input without a batch axis (a 0-d scalar) or without a sample (no rows): parity's inputs are batch
    first, and a check, a metric and a timing each need at least one sample."""
    if len(shape) and shape[0] == 0:
        raise UsageError(
            f"input {name!r} of {source} has no rows (shape {tuple(shape)}); parity checks a batch of at least "
            f"one sample: give it one or more"
        )
    if len(shape) == 0:
        raise UsageError(
            f"input {name!r} of {source} is a scalar (shape ()); parity checks inputs with a batch axis "
            f"first and does not support scalar inputs yet"
        )


def _integer_ranges(request: Request, info: dict) -> Request:
    """Each integer input's values: declared; else a mask for a ``*mask*`` input; else the ids an embedding that
    reads it takes (the generated ids must cover its range). Data given with the model needs none."""
    if request.inputs_file or request.test_data or request.polygraphy_inputs:
        return request
    embedding = info.get("input_values") or {}
    decls = []
    for decl in request.inputs:
        if isinstance(decl.values, int) and decl.name in embedding and decl.values > embedding[decl.name]:
            raise UsageError(
                f"input {decl.name!r}: ids 0 to {decl.values - 1} were declared, but the embedding that "
                f"reads it has {embedding[decl.name]} rows (ids 0 to {embedding[decl.name] - 1})"
            )
        if value_kinds.dtype_kind(decl.dtype) in "iub" and decl.values is None:
            if "mask" in decl.name.lower() or decl.dtype == "bool":
                decl = _with(decl, values="mask")
            elif decl.name in embedding:
                decl = _with(decl, values=int(embedding[decl.name]))
            else:
                shape = ",".join(map(str, decl.shape))
                raise UsageError(
                    f"input {decl.name!r} is {decl.dtype} and no embedding reads it directly: give the "
                    f"number of values its ids take, e.g. --input {decl.name}={shape}:{decl.dtype}:30522 "
                    f"(ids 0 to 30521), or :mask for an attention mask"
                )
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
                raise UsageError(
                    f"the graph's input {name!r} has dynamic dimensions "
                    f"{[a or d for a, d in zip(g['axis_names'], graph_shape)]}: give its shape with "
                    f"--input {name}=BATCHxDIMx..."
                )
            shape = tuple(graph_shape)
        concrete = request.concrete(InputDecl(name, tuple(shape)))
        if len(concrete) != len(graph_shape) or any(g_ is not None and g_ != d for g_, d in zip(graph_shape, concrete)):
            raise UsageError(f"input {name!r} of shape {tuple(shape)} does not fit the graph's {graph_shape}")
        # a string input (fed as NumPy unicode) and the low-precision ones (through ml_dtypes) are an ONNX graph's
        if g["dtype"] not in (*INPUT_DTYPES, "str", *value_kinds.ONNX_ELEMENT_TYPES):
            raise UsageError(
                f"{request.reference}: input {name!r} is a {g['dtype']} tensor; parity feeds "
                f"{', '.join(INPUT_DTYPES)} tensors"
            )
        # a graph with sequences or optionals is taken whole, as its data gives it: they have no batch axis; so is
        # an empty tensor its data gives (shape (0,): a value, not a batch of no samples)
        batched = bool(graph_shape) and graph_shape[0] is None and not graph.get("containers") and shape[0] != 0
        decls.append(InputDecl(name, tuple(shape), g["dtype"], decl.values if decl else None, batched))
    return _with(request, inputs=tuple(decls))
