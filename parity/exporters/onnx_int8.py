"""float32 ONNX -> int8 ONNX with ONNX Runtime's own quantizer (``onnxruntime.quantization``).

Two paths from the same verified float parent:

- ``export_static`` (``*/ort-int8``): ``quantize_static`` in the QDQ format (QuantizeLinear / DequantizeLinear
  around every quantized tensor, which ONNX Runtime fuses into int8 kernels), int8 weights per output channel, int8
  activations per tensor, their ranges calibrated on ``job.calibration`` with the spec's method (MinMax, Entropy,
  Percentile);
- ``export_dynamic`` (``*/ort-int8dyn``): ``quantize_dynamic``, int8 weights per channel, activations quantized at
  run time from each batch's own range (no calibration).

Both quantize for the CPU's int8 kernel (``parity.platform.cpu_int8``): where its u8 x s8 pair sums saturate at
16 bits (x86 AVX2, AVX-512 without VNNI) with ``reduce_range`` (7-bit weights), as ONNX Runtime's quantization guide
advises, so the model computes the same integers on every kernel; the record says which CPU and which setting.
Nodes without a name are named first (``<op>_<index>``): the quantizer and the layer count go by names.

Both first run ONNX Runtime's ``quant_pre_process`` (symbolic and ONNX shape inference, basic graph optimisation),
which its documentation asks for: without it ``quantize_dynamic`` refuses torch.onnx's Gemm exports (a stale weight
shape in ``value_info``). A model it cannot process is quantized as it is, and the meta says why. Both keep the nodes
``spec.quantization.kept_float(path_id)`` names in float (``nodes_to_exclude``); ``quantize_dynamic`` rewrites a
Gemm as ``<name>_MatMul`` + ``<name>_Add`` before it reads that list, so for a Gemm it is also given ``<name>_MatMul``
(the Gemm's own name alone is silently ignored: the layer would stay int8).

``quantize`` is the one call the exporters and the int8 repair (``parity.diagnose.precision.int8_repair``) share, so a
repaired model is the model this exporter writes with the same list. onnx and onnxruntime are imported inside.
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

from parity.exporters.common import ONNX_FILE, ExportJob, large_file, needed, save_onnx
from parity.model import feeds
from parity.platform import cpu_int8
from parity.platform.errors import ExportError, one_line
from parity.runtimes.onnx_common import onnx_feed

METHODS = ("MinMax", "Entropy", "Percentile")  # onnxruntime.quantization.CalibrationMethod names
# the ops a dynamic quantization writes in place of a float node (its name is gone, ``<name>_...`` holds one of these)
INTEGER_OPS = {
    "MatMulInteger",
    "ConvInteger",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
    "QAttention",
    "DynamicQuantizeLSTM",
    "QLinearMatMul",
    "QLinearConv",
}
QUANTIZE_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}


def export_static(job: ExportJob) -> dict:
    """The parent ONNX model quantized statically (QDQ, see the module docstring), calibrated on ``job.calibration``
    with ``spec.quantization.calibration``; the parent's meta plus ``meta["quantization"]``."""
    if not job.calibration:
        raise ExportError("static int8 quantization needs calibration samples, and the job has none")
    batches = calibration_batches(
        job.spec, needed(job.parent_meta, "the parent ONNX model's metadata"), job.calibration, job.batch_size
    )
    return _export(job, batches, job.spec.quantization.calibration, dynamic=False)


def export_dynamic(job: ExportJob) -> dict:
    """The parent ONNX model quantized dynamically (int8 weights per channel, activations at run time); the
    parent's meta plus ``meta["quantization"]``."""
    return _export(job, None, None, dynamic=True)


def _export(job: ExportJob, batches, method, dynamic: bool) -> dict:
    if not job.parent_meta or job.parent_meta.get("format") != "onnx":
        raise ExportError("int8 quantization reads an ONNX model, and the step before it wrote none")
    source = Path(needed(job.parent_dir, "the parent ONNX model")) / job.parent_meta["file"]
    record = quantize(
        source,
        Path(job.out_dir) / ONNX_FILE,
        batches,
        method,
        nodes_to_exclude=job.spec.quantization.kept_float(job.path_id),
        dynamic=dynamic,
    )
    return {**job.parent_meta, "file": ONNX_FILE, "quantization": record}


