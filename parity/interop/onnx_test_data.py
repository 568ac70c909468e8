"""ONNX test-data folders, read and written.

ONNX test-data folders (ONNX backend tests, onnxruntime's ``onnx_test_runner``): a model folder holds
``test_data_set_0/``, ``test_data_set_1/``, ... each with ``input_0.pb``, ``input_1.pb``, ... and
``output_0.pb``, ...: serialized ``onnx.TensorProto`` whose ``name`` is the graph input or output name.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity.platform.errors import ParityError, one_line
from parity.platform.safefs import owned_tempdir, replace_dir, sweep

if TYPE_CHECKING:
    import numpy as np

_SET = re.compile(r"test_data_set_(0|[1-9]\d*)")
_PB = re.compile(r"(input|output)_(0|[1-9]\d*)\.pb")
SEQUENCE, OPTIONAL = "sequence", "optional"  # graph kinds of values that are not tensors (``graph_kind``)


class InteropError(ParityError):
    """A test-data folder, Polygraphy JSON file or ONNX model that cannot be used as it is."""


@dataclass(frozen=True)
class TestDataSet:
    """One ``test_data_set_N`` folder: its tensors by name, in file order."""

    __test__ = False  # not a pytest test class
    path: Path
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]


# ---------------------------------------------------------------- ONNX test-data folders


def write_test_data(folder, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray], index: int = 0) -> Path:
    """Write ``folder/test_data_set_{index}`` (replacing one that exists) atomically; return it."""
    import numpy as np
    from onnx import numpy_helper

    if index < 0 or not inputs:
        raise InteropError(f"{folder}: a test data set needs an index >= 0 and at least one input")
    folder, target = Path(folder), Path(folder) / f"test_data_set_{index}"
    sweep(folder, r"^\.test_data_set_\d+\.tmp-")
    scratch = owned_tempdir(folder, f".{target.name}.tmp-")
    try:
        for kind, tensors in (("input", inputs), ("output", outputs)):
            for i, (name, array) in enumerate(tensors.items()):
                try:
                    data = numpy_helper.from_array(np.asarray(array), name).SerializeToString()
                except Exception as error:  # noqa: BLE001 - any dtype or value onnx cannot store
                    raise InteropError(
                        f"{target}: {kind} {name!r} cannot be stored as an ONNX tensor: {one_line(error, 120)}"
                    ) from None
                with open(scratch / f"{kind}_{i}.pb", "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
        replace_dir(scratch, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def read_test_data(folder, kinds: dict[str, list] | None = None) -> list[TestDataSet]:
    """Every ``test_data_set_N`` in ``folder``, by N (numeric order). ``kinds``: the graph kind (``graph_kind``) of
    each input and output slot by position (``{"input": [...], "output": [...]}``): a sequence's file is read as a
    ``SequenceProto`` (a list of arrays), an optional's as an ``OptionalProto`` (an array, a list or None)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InteropError(f"{folder}: not a folder of ONNX test data")
    sets = sorted((int(m[1]), p) for p in folder.iterdir() if p.is_dir() and (m := _SET.fullmatch(p.name)))
    if not sets:
        raise InteropError(f"{folder}: no test_data_set_* folders in it (the ONNX test-data layout)")
    return [_read_set(path, kinds or {}) for _, path in sets]


def _read_set(path: Path, kinds: dict) -> TestDataSet:
    found: dict[str, dict[int, Path]] = {"input": {}, "output": {}}
    for file in path.iterdir():
        if m := _PB.fullmatch(file.name):
            found[m[1]][int(m[2])] = file
    if not found["input"] and not found["output"]:  # a graph without inputs has output files alone
        raise InteropError(f"{path}: no input_*.pb or output_*.pb files in it")
    tensors: dict[str, dict[str, Any]] = {}
    for kind, files in found.items():
        if sorted(files) != list(range(len(files))):
            raise InteropError(
                f"{path}: {kind} files are numbered {sorted(files)}; expected "
                f"{kind}_0.pb to {kind}_{len(files) - 1}.pb without gaps"
            )
        tensors[kind] = {}
        for i in range(len(files)):
            slots = kinds.get(kind) or []
            slot = slots[i] if i < len(slots) else None
            name, array = _read_tensor(files[i]) if slot is None else _read_container(files[i], slot)
            name = name or f"{kind}_{i}"
            if name in tensors[kind]:
                raise InteropError(f"{files[i]}: a second {kind} named {name!r} in {path.name}")
            tensors[kind][name] = array
    return TestDataSet(path, tensors["input"], tensors["output"])


