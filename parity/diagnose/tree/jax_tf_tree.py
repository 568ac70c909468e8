"""One level of a JAX model's tree on ``jax/tf``: the level's values computed by the path's own converter and runtime.

The ``jax/tf`` path is a SavedModel whose one op (``XlaCallModule``) holds the StableHLO jax2tf serialised: there is
no graph of the model's operations to read a module's tensor from. Instead the JAX tree reader's function for the
level (``parity.diagnose.tree.jax_tree``: the model's outputs, and each module path's value and input as extra outputs)
is converted by jax2tf as ``parity.exporters.jax_tf`` converts the model (the same options, at the StableHLO version it
serialises at, the weights as ``tf.Variable`` arguments) and run by TensorFlow in a ``tf.function`` on the path's
device: the taps are computed by the path's converter, XLA build and runtime, not by JAX's.

Every module's value and input at all depths is returned by one conversion and run (``jax_tree.Levels``), each level
served from it. Returning more values can change what XLA compiles (its fusions), so that run is trusted only where
its model outputs are the exported SavedModel's outputs on the golden feed (within a tenth of the tolerance,
``instrument.same_outputs``); where they are not, each level is converted and run with its own values alone, and a
level whose run disturbs the outputs too has every module unobservable, with why. Outputs that
agree but not bit for bit are said in each row's reason. Imports jax and tensorflow inside.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from parity.check.closeness import bitwise_equal
from parity.diagnose.graph import instrument


class Jax2TfLevels:
    """The ``jax/tf`` path's side of a descent (the contract of ``graph_tree.GraphLevels``): the exported SavedModel
    run once on the golden feed (``plain``, by ``outputs``), and a ``level`` call per level that converts and runs
    the tree reader's function with jax2tf and TensorFlow."""

    def __init__(self, spec, path, artifact_dir, meta, x, threads, weights):
        import jax
        import tensorflow as tf

        from parity.model import layouts
        from parity.run import paths
        from parity.runtimes.tf_common import tf_device

        self.spec, self.path, self.x, self.jax, self.tf = spec, path, x, jax, tf
        self.batch_size, self.precision = spec.batch_size, path.precision
        saved = paths.load_target(path.runtime_target)(
            spec, Path(artifact_dir), meta, spec.batch_size, threads, path.device, path.precision
        )
        self.outputs = list(spec.outputs)
        self.plain = saved.run(x)
        self.device = tf_device(tf, path.device)
        self.levels = None  # the reader's levels (``jax_tree.Levels``), made by the first ``level`` call
        # the weights as the exporter holds them: float32 arrays for JAX to trace with, tf.Variables to run with
        self.params = {n: layouts.held_array(spec.params[n], weights[n], "float32") for n in spec.params}
        with tf.device(self.device):
            self.variables = {
                id(v): tf.Variable(v, name=n.replace("/", "."), trainable=False) for n, v in self.params.items()
            }

    def check_feed(self, x):
        return {i.name: np.asarray(x[i.name]) for i in self.spec.model_inputs}

    def _input(self, feeds: dict):
        """What ``jax_apply`` takes (``parity.sources.jax.packed``), floating inputs in float32 as the SavedModel's
        signature takes them."""
        from parity.sources.jax import packed

        return packed({n: v.astype(np.float32) if v.dtype.kind == "f" else v for n, v in feeds.items()})

    def run_traced(self, function, *args):
        """``function(*args)`` converted by jax2tf as the path's exporter converts the model and run by TensorFlow:
        each weight of ``args`` passed as its ``tf.Variable``, every other array as a constant; the results as
        NumPy arrays in ``function``'s structure."""
        from jax.experimental import jax2tf

        from parity.exporters.jax_tf import serialised_for_tensorflow

        tf = self.tf
        with tf.device(self.device):
            fed = self.jax.tree_util.tree_map(
                lambda a: self.variables[id(a)] if id(a) in self.variables else tf.constant(a), args
            )
        converted = jax2tf.convert(function, with_gradient=True)
        with serialised_for_tensorflow(), tf.device(self.device):  # traced (and serialised) on the first call
            returned = tf.function(converted, autograph=False)(*fed)
        return tf.nest.map_structure(lambda t: t.numpy(), returned)

    def level(self, names, calls, expected, expected_inputs) -> dict:
        """``{"values", "inputs", "located", "instrumentation"}`` for the module paths ``names``: read by the JAX tree
        reader through ``run_traced``, trusted where that run's outputs are the SavedModel's."""
        from parity.diagnose.tree import jax_tree

        tolerances = self.spec.output_tolerances(self.precision)
        if self.levels is None:  # every module's value from one conversion, trusted where its outputs are the path's
            self.levels = jax_tree.Levels(self, self.x)
            whole = self.levels.whole
            if whole is not None and not instrument.same_outputs(self.plain, whole["outputs"], tolerances.for_name):
                self.levels.per_level()
        found = self.levels.level("", list(names))
        computed = found["outputs"]
        if not instrument.same_outputs(self.plain, computed, tolerances.for_name):
            reason = (
                "jax2tf's conversion of the model with this level's values as extra outputs computes other outputs "
                "than the exported SavedModel: its values are not what the path computes"
            )
            located = {n: {"found": "unobservable", "tensor": None, "reason": reason} for n in names}
            disturbing = [{"tap": n, "tensor": None} for n in names]
            return {
                "values": {},
                "inputs": {},
                "located": located,
                "instrumentation": {"observable": [], "disturbing": disturbing, "runs": 1},
            }
        same, differ = bitwise_equal(self.plain, computed)
        note = (
            None
            if same
            else f"read from a conversion whose outputs differ from the SavedModel's by up to {differ:.3g}, "
            f"within a tenth of the tolerance"
        )
        unseen = found.get("located") or {}
        located = {}
        for name in names:
            if name in found["values"]:
                located[name] = {"found": "jax2tf", "tensor": None, **({"reason": note} if note else {})}
            else:
                located[name] = unseen.get(name) or {
                    "found": "unmapped",
                    "reason": "its first call returned no floating array this trace can return (one computed "
                    "inside a lifted transform stays there)",
                }
        return {"values": found["values"], "inputs": found["inputs"], "located": located, "instrumentation": None}