def calibration_batches(spec, meta: dict, calibration: dict, batch_size: int) -> list[dict]:
    """``calibration`` (canonical inputs, every sample) as the graph's feeds, ``batch_size`` samples each, by the
    graph's input names and layout exactly as the ORT runner feeds the float model (``onnx_feed``). Only whole
    batches (a static-batch export takes no other size), the first one filled up when there are fewer samples."""
    total = feeds.samples(spec, calibration)
    starts = range(0, max(total - batch_size, 0) + 1, batch_size)
    return [
        onnx_feed(spec, meta, feeds.padded(spec, feeds.rows(spec, calibration, start, start + batch_size), batch_size))
        for start in starts
    ]


def quantize(src, dst, calibration_feeds, method: str | None, nodes_to_exclude=(), dynamic: bool = False) -> dict:
    """Write ``src`` (a float ONNX file) quantized to int8 at ``dst`` and return what was done (the meta's
    ``quantization`` record). ``calibration_feeds``: the graph's feeds, one dict per batch (static only);
    ``method``: MinMax, Entropy or Percentile (static only); ``nodes_to_exclude``: node names kept in float, names
    of ``src`` as ``quant_pre_process`` leaves them (it keeps the exporters' names; an unknown name is an error).
    The settings are those ONNX Runtime advises for this CPU's int8 kernel (``cpu_int8``)."""
    import onnx
    import onnxruntime
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    kept = list(dict.fromkeys(nodes_to_exclude or ()))
    if not dynamic and method not in METHODS:
        raise ExportError(f"calibration method {method!r} is not one of {', '.join(METHODS)}")
    if not dynamic and not calibration_feeds:
        raise ExportError("static int8 quantization needs calibration samples, and none were given")
    if not dynamic:
        check_finite(calibration_feeds)
    cpu = cpu_int8.int8_cpu()
    settings = cpu_int8.ort_settings(cpu)
    large = large_file(Path(src))  # past protobuf's 2 GiB: every model written here keeps its tensors in a data file
    with tempfile.TemporaryDirectory(prefix="parity-int8-") as scratch:
        prepared, pre_process = prepare(src, Path(scratch) / "prepared.onnx", large)
        float_model = onnx.load(str(prepared))
        named = name_nodes(float_model)
        if named:  # a count and the first few: a graph may have thousands
            more = ", ..." if len(named) > 5 else ""
            pre_process["nodes_named"] = (
                f"{len(named)} unnamed node(s) named <op>_<index>: {', '.join(named[:5])}{more}"
            )
        widened = simplify_gemm_bias(float_model) + (gemm_as_matmul(float_model) if dynamic else [])
        if widened:
            pre_process["gemm_bias_rewritten"] = widened
        if named or widened:
            prepared = save_onnx(float_model, Path(scratch), "widened.onnx")
        names = {node.name for node in float_model.graph.node}
        unknown = [name for name in kept if name not in names]
        if unknown:
            raise ExportError(
                f"keep_float names {len(unknown)} node(s) the graph does not have: "
                f"{', '.join(unknown[:5])}{', ...' if len(unknown) > 5 else ''} (names are ONNX node "
                f"names, e.g. {', '.join(sorted(names)[:3])})"
            )
        passed = kept
        if dynamic:  # quantize_dynamic rewrites a Gemm as <name>_MatMul + <name>_Add before it reads the list
            ops = {node.name: node.op_type for node in float_model.graph.node}
            passed = [*kept, *(f"{name}_MatMul" for name in kept if ops[name] == "Gemm")]
        try:
            with _quiet():
                if dynamic:
                    quantize_dynamic(
                        str(prepared),
                        str(dst),
                        per_channel=True,
                        reduce_range=settings["reduce_range"],
                        weight_type=QuantType.QInt8,
                        nodes_to_exclude=passed,
                        use_external_data_format=large,
                    )
                else:
                    assert method is not None  # a static quantization is always given its calibration method

                    class Reader(CalibrationDataReader):
                        def __init__(self):
                            self.batches = iter(calibration_feeds)

                        def get_next(self):
                            return next(self.batches, None)

                    quantize_static(
                        str(prepared),
                        str(dst),
                        Reader(),
                        quant_format=QuantFormat.QDQ,
                        per_channel=True,
                        reduce_range=settings["reduce_range"],
                        activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8,
                        calibrate_method=getattr(CalibrationMethod, method),
                        nodes_to_exclude=kept,
                        use_external_data_format=large,
                    )
        except Exception as error:  # noqa: BLE001 - the quantizer's own reason is the export's reason
            raise ExportError(
                one_line(
                    f"onnxruntime {'quantize_dynamic' if dynamic else 'quantize_static'}: "
                    f"{type(error).__name__}: {error}",
                    300,
                )
            ) from None
        written = onnx.load(str(dst))
        quantized = quantized_layers(float_model, written, kept)
        largest = largest_weight(written)
    if not quantized:  # an "int8" path that computes in float would pass its gate and say nothing
        raise ExportError(
            f"onnxruntime {'quantize_dynamic' if dynamic else 'quantize_static'} quantized no layer of "
            f"this graph (ops: {', '.join(sorted({n.op_type for n in float_model.graph.node}))}; "
            f"{len(kept)} kept in float)"
        )
    samples = sum(len(next(iter(batch.values()))) for batch in calibration_feeds or ()) if not dynamic else 0
    return {
        "tool": f"onnxruntime {onnxruntime.__version__} quantization."
        f"{'quantize_dynamic' if dynamic else 'quantize_static'}",
        "format": "QOperator (dynamic)" if dynamic else "QDQ",
        "calibration": None if dynamic else method,
        "calibration_samples": samples,
        "per_channel": True,
        "weight_type": "int8, 7-bit range (reduce_range)" if settings["reduce_range"] else "int8",
        "reduce_range": settings["reduce_range"],
        "int8_cpu": {**cpu, "setting": settings["why"]},
        # the largest pair sum a u8 x s8 kernel can form from these weights: within 32767, no kernel saturates
        "u8s8_pair_bound": None if largest is None else 2 * 255 * largest,
        "activation_type": "int8, per batch at run time" if dynamic else "int8, per tensor",
        "pre_process": pre_process,
        "kept_float": kept,
        "nodes_to_exclude": passed,
        "quantized_layers": len(quantized),
        "quantized_ops": dict(Counter(op for _, op in quantized)),
    }


