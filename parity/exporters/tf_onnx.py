"""TensorFlow -> ONNX with tf2onnx: from the Keras source, or from a SavedModel (jax2tf's)."""

from __future__ import annotations

from parity.exporters.common import (
    ExportJob,
    capture_logs,
    check_onnx_ops,
    failed_tf_ops,
    graph_input_names,
    onnx_meta,
    save_onnx,
)
from parity.model import layouts
from parity.platform.errors import ExportError


def _convert(function, input_signature, opset: int, out_dir):
    import tf2onnx

    with capture_logs("tf2onnx") as log_lines:
        try:
            model, _ = tf2onnx.convert.from_function(function, input_signature=input_signature, opset=opset)
        except Exception as error:
            ops = failed_tf_ops(log_lines)
            where = f" op(s) {', '.join(ops)}" if ops else ""
            raise ExportError(f"tf2onnx could not convert{where}: {type(error).__name__}: {error}") from None
    ops = failed_tf_ops(log_lines)
    check_onnx_ops(model, "tf2onnx", f"unsupported TensorFlow ops: {', '.join(ops)}" if ops else "")
    save_onnx(model, out_dir)
    return model


def signature(tf, spec, batch_size: int, layout: str) -> list:
    """One ``TensorSpec`` per input in the spec's order (a single image input in ``layout``; floating inputs
    float32 unless declared float64)."""
    specs = []
    for i in spec.model_inputs:
        shape = spec.input_shape(i.name, batch_size)
        if layout == "nhwc" and len(spec.model_inputs) == 1:
            shape = tuple(shape[k] for k in (0, 2, 3, 1))
        dtype = ("float64" if i.dtype == "float64" else "float32") if i.floating else i.dtype
        specs.append(tf.TensorSpec(shape, tf.as_dtype(dtype), name=i.name))
    return specs


def _onnx_names(model, spec, layout: str) -> dict:
    return onnx_meta(spec, graph_input_names(model), [o.name for o in model.graph.output], layout)


def export_keras(job: ExportJob) -> dict:
    """The Keras source model, traced under tf.function, converted by tf2onnx."""
    import tensorflow as tf

    from parity.model.feeds import call_keras as call
    from parity.runtimes.tf_common import outputs_in_order
    from parity.sources.tf import build_model

    spec = job.spec
    keras_model = build_model(spec, job.weights, "float32")
    layout = layouts.activation_layout("tf", spec.model_inputs[0].layout)
    names = [i.name for i in spec.model_inputs]
    function = tf.function(lambda *xs: outputs_in_order(spec, call(keras_model, dict(zip(names, xs)))))
    model = _convert(function, signature(tf, spec, job.batch_size, layout), job.opset, job.out_dir)
    return _onnx_names(model, spec, layout)


def export_saved_model(job: ExportJob) -> dict:
    """A SavedModel made by an earlier stage (jax2tf), converted by tf2onnx."""
    import tensorflow as tf

    spec = job.spec
    layout = job.parent_meta["input_layout"]
    loaded = tf.saved_model.load(str(job.parent_dir))
    model = _convert(loaded.forward, signature(tf, spec, job.batch_size, layout), job.opset, job.out_dir)
    return _onnx_names(model, spec, layout)
