"""Which layer an ONNX Runtime int8 path loses its accuracy in, and the fewest nodes to keep in float.

For a ``*/ort-int8`` (static, QDQ) or ``*/ort-int8dyn`` path, from the float ONNX model it was quantized from:

1. **SQNR per layer** with ONNX Runtime's own debugger (``onnxruntime.quantization.qdq_loss_debug``): every
   intermediate tensor of the float and the quantized model on the first ``SQNR_SAMPLES`` eval samples. Per
   quantized node: ``sqnr_db``, its output against the float model's (the error accumulated up to it);
   ``channel_sqnr_db``, the weakest channel of its output's own int8 rounding (before vs after its Q/DQ pair: an
   outlier channel that sets a per-tensor range rounds the other channels to zero while the tensor's SQNR stays
   high); ``weight_sqnr_db``, its weights' int8 rounding (dequantized here: see ``_weight_pairs``). ``floor_db`` is
   the lowest of the three.
2. **Regain per layer**, for the ``MAX_TESTED`` layers of lowest ``floor_db`` only (each costs a quantization and a
   run of the eval split): the gate metric of the model quantized with that layer kept in float, minus the path's.
   Keeping a layer in float takes the node and, in a QDQ model, the quantized nodes that read its output through a
   Q/DQ pair: ONNX Runtime quantizes a tensor where its producer *or* a reader is quantized, so excluding the node
   alone leaves its output int8.
3. **first**: the earliest layer in graph order whose exclusion regains accuracy (where none does alone: the
   earliest whose ``floor_db`` is below the model output's SQNR); **worst**: the one that regains most (none: the
   lowest ``floor_db``). Each with its ONNX node, op type, SQNRs, regain and the source module it came from (the
   exporter's record, ``onnx_tree``; the node name where there is none).
4. **repair** (``int8_repair``) when the path does not pass its gate.

NumPy at import; onnx and onnxruntime inside.
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

MAX_TESTED = 12  # layers whose regain is measured (the lowest floor_db first)
SQNR_SAMPLES = 128  # eval samples the per-layer SQNR is computed on (whole batches, at least one)
QUANTIZED_SUFFIX = (
    "_quantized"  # ONNX Runtime's name for a stored int8 weight: <weight>_quantized (TENSOR_NAME_QUANT_SUFFIX)
)
CONV_OPS = {"Conv", "ConvTranspose", "QLinearConv", "ConvInteger"}  # channels on axis 1; other layers' on the last


def diagnose_int8(
    workspace: str, model: str, path_id: str, golden_dir: str, float_dir: str, float_meta: dict, threads: int
) -> dict:
    """The worker task: the diagnosis of the int8 path ``path_id`` (see the module docstring) from the float ONNX
    artifact it was quantized from (``float_dir`` / ``float_meta``, its parent export), on the golden eval split;
    a JSON-able dict with ``layers``, ``ranking``, ``first``, ``worst`` and ``repair``."""
    import onnx

    from parity.check import accuracy_gate
    from parity.diagnose.precision import int8_repair
    from parity.exporters import onnx_int8
    from parity.golden import calibration
    from parity.golden import store as golden
    from parity.model import batch_axes, feeds
    from parity.model.workspace import Workspace
    from parity.run import paths
    from parity.run.tasks import build_runner

    started = time.perf_counter()
    path = paths.by_id(path_id)
    if not path.exports or path.exports[-1] not in (paths.ORT_INT8, paths.ORT_INT8DYN):
        return {"path": path_id, "reason": f"{path_id} is not quantized by ONNX Runtime (ort-int8, ort-int8dyn)"}
    dynamic = path.exports[-1] is paths.ORT_INT8DYN
    ws = Workspace(workspace)
    spec = ws.load_spec(model)
    verified = golden.load(Path(golden_dir), spec)
    method = None if dynamic else spec.quantization.calibration
    kept = list(spec.quantization.kept_float(path_id))
    batches = None
    if not dynamic:
        samples, _ = calibration.calibration_feeds(spec, verified, ws.root)
        batches = onnx_int8.calibration_batches(spec, float_meta, samples, spec.batch_size)
    evals = feeds.from_arrays(spec, verified.arrays["eval.npz"])
    labels = verified.arrays["eval.npz"].get("y")
    golden_logits = verified.arrays["reference.npz"]["eval/logits"]
    axes = batch_axes.recorded(verified.manifest)
    output = batch_axes.eval_output(spec, axes)

    def evaluate(folder, meta):
        runner = build_runner(spec, path, {}, spec.batch_size, threads, str(folder), meta)
        return feeds.run_batched(runner, evals, spec.batch_size, axes)[output]

    def judge(logits):
        return accuracy_gate.judge(logits, golden_logits, labels, spec.gate)

    sqnr_rows = min(feeds.samples(spec, evals), max(spec.batch_size, SQNR_SAMPLES))
    sqnr_batches = onnx_int8.calibration_batches(
        spec, float_meta, feeds.rows(spec, evals, 0, sqnr_rows), spec.batch_size
    )
    with tempfile.TemporaryDirectory(prefix="parity-int8-diagnose-") as scratch_dir:
        scratch = Path(scratch_dir)
        source = Path(float_dir) / float_meta["file"]
        prepared, _ = onnx_int8.prepare(source, scratch / "float.onnx")
        candidates = int8_repair.Candidates(
            source, float_meta, batches, method, dynamic, kept, scratch / "runs", evaluate, judge
        )
        before = candidates.gate()
        layers, output_sqnr = layer_sqnr(
            prepared, candidates.file(), sqnr_batches, float_meta["output_names"], kept, dynamic
        )
        modules = module_paths(onnx.load(str(source), load_external_data=False))
        for layer in layers:
            layer["module"] = modules.get(layer["node"], layer["node"])
        tested = sorted(layers, key=lambda layer: layer["floor_db"])[:MAX_TESTED]
        for layer in tested:
            judged = candidates.gate(layer["excluded"])
            regain = None if judged["value"] is None else judged["value"] - before["value"]  # None: nothing left int8
            layer.update(regain=regain, decision=judged["decision"], value=judged["value"])
        ranking = sorted(tested, key=lambda layer: (-(layer["regain"] or 0.0), layer["floor_db"]))
        first, first_by, worst, worst_by = _first_and_worst(layers, ranking, output_sqnr)
        ranking_runs = candidates.runs
        if before["decision"] == "pass":
            fixed: dict[str, Any] = {
                "passes": True,
                "nodes_to_exclude": kept,
                "reason": "the path passes its gate as quantized",
                "runs": 0,
                "seconds": 0.0,
            }
        else:
            measured = {layer["node"] for layer in tested}
            untested = sorted(
                (layer for layer in layers if layer["node"] not in measured), key=lambda layer: layer["floor_db"]
            )
            fixed = int8_repair.repair(candidates, [layer["excluded"] for layer in ranking + untested])
        if fixed.get("passes"):
            passed = candidates.record(fixed.get("added", []))["nodes_to_exclude"]
            fixed["toolchain"] = int8_repair.toolchain(path_id, fixed["nodes_to_exclude"], passed, method, dynamic)
    return {
        "path": path_id,
        "dynamic": dynamic,
        "calibration": method,
        "kept_float": kept,
        "gate": int8_repair.gate_summary(before),
        "output_sqnr_db": output_sqnr,
        "sqnr_samples": sqnr_rows,
        "layers": layers,
        "tested": len(tested),
        "max_tested": MAX_TESTED,
        "ranking": [layer["node"] for layer in ranking],
        "first": first,
        "first_by": first_by,
        "worst": worst,
        "worst_by": worst_by,
        "ranking_runs": ranking_runs,
        "repair": fixed,
        "seconds": time.perf_counter() - started,
    }


def layer_sqnr(float_path, quantized_path, batches: list[dict], outputs: list[str], kept=(), dynamic=False):
    """``(layers, output SQNR)``: a row per quantized node of ``quantized_path`` (graph order) with its SQNRs (see
    the module docstring) and ``excluded``, the nodes that keep it in float; the model outputs' lowest SQNR."""
    import onnx
    from onnxruntime.quantization import qdq_loss_debug as debug

    from parity.diagnose.graph import onnx_graph
    from parity.exporters.onnx_int8 import QUANTIZE_OPS, _quiet, quantized_layers

    float_model, quantized = onnx.load(str(float_path)), onnx.load(str(quantized_path))
    with tempfile.TemporaryDirectory(prefix="parity-int8-sqnr-") as scratch, _quiet():
        acts = {}
        for side, model_path in (("float", float_path), ("int8", quantized_path)):
            augmented = str(Path(scratch) / f"{side}.onnx")
            debug.modify_model_output_intermediate_tensors(str(model_path), augmented)
            acts[side] = debug.collect_activations(augmented, _Reader(batches))
        matching = debug.create_activation_matching(acts["int8"], acts["float"])
    sqnr = debug.compute_signal_to_quantization_noice_ratio
    weights = {name: sqnr(*pair) for name, pair in _weight_pairs(float_model, quantized).items()}
    shapes = onnx_graph._Graph(onnx_graph.pinned(float_model, batches[0])).shapes
    by_name = {node.name: node for node in quantized.graph.node}
    readers: dict[str, list] = {}
    for node in quantized.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    float_nodes = {node.name: node for node in float_model.graph.node}
    stored = {t.name for t in quantized.graph.initializer}
    # a DequantizeLinear of a stored int8 weight (``<weight>_quantized``): its output is that weight to its readers
    weight_of = {
        dq.output[0]: dq.input[0].removesuffix(QUANTIZED_SUFFIX)
        for dq in quantized.graph.node
        if dq.op_type == "DequantizeLinear" and dq.input[0] in stored
    }
    quantized_names = [name for name, _ in quantized_layers(float_model, quantized, kept)]
    rows = []
    for index, name in enumerate(quantized_names):
        node = by_name.get(name, float_nodes[name])
        row = {
            "node": name,
            "op_type": float_nodes[name].op_type,
            "index": index,
            "sqnr_db": None,
            "channel_sqnr_db": None,
            "weight_sqnr_db": None,
            "tensor": None,
        }
        for out in node.output:
            key = out.removesuffix(debug.QUANT_INPUT_SUFFIX)
            reference = acts["float"].get(key)
            if reference is None:
                continue
            match = matching.get(key)
            test = match["post_qdq"] if match else acts["int8"].get(out)
            if test is None:
                continue
            row.update(tensor=key, sqnr_db=_db(sqnr(reference, test)))
            if match:
                row["channel_sqnr_db"] = _weakest_channel(
                    match["pre_qdq"], match["post_qdq"], shapes.get(key), float_nodes[name].op_type in CONV_OPS
                )
            break
        read = [weight_of[i] for i in node.input if weight_of.get(i) in weights]
        if read:
            row["weight_sqnr_db"] = min(_db(weights[w]) for w in read)
        found = [v for v in (row["sqnr_db"], row["channel_sqnr_db"], row["weight_sqnr_db"]) if v is not None]
        row["floor_db"] = min(found) if found else math.inf
        row["excluded"] = [name, *_readers_through_qdq(node, readers, set(quantized_names) - {name}, QUANTIZE_OPS)]
        rows.append(row)
    output_sqnr = [
        _db(sqnr(acts["float"][o], acts["int8"][o])) for o in outputs if o in acts["float"] and o in acts["int8"]
    ]
    return rows, min(output_sqnr) if output_sqnr else None


