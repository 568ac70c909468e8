"""TensorFlow -> ONNX with tf2onnx: from the Keras source, or from a SavedModel (jax2tf's).

The spec's named axes (``batch``, and axes such as ``sequence``) are exported dynamic where the source
allows it: the Keras model's own input shape (a size it fixes stays fixed), the SavedModel's saved
signature (a static one stays static). ``meta["axes"]`` records what the graph's inputs came out as.
"""

from __future__ import annotations

from parity.exporters.axes import NHWC_AXES, REASON_CHARS, declared_dynamic, name_dims, onnx_axes, short_reason
from parity.exporters.common import (
    ExportJob,
    capture_logs,
    check_onnx_ops,
    failed_tf_ops,
    graph_input_names,
    onnx_meta,
    save_onnx,
)
from parity.exporters.onnx_names import name_graph
from parity.model import layouts
from parity.platform.errors import ExportError, one_line


def _convert(function, input_signature, opset: int, out_dir, spec=None, layout: str | None = None):
    import tf2onnx

    with capture_logs("tf2onnx") as log_lines:
        try:
            model, _ = tf2onnx.convert.from_function(function, input_signature=input_signature, opset=opset)
        except Exception as error:  # noqa: BLE001 - the converter's own reason is the export's reason
            ops = failed_tf_ops(log_lines)
            where = f" op(s) {', '.join(ops)}" if ops else ""
            raise ExportError(f"tf2onnx could not convert{where}: {type(error).__name__}: {error}") from None
    ops = failed_tf_ops(log_lines)
    check_onnx_ops(model, "tf2onnx", f"unsupported TensorFlow ops: {', '.join(ops)}" if ops else "")
    if spec is not None:
        name_dims(model, spec, layout)
        name_graph(model, outputs=list(spec.outputs))  # tf2onnx writes ``Identity:0``: named by the spec's keys
    save_onnx(model, out_dir)
    return model


def _convert_dynamic(
    function, spec, batch_size: int, layout: str, dynamic: dict[str, set[int]], opset: int, out_dir, reason: str | None
) -> tuple:
    """Convert with ``dynamic`` axes left None; if that fails, convert at the static golden shape and keep the
    error as the reason. Returns (the ONNX model, the reason some declared axes are static, or None)."""
    import tensorflow as tf

    if any(dynamic.values()):
        try:
            return _convert(
                function, signature(tf, spec, batch_size, layout, dynamic), opset, out_dir, spec, layout
            ), reason
        except Exception as error:  # noqa: BLE001 - retried static; a static failure is the one raised
            failed = f"tf2onnx could not export the dynamic axes: {short_reason(error)}"
            reason = one_line("; ".join(filter(None, (failed, reason))), REASON_CHARS)
    return _convert(function, signature(tf, spec, batch_size, layout), opset, out_dir, spec, layout), reason


def signature(tf, spec, batch_size: int, layout: str, dynamic: dict[str, set[int]] | None = None) -> list:
    """One ``TensorSpec`` per input in the spec's order (a single image input in ``layout``; floating inputs
    float32 unless declared float64); the axes ``dynamic`` lists (input name -> axis indices in ``layout``)
    are None, the others at their golden size for ``batch_size``."""
    specs = []
    for i in spec.model_inputs:
        shape = spec.input_shape(i.name, batch_size)
        if layout == "nhwc" and len(spec.model_inputs) == 1:
            shape = tuple(shape[k] for k in NHWC_AXES)
        left = (dynamic or {}).get(i.name, ())
        shape = tuple(None if k in left else size for k, size in enumerate(shape))
        dtype = ("float64" if i.dtype == "float64" else "float32") if i.floating else i.dtype
        specs.append(tf.TensorSpec(shape, tf.as_dtype(dtype), name=i.name))
    return specs


def _onnx_names(model, spec, layout: str) -> dict:
    return onnx_meta(spec, graph_input_names(model), [o.name for o in model.graph.output], layout)


