"""TensorFlow -> LiteRT: the Keras source model traced under ``tf.function`` and converted to a ``.tflite``
flatbuffer by the TFLite converter, at float32 (no optimizations, no quantization, TFLite builtin ops only).

The spec's named axes are exported dynamic where the Keras model allows it (``-1`` in the tensors'
``shape_signature``); if the converter refuses them, the model is converted at the static golden shape and
``meta["axes"]["reason"]`` says why. ``meta["taps"]`` records what each tap's Keras layer outputs (its shape in
the Keras layout, and the model output it is, if it is one), so the runtime can check the tensor it finds for a
layer before it reports one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from parity.exporters.axes import REASON_CHARS, axes_record, short_reason
from parity.exporters.common import ExportJob
from parity.platform.errors import ExportError, one_line
from parity.platform.safefs import write_bytes_atomic

TFLITE_FILE = "model.tflite"
# the converter's refusal of a TensorFlow op with builtins only: "'tf.Erfc' op is neither a custom op nor a flex op"
_REFUSED_OP = re.compile(r"'tf\.(\w+)' op is neither a custom op nor a flex op")


def export(job: ExportJob) -> dict:
    """The Keras source model at float32 with canonical weights, converted by ``tf.lite.TFLiteConverter`` into
    ``out_dir/model.tflite``; its metadata (``tflite_meta``)."""
    import tensorflow as tf

    from parity.exporters.tf_onnx import keras_function, signature

    spec = job.spec
    keras_model, layout, function, dynamic, reason = keras_function(job)
    data = None
    if any(dynamic.values()):
        try:
            data = convert(tf, function, signature(tf, spec, job.batch_size, layout, dynamic), keras_model)
        except Exception as error:  # noqa: BLE001 - retried static; a static failure is the one raised
            failed = f"the TFLite converter could not export the dynamic axes: {short_reason(error)}"
            reason = one_line("; ".join(filter(None, (failed, reason))), REASON_CHARS)
    if data is None:
        data = convert(tf, function, signature(tf, spec, job.batch_size, layout), keras_model)
    write_bytes_atomic(Path(job.out_dir) / TFLITE_FILE, data)
    meta = tflite_meta(spec, data, layout, reason, tap_records(spec, keras_model, layout))
    meta["keras_model_name"] = keras_model.name  # the outer name scope of the converter's tensor names
    return meta


def convert(tf, function, input_signature: list, keras_model) -> bytes:
    """``function`` traced at ``input_signature`` and converted to TFLite builtins at float32.

    The variables are frozen into the flatbuffer as constants: the converter's SavedModel route keeps a Keras 3
    model's variables as resource variables that nothing initialises in the ``.tflite`` file (every weight reads
    as zero), so the concrete function is frozen directly (``experimental_lower_to_saved_model`` off). Ops outside
    TFLite's builtins are not converted with ``SELECT_TF_OPS``: LiteRT's interpreter runs no TensorFlow (Flex) ops,
    so such a model is an export error naming the ops."""
    concrete = function.get_concrete_function(*input_signature)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], keras_model)
    converter.experimental_lower_to_saved_model = False
    converter.optimizations = []
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    converter.target_spec.supported_types = [tf.float32]
    try:
        return converter.convert()
    except Exception as error:  # noqa: BLE001 - any converter failure is the export's error, in its own words
        refused = sorted(set(_REFUSED_OP.findall(str(error))))
        if refused:
            raise ExportError(
                f"the TFLite converter could not convert op(s) {', '.join(refused)} to TFLite builtins "
                f"(LiteRT runs no TensorFlow ops)"
            ) from None
        raise ExportError(f"the TFLite converter failed: {short_reason(error)}") from None


def tap_records(spec, keras_model, layout: str) -> dict:
    """Tap -> ``{"shape": the Keras layer's output shape (None for a dynamic size), "output": the spec output it
    is, or None}``; a layer that returns several tensors has ``shape`` None (the runtime reports it unmapped)."""
    import keras

    from parity.sources.tf import call_output

    outputs = list(keras_model.outputs)
    records: dict[str, dict[str, Any]] = {}
    for tap in spec.taps:
        try:
            produced = call_output(keras, keras_model.get_layer(tap))
        except (ValueError, AttributeError) as error:  # not a top-level layer of the functional model
            records[tap] = {"shape": None, "output": None, "reason": one_line(str(error), REASON_CHARS)}
            continue
        single = not isinstance(produced, (list, tuple, dict))
        output = next(
            (spec.outputs[k] for k, out in enumerate(outputs) if out is produced and k < len(spec.outputs)), None
        )
        records[tap] = {
            "shape": [None if d is None else int(d) for d in produced.shape] if single else None,
            "output": output,
            "layout": layout if single and len(produced.shape) == 4 else None,
        }
    return records


def tflite_meta(spec, data: bytes, layout: str, reason: str | None, taps: dict) -> dict:
    """The artifact's metadata, read back from the flatbuffer: its subgraph's input tensors in the spec's input
    order, its output tensors in the spec's output order (the converter keeps the traced function's order and
    names its outputs ``Identity``, ``Identity_1`` ...: ``tflite_outputs`` maps the spec's names to them), and the
    axes as the inputs' ``shape_signature`` has them (-1 dynamic)."""
    inputs, outputs = _io_tensors(data)
    by_name = {name: (name, shape) for name, shape in inputs}
    ordered = [
        by_name.get(i.name, inputs[k] if k < len(inputs) else (i.name, None)) for k, i in enumerate(spec.model_inputs)
    ]
    if len(outputs) != len(spec.outputs):
        raise ExportError(f"the .tflite model has {len(outputs)} output(s), the spec names {len(spec.outputs)}")
    shapes = {i.name: shape for i, (_, shape) in zip(spec.model_inputs, ordered)}
    return {
        "format": "tflite",
        "file": TFLITE_FILE,
        "input_names": [name for name, _ in ordered],
        "output_names": list(outputs),
        "tflite_outputs": dict(zip(spec.outputs, outputs)),
        "tflite_inputs": {i.name: name for i, (name, _) in zip(spec.model_inputs, ordered)},
        "signature": None,  # a frozen concrete function converts to a graph without a SignatureDef
        "input_layout": layout,
        "canonical_layout": spec.model_inputs[0].layout if spec.model_inputs else "flat",
        "axes": axes_record(spec, shapes, layout, reason),
        "taps": taps,
        "converter": {
            "optimizations": [],
            "supported_ops": ["TFLITE_BUILTINS"],
            "select_tf_ops": False,
            "frozen_variables": True,
        },
    }


def _io_tensors(data: bytes) -> tuple[list, list[str]]:
    """``([(input name, shape with None where dynamic)], [output names])`` of the main subgraph, read from the
    flatbuffer with TensorFlow's schema (no interpreter)."""
    from tensorflow.lite.python import schema_py_generated as schema

    graph = schema.Model.GetRootAsModel(data, 0).Subgraphs(0)

    def tensor(index):
        return graph.Tensors(int(index))

    def shape(t):
        dims = t.ShapeSignatureAsNumpy() if t.ShapeSignatureLength() else t.ShapeAsNumpy()
        return [None if int(d) < 0 else int(d) for d in (dims if hasattr(dims, "__len__") else [])]

    inputs = [(tensor(k).Name().decode(), shape(tensor(k))) for k in graph.InputsAsNumpy()]
    outputs = [tensor(k).Name().decode() for k in graph.OutputsAsNumpy()]
    return inputs, outputs
