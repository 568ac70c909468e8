"""JAX -> TensorFlow with jax2tf, saved as a SavedModel whose weights stay tf.Variables.

The saved function keeps its gradient (``with_gradient=True`` and custom gradients saved),
so the ``jax/tf`` path can be differentiated in TensorFlow. Current JAX serialises through
the ``XlaCallModule`` op.
"""

from __future__ import annotations

from parity.exporters import tf_onnx
from parity.exporters.common import ExportJob
from parity.model import layouts
from parity.sources.jax import forward_outputs, packed


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

    inputs = [i.name for i in spec.model_inputs]

    def apply(param_values, *xs):
        return forward_outputs(spec, spec.jax_apply(dict(zip(names, param_values)), packed(dict(zip(inputs, xs))), None))

    converted = jax2tf.convert(apply, with_gradient=True)

    @tf.function(autograph=False, input_signature=tf_onnx.signature(tf, spec, job.batch_size, spec.model_inputs[0].layout))
    def forward(*xs):
        return converted(list(module.param_list), *xs)

    module.forward = forward
    tf.saved_model.save(module, str(job.out_dir), options=tf.saved_model.SaveOptions(experimental_custom_gradients=True))
    return {"format": "tf-savedmodel", "param_names": names, "input_layout": spec.model_inputs[0].layout,
            "canonical_layout": spec.model_inputs[0].layout, "output_names": list(spec.outputs)}
