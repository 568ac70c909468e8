"""dropout: declared at inference, so the identity ``y = x``. Attribute ``rate``.

Variants (dropout left active at inference: a PyTorch module not switched to ``eval()``, a
Keras layer called with ``training=True``, an export traced in training mode):

* ``dropout_active``: inverted dropout, each element 0 or ``x / (1 - rate)`` (PyTorch, Keras, Flax);
* ``dropout_active_unscaled``: each element 0 or ``x`` (dropout without the 1/(1-rate) rescale).

The mask is random, so ``compute`` reads it from the observed activation: elements observed
closer to zero than to ``x`` are taken as dropped. It is used only if plausible for ``rate``:
at least one non-zero input element dropped, and the dropped fraction of non-zero inputs
within 5 binomial standard deviations of ``rate``. Otherwise ``compute`` returns the
declared form, so an observed activation without a dropout pattern is not "explained".
"""

from __future__ import annotations

import math

import numpy as np

from parity.diagnose.causes.layers import Variant

KIND = "dropout"


def forward(inputs, weights, attrs):
    return np.asarray(inputs[0], np.float64)


def observed_mask(x, observed, rate):
    """The dropped elements read from ``observed``, or None if no plausible dropout pattern is there."""
    observed = np.asarray(observed, np.float64)
    if observed.shape != x.shape or not 0.0 < rate < 1.0:
        return None
    live = x != 0
    dropped = live & (np.abs(observed) < 0.5 * np.abs(x))
    n, k = int(live.sum()), int(dropped.sum())
    if k == 0 or abs(k - rate * n) > 5.0 * math.sqrt(n * rate * (1.0 - rate)):
        return None
    return dropped


def _active(scaled):
    def compute(inputs, weights, attrs, observed):
        x = forward(inputs, weights, attrs)
        rate = float(attrs.get("rate", 0.5))
        dropped = observed_mask(x, observed, rate)
        if dropped is None:
            return x
        return np.where(dropped, 0.0, x / (1.0 - rate) if scaled else x)

    return compute


def variants(attrs):
    rate = attrs.get("rate", 0.5)
    return [
        Variant(
            "dropout_active",
            f"dropout (rate {rate:g}) active at inference: elements zeroed, the rest scaled by 1/(1-rate)",
            _active(True),
        ),
        Variant(
            "dropout_active_unscaled",
            f"dropout (rate {rate:g}) active at inference without the 1/(1-rate) rescale",
            _active(False),
        ),
    ]
