"""TF-XLA: the Keras source model with every function compiled by XLA (``tf.function(jit_compile=True)``):
forward, gradients, the training step and the taps.

``jit_compile=True`` is XLA's must-compile mode: a function XLA cannot compile raises (an ``error`` verdict with
XLA's message) instead of falling back to TensorFlow's kernels, so a ``pass`` here is XLA's numerics. XLA
compiles once per input shape; ``runtime_record`` says how often each function was traced and at which shapes.
"""

from __future__ import annotations

from typing import Any

from parity.model.feeds import call_keras as call
from parity.runtimes.tf_common import run_sgd_step, sgd_step, tape_gradients
from parity.sources.tf import KerasSource

FUNCTIONS = ("forward", "gradients", "train_step", "taps")


class KerasXlaSource(KerasSource):
    """The ``tf/xla`` path: ``KerasSource`` with its forward, the tape's forward (whose backward function
    TensorFlow compiles with XLA too), the whole SGD step and the tap model each under
    ``tf.function(jit_compile=True)``, at float32 on the CPU. Constructed like ``KerasSource``."""

    jit_compile = True

    def __init__(
        self, spec, weights, batch_size: int, dtype: str = "float32", device: str = "cpu", precision: str = "fp32"
    ):
        super().__init__(spec, weights, batch_size, dtype, device, precision)
        # the model's own structure, for the tape: ``tape_gradients`` orders its outputs
        self._xla_call = self.tf.function(lambda inputs: call(self.model, inputs), jit_compile=True)
        self._tap_calls = 0
        self._shapes: dict[str, list[dict]] = {name: [] for name in FUNCTIONS}
        self.numerics = {**self.numerics, "xla": True, "jit_compile": True}

    def _seen(self, function: str, x: dict) -> None:
        shape = {name: list(value.shape) for name, value in x.items()}
        if shape not in self._shapes[function]:
            self._shapes[function].append(shape)

    def run_impl(self, x):
        self._seen("forward", x)
        return super().run_impl(x)

    def gradients_impl(self, x, labels):
        self._seen("gradients", x)
        variables = {v.path: v for v in self.model.weights}
        return tape_gradients(
            self.tf, self.spec, self._xla_call, variables, self._to_tf(x), labels, self.layout, param_layout="tf"
        )

    def train_step_impl(self, x, labels, lr):
        self._seen("train_step", x)
        if self._step is None:
            variables = {v.path: v for v in self.model.weights}
            step = sgd_step(
                self.tf,
                self.spec,
                lambda inputs: call(self.model, inputs),
                [variables[name] for name in self.optimized_params()],
            )
            # the same step (forward, loss, tape, assign_sub) as one XLA computation
            self._step = self.tf.function(step.python_function, jit_compile=True)
        run_sgd_step(self.tf, self._step, self._to_tf(x), labels, lr, self.compute_dtype)

    def _tap_values(self, tap_model, inputs):
        self._tap_calls += 1
        self._seen("taps", inputs)
        return self.tf.function(lambda feeds: call(tap_model, feeds), jit_compile=True)(inputs)

    def runtime_record(self) -> dict:
        """XLA on (must-compile), the TensorFlow version, and per function the tf.function traces and the input
        shapes it ran at (XLA compiles each shape once: more traces than shapes are retraces)."""
        traced = {"forward": self._forward, "gradients": self._xla_call, "train_step": self._step}
        functions: dict[str, dict[str, Any]] = {}
        for name in FUNCTIONS:
            if not self._shapes[name]:
                continue
            function = traced.get(name)
            entry: dict[str, Any] = {"shapes": self._shapes[name]}
            if function is not None:
                entry["traces"] = function.experimental_get_tracing_count()
            if name == "taps":
                entry["compiles"] = self._tap_calls  # a tap model is built, traced and compiled per diagnosis
            functions[name] = entry
        counts = ", ".join(
            f"{name} {entry.get('traces', entry.get('compiles'))} at {len(entry['shapes'])} shapes"
            for name, entry in functions.items()
        )
        return {
            "runtime": "tf-xla",
            "xla": True,
            "jit_compile": "must-compile",
            "tensorflow": self.tf.__version__,
            "device": self.tf_device,
            "functions": functions,
            "summary": f"XLA must-compile; traced: {counts}",
            "note": "gradients differentiate the XLA-compiled forward; TensorFlow compiles its backward "
            "function with XLA as well",
        }