def check_finite(batches) -> None:
    """An ``ExportError`` naming the first calibration input that holds NaN or infinity: the quantizer would take
    its range from it and write a model whose scales are NaN or whose every other value rounds to zero."""
    for k, batch in enumerate(batches):
        bad = feeds.first_non_finite(batch)
        if bad is not None:
            name, rows, what = bad
            raise ExportError(
                f"calibration input {name!r} holds {what} ({len(rows)} sample(s) of batch {k + 1} of "
                f"{len(batches)}, the first sample {int(rows[0])}): int8 ranges cannot be calibrated on it; give "
                "finite calibration samples"
            )


def name_nodes(model) -> list[str]:
    """Name, in place, every node of ``model`` without a name ``<op>_<index>`` (unique in the graph): the quantizer
    quantizes, excludes and reports nodes by name. Returns the names given."""
    taken = {node.name for node in model.graph.node if node.name}
    given = []
    for k, node in enumerate(model.graph.node):
        if node.name:
            continue
        name, n = f"{node.op_type}_{k}", 0
        while name in taken:
            n += 1
            name = f"{node.op_type}_{k}_{n}"
        node.name = name
        taken.add(name)
        given.append(name)
    return given


def largest_weight(model) -> int | None:
    """The largest magnitude of an int8 weight a quantized matrix product or convolution of ``model`` multiplies by
    (through its DequantizeLinear in QDQ, directly for the integer ops), or None where there is none."""
    from onnx import numpy_helper

    initializers = {t.name: t for t in model.graph.initializer}
    producer = {out: node for node in model.graph.node for out in node.output}
    largest = None
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm", "Conv", "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul"):
            continue
        if len(node.input) < 2:
            continue
        weight = node.input[1]
        source = producer.get(weight)
        if source is not None and source.op_type == "DequantizeLinear":
            weight = source.input[0]
        if weight in initializers:
            values = numpy_helper.to_array(initializers[weight])
            if values.dtype == np.int8 and values.size:
                peak = int(np.abs(values.astype(np.int32)).max())
                largest = peak if largest is None else max(largest, peak)
    return largest


