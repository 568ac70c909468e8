"""ONNX graph plumbing: float intermediates in topological order, extra graph outputs, one
inference on ONNX Runtime or ``onnx.reference``, and the two runtimes compared tensor by tensor.

A model whose weights lie in a data file beside it (an export past protobuf's 2 GiB, ``parity.exporters.common``) is
read without them (``load``) and edited as the graph alone: a run gives ONNX Runtime the data's folder, OpenVINO a
scratch file beside links to the data, so no copy of the weights is made; only ``onnx.reference``, which computes
from arrays in memory, reads them. Knows nothing of taps (see ``onnx_taps``). Every function imports onnx /
onnxruntime inside; this module imports only NumPy.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from parity.check.closeness import error_stats

RUNTIMES = ("ort", "ort-noopt", "onnxref", "openvino")
_REASON_CHARS = 300  # an error reason is one line of at most this many characters


# --------------------------------------------------------------------------- reading a file


def load(path) -> tuple:
    """``(model, folder)``: the ONNX file at ``path`` with the tensors it keeps in data files left there (``folder``:
    where they lie, for the runs of ``model`` and of copies of it edited in memory), or read whole (``folder``
    None) where it has none."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return model, (Path(path).resolve().parent if external(model) else None)


def external(model) -> bool:
    """Whether ``model`` keeps any tensor's data in a file (and needs the folder of that file to run)."""
    from onnx import TensorProto

    from parity.exporters.common import all_tensors

    return any(t.data_location == TensorProto.EXTERNAL for t in all_tensors(model))


def _data_files(model) -> list[str]:
    from onnx import TensorProto

    from parity.exporters.common import all_tensors

    found = (
        entry.value
        for tensor in all_tensors(model)
        if tensor.data_location == TensorProto.EXTERNAL
        for entry in tensor.external_data
        if entry.key == "location"
    )
    return list(dict.fromkeys(found))


def _check_folder(model, folder) -> None:
    if folder is None and external(model):
        raise ValueError("the model keeps its weights in a data file, and the folder of that file was not given")


def with_data(model, folder):
    """A copy of ``model`` holding every tensor it keeps in data files (for ``onnx.reference``, which computes from
    arrays in memory); ``model`` itself where it keeps none."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    if folder is None or not external(model):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    load_external_data_for_model(copy, str(folder))
    return copy


class Weights(Mapping):
    """``model``'s initializers by name as arrays, each read (from its data file in ``folder`` too) when first asked
    for: a look at a few nodes' weights reads those alone."""

    def __init__(self, model, folder=None):
        self.tensors = {t.name: t for t in model.graph.initializer}
        self.folder, self.read = folder, {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.read:
            from onnx import numpy_helper

            self.read[name] = numpy_helper.to_array(self.tensors[name], str(self.folder or ""))
        return self.read[name]

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)


@contextmanager
def saved_beside(model, folder):
    """The path of ``model`` written to a scratch folder where each of its data files in ``folder`` is a hard link
    (a runtime that reads a file and its data by path: OpenVINO, which refuses data reached through a symbolic link);
    the scratch folder lies in the temporary folder, or beside ``folder`` where links cannot reach across disks."""
    import onnx

    names = _data_files(model)
    scratch = None
    for parent in (None, Path(folder).parent):
        scratch = Path(tempfile.mkdtemp(prefix=".parity-graph-", dir=parent))
        try:
            for name in names:
                target = scratch / name
                target.parent.mkdir(parents=True, exist_ok=True)
                os.link(Path(folder) / name, target)
            break
        except OSError:
            shutil.rmtree(scratch, ignore_errors=True)
            scratch = None
    if scratch is None:
        raise ValueError(f"the model's data files in {folder} cannot be linked into a scratch folder")
    try:
        path = scratch / "model.onnx"
        onnx.save_model(model, str(path))
        yield path
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# --------------------------------------------------------------------------- graph helpers


def _float_types():
    import onnx

    return {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}


def pinned(model, feed: dict, in_place: bool = False):
    """A copy of ``model`` (``in_place``: the model itself, where the caller just read it) whose graph inputs'
    dynamic dims are the sizes of the arrays ``feed`` gives them: shape inference then gives every intermediate the
    static shape it has on that feed (tap mapping compares shapes)."""
    import onnx

    copy = model if in_place else onnx.ModelProto()
    if not in_place:
        copy.CopyFrom(model)
    for graph_input in copy.graph.input:
        value = feed.get(graph_input.name)
        if value is None or not graph_input.type.tensor_type.HasField("shape"):
            continue
        dims = graph_input.type.tensor_type.shape.dim
        if len(dims) == value.ndim:
            for dim, size in zip(dims, value.shape):
                if not dim.HasField("dim_value"):
                    dim.dim_value = int(size)
    return copy


