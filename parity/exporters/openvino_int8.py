"""A float model -> an int8 OpenVINO IR quantized by NNCF (``nncf.quantize``), calibrated on the job's calibration
samples.

The parent artifact is the verified float model: an ONNX file (``*/onnx/openvino-int8``, read by OpenVINO's ONNX
frontend) or the IR ``openvino.convert_model`` made from torch (``torch/openvino-int8``). NNCF inserts FakeQuantize
ops on the activations and stores the weights as int8 constants with their scales; OpenVINO's CPU plugin runs the
quantized ops in int8 (its low-precision transformations) whatever the float precision hint, so the OPENVINO runtime
step runs the IR unchanged, fed and read by the parent's tensor names.

Settings, recorded in ``meta["quantization"]``: the preset is ``PERFORMANCE`` (symmetric weights and activations),
``MIXED`` with ``model_type=TRANSFORMER`` for a model with attention (a MatMul of two activations), as NNCF
advises; the activations' range estimator follows ``spec.quantization.calibration`` (MinMax: the global min and
max; Percentile: NNCF's mean quantile; Entropy: its histogram-based optimal range); every calibration sample is
used (``subset_size``); ``spec.quantization.kept_float(path_id)`` names NNCF nodes (the OpenVINO op names, as
``parity.diagnose.precision.int8_nncf`` reports them) left unquantized through ``nncf.IgnoredScope``; a name that
matches no node is NNCF's error, in one line.
"""

from __future__ import annotations

import io
import logging
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np

from parity.exporters.axes import short_reason
from parity.exporters.common import ExportJob, needed
from parity.model import feeds
from parity.platform.errors import ExportError, one_line
from parity.runtimes.onnx_common import onnx_feed

IR_FILE = "model.xml"  # its weights in model.bin beside it
TOOL = "nncf.quantize"
# NNCF's range estimators for the activations, by the spec's calibration method
RANGE_ESTIMATORS = {"MinMax": "MINMAX", "Percentile": "MEAN_QUANTILE", "Entropy": "HISTOGRAM"}
# ops whose weights NNCF quantizes: a layer that computes in int8
WEIGHTED_OPS = {
    "MatMul",
    "Convolution",
    "GroupConvolution",
    "ConvolutionBackpropData",
    "GroupConvolutionBackpropData",
    "Gather",
}
INT_TYPES = {"i8", "u8"}


def export(job: ExportJob) -> dict:
    """The parent's float model quantized by NNCF into ``out_dir/model.xml`` (float32 scales, int8 weights); the
    parent's metadata with ``format`` openvino and ``quantization``: the tool and its version, the preset, the
    calibration, the layers kept in float and the layers quantized."""
    import openvino as ov

    if not job.calibration:
        raise ExportError("an openvino-int8 path needs calibration samples and was given none")
    parent = job.parent_meta or {}
    if parent.get("format") not in ("onnx", "openvino"):
        raise ExportError(
            f"NNCF quantizes an ONNX file or an OpenVINO IR; the parent artifact is {parent.get('format')!r}"
        )
    model = ov.Core().read_model(str(Path(needed(job.parent_dir, "the parent artifact")) / parent["file"]))
    quantized, settings = quantize(
        model, job.spec, parent, job.calibration, job.spec.quantization.kept_float(job.path_id)
    )
    ov.save_model(quantized, str(Path(job.out_dir) / IR_FILE), compress_to_fp16=False)
    return {
        **parent,
        "format": "openvino",
        "file": IR_FILE,
        "openvino": ov.__version__,
        "weights_dtype": "int8",
        "parent_format": parent["format"],
        "quantization": settings,
    }


def calibration_items(spec, meta: dict, calibration: dict, batch: int) -> list[dict]:
    """The calibration samples as the model's feeds (``onnx_feed``: its input names, a single image input in its
    layout), ``batch`` samples an item (the last filled up by repeating its last sample)."""
    total = feeds.samples(spec, calibration)
    return [
        onnx_feed(spec, meta, feeds.padded(spec, feeds.rows(spec, calibration, start, start + batch), batch))
        for start in range(0, total, batch)
    ]


def static_batch(model) -> int:
    """1 where every input's first axis is dynamic, else the size the model fixed it to."""
    sizes = {
        port.get_partial_shape()[0].get_length()
        for port in model.inputs
        if port.get_partial_shape().rank.is_static
        and port.get_partial_shape().rank.get_length()
        and port.get_partial_shape()[0].is_static
    }
    return max(sizes) if sizes else 1


def settings_for(model, spec) -> dict:
    """The quantization settings (module docstring) as data: ``{"preset", "model_type", "why", "range_estimator"}``."""
    attention = has_attention(model)
    return {
        "preset": "MIXED" if attention else "PERFORMANCE",
        "model_type": "TRANSFORMER" if attention else None,
        "why": (
            "a MatMul of two activations (attention): NNCF's transformer settings"
            if attention
            else "no attention: symmetric weights and activations"
        ),
        "range_estimator": RANGE_ESTIMATORS[spec.quantization.calibration],
    }


