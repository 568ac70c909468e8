"""JAX -> TensorFlow with jax2tf, saved as a SavedModel whose weights stay tf.Variables.

The saved function keeps its gradient (``with_gradient=True`` and custom gradients saved),
so the ``jax/tf`` path can be differentiated in TensorFlow. Current JAX serialises through
the ``XlaCallModule`` op.

The spec's named axes are shape-polymorphic (``polymorphic_shapes`` with the axis names as symbols) and
None in the saved ``input_signature``; where JAX's shape polymorphism refuses them, the SavedModel is saved
static and ``meta["axes"]["reason"]`` says why.
"""

from __future__ import annotations

from pathlib import Path

from parity.exporters import tf_onnx
from parity.exporters.axes import REASON_CHARS, axes_record, declared_dynamic, short_reason
from parity.exporters.common import ExportJob
from parity.model import layouts
from parity.platform.errors import one_line
from parity.sources.jax import forward_outputs, packed

SAVED_ENTRIES = ("saved_model.pb", "fingerprint.pb", "variables", "assets")  # what a failed save may leave


def export(job: ExportJob) -> dict:
    spec = job.spec
    layout = spec.model_inputs[0].layout
    wanted = declared_dynamic(spec, layout)
    reason = None
    forward = None
    if any(wanted.values()):
        try:
            forward, names = _save(job, wanted)
        except Exception as error:  # noqa: BLE001 - saved static below; a static failure is the one raised
            reason = one_line(f"jax2tf could not save the dynamic axes: {short_reason(error)}", REASON_CHARS)
            _clear(job.out_dir)
            forward = None
    if forward is None:
        forward, names = _save(job, None)
    shapes = {
        i.name: (None if s.shape.rank is None else s.shape.as_list())
        for i, s in zip(spec.model_inputs, forward.input_signature)
    }
    return {
        "format": "tf-savedmodel",
        "param_names": names,
        "input_layout": layout,
        "canonical_layout": spec.model_inputs[0].layout,
        "output_names": list(spec.outputs),
        "axes": axes_record(spec, shapes, layout, reason),
    }


def _save(job: ExportJob, dynamic: dict[str, set[int]] | None):
    """Convert and save; ``dynamic`` (input name -> axis indices) are polymorphic in jax2tf and None in the
    saved signature. Returns (the saved tf.function, the parameter names)."""
    import tensorflow as tf
    from jax.experimental import jax2tf

    spec = job.spec
    names = list(spec.params)
    module = tf.Module()
    module.param_list = [
        tf.Variable(
            layouts.held_array(spec.params[n], job.weights[n], "float32"),
            name=n.replace("/", "."),
            trainable=spec.params[n].trainable,
        )
        for n in names
    ]

    inputs = [i.name for i in spec.model_inputs]

    def apply(param_values, *xs):
        return forward_outputs(
            spec, spec.jax_apply(dict(zip(names, param_values)), packed(dict(zip(inputs, xs))), None)
        )

    layout = spec.model_inputs[0].layout
    options = {}
    if dynamic is not None:
        options["polymorphic_shapes"] = [None] + [
            _polymorphic(spec, i, job.batch_size, dynamic) for i in spec.model_inputs
        ]
    converted = jax2tf.convert(apply, with_gradient=True, **options)

    @tf.function(autograph=False, input_signature=tf_onnx.signature(tf, spec, job.batch_size, layout, dynamic))
    def forward(*xs):
        return converted(list(module.param_list), *xs)

    forward.get_concrete_function()  # traced here, so a refused polymorphic shape fails before anything is saved
    module.forward = forward
    tf.saved_model.save(
        module, str(job.out_dir), options=tf.saved_model.SaveOptions(experimental_custom_gradients=True)
    )
    return forward, names


def _polymorphic(spec, i, batch_size: int, dynamic: dict[str, set[int]]) -> str:
    """jax2tf's polymorphic shape of input ``i``: ``"(batch, 64)"``, an axis name where it is dynamic."""
    shape = spec.input_shape(i.name, batch_size)
    left = dynamic.get(i.name, ())
    dims = [axis if k in left else str(size) for k, (axis, size) in enumerate(zip(i.axis_names, shape))]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def _clear(out_dir) -> None:
    """Remove what a failed save may have written (the folder is the exporter's own)."""
    import shutil

    for name in SAVED_ENTRIES:
        path = Path(out_dir) / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink()