SKELETON_ELEMENTS = 1024  # initializers up to this size keep their values for shape inference (shapes, axes, scales)


def _inferred(model):
    """Shape-inferred copy of ``model``'s graph (never the argument itself), without the values of its weights:
    shape inference reads the values of small constants only (a ``Reshape``'s shape, a ``Slice``'s starts), so each
    initializer of more than ``SKELETON_ELEMENTS`` elements is given to it as a graph input of its type, and a model
    of hundreds of megabytes is not copied (twice) for it. Falls back to the skeleton uninferred on failure."""
    import onnx

    skeleton = _skeleton(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, data_prop=True)
    except Exception:  # noqa: BLE001 - a model inference cannot type is still usable
        inferred = skeleton
    del inferred.graph.input[len(model.graph.input) :]  # the weights given as inputs
    return inferred


def _skeleton(model):
    """``model``'s graph with its large initializers as graph inputs of their types (see ``_inferred``)."""
    import onnx

    skeleton = onnx.ModelProto(ir_version=model.ir_version)
    skeleton.opset_import.extend(model.opset_import)
    skeleton.functions.extend(model.functions)
    graph, bare = model.graph, skeleton.graph
    bare.name = graph.name
    for field in ("node", "input", "output", "value_info", "sparse_initializer"):
        getattr(bare, field).extend(getattr(graph, field))
    declared = {i.name for i in graph.input}
    for tensor in graph.initializer:
        if int(np.prod(tensor.dims)) <= SKELETON_ELEMENTS:
            bare.initializer.append(tensor)
        elif tensor.name not in declared:
            bare.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    return skeleton


def _value_infos(inferred) -> dict:
    graph = inferred.graph
    infos: dict[str, object] = {}
    for info in (*graph.input, *graph.value_info, *graph.output):
        infos.setdefault(info.name, info)
    return infos


def _static_shape(info) -> tuple | None:
    tensor_type = info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    dims = []
    for dim in tensor_type.shape.dim:
        if not dim.HasField("dim_value"):
            return None
        dims.append(int(dim.dim_value))
    return tuple(dims)


class _Graph:
    """What the mapping needs from a model: node order, consumers, float tensors and their shapes."""

    def __init__(self, model):
        inferred = _inferred(model)
        self.infos = infos = _value_infos(inferred)  # every tensor's type, for ``with_outputs``
        floats = _float_types()
        graph = model.graph
        self.nodes = list(graph.node)
        self.graph_outputs = {o.name for o in graph.output}
        self.position: dict[str, int] = {}  # float tensor -> topological position
        self.producer: dict[str, int] = {}  # tensor -> node index
        self.shapes: dict[str, tuple | None] = {}
        self.consumers: dict[str, list[int]] = {}
        self.names: list[str] = []
        for index, node in enumerate(self.nodes):
            for name in node.input:
                if name:
                    self.consumers.setdefault(name, []).append(index)
            for name in node.output:
                if not name:
                    continue
                self.producer[name] = index
                info = infos.get(name)
                if info is None or info.type.tensor_type.elem_type not in floats:
                    continue
                self.position[name] = len(self.names)
                self.names.append(name)
                self.shapes[name] = _static_shape(info)


def outside_inputs(model, nodes) -> list[str]:
    """The tensors ``nodes`` (NodeProtos) read that none of them computes and that are not weights: graph inputs and
    other nodes' outputs, in the order the nodes read them."""
    inside = {t for node in nodes for t in node.output}
    weights = {t.name for t in model.graph.initializer}
    return list(dict.fromkeys(t for node in nodes for t in node.input if t and t not in inside and t not in weights))


def intermediate_names(model) -> list[str]:
    """Every float tensor a node produces, in topological order (graph outputs included;
    initializers and graph inputs are not produced by a node)."""
    return list(_Graph(model).names)