def nncf_arguments(nncf, settings: dict, kept: tuple[str, ...]) -> dict:
    """The keyword arguments ``settings`` and ``kept`` make for ``nncf.quantize`` (and its accuracy control)."""
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters
    from nncf.quantization.range_estimator import RangeEstimatorParametersSet

    arguments = {
        "preset": getattr(nncf.QuantizationPreset, settings["preset"]),
        "advanced_parameters": AdvancedQuantizationParameters(
            activations_range_estimator_params=getattr(RangeEstimatorParametersSet, settings["range_estimator"])
        ),
    }
    if settings["model_type"]:
        arguments["model_type"] = getattr(nncf.ModelType, settings["model_type"])
    if kept:
        arguments["ignored_scope"] = nncf.IgnoredScope(names=list(kept))
    return arguments


def quantize(model, spec, meta: dict, calibration: dict, kept: tuple[str, ...]) -> tuple[object, dict]:
    """``(quantized ov.Model, meta["quantization"])``: ``model`` quantized by ``nncf.quantize`` on ``calibration``
    (every sample) with the settings ``settings_for`` picks, ``kept`` in float."""
    import nncf

    settings = settings_for(model, spec)
    items = calibration_items(spec, meta, calibration, static_batch(model))
    try:
        with quiet():
            quantized = nncf.quantize(
                model, nncf.Dataset(items), subset_size=len(items), **nncf_arguments(nncf, settings, kept)
            )
    except Exception as error:  # noqa: BLE001 - NNCF's own message is the export's error
        raise ExportError(one_line(f"nncf.quantize failed: {short_reason(error)}", 600)) from None
    layers = quantized_layers(quantized)
    still = [name for name in kept if name in layers]
    if still:
        raise ExportError(f"NNCF quantized {', '.join(still)} although the spec keeps it in float")
    record = {
        "tool": TOOL,
        "nncf": nncf.__version__,
        "preset": settings["preset"],
        "model_type": settings["model_type"],
        "preset_why": settings["why"],
        "calibration": spec.quantization.calibration,
        "range_estimator": {"activations": settings["range_estimator"], "weights": "MINMAX"},
        "calibration_samples": feeds.samples(spec, calibration),
        "subset_size": len(items),
        "fast_bias_correction": True,
        "kept_float": list(kept),
        "quantized_layers": len(layers),
        "layers": layers,
        **weight_record(quantized),
    }
    return quantized, record


@contextmanager
def quiet():
    """NNCF's progress bars and info lines kept out of the worker's output (its warnings and errors still raise or
    log)."""
    logger = logging.getLogger("nncf")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


def has_attention(model) -> bool:
    """Whether a MatMul multiplies two values computed from the inputs (attention's scores and context), not an
    input by a weight."""
    for op in model.get_ordered_ops():
        if op.get_type_name() == "MatMul" and all(not _is_constant(op.input_value(k).get_node()) for k in range(2)):
            return True
    return False


def _is_constant(node, depth: int = 6) -> bool:
    """A Constant, or reached from one through converts, reshapes, transposes and scales (a weight's chain)."""
    if node.get_type_name() == "Constant":
        return True
    if depth == 0 or node.get_type_name() not in (
        "Convert",
        "Reshape",
        "Transpose",
        "Multiply",
        "Subtract",
        "Unsqueeze",
        "Squeeze",
        "FakeQuantize",
    ):
        return False
    return all(_is_constant(node.input_value(k).get_node(), depth - 1) for k in range(node.get_input_size()))


def quantized_layers(model) -> list[str]:
    """The names of the weighted ops (MatMul, Convolution ...) that read an int8 weight or a FakeQuantize'd input:
    the layers that compute in int8 on the CPU plugin."""
    return [
        op.get_friendly_name()
        for op in model.get_ordered_ops()
        if op.get_type_name() in WEIGHTED_OPS
        and any(_quantized_input(op.input_value(k).get_node()) for k in range(op.get_input_size()))
    ]


def _quantized_input(node, depth: int = 4) -> bool:
    if node.get_type_name() == "FakeQuantize":
        return True
    if node.get_type_name() == "Constant":
        return node.get_output_element_type(0).get_type_name() in INT_TYPES
    if depth == 0 or node.get_type_name() not in ("Convert", "Multiply", "Subtract", "Reshape", "Transpose"):
        return False
    return any(_quantized_input(node.input_value(k).get_node(), depth - 1) for k in range(node.get_input_size()))


def weight_record(model) -> dict:
    """How the int8 weights are scaled and how many FakeQuantize ops the activations got."""
    per_channel = per_tensor = fake_quantize = 0
    for op in model.get_ordered_ops():
        kind = op.get_type_name()
        fake_quantize += kind == "FakeQuantize"
        if kind == "Constant" and op.get_output_element_type(0).get_type_name() in INT_TYPES:
            scale = _scale_of(op)
            if scale is not None:
                per_channel += scale > 1
                per_tensor += scale <= 1
    return {
        "per_channel": per_channel > 0,
        "weights": {"int8_per_channel": per_channel, "int8_per_tensor": per_tensor},
        "fake_quantize": fake_quantize,
    }


def _scale_of(constant) -> int | None:
    """The number of scales an int8 weight constant is multiplied by (Convert -> [Subtract] -> Multiply)."""
    node = constant
    for _ in range(3):
        readers = [target.get_node() for target in node.output(0).get_target_inputs()]
        if len(readers) != 1:
            return None
        node = readers[0]
        if node.get_type_name() == "Multiply":
            scales = [node.input_value(k).get_node() for k in range(2)]
            sizes = [int(np.prod(s.get_output_shape(0))) for s in scales if s.get_type_name() == "Constant"]
            return max(sizes) if sizes else None
    return None