def _weight_pairs(float_model, quantized) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{weight: (float, dequantized)}`` for every stored int8 weight a DequantizeLinear reads, at least 1-d.
    ``qdq_loss_debug.create_weight_matching`` (1.31) subtracts the zero point in int8, which wraps around for an
    asymmetric weight (a bias an Add reads), and its SQNR refuses a scalar: the dequantization is done here in int32."""
    from onnx import numpy_helper

    floats = {t.name: t for t in float_model.graph.initializer}
    stored = {t.name: t for t in quantized.graph.initializer}
    pairs = {}
    for dq in quantized.graph.node:
        name = dq.input[0].removesuffix(QUANTIZED_SUFFIX)
        if dq.op_type != "DequantizeLinear" or dq.input[0] not in stored or name not in floats:
            continue
        values = numpy_helper.to_array(stored[dq.input[0]]).astype(np.int32)
        scale = numpy_helper.to_array(stored[dq.input[1]]).astype(np.float64) if dq.input[1] in stored else None
        if scale is None:
            continue
        zero = (
            numpy_helper.to_array(stored[dq.input[2]]).astype(np.int32)
            if len(dq.input) > 2 and dq.input[2] in stored
            else np.zeros_like(scale, dtype=np.int32)
        )
        if scale.size > 1:  # per channel, along the node's axis (ONNX's default: 1)
            axis = next((a.i for a in dq.attribute if a.name == "axis"), 1) % max(values.ndim, 1)
            shape = [1] * values.ndim
            shape[axis] = -1
            scale, zero = scale.reshape(shape), zero.reshape(shape)
        dequantized = (values - zero) * scale
        pairs[name] = (
            np.atleast_1d(numpy_helper.to_array(floats[name]).astype(np.float64)),
            np.atleast_1d(dequantized),
        )
    return pairs


def _readers_through_qdq(node, readers: dict, quantized: set[str], quantize_ops) -> list[str]:
    """The quantized nodes that read ``node``'s outputs through a QuantizeLinear -> DequantizeLinear pair."""
    found = []
    for out in node.output:
        for q in readers.get(out, []):
            if q.op_type != "QuantizeLinear":
                continue
            for dq in readers.get(q.output[0], []):
                if dq.op_type != "DequantizeLinear":
                    continue
                found += [
                    r.name
                    for r in readers.get(dq.output[0], [])
                    if r.name in quantized and r.op_type not in quantize_ops
                ]
    return list(dict.fromkeys(found))


