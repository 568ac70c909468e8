"""TensorFlow running a SavedModel made by an exporter (jax2tf), with gradients."""

from __future__ import annotations

from pathlib import Path

from parity import layouts
from parity.runtimes.base import Runner
from parity.sources.tf import tape_gradients


class SavedModelRunner(Runner):
    """``tf`` as a runtime: ``tf.saved_model.load`` then the saved ``forward`` function."""

    differentiable = True

    def __init__(self, spec, artifact_dir: Path, meta: dict, batch_size: int, threads: int):
        super().__init__(spec, batch_size, "float32")
        import tensorflow as tf

        self.tf = tf
        self.loaded = tf.saved_model.load(str(artifact_dir))
        self.variables = dict(zip(meta["param_names"], self.loaded.param_list))
        self.layout = meta["input_layout"]

    def _to_tf(self, x):
        return self.tf.constant(layouts.to_layout(x, self.spec.input.layout, self.layout))

    def run_impl(self, x):
        return tuple(t.numpy() for t in self.loaded.forward(self._to_tf(x)))

    def gradients_impl(self, x, labels):
        return tape_gradients(self.tf, self.spec, self.loaded.forward, self.variables, self._to_tf(x), labels,
                              self.layout, param_layout="spec")
