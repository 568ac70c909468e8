"""flatten: ``(N, C, H, W) -> (N, C*H*W)`` in the order of attribute ``order``.

``order="nchw"`` (canonical, default): a plain reshape of the NCHW input, (C, H, W) order.
``order="nhwc"``: channels last first, ``x.transpose(0, 2, 3, 1).reshape(N, -1)``; for any rank
the channel axis 1 moves last.

Variant ``flatten_nhwc`` (or ``flatten_nchw`` when NHWC is declared): the other order. Keras
``Flatten`` on a channels-last tensor feeding a Dense whose kernel was copied from PyTorch
(which flattens NCHW) scrambles the features: the classic CNN port bug. Not applicable when
C == 1 or H*W == 1 (the orders coincide).
"""

from __future__ import annotations

import numpy as np

from parity.diagnose.causes.layers import NotApplicable, Variant

KIND = "flatten"


def flatten(x, order):
    x = np.asarray(x, np.float64)
    if order == "nhwc":
        x = np.moveaxis(x, 1, -1)
    elif order != "nchw":
        raise ValueError(f"unknown flatten order {order!r}")
    return x.reshape(x.shape[0], -1)


def forward(inputs, weights, attrs):
    return flatten(inputs[0], attrs.get("order", "nchw"))


def _other(order):
    def compute(inputs, weights, attrs, observed):
        x = inputs[0]
        if x.ndim < 3 or x.shape[1] == 1 or int(np.prod(x.shape[2:])) == 1:
            raise NotApplicable(f"input {x.shape}: both flatten orders coincide")
        return flatten(x, order)

    return compute


def variants(attrs):
    other = "nchw" if attrs.get("order", "nchw") == "nhwc" else "nhwc"
    return [
        Variant(
            f"flatten_{other}",
            f"flatten in {other.upper()} order (channels "
            f"{'last' if other == 'nhwc' else 'first'}) instead of {attrs.get('order', 'nchw').upper()}",
            _other(other),
        )
    ]