def _weakest_channel(pre, post, shape, conv: bool) -> float | None:
    """The lowest SQNR over the channels of a tensor's own int8 rounding (``pre``/``post``: ``collect_activations``'
    flat arrays per batch; ``shape``: one batch's), channels without signal left out; None without a shape."""
    from onnxruntime.quantization.qdq_loss_debug import compute_signal_to_quantization_noice_ratio as sqnr

    if not shape or len(shape) < 2:
        return None
    size = int(np.prod(shape))
    if any(np.size(a) != size for a in (*pre, *post)):
        return None
    axis = 1 if conv else len(shape) - 1
    pre = np.moveaxis(np.stack([np.reshape(a, shape) for a in pre]), axis + 1, 0)
    post = np.moveaxis(np.stack([np.reshape(a, shape) for a in post]), axis + 1, 0)
    values = [_db(sqnr(p, q)) for p, q in zip(pre, post) if np.any(p)]
    return min(values) if values else None


def module_paths(model) -> dict[str, str]:
    """ONNX node name -> the source module it was exported from, as ``onnx_tree`` reads the exporter's record
    (torch.onnx metadata, or ``/``-scoped node names); nodes without one are left out."""
    from parity.diagnose.tree import onnx_tree

    nodes = list(model.graph.node)
    kind = onnx_tree.scope_kind(SimpleNamespace(nodes=nodes))
    found = {}
    for node in nodes:
        scopes = onnx_tree.node_scopes(node, kind)
        if node.name and scopes:
            found[node.name] = scopes[-1]
    return found


