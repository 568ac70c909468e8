"""TensorFlow pieces shared by the Keras source and the SavedModel runtime: outputs in spec order, the
device name, tape gradients and one SGD step, all in canonical layout."""

from __future__ import annotations

import numpy as np

from parity.model import layouts, outputs
from parity.platform.errors import Unavailable


def outputs_in_order(spec, returned) -> tuple:
    """The spec's outputs of a returned structure (list, dict, ...), in the spec's order."""
    import tensorflow as tf

    return tuple(outputs.named(spec.outputs, outputs.flatten(returned, tf.is_tensor)).values())


def to_tf(tf, spec, feeds: dict, layout: str, device: str, dtype: str | None = None) -> dict:
    """Feeds as constants on ``device``, a single input in the activation ``layout``, floating ones cast to
    ``dtype`` (given)."""
    with tf.device(device):
        tensors = {}
        for i in spec.model_inputs:
            value = layouts.to_layout(feeds[i.name], i.layout, layout) if len(spec.model_inputs) == 1 else feeds[i.name]
            tensor = tf.constant(value)
            tensors[i.name] = tf.cast(tensor, dtype) if dtype and tensor.dtype.is_floating else tensor
        return tensors


def tf_device(tf, device: str) -> str:
    """The TensorFlow device name for ``cpu`` / ``cuda:N`` (inside a worker the chosen GPU is GPU 0)."""
    if device == "cpu":
        return "/CPU:0"
    if not tf.config.list_physical_devices("GPU"):
        raise Unavailable(f"tensorflow {tf.__version__} sees no GPU")
    return "/GPU:0"


def tape_gradients(
    tf, spec, forward, variables: dict, inputs: dict, labels, input_layout: str, param_layout: str
) -> dict:
    """Gradients of mean cross-entropy w.r.t. trainable ``variables`` (by canonical name) and every floating
    input (``inputs``: name -> tensor, as ``forward`` takes them).

    ``param_layout`` is the layout the variables are stored in (``"tf"`` for Keras, ``"spec"``
    for canonical); results come back in canonical layout.
    """
    trainable = [variables[name] for name in spec.trainable_params]
    watched = {name: inputs[name] for name in spec.input_grad_names}
    with tf.GradientTape() as tape:
        for tensor in watched.values():
            tape.watch(tensor)
        logits = _loss_dtype(tf, outputs_in_order(spec, forward(inputs))[0])
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    grads = tape.gradient(loss, [*trainable, *watched.values()])
    result = {
        name: layouts.param_from_framework(param_layout, spec.params[name].kind, dense_gradient(tf, g, variable))
        for name, variable, g in zip(spec.trainable_params, trainable, grads)
    }
    for (name, tensor), g in zip(watched.items(), grads[len(trainable) :]):
        layout = next(i.layout for i in spec.model_inputs if i.name == name)
        result[spec.input_grad_names[name]] = layouts.from_layout(dense_gradient(tf, g, tensor), layout, input_layout)
    return result


def _loss_dtype(tf, logits):
    """Reduced-precision logits in float32 for the loss, as mixed-precision training computes it."""
    return tf.cast(logits, tf.float32) if logits.dtype in (tf.float16, tf.bfloat16) else logits


def sgd_step(tf, spec, forward, variables: list):
    """One ``tf.function``: forward, mean cross-entropy, ``GradientTape``, ``assign_sub(lr * grad)`` on
    every variable in ``variables`` (a variable the loss does not reach has no gradient: left as it is).

    Called as ``step(inputs, labels, lr)`` with tensors (``inputs`` as ``forward`` takes them; ``lr`` a scalar
    tensor, so a new rate does not retrace); returns the loss.
    """

    @tf.function
    def step(inputs, labels, lr):
        with tf.GradientTape() as tape:
            logits = _loss_dtype(tf, outputs_in_order(spec, forward(inputs))[0])
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        grads = tape.gradient(loss, variables)
        for variable, grad in zip(variables, grads):
            if grad is not None:
                variable.assign_sub(tf.cast(lr, variable.dtype) * tf.convert_to_tensor(grad))
        return loss

    return step


def run_sgd_step(tf, step, inputs, labels, lr: float, dtype: str) -> None:
    """Call a ``sgd_step`` function and wait for it (reading the loss back ends the step)."""
    step(inputs, tf.constant(labels), tf.constant(lr, dtype=dtype)).numpy()


def variable_values(spec, variables: dict, param_layout: str) -> dict[str, np.ndarray]:
    """Current values of the trainable ``variables`` (by canonical name), as canonical-layout copies."""
    return {
        name: np.array(layouts.param_from_framework(param_layout, spec.params[name].kind, np.asarray(variables[name])))
        for name in spec.trainable_params
    }


def dense_gradient(tf, gradient, like) -> np.ndarray:
    """A gradient as an array; a missing one (``like`` does not affect the loss) is zero, not an error."""
    if gradient is None:
        return np.zeros(tuple(like.shape), dtype=tf.as_dtype(like.dtype).as_numpy_dtype)
    return tf.convert_to_tensor(gradient).numpy()
