"""add: the residual sum ``inputs[0] + inputs[1]``. No weights, no attributes.

Variants (a residual connection lost in a port or a graph rewrite):

* ``residual_missing``: only the second input (the branch), the skip path dropped;
* ``residual_missing_first``: only the first input (the skip path), the branch dropped.
"""

from __future__ import annotations

import numpy as np

from parity.diagnose.causes.layers import Variant

KIND = "add"


def forward(inputs, weights, attrs):
    return np.asarray(inputs[0], np.float64) + np.asarray(inputs[1], np.float64)


def variants(attrs):
    return [
        Variant(
            "residual_missing",
            "skip connection dropped: only the second input (the branch)",
            lambda inputs, weights, attrs, observed: np.asarray(inputs[1], np.float64),
        ),
        Variant(
            "residual_missing_first",
            "branch dropped: only the first input (the skip path)",
            lambda inputs, weights, attrs, observed: np.asarray(inputs[0], np.float64),
        ),
    ]