def _first_and_worst(layers, ranking, output_sqnr):
    costly = [layer for layer in ranking if (layer["regain"] or 0.0) > 0]
    if costly:
        first = min(costly, key=lambda layer: layer["index"])
        return _brief(first), "regain", _brief(costly[0]), "regain"
    below = [layer for layer in layers if output_sqnr is not None and layer["floor_db"] < output_sqnr]
    lowest = min(layers, key=lambda layer: layer["floor_db"], default=None)
    first = min(below, key=lambda layer: layer["index"]) if below else lowest
    return _brief(first), "sqnr", _brief(lowest), "sqnr"


def _brief(layer) -> dict | None:
    if layer is None:
        return None
    return {
        key: layer.get(key)
        for key in (
            "node",
            "op_type",
            "module",
            "sqnr_db",
            "channel_sqnr_db",
            "weight_sqnr_db",
            "floor_db",
            "regain",
            "excluded",
        )
    }


def _db(value) -> float:
    """A finite SQNR in dB (the library floors the noise at machine epsilon; NaN where a tensor is non-finite)."""
    value = float(value)
    return value if math.isfinite(value) else -math.inf


class _Reader:
    """The feeds of ``batches`` as ONNX Runtime's ``CalibrationDataReader`` protocol reads them (``get_next``)."""

    def __init__(self, batches):
        self.batches = iter(batches)

    def get_next(self):
        return next(self.batches, None)

    def __iter__(self):
        return self

    def __next__(self):
        batch = self.get_next()
        if batch is None:
            raise StopIteration
        return batch


