"""TensorFlow -> full-integer LiteRT: the Keras source model converted by the TFLite converter with post-training
int8 quantization, calibrated on the job's calibration samples (``representative_dataset``).

Every op computes in int8 (``supported_ops=[TFLITE_BUILTINS_INT8]``: an op the converter cannot quantize fails the
conversion instead of silently staying float); the model's inputs and outputs stay float32 (a QUANTIZE op after each
input, a DEQUANTIZE before each output), so it is fed and read as the float ``tf/litert`` model is. Weights are
quantized symmetric (per channel for convolutions), activations asymmetric, their ranges the min and max the
calibration samples reach: the converter's only calibration.

Layers the spec keeps in float (``spec.quantization.kept_float(path_id)``) go through TensorFlow's documented
selective quantization: ``tf.lite.experimental.QuantizationDebugger`` with ``QuantizationDebugOptions(
denylisted_nodes=...)`` and ``get_nondebug_quantized_model()``; the denylisted ops keep float weights and compute in
float32 between a DEQUANTIZE and a QUANTIZE, the others stay int8, and the supported ops then include the float
builtins. A name is an op's output tensor in the converter's graph (``cnn_1/pool1_1/AvgPool``) or a Keras layer
name (``conv2``: every op whose output tensor holds that layer's ops); a name that matches no op is an error naming
the ops there are.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from parity.exporters.axes import REASON_CHARS, short_reason
from parity.exporters.common import ExportJob
from parity.exporters.tf_litert import _REFUSED_OP, TFLITE_FILE, tap_records, tflite_meta
from parity.model import feeds, layouts
from parity.platform.errors import ExportError, one_line
from parity.platform.safefs import write_bytes_atomic

TOOL = "tf.lite.TFLiteConverter (post-training integer quantization)"
INT8_OPS = "TFLITE_BUILTINS_INT8"
FLOAT_OPS = "TFLITE_BUILTINS"
# flatbuffer TensorType codes (tensorflow/lite/schema): what an op's output tensor holds
TENSOR_TYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 7: "int16", 9: "int8"}
EDGE_OPS = {"QUANTIZE", "DEQUANTIZE"}  # the converter's casts between float and int8, not layers
SHAPE_OPS = {"SHAPE", "STRIDED_SLICE", "PACK", "GATHER", "CONCATENATION"}  # int32 shape arithmetic


def export(job: ExportJob) -> dict:
    """The Keras source model at float32 with canonical weights, quantized to int8 by the TFLite converter from
    ``job.calibration`` into ``out_dir/model.tflite``; its metadata (``tflite_meta``) plus ``quantization``: the
    tool, the calibration, the layers kept in float, how many ops compute in int8 and how weights are scaled."""
    import tensorflow as tf

    from parity.exporters.tf_onnx import keras_function, signature

    spec = job.spec
    if not job.calibration:
        raise ExportError("tf/litert-int8 needs calibration samples and was given none")
    kept = tuple(spec.quantization.kept_float(job.path_id))
    keras_model, layout, function, dynamic, reason = keras_function(job)
    converted = None
    if any(dynamic.values()):
        try:
            converted = quantize(
                tf,
                spec,
                function,
                signature(tf, spec, job.batch_size, layout, dynamic),
                keras_model,
                job.calibration,
                layout,
                1,
                kept,
            )
        except ExportError as error:
            if kept and "keeps in float" in str(error):  # a wrong name is wrong at any shape
                raise
            failed = f"the TFLite converter could not quantize the dynamic axes: {short_reason(error)}"
            reason = one_line("; ".join(filter(None, (failed, reason))), REASON_CHARS)
    if converted is None:
        converted = quantize(
            tf,
            spec,
            function,
            signature(tf, spec, job.batch_size, layout),
            keras_model,
            job.calibration,
            layout,
            job.batch_size,
            kept,
        )
    data, denylisted = converted
    write_bytes_atomic(Path(job.out_dir) / TFLITE_FILE, data)
    meta = tflite_meta(spec, data, layout, reason, tap_records(spec, keras_model, layout))
    meta["keras_model_name"] = keras_model.name
    supported = [INT8_OPS, FLOAT_OPS] if denylisted else [INT8_OPS]
    meta["converter"] = {
        "optimizations": ["DEFAULT"],
        "supported_ops": supported,
        "select_tf_ops": False,
        "frozen_variables": True,
        "inference_input_type": "float32",
        "inference_output_type": "float32",
        "selective": "QuantizationDebugger.get_nondebug_quantized_model" if denylisted else None,
    }
    meta["quantization"] = quantization_record(data, spec, job.calibration, kept, denylisted, supported, tf.__version__)
    return meta


def representative(spec, calibration: dict, layout: str, batch: int):
    """The converter's ``representative_dataset``: a callable yielding each batch of ``batch`` calibration samples
    (the last filled up by repeating its last sample) as the traced function's positional inputs, a single image
    input in ``layout``."""
    total = feeds.samples(spec, calibration)

    def dataset():
        for start in range(0, total, batch):
            rows = feeds.padded(spec, feeds.rows(spec, calibration, start, start + batch), batch)
            values = []
            for i in spec.model_inputs:
                value = np.asarray(rows[i.name])
                if len(spec.model_inputs) == 1:
                    value = layouts.to_layout(value, i.layout, layout)
                values.append(value.astype(np.float32) if value.dtype.kind == "f" else value)
            yield values

    return dataset


def quantize(
    tf,
    spec,
    function,
    input_signature: list,
    keras_model,
    calibration: dict,
    layout: str,
    batch: int,
    kept: tuple[str, ...],
) -> tuple[bytes, list[str]]:
    """``(flatbuffer, denylisted op tensor names)``: ``function`` traced at ``input_signature`` and quantized to
    full integer, or with the ``kept`` layers denylisted (see the module docstring)."""
    dataset = representative(spec, calibration, layout, batch)
    concrete = function.get_concrete_function(*input_signature)

    def converter(supported: list[str]):
        made = tf.lite.TFLiteConverter.from_concrete_functions([concrete], keras_model)
        made.experimental_lower_to_saved_model = False  # frozen variables, as tf_litert.convert says why
        made.optimizations = [tf.lite.Optimize.DEFAULT]
        made.representative_dataset = dataset
        made.target_spec.supported_ops = [getattr(tf.lite.OpsSet, name) for name in supported]
        made.inference_input_type = tf.float32
        made.inference_output_type = tf.float32
        return made

    with warnings.catch_warnings():  # "statistics for quantized inputs were expected": the float inputs have none
        warnings.simplefilter("ignore", UserWarning)
        try:
            if not kept:
                return converter([INT8_OPS]).convert(), []
            debugger = _debugger(tf, converter([INT8_OPS, FLOAT_OPS]), dataset, [])
            denylisted = resolve_kept(kept, op_outputs(debugger.calibrated_model), keras_model.name)
            debugger = _debugger(tf, converter([INT8_OPS, FLOAT_OPS]), dataset, denylisted)
            data = debugger.get_nondebug_quantized_model()
        except ExportError:
            raise
        except Exception as error:  # noqa: BLE001 - any converter failure is the export's error, in its own words
            refused = sorted(set(_REFUSED_OP.findall(str(error))))
            if refused:
                raise ExportError(
                    f"the TFLite converter could not convert op(s) {', '.join(refused)} to TFLite "
                    f"builtins (LiteRT runs no TensorFlow ops)"
                ) from None
            raise ExportError(
                f"the TFLite converter could not quantize the model to int8: {short_reason(error)}"
            ) from None
    still_int8 = [
        name
        for name, (_, dtype) in _by_output(op_outputs(data)).items()
        if name in denylisted and dtype not in ("float32",)
    ]
    if still_int8:
        raise ExportError(
            f"the TFLite converter kept op(s) {', '.join(still_int8)} in int8 although they were denylisted"
        )
    return data, denylisted


def _debugger(tf, converter, dataset, denylisted: list[str]):
    """TensorFlow's quantization debugger over ``converter``: it calibrates (``calibrated_model``) and quantizes
    with ``denylisted`` op outputs left in float."""
    options = tf.lite.experimental.QuantizationDebugOptions(denylisted_nodes=list(denylisted))
    return tf.lite.experimental.QuantizationDebugger(converter=converter, debug_dataset=dataset, debug_options=options)


def resolve_kept(kept: tuple[str, ...], ops: list[tuple[str, str, str]], model_name: str | None) -> list[str]:
    """The op output tensors ``kept`` names (see the module docstring), in graph order. Raises ``ExportError``
    naming the ops of the graph when a name matches none."""
    from parity.runtimes.litert import tensor_layers

    layers = [name for name, _, _ in ops]
    chosen, unknown = set(), []
    for name in kept:
        if name in layers:
            chosen.add(name)
            continue
        holding = {
            tensor for tensor, op, _ in ops if op not in EDGE_OPS and name in tensor_layers(tensor, [name], model_name)
        }
        if holding:
            chosen |= holding
        else:
            unknown.append(name)
    if unknown:
        listed = "; ".join(f"{op} {tensor!r}" for tensor, op, _ in ops if op not in EDGE_OPS | SHAPE_OPS)
        raise ExportError(
            one_line(
                f"tf/litert-int8 keeps in float {', '.join(map(repr, unknown))}, which is no op's "
                f"output tensor nor a layer in the converter's graph; its ops: {listed}",
                2000,
            )
        )
    return [tensor for tensor in layers if tensor in chosen]


def op_outputs(data: bytes) -> list[tuple[str, str, str]]:
    """``[(output tensor name, op name, output dtype)]`` of the main subgraph's ops in execution order, read from the
    flatbuffer with TensorFlow's schema (no interpreter)."""
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.Model.GetRootAsModel(data, 0)
    graph = model.Subgraphs(0)
    names = {code: name for name, code in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    ops = []
    for k in range(graph.OperatorsLength()):
        op = graph.Operators(k)
        code = model.OperatorCodes(op.OpcodeIndex())
        name = names.get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode()), "CUSTOM")
        for index in op.OutputsAsNumpy():
            tensor = graph.Tensors(int(index))
            ops.append((tensor.Name().decode(), name, TENSOR_TYPES.get(tensor.Type(), f"type {tensor.Type()}")))
    return ops


