"""A user's ONNX file as a source model, and its reference outputs from ``onnx.reference``.

``load_checked`` refuses a file that is missing, does not parse, fails the full ONNX checker (unless only the
checker's type inference refuses it and ONNX Runtime loads it) or lacks its external data, always with one line
naming the file. ``to_float64`` rewrites a model to
compute in float64 (every float tensor type, initializer, constant and cast target, in subgraphs
and local functions too); ``float64_reference`` runs that copy and falls back to float32, with the
reason, when the float64 run fails (an op with no float64 kernel in ``onnx.reference``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity.platform.errors import ParityError, one_line

if TYPE_CHECKING:
    import numpy as np

if TYPE_CHECKING:
    import onnx

# TensorProto.DataType values (stable protobuf enums; ``onnx`` is imported lazily).
DOUBLE = 11
FLOATS = frozenset({1, 10, 16})  # FLOAT, FLOAT16, BFLOAT16
# int attributes naming an element type, on ops of the default domain (not BitCast: bit layout)
_DTYPE_ATTRIBUTES = frozenset({"to", "dtype", "output_datatype", "output_dtype"})
# ops whose dtype attribute, when absent, means FLOAT
_FLOAT_BY_DEFAULT = {
    "RandomNormal": "dtype",
    "RandomUniform": "dtype",
    "HannWindow": "output_datatype",
    "HammingWindow": "output_datatype",
    "BlackmanWindow": "output_datatype",
    "MelWeightMatrix": "output_datatype",
    "SequenceEmpty": "dtype",
}


class OnnxFileError(ParityError):
    """An ONNX file that cannot be used as a source model."""


def load_checked(path) -> onnx.ModelProto:
    """The ONNX model at ``path`` with its external data loaded, after the full ONNX checker."""
    import onnx

    path = Path(path)
    if not path.exists():
        raise OnnxFileError(f"{path}: no such file")
    if not path.is_file():
        raise OnnxFileError(f"{path}: not a file")
    outside = [location for location in external_locations(path) if not _inside(path.parent, location)]
    if outside:
        raise OnnxFileError(
            f"{path}: external data {outside[0]!r} lies outside the model's folder; parity reads data "
            f"files only beside the model"
        )
    try:
        model = onnx.load(str(path), load_external_data=True)
    except Exception as error:  # noqa: BLE001 - a parse error or missing external data
        try:
            bare = onnx.load(str(path), load_external_data=False)
        except Exception:  # noqa: BLE001 - the file itself does not parse
            raise OnnxFileError(f"{path}: not an ONNX model ({_reason(error)})") from None
        missing = sorted(
            {
                entry.value
                for tensor in _external_tensors(bare)
                for entry in tensor.external_data
                if entry.key == "location" and not (path.parent / entry.value).is_file()
            }
        )
        what = (
            f"external data file(s) missing: {', '.join(missing)}"
            if missing
            else f"external data cannot be loaded ({_reason(error)})"
        )
        raise OnnxFileError(f"{path}: {what}") from None
    if not model.HasField("graph"):
        raise OnnxFileError(f"{path}: not an ONNX model (no graph)")
    checked = model if model.ByteSize() < 2**31 - 1 else str(path)
    try:
        onnx.checker.check_model(checked, full_check=True)
    except Exception as error:  # noqa: BLE001 - ValidationError, InferenceError, ...
        text = str(error).split("==> Context")[0].strip() or type(error).__name__  # the message, not its node dump
        if not _inference_only(onnx, checked, path):
            raise OnnxFileError(f"{path}: fails the ONNX checker: {one_line(text, 300)}") from None
    return model


def _inference_only(onnx, checked, path: Path) -> bool:
    """Whether a file the full checker refuses is refused by its type and shape inference only (the structural
    check passes) and ONNX Runtime loads it all the same: the checker's inference is then what is wrong (onnx 1.23
    cannot infer through some function ops' bodies, MeanVarianceNormalization's among them), and the file is taken."""
    try:
        onnx.checker.check_model(checked, full_check=False)
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - structurally invalid, no ONNX Runtime here, or ONNX Runtime refuses it too
        return False
    return True


def to_float64(model) -> onnx.ModelProto:
    """A copy of ``model`` computing in float64: FLOAT/FLOAT16/BFLOAT16 become DOUBLE everywhere."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    _graph(out.graph)
    for function in out.functions:
        for info in function.value_info:
            _type(info.type)
        for attribute in function.attribute_proto:
            _attribute(attribute, "")
        _nodes(function.node)
    return out


