"""dense: ``y = x @ kernel + bias`` over the last axis.

Weights: ``kernel`` ``(in, out)`` (Keras layout), ``bias`` ``(out,)`` (optional). No attributes.

Variants:

* ``kernel_transposed``: ``x @ kernel.T + bias``. PyTorch ``nn.Linear`` stores its weight as
  ``(out, in)`` and computes ``x @ W.T``; a port that copies it into a Keras/JAX ``(in, out)``
  kernel without transposing only runs when the kernel is square, and then silently.
* ``bias_dropped``: ``x @ kernel`` (``use_bias=False`` on one side, or a bias not exported).
"""

from __future__ import annotations

import numpy as np

from parity.diagnose.causes.layers import NotApplicable, Variant

KIND = "dense"


def _dense(x, kernel, bias):
    y = np.asarray(x, np.float64) @ np.asarray(kernel, np.float64)
    return y if bias is None else y + bias


def forward(inputs, weights, attrs):
    return _dense(inputs[0], weights["kernel"], weights.get("bias"))


def _transposed(inputs, weights, attrs, observed):
    kernel = weights["kernel"]
    if kernel.shape[0] != kernel.shape[1]:
        raise NotApplicable(f"kernel {kernel.shape} is not square: a transposed copy could not run")
    return _dense(inputs[0], kernel.T, weights.get("bias"))


def _no_bias(inputs, weights, attrs, observed):
    if "bias" not in weights:
        raise NotApplicable("the layer has no bias")
    return _dense(inputs[0], weights["kernel"], None)


def variants(attrs):
    return [
        Variant(
            "kernel_transposed",
            "kernel used transposed (PyTorch Linear stores (out, in), Keras (in, out))",
            _transposed,
        ),
        Variant("bias_dropped", "bias not added (use_bias=False or the bias was not exported)", _no_bias),
    ]
