"""Read and write two foreign formats for model inputs and reference outputs.

ONNX test-data folders (ONNX backend tests, onnxruntime's ``onnx_test_runner``): a model folder holds
``test_data_set_0/``, ``test_data_set_1/``, ... each with ``input_0.pb``, ``input_1.pb``, ... and
``output_0.pb``, ...: serialized ``onnx.TensorProto`` whose ``name`` is the graph input or output name.

Polygraphy JSON (``polygraphy run --save-inputs inputs.json --save-outputs outputs.json``): objects are
JSON dicts tagged ``"polygraphy_class": "<Class>"`` (Polygraphy 0.27-0.29 tagged them
``"__polygraphy_encoded_<Class>": "polygraphy_serialized_json_type"``). An array is
``{"array": base64(np.save bytes), "polygraphy_class": "ndarray"}`` (0.27-0.29: the latin-1 text of
``np.savez`` bytes). ``--save-inputs`` writes a JSON list of feed dicts ``{name: array}``;
``--save-outputs`` writes ``{"lst": [[runner, [IterationResult, ...]], ...], "polygraphy_class":
"RunResults"}``, an IterationResult being ``{"outputs": {name: {"values": array, "polygraphy_class":
"LazyArray"}}, "runtime": s, "runner_name": runner, ...}`` (``LazyNumpyArray`` before 0.49, plain
arrays before 0.28). Polygraphy before 0.27 pickled whole files, and torch tensors are torch.save
pickles: parity refuses both, it never unpickles anything.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from parity.errors import ParityError, one_line
from parity.safefs import owned_tempdir, replace_dir, sweep, write_text_atomic

_SET = re.compile(r"test_data_set_(0|[1-9]\d*)")
_PB = re.compile(r"(input|output)_(0|[1-9]\d*)\.pb")
_LEGACY_PREFIX, _LEGACY_MARKER = "__polygraphy_encoded_", "polygraphy_serialized_json_type"
_NO_PICKLE = "parity never unpickles"
_RESAVE = ("re-save with Polygraphy 0.30 or later, which stores arrays with np.save "
           "(polygraphy run ... --save-inputs inputs.json --save-outputs outputs.json)")


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
                    raise InteropError(f"{target}: {kind} {name!r} cannot be stored as an ONNX tensor: "
                                       f"{one_line(error, 120)}") from None
                with open(scratch / f"{kind}_{i}.pb", "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
        replace_dir(scratch, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def read_test_data(folder) -> list[TestDataSet]:
    """Every ``test_data_set_N`` in ``folder``, by N (numeric order)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InteropError(f"{folder}: not a folder of ONNX test data")
    sets = sorted((int(m[1]), p) for p in folder.iterdir() if p.is_dir() and (m := _SET.fullmatch(p.name)))
    if not sets:
        raise InteropError(f"{folder}: no test_data_set_* folders in it (the ONNX test-data layout)")
    return [_read_set(path) for _, path in sets]


def _read_set(path: Path) -> TestDataSet:
    found: dict[str, dict[int, Path]] = {"input": {}, "output": {}}
    for file in path.iterdir():
        if m := _PB.fullmatch(file.name):
            found[m[1]][int(m[2])] = file
    if not found["input"]:
        raise InteropError(f"{path}: no input_*.pb files in it")
    tensors = {}
    for kind, files in found.items():
        if sorted(files) != list(range(len(files))):
            raise InteropError(f"{path}: {kind} files are numbered {sorted(files)}; expected "
                               f"{kind}_0.pb to {kind}_{len(files) - 1}.pb without gaps")
        tensors[kind] = {}
        for i in range(len(files)):
            name, array = _read_tensor(files[i])
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
        return proto.name, numpy_helper.to_array(proto)
    except Exception as error:  # noqa: BLE001 - OSError, DecodeError, bad or missing data alike
        raise InteropError(f"{file}: not a serialized onnx.TensorProto ({one_line(error, 120)})") from None


def graph_signature(model) -> tuple[dict[str, tuple], list[str]]:
    """(inputs ``{name: (shape, dtype)}``, output names) of an ``onnx.ModelProto``.

    A dim is its value, its symbolic name, or None; shape or dtype is None where the graph does not
    say (non-tensor input, unknown rank). Inputs that are also initializers are left out.
    """
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
            if tensor.elem_type:
                dtype = str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)))
            if tensor.HasField("shape"):
                shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                              for d in tensor.shape.dim)
        inputs[value.name] = (shape, dtype)
    return inputs, [value.name for value in graph.output]