def reference_outputs(model, feeds: dict[str, np.ndarray], dtype: str) -> dict[str, Any]:
    """``onnx.reference`` outputs of ``model`` by graph output name, run in ``dtype`` ("float32"
    runs the model as it is, "float64" its ``to_float64`` copy); float feeds are cast to the
    graph inputs' declared types."""
    import numpy as np
    from onnx.reference import ReferenceEvaluator

    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype {dtype!r} is not 'float32' or 'float64'")
    if dtype == "float64":
        model = to_float64(model)
    declared = {i.name: i.type for i in model.graph.input}
    feeds = {name: _cast(value, declared[name]) if name in declared else value for name, value in feeds.items()}
    names = [output.name for output in model.graph.output]
    values = ReferenceEvaluator(model, new_ops=_deprecated_ops()).run(None, feeds)
    return {
        name: value if value is None or isinstance(value, list) else np.asarray(value)  # sequences, optionals
        for name, value in zip(names, values)
    }


def _deprecated_ops() -> list:
    """Ops the ONNX spec deprecated in favour of another with the same semantics, which ``onnx.reference`` no longer
    implements: the reference computes them as their replacement (``Scatter`` as ``ScatterElements``). Only the
    golden reference does; the ``onnx/onnxref`` path runs onnx.reference as it is."""
    from onnx.reference.ops.op_scatter_elements import ScatterElements

    class Scatter(ScatterElements):  # deprecated at opset 11: "use ScatterElements", the same operator
        op_domain = ""

    return [Scatter]


def float64_reference(model, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], str, str | None]:
    """``(outputs, dtype_used, reason)``: the float64 run, or when that raises, the float32 run
    and why float64 failed. Float outputs are float64 arrays either way."""
    import numpy as np

    try:
        outputs, used, reason = reference_outputs(model, feeds, "float64"), "float64", None
    except Exception as error:  # noqa: BLE001 - any float64 failure falls back to float32
        reason = f"float64 run failed: {_reason(error)}; reference computed in float32"
        outputs, used = reference_outputs(model, feeds, "float32"), "float32"
    floats = {
        o.name
        for o in model.graph.output
        if o.type.WhichOneof("value") == "tensor_type" and o.type.tensor_type.elem_type in FLOATS | {DOUBLE}
    }
    return (
        {name: value.astype(np.float64) if name in floats else value for name, value in outputs.items()},
        used,
        reason,
    )


# --------------------------------------------------------------------------- helpers


def _reason(error: BaseException) -> str:
    return one_line(f"{type(error).__name__}: {error}", 300)


def _cast(value, type_proto):
    """A feed cast to its input's declared float type (tensors, sequences and optionals of them)."""
    import numpy as np
    from onnx.helper import tensor_dtype_to_np_dtype

    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type" and type_proto.tensor_type.elem_type in FLOATS | {DOUBLE}:
        return np.asarray(value).astype(tensor_dtype_to_np_dtype(type_proto.tensor_type.elem_type))
    if kind == "tensor_type" and isinstance(value, np.ndarray) and value.dtype.kind == "U":
        return value.astype(object)  # the evaluator's string kernels take Python strings
    if kind == "sequence_type" and isinstance(value, (list, tuple)):
        return [_cast(item, type_proto.sequence_type.elem_type) for item in value]
    if kind == "optional_type" and value is not None:
        return _cast(value, type_proto.optional_type.elem_type)
    return value


def external_locations(path) -> list[str]:
    """The external data files an ONNX file names (relative to its folder), in order, each once; none for a file
    that does not parse (``load_checked`` says why)."""
    import onnx

    try:
        bare = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - reported by load_checked
        return []
    return list(
        dict.fromkeys(
            entry.value
            for tensor in _external_tensors(bare)
            for entry in tensor.external_data
            if entry.key == "location"
        )
    )


def _inside(folder: Path, location: str) -> bool:
    target = (Path(folder) / location).resolve()
    return Path(location).is_absolute() is False and Path(folder).resolve() in target.parents