def with_outputs(model, names: list[str], infos: dict | None = None):
    """A copy of ``model`` with ``names`` added as graph outputs (types and shapes from shape inference, or from
    ``infos``: a ``_Graph``'s of the same model); the argument is not changed."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.graph.output.extend(_added_outputs(model, names, infos))
    return copy


def _added_outputs(model, names: list[str], infos: dict | None) -> list:
    """The ``ValueInfoProto``s of ``names`` that are not graph outputs of ``model`` yet."""
    import onnx

    existing = {o.name for o in model.graph.output}
    wanted = [n for n in dict.fromkeys(names) if n not in existing]
    if wanted and infos is None:
        infos = _value_infos(_inferred(model))
    added = []
    for name in wanted:
        info = (infos or {}).get(name)
        if info is not None and info.type.tensor_type.elem_type:
            value = onnx.ValueInfoProto()
            value.CopyFrom(info)
            if hasattr(value, "metadata_props"):
                del value.metadata_props[:]
        else:
            value = onnx.helper.make_empty_tensor_value_info(name)
        added.append(value)
    return added


def serialized_with_outputs(model, data: bytes, names: list[str], infos: dict | None = None) -> bytes:
    """``with_outputs(model, names, infos)`` serialised, from ``data``, the model's own bytes, without serialising
    the model again: protobuf parses two concatenated messages as one merged message, and a merge appends repeated
    fields, so the bytes of a ``ModelProto`` holding only the added graph outputs, appended, add them."""
    import onnx

    delta = onnx.ModelProto()
    delta.graph.output.extend(_added_outputs(model, names, infos))
    return data + delta.SerializeToString()


# ONNX Runtime's session option: where a model read from bytes finds its external data files
EXTERNAL_FOLDER = "session.model_external_initializers_file_folder_path"


def ort_options(threads: int, optimize: bool = True, folder=None):
    """ONNX Runtime's session options for a diagnosis run: ``threads`` intra-op threads, every optimisation on (or
    off), and, for a model given as bytes whose weights lie in data files, the ``folder`` they lie in."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if folder is not None:
        options.add_session_config_entry(EXTERNAL_FOLDER, str(folder))
    return options


def _ort_session(model, threads: int, optimize: bool = True, folder=None, data: bytes | None = None):
    """An ONNX Runtime session of ``model``, from ``data`` (its bytes) where the caller has them."""
    import onnxruntime as ort

    _check_folder(model, folder)
    options = ort_options(threads, optimize, folder)
    data = model.SerializeToString() if data is None else data
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def run_tensors(
    runtime: str,
    model,
    feed: dict,
    names: list[str],
    threads: int = 1,
    infos: dict | None = None,
    folder=None,
    data: bytes | None = None,
) -> dict[str, np.ndarray]:
    """One inference of ``model`` on ``runtime`` (``ort``, ``ort-noopt``, ``onnxref`` or ``openvino``) returning
    ``names`` (OpenVINO: those its ONNX frontend keeps; a tensor it folds away is left out, so the tap is unmapped);
    ``infos``: the tensors' types where the caller has them (``_Graph.infos``), else shape inference finds them
    (ONNX Runtime types its outputs itself: none is given to it); ``folder``: where the data files of a model read
    by ``load`` lie (see the module docstring); ``data``: the bytes of the file ``model`` was read from (and
    ``pinned``), where the caller has them: ONNX Runtime runs them, with the outputs appended
    (``serialized_with_outputs``), as the path's own run does, and the model is not serialised."""
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime {runtime!r} is not one of {RUNTIMES}")
    names = list(dict.fromkeys(names))
    if runtime.startswith("ort"):  # ONNX Runtime types the outputs it is asked for itself: no shape inference
        data = model.SerializeToString() if data is None else data
        extended_data = serialized_with_outputs(model, data, names, {})
        values = _ort_session(model, threads, runtime == "ort", folder, extended_data).run(names, feed)
        return {name: np.asarray(value) for name, value in zip(names, values)}
    extended = with_outputs(model, names, infos)
    if runtime == "openvino":
        from parity.runtimes import openvino

        if folder is not None and external(extended):
            with saved_beside(extended, folder) as path:
                return openvino.run_tensors(path, feed, names, threads)
        return openvino.run_tensors(extended.SerializeToString(), feed, names, threads)
    from onnx.reference import ReferenceEvaluator

    _check_folder(extended, folder)
    values = ReferenceEvaluator(with_data(extended, folder)).run(names, feed)
    return {name: np.asarray(value) for name, value in zip(names, values)}


# --------------------------------------------------------------------------- ORT vs onnx.reference