def match_graph(sets: list[TestDataSet], graph_inputs: dict[str, tuple], graph_outputs: list[str] | None = None,
                source: str = "") -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    """Check each set against the graph; return (inputs, outputs) per set, keyed by the graph's names.

    ``graph_inputs`` is ``{name: (shape, dtype)}`` as from ``graph_signature``; ``source`` names the
    graph in messages. Outputs are re-keyed when ``graph_outputs`` is given (a set without output
    files gives ``{}``), else returned as read.
    """
    graph = source or "the graph"
    names = list(graph_inputs)
    feeds, references = [], []
    for s in sets:
        feed = _rekey(s, s.inputs, names, "input", graph)
        for name, (file, array) in feed.items():
            shape, dtype = graph_inputs[name]
            if shape is not None and (len(shape) != array.ndim or any(
                    isinstance(want, int) and want != got for want, got in zip(shape, array.shape))):
                raise InteropError(f"{file}: input {name!r} has shape {_dims(array.shape)}, {graph} takes {_dims(shape)}")
            if dtype is not None and np.dtype(dtype) != array.dtype:
                raise InteropError(f"{file}: input {name!r} has dtype {array.dtype}, {graph} takes {np.dtype(dtype)}")
        feeds.append({name: array for name, (_, array) in feed.items()})
        if graph_outputs is None or not s.outputs:
            references.append(dict(s.outputs))
        else:
            references.append({n: a for n, (_, a) in _rekey(s, s.outputs, list(graph_outputs), "output", graph).items()})
    return feeds, references


def _dims(shape) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


def _rekey(s: TestDataSet, tensors: dict, names: list[str], kind: str, graph: str) -> dict[str, tuple[Path, np.ndarray]]:
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
            raise InteropError(f"{files[key]}: {kind} {key!r} is number {i}, {graph} has it as number "
                               f"{names.index(key)}; name all {kind}s or none")
    return {name: (files[key], tensors[key]) for name, key in zip(names, keys)}


# ---------------------------------------------------------------- Polygraphy JSON

def read_polygraphy_inputs(path) -> list[dict[str, np.ndarray]]:
    """The feed dicts of a ``--save-inputs`` file, one per iteration."""
    data = _load_json(path)
    if _cls(data) == "RunResults":
        raise InteropError(f"{path}: holds Polygraphy RunResults (--save-outputs), not inputs (--save-inputs)")
    if isinstance(data, dict) and _cls(data) is None:
        data = [data]  # Polygraphy also accepts a single feed dict
    if not isinstance(data, list) or not data:
        raise InteropError(f"{path}: not a Polygraphy input file (a JSON list of feed dicts)")
    return [_arrays(feed, f"{path}: iteration {i}") for i, feed in enumerate(data)]


def read_polygraphy_outputs(path, runner: str | None = None) -> list[dict[str, np.ndarray]]:
    """The outputs of ``runner`` (or of the only runner) in a ``--save-outputs`` file, one dict per iteration."""
    data = _load_json(path)
    entries = data.get("lst") if _cls(data) == "RunResults" else None
    if not isinstance(entries, list) or not all(
            isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and isinstance(e[1], list) for e in entries):
        raise InteropError(f"{path}: not a Polygraphy RunResults file (polygraphy run --save-outputs)")
    runners = [name for name, _ in entries]
    if runner is None and len(entries) != 1:
        raise InteropError(f"{path}: holds {len(entries)} runners {runners}; say which one")
    chosen = [e for e in entries if runner is None or e[0] == runner]
    if not chosen:
        raise InteropError(f"{path}: no runner {runner!r}; it holds {runners}")
    name, iterations = chosen[0]  # Polygraphy too takes the first of duplicate names
    if not iterations:
        raise InteropError(f"{path}: runner {name!r} has no iterations")
    results = []
    for i, item in enumerate(iterations):
        where = f"{path}: runner {name!r}, iteration {i}"
        if _cls(item) != "IterationResult" or not isinstance(item.get("outputs"), dict):
            raise InteropError(f"{where}: not a Polygraphy IterationResult")
        results.append(_arrays(item["outputs"], where))
    return results


