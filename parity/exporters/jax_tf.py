"""JAX -> TensorFlow with jax2tf, saved as a SavedModel whose weights stay tf.Variables.

The saved function keeps its gradient (``with_gradient=True`` and custom gradients saved),
so the ``jax/tf`` path can be differentiated in TensorFlow. Current JAX serialises through
the ``XlaCallModule`` op.
"""

from __future__ import annotations

from parity.exporters.common import ExportJob
from parity.model import layouts
from parity.runtimes.base import as_tuple


def export(job: ExportJob) -> dict:
    import tensorflow as tf
    from jax.experimental import jax2tf

    spec = job.spec
    names = list(spec.params)
    module = tf.Module()
    module.param_list = [
        tf.Variable(layouts.held_array(spec.params[n], job.weights[n], "float32"), name=n.replace("/", "."), trainable=spec.params[n].trainable)
        for n in names
    ]

    def apply(param_values, x):
        return as_tuple(spec.jax_apply(dict(zip(names, param_values)), x, None))

    converted = jax2tf.convert(apply, with_gradient=True)
    signature = [tf.TensorSpec((job.batch_size, *spec.input.shape), tf.as_dtype(spec.input.dtype), name=spec.input.name)]

    @tf.function(autograph=False, input_signature=signature)
    def forward(x):
        return converted(list(module.param_list), x)

    module.forward = forward
    tf.saved_model.save(module, str(job.out_dir), options=tf.saved_model.SaveOptions(experimental_custom_gradients=True))
    return {"format": "tf-savedmodel", "param_names": names, "input_layout": spec.input.layout,
            "canonical_layout": spec.input.layout, "output_names": list(spec.outputs)}