def simplify_gemm_bias(model) -> list[str]:
    """Rewrite, in place, the Gemm biases ONNX Runtime's quantizer (1.31) gets wrong, each to the same sum; return
    ``["<node>: <what>"]``. A bias ``C`` with ``beta=0`` (jax2onnx writes a scalar ``dot_bias`` and adds the real
    bias after) is dropped: the quantizer folds C into an int32 bias without its beta, and the jax zoo's int8 model
    scored 1.6 % for 97 %. A rank-0 ``C`` with another beta becomes a vector of the output width (the quantizer
    indexes it: "array is 0-dimensional")."""
    from onnx import numpy_helper

    initializers = {t.name: t for t in model.graph.initializer}
    changed = []
    for node in model.graph.node:
        if node.op_type != "Gemm" or len(node.input) < 3 or node.input[2] not in initializers:
            continue
        bias, weight = numpy_helper.to_array(initializers[node.input[2]]), initializers.get(node.input[1])
        beta = next((a.f for a in node.attribute if a.name == "beta"), 1.0)
        if beta == 0.0 and np.all(np.isfinite(bias)):  # 0 * C adds nothing (a NaN or Inf in C would)
            del node.input[2]
            changed.append(f"{node.name}: C unused (beta=0) dropped")
        elif bias.ndim == 0 and weight is not None and len(weight.dims) == 2:
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            width = weight.dims[0] if trans_b else weight.dims[1]
            vector = numpy_helper.from_array(np.full((width,), bias, dtype=bias.dtype), f"{node.input[2]}__{node.name}")
            model.graph.initializer.append(vector)
            node.input[2] = vector.name
            changed.append(f"{node.name}: scalar C widened to {width}")
    return changed


def gemm_as_matmul(model) -> list[str]:
    """Rewrite, in place, each Gemm without a bias (``alpha=1``, ``transA=0``, weights an initializer) as the MatMul
    it is, transposing the weights where ``transB=1``: ONNX Runtime's dynamic quantizer (1.31) quantizes MatMul, not
    Gemm, so a jax2onnx Gemm would stay float. Returns ``["<node>: Gemm as MatMul"]``."""
    from onnx import helper, numpy_helper

    initializers = {t.name: t for t in model.graph.initializer}
    changed = []
    for k, node in enumerate(model.graph.node):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (
            node.op_type != "Gemm"
            or len(node.input) != 2
            or node.input[1] not in initializers
            or attrs.get("alpha", 1.0) != 1.0
            or attrs.get("transA", 0)
        ):
            continue
        weights = node.input[1]
        if attrs.get("transB", 0):
            transposed = numpy_helper.from_array(
                numpy_helper.to_array(initializers[weights]).T.copy(), f"{weights}__{node.name}_T"
            )
            model.graph.initializer.append(transposed)
            weights = transposed.name
        model.graph.node[k].CopyFrom(
            helper.make_node("MatMul", [node.input[0], weights], list(node.output), name=node.name)
        )
        changed.append(f"{node.name}: Gemm as MatMul")
    return changed


def prepare(src, dst, large: bool = False) -> tuple[Path, dict]:
    """``(model to quantize, record)``: ``src`` through ONNX Runtime's ``quant_pre_process`` into ``dst`` (``large``:
    its tensors in ``<dst>.data``), or ``src`` itself where the pre-process fails (the record says why)."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        with _quiet():
            external = {"all_tensors_to_one_file": True, "external_data_location": f"{Path(dst).name}.data"}
            quant_pre_process(str(src), str(dst), save_as_external_data=large, **(external if large else {}))
        return Path(dst), {
            "applied": True,
            "step": "onnxruntime.quantization.shape_inference.quant_pre_process "
            "(symbolic + ONNX shape inference, basic optimisation)",
        }
    except Exception as error:  # noqa: BLE001 - quantizing the model as it is still works for most graphs
        return Path(src), {"applied": False, "reason": one_line(f"{type(error).__name__}: {error}", 300)}


def quantized_layers(float_model, quantized_model, kept=()) -> list[tuple[str, str]]:
    """``[(node name, op type)]`` of ``float_model``'s nodes the quantizer made int8, in graph order: a QDQ node that
    reads a DequantizeLinear output (a weight or an activation), or a node a dynamic quantization replaced by an
    integer op (its name gone, ``<name>_...`` an op of ``INTEGER_OPS``); never one of ``kept`` (a node kept in float
    may still read the dequantized output of a quantized producer)."""
    by_name = {node.name: node for node in quantized_model.graph.node}
    producer = {out: node.op_type for node in quantized_model.graph.node for out in node.output}
    integer_prefixes = [node.name for node in quantized_model.graph.node if node.op_type in INTEGER_OPS]
    found = []
    for node in float_model.graph.node:
        if not node.name or node.op_type in QUANTIZE_OPS or node.name in kept:
            continue
        twin = by_name.get(node.name)
        if twin is not None:
            if twin.op_type in INTEGER_OPS or any(producer.get(i) == "DequantizeLinear" for i in twin.input):
                found.append((node.name, node.op_type))
        elif any(name.startswith(f"{node.name}_") for name in integer_prefixes):
            found.append((node.name, node.op_type))
    return found


@contextlib.contextmanager
def _quiet():
    """The quantizer prints its calibration progress and logs advice on the root logger: neither is a result."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(level)
