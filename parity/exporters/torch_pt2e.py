"""torch -> int8 with PyTorch 2 export quantization: torchao's pt2e flow with its ``X86InductorQuantizer``, the
quantized program saved as the ``.pt2`` file users ship (run compiled by TorchInductor into int8 kernels)."""

from __future__ import annotations

import io
import warnings
from contextlib import redirect_stderr, redirect_stdout

import numpy as np

from parity.exporters.common import ExportJob, needed
from parity.exporters.torch_export import exported_program, program_meta, save_program
from parity.exporters.torch_onnx import traced_module
from parity.model import feeds
from parity.platform.errors import ExportError

TOOL = "torchao pt2e"
WRAPPED = "model."  # the exporter's wrapper holds the model as ``model``: module paths in the program start so
_WEIGHTED = ("conv1d", "conv2d", "conv3d", "linear")  # the layers with weights X86InductorQuantizer quantizes


def export(job: ExportJob) -> dict:
    """The spec's float32 module exported with ``torch.export`` (axes dynamic as ``torch_export`` exports them),
    prepared with ``X86InductorQuantizer``'s default static config (uint8 activations per tensor from a histogram
    observer, int8 weights per output channel), calibrated on ``job.calibration`` in batches of the golden batch
    size, converted to quantize / dequantize ops, exported again and saved as ``model.pt2``. The modules
    ``spec.quantization.kept_float(job.path_id)`` names (module paths of the spec's torch module) stay float."""
    spec = job.spec
    if not job.calibration:
        raise ExportError("pt2e quantization needs calibration samples and was given none")
    with warnings.catch_warnings(), redirect_stderr(io.StringIO()), redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # torchao's import reports its optional CUDA kernels missing on a CPU host
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

    float_program, float_axes = exported_program(job)
    float_module = float_program.module()
    modules = _called_modules(float_module.graph)
    kept = list(spec.quantization.kept_float(job.path_id))
    unknown = [name for name in kept if WRAPPED + name not in modules]
    if unknown:
        shown = ", ".join(sorted(m[len(WRAPPED) :] for m in modules if m.startswith(WRAPPED)))
        raise ExportError(
            f"keep_float for {job.path_id} names {', '.join(map(repr, unknown))}, which the program "
            f"of {spec.name!r} does not call (its modules: {shown})"
        )
    folded = _conv_bn_folds(float_module.graph)
    quantizer = x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config())
    for name in kept:
        quantizer.set_module_name_qconfig(WRAPPED + name, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = prepare_pt2e(float_module, quantizer)
        samples = _calibrate(prepared, job, bool(float_axes.get("static")))
        converted = convert_pt2e(prepared)
    _, example = traced_module(job)
    program, axes = exported_program(job, traced=(converted, example))
    save_program(program, job.out_dir)
    graph = program.graph_module.graph
    layers = _weighted_layers(graph)
    quantized = [name for name, int8 in layers.items() if int8]
    left_float = [name for name, int8 in layers.items() if not int8 and name not in kept]
    record = {
        "tool": TOOL,
        "quantizer": "X86InductorQuantizer",
        "config": "default static (post-training)",
        "calibration": "HistogramObserver (activations, per tensor); PerChannelMinMaxObserver (weights)",
        "calibration_samples": samples,
        "activations": "uint8 per tensor, affine",
        "weights": "int8 per output channel, symmetric",
        "per_channel": True,
        "kept_float": kept,
        "quantized_layers": len(quantized),
        "quantized": quantized,
        "qdq_pairs": _qdq_pairs(graph),
        "folded": {bn: conv for bn, conv in folded.items() if WRAPPED + bn not in _called_modules(graph)},
    }
    if left_float:
        record["not_quantized"] = left_float
        record["note"] = (
            f"the quantizer matched no int8 pattern at {', '.join(left_float)}, left in float32 "
            f"(X86InductorQuantizer finds a layer by the class of the module calling it, torch.nn.Conv2d, "
            f"torch.nn.Linear, ...: a subclass of one is not matched)"
        )
    return {**program_meta(spec, axes), "quantization": record}


def _calibrate(prepared, job: ExportJob, static: bool) -> int:
    """``job.calibration`` through the observers of ``prepared`` in batches of the golden batch size (the last one
    padded to it where the program's batch is static); returns the number of samples seen."""
    import torch

    spec, calibration = job.spec, needed(job.calibration, "calibration samples")
    total = feeds.samples(spec, calibration)
    with torch.no_grad():
        for start in range(0, total, job.batch_size):
            batch = feeds.rows(spec, calibration, start, start + job.batch_size)
            if static:
                batch = feeds.padded(spec, batch, job.batch_size)
            prepared(
                *(
                    torch.from_numpy(np.ascontiguousarray(batch[i.name], dtype=_host(i.dtype)))
                    for i in spec.model_inputs
                )
            )
    return total


def _host(dtype: str) -> str:
    return "float32" if dtype.startswith(("float", "bfloat")) else dtype


def _module_of(node) -> str | None:
    """The innermost module path of the spec's model whose call produced ``node`` (with the wrapper's prefix), None
    for an op outside every module of the model (a q/dq pair pt2e inserted)."""
    stack = node.meta.get("nn_module_stack") or {}
    path = list(stack.values())[-1][0] if stack else ""
    return path if path.startswith(WRAPPED) else None


def _called_modules(graph) -> set[str]:
    """Every module path the graph records a call of (each enclosing module of each op)."""
    return {path for node in graph.nodes for path, _ in (node.meta.get("nn_module_stack") or {}).values()}


def _op(node) -> str:
    target = getattr(node, "target", None)
    return getattr(target, "__name__", str(target)).split(".")[0] if node.op == "call_function" else ""


def _conv_bn_folds(graph) -> dict[str, str]:
    """BatchNorm module -> the conv module it follows, where pt2e folds the norm into the conv's weights (a conv whose
    one user is ``batch_norm``): the conv's call then returns the norm's values. Spec names (no wrapper prefix)."""
    folds = {}
    for node in graph.nodes:
        if _op(node) in ("batch_norm", "_native_batch_norm_legit_no_training"):
            source = node.args[0]
            if _op(source).startswith("conv") and len(source.users) == 1:
                bn, conv = _module_of(node), _module_of(source)
                if bn and conv and bn != conv:
                    folds[bn[len(WRAPPED) :]] = conv[len(WRAPPED) :]
    return folds


def _weighted_layers(graph) -> dict[str, bool]:
    """Module path (spec names) of each conv / linear -> whether it computes on int8: its activation and its weight
    both come out of a dequantize."""
    layers: dict[str, bool] = {}
    for node in graph.nodes:
        if _op(node) in _WEIGHTED and (module := _module_of(node)):
            operands = [a for a in node.args[:2] if hasattr(a, "op")]
            int8 = bool(operands) and all(_op(a).startswith("dequantize") for a in operands)
            name = module[len(WRAPPED) :]
            layers[name] = layers.get(name, True) and int8
    return layers


def _qdq_pairs(graph) -> int:
    """Quantize ops whose users are dequantize ops (an activation's int8 round trip), plus the int8 weights (stored
    quantized, so only their dequantize is left in the graph)."""
    pairs = sum(
        1
        for n in graph.nodes
        if _op(n).startswith("quantize_per") and any(_op(u).startswith("dequantize") for u in n.users)
    )
    weights = sum(1 for n in graph.nodes if _op(n).startswith("dequantize_per_channel"))
    return pairs + weights