def _by_output(ops: list[tuple[str, str, str]]) -> dict[str, tuple[str, str]]:
    return {tensor: (op, dtype) for tensor, op, dtype in ops}


def weight_scales(data: bytes) -> dict[str, int]:
    """How the int8 weights (constant tensors with a buffer) are scaled: ``{"per_channel": n, "per_tensor": n}``."""
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.Model.GetRootAsModel(data, 0)
    graph = model.Subgraphs(0)
    counts = {"per_channel": 0, "per_tensor": 0}
    for k in range(graph.TensorsLength()):
        tensor = graph.Tensors(k)
        quantization = tensor.Quantization()
        if tensor.Type() != 9 or quantization is None or not model.Buffers(tensor.Buffer()).DataLength():
            continue
        counts["per_channel" if quantization.ScaleLength() > 1 else "per_tensor"] += 1
    return counts


def quantization_record(
    data: bytes,
    spec,
    calibration: dict,
    kept: tuple[str, ...],
    denylisted: list[str],
    supported: list[str],
    tf_version: str,
) -> dict:
    """``meta["quantization"]``: what the converter did, read back from the flatbuffer (``quantized_layers``: the
    ops that compute in int8, casts and data movement aside)."""
    from parity.runtimes.litert import DATA_MOVEMENT

    ops = op_outputs(data)
    layers = [
        (tensor, op, dtype) for tensor, op, dtype in ops if op not in EDGE_OPS | DATA_MOVEMENT and dtype != "int32"
    ]
    scales = weight_scales(data)
    return {
        "tool": TOOL,
        "tensorflow": tf_version,
        "calibration": "MinMax",
        "calibration_note": "the TFLite converter's only calibration: each activation's min and max over the "
        "representative dataset",
        "requested_calibration": spec.quantization.calibration,
        "calibration_samples": feeds.samples(spec, calibration),
        "per_channel": scales["per_channel"] > 0,
        "weights": {"int8_per_channel": scales["per_channel"], "int8_per_tensor": scales["per_tensor"]},
        "activations": "int8 asymmetric (per tensor)",
        "kept_float": list(kept),
        "denylisted_nodes": denylisted,
        "supported_ops": supported,
        "quantized_layers": sum(dtype in ("int8", "uint8", "int16") for _, _, dtype in layers),
        "float_layers": [tensor for tensor, _, dtype in layers if dtype == "float32"],
        "input_output": "float32 (QUANTIZE after each input, DEQUANTIZE before each output)",
    }
