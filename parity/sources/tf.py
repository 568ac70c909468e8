"""TensorFlow source: the spec's Keras model under ``tf.function``, loaded with canonical weights."""

from __future__ import annotations

import numpy as np

from parity import layouts
from parity.errors import Unavailable
from parity.precision import tf_flags
from parity.runtimes.base import Runner, as_tuple


def build_model(spec, weights: dict[str, np.ndarray] | None, dtype: str = "float32"):
    """The spec's Keras model in ``dtype`` holding ``weights`` (canonical) if given."""
    import keras

    keras.utils.set_random_seed(spec.training.seed)
    model = spec.keras_model(dtype)
    variables = {v.path: v for v in model.weights if str(v.dtype).startswith(("float", "bfloat"))}
    layouts.check_names_and_shapes("tf", spec.params, {k: tuple(v.shape) for k, v in variables.items()})
    if weights is not None:
        layouts.check_weights(spec.params, weights)
        for name, param in spec.params.items():
            value = layouts.param_to_framework("tf", param.kind, np.asarray(weights[name]))
            variables[name].assign(keras.ops.cast(value, variables[name].dtype))
    return model


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


class KerasSource(Runner):
    """The native ``tf`` path: a Keras model called under ``tf.function``, built in the precision's dtype
    (a Keras dtype policy), on the CPU or a GPU."""

    differentiable = True

    def __init__(self, spec, weights, batch_size: int, dtype: str = "float32", device: str = "cpu",
                 precision: str = "fp32"):
        super().__init__(spec, batch_size, dtype, device, precision)
        import tensorflow as tf

        self.tf = tf
        self.tf_device = tf_device(tf, device)
        self.numerics = tf_flags(tf, precision, device)
        with tf.device(self.tf_device):
            self.model = build_model(spec, weights, self.compute_dtype)
        self.layout = layouts.activation_layout("tf", spec.input.layout)
        model = self.model
        self._forward = tf.function(lambda x: outputs_in_order(spec, model(x, training=False)))
        self._step = None  # the SGD step's tf.function, made by the first train_step

    def _to_tf(self, x):
        tf = self.tf
        with tf.device(self.tf_device):
            x_t = tf.constant(layouts.to_layout(x, self.spec.input.layout, self.layout))
            return tf.cast(x_t, self.compute_dtype) if x_t.dtype.is_floating else x_t

    def run_impl(self, x):
        with self.tf.device(self.tf_device):
            return tuple(t.numpy() for t in self._forward(self._to_tf(x)))

    def device_compute(self, x):
        if self.device == "cpu":
            return None
        x_t, tf = self._to_tf(x), self.tf

        def compute():
            with tf.device(self.tf_device):
                outputs = self._forward(x_t)
            tf.test.experimental.sync_devices()  # wait for the GPU, without copying the outputs to the host
            return outputs

        return compute

    def taps_impl(self, x):
        import keras

        tap_model = keras.Model(self.model.inputs, [self.model.get_layer(t).output for t in self.spec.taps])
        values = as_tuple(tap_model(self._to_tf(x), training=False))
        return {
            name: layouts.from_layout(v.numpy(), self.spec.input.layout, self.layout)
            for name, v in zip(self.spec.taps, values)
        }

    def gradients_impl(self, x, labels):
        variables = {v.path: v for v in self.model.weights}
        return tape_gradients(self.tf, self.spec, lambda x_t: self.model(x_t, training=False), variables,
                              self._to_tf(x), labels, self.layout, param_layout="tf")

    def train_step_impl(self, x, labels, lr):
        if self._step is None:
            variables = {v.path: v for v in self.model.weights}
            self._step = sgd_step(self.tf, self.spec, lambda x_t: self.model(x_t, training=False),
                                  [variables[name] for name in self.optimized_params()])
        run_sgd_step(self.tf, self._step, self._to_tf(x), labels, lr, self.compute_dtype)

    def trainable_weights_impl(self):
        variables = {v.path: v for v in self.model.weights}
        return variable_values(self.spec, variables, param_layout="tf")


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
