"""TensorFlow pieces shared by the Keras source and the SavedModel runtime: outputs in spec order, the
device name, tape gradients and one SGD step, all in canonical layout."""

from __future__ import annotations

import numpy as np

from parity.model import layouts
from parity.platform.errors import Unavailable
from parity.runtimes.base import as_tuple


def outputs_in_order(spec, outputs) -> tuple:
    if isinstance(outputs, dict):
        return tuple(outputs[name] for name in spec.outputs)
    return as_tuple(outputs)


def tf_device(tf, device: str) -> str:
    """The TensorFlow device name for ``cpu`` / ``cuda:N`` (inside a worker the chosen GPU is GPU 0)."""
    if device == "cpu":
        return "/CPU:0"
    if not tf.config.list_physical_devices("GPU"):
        raise Unavailable(f"tensorflow {tf.__version__} sees no GPU")
    return "/GPU:0"


def tape_gradients(tf, spec, forward, variables: dict, x_t, labels, input_layout: str, param_layout: str) -> dict:
    """Gradients of mean cross-entropy w.r.t. trainable ``variables`` (by canonical name) and the input.

    ``param_layout`` is the layout the variables are stored in (``"tf"`` for Keras, ``"spec"``
    for canonical); results come back in canonical layout.
    """
    trainable = [variables[name] for name in spec.trainable_params]
    with tf.GradientTape() as tape:
        tape.watch(x_t)
        logits = _loss_dtype(tf, outputs_in_order(spec, forward(x_t))[0])
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    grads = tape.gradient(loss, [*trainable, x_t])
    result = {
        name: layouts.param_from_framework(param_layout, spec.params[name].kind, dense_gradient(tf, g, variable))
        for name, variable, g in zip(spec.trainable_params, trainable, grads)
    }
    result[spec.input_grad_name] = layouts.from_layout(dense_gradient(tf, grads[-1], x_t), spec.input.layout, input_layout)
    return result


def _loss_dtype(tf, logits):
    """Reduced-precision logits in float32 for the loss, as mixed-precision training computes it."""
    return tf.cast(logits, tf.float32) if logits.dtype in (tf.float16, tf.bfloat16) else logits


def sgd_step(tf, spec, forward, variables: list):
    """One ``tf.function``: forward, mean cross-entropy, ``GradientTape``, ``assign_sub(lr * grad)`` on
    every variable in ``variables`` (a variable the loss does not reach has no gradient: left as it is).

    Called as ``step(x_t, labels, lr)`` with tensors (``lr`` a scalar tensor, so a new rate does not
    retrace); returns the loss.
    """

    @tf.function
    def step(x_t, labels, lr):
        with tf.GradientTape() as tape:
            logits = _loss_dtype(tf, outputs_in_order(spec, forward(x_t))[0])
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        grads = tape.gradient(loss, variables)
        for variable, grad in zip(variables, grads):
            if grad is not None:
                variable.assign_sub(tf.cast(lr, variable.dtype) * tf.convert_to_tensor(grad))
        return loss

    return step


def run_sgd_step(tf, step, x_t, labels, lr: float, dtype: str) -> None:
    """Call a ``sgd_step`` function and wait for it (reading the loss back ends the step)."""
    step(x_t, tf.constant(labels), tf.constant(lr, dtype=dtype)).numpy()


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
