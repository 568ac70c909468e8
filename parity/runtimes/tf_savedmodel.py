"""TensorFlow running a SavedModel made by an exporter (jax2tf), with gradients."""

from __future__ import annotations

from pathlib import Path

from parity.platform.precision import tf_flags
from parity.runtimes.base import Runner
from parity.runtimes.tf_common import run_sgd_step, sgd_step, tape_gradients, tf_device, to_tf, variable_values


class SavedModelRunner(Runner):
    """``tf`` as a runtime: ``tf.saved_model.load`` then the saved ``forward`` function."""

    differentiable = True

    def __init__(
        self,
        spec,
        artifact_dir: Path,
        meta: dict,
        batch_size: int,
        threads: int,
        device: str = "cpu",
        precision: str = "fp32",
    ):
        super().__init__(spec, batch_size, "float32", device, precision)
        import tensorflow as tf

        self.tf = tf
        self.tf_device = tf_device(tf, device)
        self.numerics = tf_flags(tf, precision, device)
        with tf.device(self.tf_device):
            self.loaded = tf.saved_model.load(str(artifact_dir))
        self.variables = dict(zip(meta["param_names"], self.loaded.param_list))
        self.layout = meta["input_layout"]
        self._step = None  # the SGD step's tf.function, made by the first train_step

    def _to_tf(self, x):
        return to_tf(self.tf, self.spec, x, self.layout, self.tf_device)

    def _forward(self, inputs: dict):
        """The saved ``forward``, which takes the inputs positionally in the spec's order."""
        return self.loaded.forward(*inputs.values())

    def run_impl(self, x):
        with self.tf.device(self.tf_device):
            return tuple(t.numpy() for t in self._forward(self._to_tf(x)))

    def gradients_impl(self, x, labels):
        return tape_gradients(
            self.tf, self.spec, self._forward, self.variables, self._to_tf(x), labels, self.layout, param_layout="spec"
        )

    def train_step_impl(self, x, labels, lr):
        if self._step is None:
            self._step = sgd_step(self.tf, self.spec, self._forward, self._updatable(self.optimized_params()))
        run_sgd_step(self.tf, self._step, self._to_tf(x), labels, lr, self.dtype)

    def trainable_weights_impl(self):
        return variable_values(self.spec, self.variables, param_layout="spec")

    def _updatable(self, names) -> list:
        """The restored variables behind ``names``; a SavedModel whose weights were frozen into
        constants (nothing to assign to) cannot take a training step in place."""
        missing = [name for name in names if name not in self.variables]
        frozen = [
            name for name in names if name in self.variables and not isinstance(self.variables[name], self.tf.Variable)
        ]
        if missing or frozen:
            raise NotImplementedError(
                f"the SavedModel's weights {', '.join(missing + frozen)} are not restored tf.Variables, so they "
                f"cannot be updated in place; re-export with the weights as variables (param_list)"
            )
        return [self.variables[name] for name in names]