def _finite_stats(actual: np.ndarray, reference: np.ndarray, tol) -> dict:
    """``error_stats`` of one runtime's tensor against the other's, whose ``tol_units`` and
    ``max_abs`` are always numbers, never NaN.

    NaN/Inf elements that both runtimes produce at the same positions (equal Infs, NaN and NaN)
    count as agreeing and are left out. Any other non-finite element (one side only, or
    ``inf`` against ``-inf``/NaN), like a shape mismatch, gives ``tol_units = max_abs = inf`` and
    ``ok`` False.
    """
    actual, reference = np.asarray(actual), np.asarray(reference)
    if actual.shape != reference.shape:
        return {**error_stats(actual, reference, tol), "ok": False, "max_abs": math.inf, "tol_units": math.inf}
    a, r = actual.astype(np.float64), reference.astype(np.float64)
    bad_a, bad_r = ~np.isfinite(a), ~np.isfinite(r)
    if bad_a.any() or bad_r.any():
        alike = (bad_a == bad_r) & (~bad_a | (a == r) | (np.isnan(a) & np.isnan(r)))
        differ = int(a.size - np.count_nonzero(alike))
        if differ:
            return {
                "ok": False,
                "max_abs": math.inf,
                "tol_units": math.inf,
                "n_bad": differ,
                "size": int(a.size),
                "reason": f"{differ} of {a.size} elements are NaN or Inf in one runtime and not alike in the other",
            }
        keep = ~bad_a
        a, r = a[keep], r[keep]
    return error_stats(a, r, tol)


def _units(value) -> float:
    """A ``tol_units`` for comparisons: NaN (never produced here, but possible in a hand-made
    entry) counts as infinitely far."""
    value = float(value)
    return math.inf if math.isnan(value) else value


def first_divergent_node(entries: list[dict], inputs_of: dict[str, list[str]]) -> dict | None:
    """The first entry (topological order) with ``tol_units > 1`` that is larger than the
    ``tol_units`` of every tensor its node reads (``inputs_of[entry["tensor"]]``); tensors with no
    entry (graph inputs, initializers) count as exact. ``inf`` (non-finite values where the other
    runtime has none) is the largest; a NaN counts as ``inf``. None when no node diverges on its own."""
    units = {e["tensor"]: _units(e["tol_units"]) for e in entries}
    for entry in entries:
        own = units[entry["tensor"]]
        if not own > 1.0:
            continue
        worst_input = max((units.get(name, 0.0) for name in inputs_of.get(entry["tensor"], ())), default=0.0)
        if own > worst_input:
            return entry
    return None


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or "no message"
    line = f"{type(error).__name__}: {text}"
    return line if len(line) <= _REASON_CHARS else line[: _REASON_CHARS - 3] + "..."


def compare_runtimes(model, feed: dict, tol, threads: int = 1, keep: dict | None = None, folder=None) -> dict:
    """ONNX Runtime against ``onnx.reference`` on every intermediate tensor (one inference each,
    every intermediate an output), in topological order, and the first node that diverges.

    When a runtime cannot run the graph (``onnx.reference`` lacks an op, e.g. a ``com.microsoft``
    contrib op): ``{"nodes": [], "first_divergent": None, "error": "<one line reason>"}``.

    ``keep``, a dict, receives each runtime's tensors (graph inputs included) for a closer look at the nodes
    (``parity.diagnose.graph.node_causes.judge``); ``folder``: as ``run_tensors`` takes it.
    """
    graph = _Graph(model)
    names = graph.names
    values = {}
    for runtime, label in (("ort", "ONNX Runtime"), ("onnxref", "onnx.reference")):
        try:
            values[runtime] = run_tensors(runtime, model, feed, names, threads, graph.infos, folder)
        except Exception as error:  # noqa: BLE001 - any failure to run is reported, not raised
            return {"nodes": [], "first_divergent": None, "error": f"{label} cannot run the graph: {_one_line(error)}"}
    entries, inputs_of = [], {}
    for name in names:
        node = graph.nodes[graph.producer[name]]
        stats = _finite_stats(values["ort"][name], values["onnxref"][name], tol)
        entries.append(
            {
                "node": node.name,
                "op_type": node.op_type,
                "tensor": name,
                "max_abs": stats.get("max_abs", math.inf),
                "tol_units": stats.get("tol_units", math.inf),
            }
        )
        inputs_of[name] = [i for i in node.input if i]
    if keep is not None:
        keep.update({runtime: {**feed, **tensors} for runtime, tensors in values.items()})
    return {"nodes": entries, "first_divergent": first_divergent_node(entries, inputs_of)}