def render_int8(diagnosis: dict) -> list[str]:
    """Terminal lines for ``diagnose_int8``'s dict."""
    if diagnosis.get("reason"):
        return [f"  int8 diagnosis: {diagnosis['reason']}"]
    gate = diagnosis["gate"]
    lines = [
        (
            f"  int8 gate as quantized: {gate['decision']} ({gate['metric']} {_pct(gate['value'])} vs golden "
            f"{_pct(gate['golden'])}); model output SQNR {_shown(diagnosis['output_sqnr_db'])} on "
            f"{diagnosis['sqnr_samples']} eval samples"
        )
    ]
    for label in ("first", "worst"):
        layer = diagnosis[label]
        if layer is None:
            continue
        by = "regains accuracy kept in float" if diagnosis[f"{label}_by"] == "regain" else "by SQNR alone"
        regain = "" if layer["regain"] is None else f", regain {100 * layer['regain']:+.2f} pts"
        lines.append(
            f"  int8 {label} layer ({by}): {layer['module']} (node {layer['node']}, {layer['op_type']}): "
            f"SQNR {_shown(layer['sqnr_db'])}, weakest channel {_shown(layer['channel_sqnr_db'])}, weights "
            f"{_shown(layer['weight_sqnr_db'])}{regain}"
        )
    lines.append(
        f"  int8 layers: {len(diagnosis['layers'])} quantized, regain measured for the {diagnosis['tested']} "
        f"of lowest SQNR ({diagnosis['ranking_runs']} runs)"
    )
    repair = diagnosis["repair"]
    if not repair.get("passes"):
        lines.append(f"  int8 repair: none: {repair.get('reason')}")
    elif repair.get("reason"):
        lines.append(f"  int8 repair: not needed: {repair['reason']}")
    else:
        after = repair["after"]
        proof = (
            "minimal: with any one of them back in int8 the gate does not pass"
            if repair["minimal"]
            else f"not proven minimal: the budget of {repair['max_runs']} runs ran out"
        )
        lines.append(
            f"  int8 repair: keep {len(repair['added'])} node(s) in float: {', '.join(repair['added'])}; "
            f"the gate then says {after['decision']} ({_pct(after['value'])}; {proof}; {repair['judged']} lists "
            f"judged, {repair['runs']} new runs, {repair['seconds']:.1f} s)"
        )
        lines.append(
            f"  int8 repair, as the toolchain takes it: {repair['toolchain']['onnxruntime']}; in the model "
            f"spec: {repair['toolchain']['spec']}"
        )
    return lines


def _pct(value) -> str:
    from parity.check.accuracy_gate import percent

    return "n/a" if value is None else percent(value)


def _shown(db) -> str:
    return "n/a" if db is None else f"{db:.1f} dB"
