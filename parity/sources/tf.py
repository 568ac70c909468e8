"""TensorFlow source: the spec's Keras model under ``tf.function``, loaded with canonical weights."""

from __future__ import annotations

import numpy as np

from parity.model import layouts
from parity.model.feeds import call_keras as call
from parity.platform.precision import tf_flags
from parity.runtimes.base import Runner, as_tuple
from parity.runtimes.tf_common import (
    outputs_in_order,
    run_sgd_step,
    sgd_step,
    tape_gradients,
    tf_device,
    to_tf,
    variable_values,
)


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


def call_output(keras, layer):
    """What ``layer``'s (first) call in the model returns: a functional sub-model's ``output`` is its own graph's
    output, not connected to the outer model's inputs."""
    if isinstance(layer, keras.Model) and getattr(layer, "_inbound_nodes", None):
        outputs = layer._inbound_nodes[0].output_tensors
        return outputs[0] if len(outputs) == 1 else outputs
    return layer.output


class KerasSource(Runner):
    """The native ``tf`` path: a Keras model called under ``tf.function``, built in the precision's dtype
    (a Keras dtype policy), on the CPU or a GPU."""

    differentiable = True
    jit_compile: bool | None = None  # tf.function's own: ``parity.sources.tf_xla`` compiles with XLA (True)

    def __init__(
        self, spec, weights, batch_size: int, dtype: str = "float32", device: str = "cpu", precision: str = "fp32"
    ):
        super().__init__(spec, batch_size, dtype, device, precision)
        import tensorflow as tf

        self.tf = tf
        self.tf_device = tf_device(tf, device)
        self.numerics = tf_flags(tf, precision, device)
        with tf.device(self.tf_device):
            self.model = build_model(spec, weights, self.compute_dtype)
        self.layout = layouts.activation_layout("tf", spec.model_inputs[0].layout)
        self._forward = tf.function(
            lambda inputs: outputs_in_order(spec, call(self.model, inputs)), jit_compile=self.jit_compile
        )
        self._step = None  # the SGD step's tf.function, made by the first train_step

    def _to_tf(self, x):
        return to_tf(self.tf, self.spec, x, self.layout, self.tf_device, self.compute_dtype)

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

        tap_model = keras.Model(
            self.model.inputs, [call_output(keras, self.model.get_layer(t)) for t in self.spec.taps]
        )
        values = as_tuple(self._tap_values(tap_model, self._to_tf(x)))
        return {
            name: layouts.from_layout(v.numpy(), self.spec.model_inputs[0].layout, self.layout)
            for name, v in zip(self.spec.taps, values)
        }

    def _tap_values(self, tap_model, inputs):
        """The tap model's outputs on ``inputs``, called eagerly (a compiling subclass compiles the call)."""
        return call(tap_model, inputs)

    def gradients_impl(self, x, labels):
        variables = {v.path: v for v in self.model.weights}
        return tape_gradients(
            self.tf,
            self.spec,
            lambda inputs: call(self.model, inputs),
            variables,
            self._to_tf(x),
            labels,
            self.layout,
            param_layout="tf",
        )

    def train_step_impl(self, x, labels, lr):
        if self._step is None:
            variables = {v.path: v for v in self.model.weights}
            self._step = sgd_step(
                self.tf,
                self.spec,
                lambda inputs: call(self.model, inputs),
                [variables[name] for name in self.optimized_params()],
            )
        run_sgd_step(self.tf, self._step, self._to_tf(x), labels, lr, self.compute_dtype)

    def trainable_weights_impl(self):
        variables = {v.path: v for v in self.model.weights}
        return variable_values(self.spec, variables, param_layout="tf")