def _keras_dynamic(keras_model, spec, wanted: dict[str, set[int]]) -> tuple[dict[str, set[int]], str | None]:
    """The declared dynamic axes the Keras model accepts dynamic (its input shape has None there), and why the
    others are not: a Keras input of fixed size takes only that size."""
    keras_inputs = list(getattr(keras_model, "inputs", None) or [])
    names = [i.name for i in spec.model_inputs]
    if {getattr(t, "name", None) for t in keras_inputs} == set(names):
        by_name = {t.name: t for t in keras_inputs}
    elif len(keras_inputs) == len(names):
        by_name = dict(zip(names, keras_inputs))
    else:
        return wanted, None  # not matched to the spec's inputs: the declared axes as they are
    allowed: dict[str, set[int]] = {}
    fixed = []
    for name, indices in wanted.items():
        shape = tuple(by_name[name].shape)
        allowed[name] = set()
        for k in sorted(indices):
            if k >= len(shape) or shape[k] is None:
                allowed[name].add(k)
            else:
                fixed.append(f"{name} axis {k} is {shape[k]}")
    reason = ("the Keras model fixes the size of declared dynamic axes (" + "; ".join(fixed) + ")") if fixed else None
    return allowed, reason


def keras_function(job: ExportJob):
    """What a converter of the Keras source model starts from: the model at float32 with canonical weights, its
    activation layout, its call under ``tf.function`` taking the inputs positionally (outputs in the spec's order),
    the declared dynamic axes the model leaves dynamic and why any are not. ``(keras_model, layout, function,
    dynamic, reason)``."""
    import tensorflow as tf

    from parity.model.feeds import call_keras as call
    from parity.runtimes.tf_common import outputs_in_order
    from parity.sources.tf import build_model

    spec = job.spec
    keras_model = build_model(spec, job.weights, "float32")
    layout = layouts.activation_layout("tf", spec.model_inputs[0].layout)
    names = [i.name for i in spec.model_inputs]
    function = tf.function(lambda *xs: outputs_in_order(spec, call(keras_model, dict(zip(names, xs)))))
    dynamic, reason = _keras_dynamic(keras_model, spec, declared_dynamic(spec, layout))
    return keras_model, layout, function, dynamic, reason


def export_keras(job: ExportJob) -> dict:
    """The Keras source model, traced under tf.function, converted by tf2onnx."""
    spec = job.spec
    _, layout, function, dynamic, reason = keras_function(job)
    model, reason = _convert_dynamic(function, spec, job.batch_size, layout, dynamic, job.opset, job.out_dir, reason)
    return {**_onnx_names(model, spec, layout), "axes": onnx_axes(spec, model, layout, reason)}


def _saved_signature(function) -> list | None:
    """The TensorSpecs a restored ``tf.function`` was saved with (None where it cannot be read)."""
    signature_ = getattr(function, "input_signature", None)
    if signature_ is None:
        concrete = list(getattr(function, "concrete_functions", None) or [])
        if len(concrete) != 1:
            return None
        signature_ = concrete[0].structured_input_signature[0]
    return list(signature_)


def export_saved_model(job: ExportJob) -> dict:
    """A SavedModel made by an earlier stage (jax2tf), converted by tf2onnx: its axes are dynamic where the
    SavedModel's signature has them dynamic."""
    import tensorflow as tf

    spec = job.spec
    parent_dir, parent_meta = job.parent()
    layout = parent_meta["input_layout"]
    loaded = tf.saved_model.load(str(parent_dir))
    wanted = declared_dynamic(spec, layout)
    saved = _saved_signature(loaded.forward)
    reason = None
    if saved is not None and len(saved) == len(spec.model_inputs):
        dynamic, kept = {}, []
        for i, tensor_spec in zip(spec.model_inputs, saved):
            dims = tensor_spec.shape.as_list() if tensor_spec.shape.rank is not None else None
            dynamic[i.name] = {k for k in wanted[i.name] if dims is None or k >= len(dims) or dims[k] is None}
            if dims is not None:  # an unknown rank keeps nothing static
                kept += [f"{i.name} axis {k} is {dims[k]}" for k in sorted(wanted[i.name] - dynamic[i.name])]
        if kept:
            parent_reason = (parent_meta.get("axes") or {}).get("reason")
            reason = one_line(
                "tf2onnx kept the SavedModel's static signature ("
                + "; ".join(kept)
                + ")"
                + (f": {parent_reason}" if parent_reason else ""),
                REASON_CHARS,
            )
    else:
        dynamic = wanted  # unreadable: try the declared axes (a signature that refuses them falls back static)
    model, reason = _convert_dynamic(
        loaded.forward, spec, job.batch_size, layout, dynamic, job.opset, job.out_dir, reason
    )
    return {**_onnx_names(model, spec, layout), "axes": onnx_axes(spec, model, layout, reason)}
