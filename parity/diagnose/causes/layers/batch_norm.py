"""batch_norm: inference BatchNorm over channel axis 1 (NCHW, or (N, C)), moving statistics.

``y = (x - moving_mean) / sqrt(moving_variance + eps) * gamma + beta``, per channel.
Attribute ``eps`` (default 1e-5). Weights ``gamma``, ``beta`` (optional: 1 and 0 when absent,
Keras ``scale=False`` / ``center=False``), ``moving_mean``, ``moving_variance``.

Variants:

* ``eps=<value>``: another epsilon among 1e-3 (Keras ``BatchNormalization`` default), 1e-5
  (PyTorch ``BatchNorm2d`` default), 1.001e-5 (``keras.applications`` ResNet), 1e-6, 0. Values
  within 1% of the declared one are left out: no data tells them apart;
* ``batch_statistics``: the batch's own mean and biased variance over (N, H, W): a PyTorch
  module left in ``train()`` mode, a Keras layer called with ``training=True``, or an export
  traced in training mode;
* ``batch_statistics_unbiased``: the same with the unbiased (N-1) variance;
* ``eps_outside_sqrt``: ``(x - mean) / (sqrt(var) + eps)`` (hand-written BatchNorms).
"""

from __future__ import annotations

import numpy as np

from parity.diagnose.causes.layers import Variant, epsilon_variants

KIND = "batch_norm"
EPSILONS = (
    (1e-3, "1e-3", "Keras default"),
    (1e-5, "1e-5", "PyTorch default"),
    (1.001e-5, "1.001e-5", "keras.applications ResNet"),
    (1e-6, "1e-6", ""),
    (0.0, "0", "none"),
)


def _channel(x, v):
    return np.asarray(v, np.float64).reshape((1, -1) + (1,) * (x.ndim - 2))


def normalise(x, weights, mean, var, eps, eps_inside=True):
    scale = 1.0 / (np.sqrt(var + eps) if eps_inside else np.sqrt(var) + eps)
    gamma = _channel(x, weights.get("gamma", 1.0))
    beta = _channel(x, weights.get("beta", 0.0))
    return (x - mean) * scale * gamma + beta


def _statistics(x, weights, batch, ddof):
    if batch:
        axes = (0,) + tuple(range(2, x.ndim))
        return x.mean(axis=axes, keepdims=True), x.var(axis=axes, ddof=ddof, keepdims=True)
    return _channel(x, weights["moving_mean"]), _channel(x, weights["moving_variance"])


def forward(inputs, weights, attrs, batch=False, ddof=0, eps_inside=True):
    x = np.asarray(inputs[0], np.float64)
    mean, var = _statistics(x, weights, batch, ddof)
    return normalise(x, weights, mean, var, attrs.get("eps", 1e-5), eps_inside)


def _form(**options):
    return lambda inputs, weights, attrs, observed: forward(inputs, weights, attrs, **options)


def variants(attrs):
    declared = attrs.get("eps", 1e-5)
    found = epsilon_variants("BatchNorm", forward, declared, EPSILONS)
    return found + [
        Variant(
            "batch_statistics",
            "batch mean and variance instead of the moving statistics (training mode)",
            _form(batch=True),
        ),
        Variant(
            "batch_statistics_unbiased",
            "batch mean and unbiased (N-1) variance instead of the moving statistics",
            _form(batch=True, ddof=1),
        ),
        Variant(
            "eps_outside_sqrt", "epsilon added to the standard deviation, not the variance", _form(eps_inside=False)
        ),
    ]