def source_digest(path) -> str:
    """sha256 of an ONNX source: of the file alone, or, where it keeps tensors in external data files, of the
    file's and each data file's sha256 together (a changed data file is a changed model)."""
    import hashlib

    from parity.platform.safefs import sha256_file

    path = Path(path)
    own, may_name_files = _sha256_and_scan(path, EXTERNAL_KEY)
    # a file that names an external data file holds the key "location" as plain bytes; one that does not hold them
    # names none, and is hashed without parsing it (importing onnx costs about 0.18 s per process)
    locations = external_locations(path) if may_name_files else []
    if not locations:
        return own
    parts = [own, *(f"{location}:{sha256_file(path.parent / location)}" for location in locations)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


EXTERNAL_KEY = b"location"  # the key of a tensor's external_data entry naming its file, stored as a protobuf string


def _sha256_and_scan(path: Path, needle: bytes) -> tuple[str, bool]:
    """The file's sha256, and whether ``needle`` occurs in its bytes (one pass over the file)."""
    import hashlib

    digest, found, tail = hashlib.sha256(), False, b""
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
            if not found:
                found = needle in tail + block[: len(needle) - 1] or needle in block
                tail = block[-(len(needle) - 1) :]
    return digest.hexdigest(), found


def _external_tensors(model):
    """Top-level initializers and Constant tensors kept in external data (where files are named)."""
    from onnx import AttributeProto, TensorProto

    tensors = [
        *model.graph.initializer,
        *(a.t for node in model.graph.node for a in node.attribute if a.type == AttributeProto.TENSOR),
    ]
    return [tensor for tensor in tensors if tensor.data_location == TensorProto.EXTERNAL]


def _type(type_proto) -> None:
    kind = type_proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        tensor = getattr(type_proto, kind)
        if tensor.elem_type in FLOATS:
            tensor.elem_type = DOUBLE
    elif kind in ("sequence_type", "optional_type"):
        _type(getattr(type_proto, kind).elem_type)
    elif kind == "map_type":
        _type(type_proto.map_type.value_type)


def _tensor(tensor) -> None:
    import numpy as np
    from onnx import numpy_helper

    if tensor.data_type in FLOATS:
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64), tensor.name))


def _graph(graph) -> None:
    for info in (*graph.input, *graph.output, *graph.value_info):
        _type(info.type)
    for tensor in graph.initializer:
        _tensor(tensor)
    for sparse in graph.sparse_initializer:
        _tensor(sparse.values)
    _nodes(graph.node)


def _nodes(nodes) -> None:
    from onnx import helper

    for node in nodes:
        op = node.op_type if node.domain in ("", "ai.onnx") else ""
        for attribute in node.attribute:
            _attribute(attribute, op)
        names = {attribute.name for attribute in node.attribute}
        if op == "Constant" and names & {"value_float", "value_floats"}:
            old = next(a for a in node.attribute if a.name in ("value_float", "value_floats"))
            if not old.ref_attr_name:
                dims, values = ([], [old.f]) if old.name == "value_float" else ([len(old.floats)], list(old.floats))
                node.attribute.remove(old)
                node.attribute.append(helper.make_attribute("value", helper.make_tensor("value", DOUBLE, dims, values)))
        elif op == "ConstantOfShape" and "value" not in names:
            node.attribute.append(helper.make_attribute("value", helper.make_tensor("value", DOUBLE, [1], [0.0])))
        elif op in _FLOAT_BY_DEFAULT and _FLOAT_BY_DEFAULT[op] not in names:
            node.attribute.append(helper.make_attribute(_FLOAT_BY_DEFAULT[op], DOUBLE))


def _attribute(attribute, op: str) -> None:
    """Convert one attribute in place; ``op`` is the node's op type, "" outside the default domain."""
    from onnx import AttributeProto as A

    if attribute.ref_attr_name:
        return
    kind = attribute.type
    if kind == A.INT and op and op != "BitCast" and attribute.name in _DTYPE_ATTRIBUTES and attribute.i in FLOATS:
        attribute.i = DOUBLE
    elif kind in (A.TENSOR, A.TENSORS):
        for tensor in [attribute.t] if kind == A.TENSOR else attribute.tensors:
            _tensor(tensor)
    elif kind in (A.SPARSE_TENSOR, A.SPARSE_TENSORS):
        for sparse in [attribute.sparse_tensor] if kind == A.SPARSE_TENSOR else attribute.sparse_tensors:
            _tensor(sparse.values)
    elif kind in (A.GRAPH, A.GRAPHS):
        for graph in [attribute.g] if kind == A.GRAPH else attribute.graphs:
            _graph(graph)
    elif kind in (A.TYPE_PROTO, A.TYPE_PROTOS):
        for type_proto in [attribute.tp] if kind == A.TYPE_PROTO else attribute.type_protos:
            _type(type_proto)
