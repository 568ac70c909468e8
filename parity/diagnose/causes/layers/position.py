"""position: a learned positional embedding added to the tokens, ``x + embedding[:tokens]``.

Input ``(batch, tokens, features)``; weight ``embedding`` ``(tokens, features)``. No attributes.

Variant ``position_missing``: ``x`` unchanged. The embedding is a bare parameter, not a
layer: hand-written modules forget to add it, and exporters that trace only submodules
(or drop a "constant" added in ``forward``) lose it.
"""

from __future__ import annotations

import numpy as np

from parity.diagnose.causes.layers import Variant

KIND = "position"


def forward(inputs, weights, attrs):
    x = np.asarray(inputs[0], np.float64)
    return x + weights["embedding"][: x.shape[-2]]


def variants(attrs):
    return [
        Variant(
            "position_missing",
            "positional embedding not added",
            lambda inputs, weights, attrs, observed: np.asarray(inputs[0], np.float64),
        )
    ]