def _read_tensor(file: Path) -> tuple[str, np.ndarray]:
    from onnx import TensorProto, numpy_helper

    proto = TensorProto()
    try:
        proto.ParseFromString(file.read_bytes())
        if proto.data_type == TensorProto.UNDEFINED:
            raise ValueError("no element type")
        array = numpy_helper.to_array(proto)
        if proto.data_type == TensorProto.STRING:  # held as unicode: golden data never holds object arrays
            array = unicode(array)
        return proto.name, array
    except Exception as error:  # noqa: BLE001 - OSError, DecodeError, bad or missing data alike
        raise InteropError(f"{file}: not a serialized onnx.TensorProto ({one_line(error, 120)})") from None


def graph_kind(type_proto) -> str | None:
    """``"sequence"``, ``"optional"`` (of a tensor) or ``"optional sequence"`` for an ONNX ``TypeProto`` of those
    kinds (of tensors); None for a tensor; ``"unsupported: <what>"`` for anything else (a map, a sequence of
    sequences), which parity cannot hold as arrays."""
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        return None
    if kind == "sequence_type":
        inner = type_proto.sequence_type.elem_type.WhichOneof("value")
        return SEQUENCE if inner == "tensor_type" else f"unsupported: a sequence of {inner or 'no type'}"
    if kind == "optional_type":
        inner = graph_kind(type_proto.optional_type.elem_type)
        if inner is None:
            return OPTIONAL
        return f"{OPTIONAL} {SEQUENCE}" if inner == SEQUENCE else f"unsupported: an optional of {inner}"
    return f"unsupported: a {kind or 'value of no type'}"


def _read_container(file: Path, kind: str):
    """A sequence or optional file: ``(name, list of arrays | array | None)``, text held as unicode."""
    import numpy as np
    from onnx import OptionalProto, SequenceProto, numpy_helper

    if kind.startswith("unsupported: "):
        raise InteropError(
            f"{file}: the graph's slot is {kind[len('unsupported: ') :]}; parity holds tensors, "
            f"sequences of tensors and optionals of those"
        )
    proto = SequenceProto() if kind == SEQUENCE else OptionalProto()
    what = "onnx.SequenceProto" if kind == SEQUENCE else "onnx.OptionalProto"
    try:
        proto.ParseFromString(file.read_bytes())
        value = numpy_helper.to_list(proto) if kind == SEQUENCE else numpy_helper.to_optional(proto)
    except Exception as error:  # noqa: BLE001 - OSError, DecodeError, a value of another kind alike
        raise InteropError(f"{file}: not a serialized {what} ({one_line(error, 120)})") from None

    def held(item):  # text as unicode, numbers as they are
        item = np.asarray(item)
        return unicode(item) if item.dtype.kind in "OS" else item

    if isinstance(value, list):
        value = [held(item) for item in value]
    elif value is not None:
        value = held(value)
    return proto.name, value


def unicode(array: np.ndarray) -> np.ndarray:
    """``array`` as a fixed-width unicode array, its shape kept: bytes decoded as UTF-8, other items by ``str``
    (golden data never holds object arrays, which need pickles)."""
    import numpy as np

    if array.dtype.kind == "U":
        return array
    items = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.ravel().tolist()]
    return np.array(items, dtype=str).reshape(array.shape) if items else np.zeros(array.shape, "<U1")