def write_polygraphy_inputs(path, feeds: list[dict[str, np.ndarray]]) -> None:
    """Write feed dicts as ``polygraphy run --save-inputs`` does (readable by ``--load-inputs``)."""
    write_text_atomic(Path(path), json.dumps([{n: _encode(a, path) for n, a in feed.items()} for feed in feeds], indent=4))


def write_polygraphy_run_results(path, runner_name: str, iterations: list[dict[str, np.ndarray]]) -> None:
    """Write one runner's outputs as ``polygraphy run --save-outputs`` does (``RunResults.load`` reads it)."""
    results = [{"outputs": {name: {"values": _encode(array, path), "polygraphy_class": "LazyArray"}
                            for name, array in outputs.items()},
                "runtime": None, "runner_name": runner_name, "polygraphy_class": "IterationResult"}
               for outputs in iterations]
    write_text_atomic(Path(path), json.dumps({"lst": [[runner_name, results]], "polygraphy_class": "RunResults"}, indent=4))


def _encode(array, path) -> dict:
    buffer = io.BytesIO()
    try:
        np.save(buffer, np.asarray(array), allow_pickle=False)
    except ValueError as error:
        raise InteropError(f"{path}: {one_line(error, 120)} (object arrays cannot be saved without pickling)") from None
    return {"array": base64.b64encode(buffer.getvalue()).decode(), "polygraphy_class": "ndarray"}


def _load_json(path):
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise InteropError(f"{path}: cannot be read ({error.strerror or error})") from None
    if raw[:1] == b"\x80":
        raise InteropError(f"{path}: a pickle file (Polygraphy before 0.27 pickled its data); {_NO_PICKLE}: {_RESAVE}")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise InteropError(f"{path}: not a JSON file ({one_line(error, 100)})") from None


def _cls(obj) -> str | None:
    """The Polygraphy class an encoded object is tagged with, current or legacy tag; None if untagged."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("polygraphy_class"), str):
        return obj["polygraphy_class"]
    return next((k[len(_LEGACY_PREFIX):] for k, v in obj.items()
                 if k.startswith(_LEGACY_PREFIX) and v == _LEGACY_MARKER), None)


def _arrays(obj, where: str) -> dict[str, np.ndarray]:
    if not isinstance(obj, dict) or _cls(obj) is not None or not obj:
        raise InteropError(f"{where}: expected a non-empty dict of named arrays")
    return {name: _array(value, f"{where}, {name!r}") for name, value in obj.items()}


def _array(obj, where: str) -> np.ndarray:
    kind = _cls(obj)
    if kind in ("LazyArray", "LazyNumpyArray"):
        return _array(obj.get("values"), where)
    if kind == "Tensor":
        raise InteropError(f"{where}: a torch.Tensor stored with torch.save, a pickle; {_NO_PICKLE}: "
                           "save NumPy arrays, which Polygraphy stores with np.save")
    if kind != "ndarray" or not isinstance(obj.get("array"), str):
        raise InteropError(f"{where}: not a Polygraphy-encoded array")
    try:
        raw = base64.b64decode(obj["array"], validate=True)
    except ValueError:  # Polygraphy 0.27-0.29: np.savez bytes as latin-1 text
        raw = obj["array"].encode("latin-1", "replace")
    if raw[:1] == b"\x80":
        raise InteropError(f"{where}: the array is a pickle; {_NO_PICKLE}: {_RESAVE}")
    if not raw.startswith((b"\x93NUMPY", b"PK\x03\x04")):
        raise InteropError(f"{where}: the array is neither .npy nor .npz data")
    try:
        loaded = np.load(io.BytesIO(raw), allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                loaded = loaded[loaded.files[0]]
        return loaded
    except Exception as error:  # noqa: BLE001 - numpy and zipfile errors on untrusted bytes
        if "allow_pickle" in str(error):
            raise InteropError(f"{where}: an object array, which only a pickle holds; {_NO_PICKLE}: "
                               "save numeric arrays (np.save with allow_pickle=False, as Polygraphy does)") from None
        raise InteropError(f"{where}: corrupt array data ({one_line(error, 100)})") from None