def graph_signature(model) -> tuple[dict[str, tuple], list[str]]:
    """(inputs ``{name: (shape, dtype)}``, output names) of an ``onnx.ModelProto``.

    A dim is its value, its symbolic name, or None; shape or dtype is None where the graph does not
    say (non-tensor input, unknown rank). Inputs that are also initializers are left out.
    """
    import numpy as np
    import onnx

    graph = model.graph
    constants = {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}
    inputs = {}
    for value in graph.input:
        if value.name in constants:
            continue
        shape = dtype = None
        if value.type.WhichOneof("value") == "tensor_type":
            tensor = value.type.tensor_type
            if tensor.elem_type == onnx.TensorProto.STRING:
                dtype = "str"  # held as NumPy unicode
            elif tensor.elem_type:
                dtype = str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)))
            if tensor.HasField("shape"):
                shape = tuple(
                    d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim
                )
        inputs[value.name] = (shape, dtype)
    return inputs, [value.name for value in graph.output]


def graph_kinds(model) -> dict[str, list]:
    """The graph kind (``graph_kind``) of each input (initializers left out) and output, by position:
    ``{"input": [...], "output": [...]}``, None for a tensor."""
    graph = model.graph
    constants = {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}
    return {
        "input": [graph_kind(v.type) for v in graph.input if v.name not in constants],
        "output": [graph_kind(v.type) for v in graph.output],
    }


def match_graph(
    sets: list[TestDataSet], graph_inputs: dict[str, tuple], graph_outputs: list[str] | None = None, source: str = ""
) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    """Check each set against the graph; return (inputs, outputs) per set, keyed by the graph's names.

    ``graph_inputs`` is ``{name: (shape, dtype)}`` as from ``graph_signature``; ``source`` names the
    graph in messages. Outputs are re-keyed when ``graph_outputs`` is given (a set without output
    files gives ``{}``), else returned as read.
    """
    import numpy as np

    graph = source or "the graph"
    names = list(graph_inputs)
    feeds, references = [], []
    for s in sets:
        feed = _rekey(s, s.inputs, names, "input", graph)
        for name, (file, array) in feed.items():
            shape, dtype = graph_inputs[name]
            if shape is not None and (
                len(shape) != array.ndim
                or any(isinstance(want, int) and want != got for want, got in zip(shape, array.shape))
            ):
                raise InteropError(
                    f"{file}: input {name!r} has shape {_dims(array.shape)}, {graph} takes {_dims(shape)}"
                )
            if dtype == "str" and array.dtype.kind != "U":
                raise InteropError(f"{file}: input {name!r} has dtype {array.dtype}, {graph} takes strings")
            if dtype is not None and dtype != "str" and np.dtype(dtype) != array.dtype:
                raise InteropError(f"{file}: input {name!r} has dtype {array.dtype}, {graph} takes {np.dtype(dtype)}")
        feeds.append({name: array for name, (_, array) in feed.items()})
        if graph_outputs is None or not s.outputs:
            references.append(dict(s.outputs))
        else:
            references.append(
                {n: a for n, (_, a) in _rekey(s, s.outputs, list(graph_outputs), "output", graph).items()}
            )
    return feeds, references


def _dims(shape) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


def _rekey(
    s: TestDataSet, tensors: dict, names: list[str], kind: str, graph: str
) -> dict[str, tuple[Path, np.ndarray]]:
    """``{graph name: (file, array)}`` in graph order: by name when every tensor names one, else by position."""
    keys = list(tensors)
    if len(keys) != len(names):
        raise InteropError(f"{s.path}: {len(keys)} {kind} files, {graph} has {len(names)} {kind}s {names}")
    files = {key: s.path / f"{kind}_{i}.pb" for i, key in enumerate(keys)}
    if set(keys) == set(names):
        return {name: (files[name], tensors[name]) for name in names}
    for i, key in enumerate(keys):
        if key not in names and key != f"{kind}_{i}":
            raise InteropError(f"{files[key]}: {kind} {key!r} is not an {kind} of {graph} (it has {names})")
        if key in names and key != names[i]:
            raise InteropError(
                f"{files[key]}: {kind} {key!r} is number {i}, {graph} has it as number "
                f"{names.index(key)}; name all {kind}s or none"
            )
    return {name: (files[key], tensors[key]) for name, key in zip(names, keys)}


# ---------------------------------------------------------------- Polygraphy JSON
