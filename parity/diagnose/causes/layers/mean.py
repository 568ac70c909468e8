"""mean: the mean over ``axis`` (attribute, default 1: the tokens of ``(batch, tokens, features)``).

Variants:

* ``sum``: the sum instead of the mean (a global *sum* pool, or a mean written as
  ``reduce_sum`` without the division);
* ``mean_other_axis``: the mean over the other non-batch axis of a 3-D input (features
  instead of tokens: Keras ``GlobalAveragePooling1D(data_format="channels_first")`` versus
  the default ``channels_last``, or ``mean(dim=-1)`` for ``mean(dim=1)``). Its output shape
  differs unless tokens == features.
"""

from __future__ import annotations

import numpy as np

from parity.diagnose.causes.layers import NotApplicable, Variant

KIND = "mean"


def forward(inputs, weights, attrs):
    return np.asarray(inputs[0], np.float64).mean(axis=attrs.get("axis", 1))


def _sum(inputs, weights, attrs, observed):
    return np.asarray(inputs[0], np.float64).sum(axis=attrs.get("axis", 1))


def _other_axis(inputs, weights, attrs, observed):
    x = np.asarray(inputs[0], np.float64)
    if x.ndim != 3:
        raise NotApplicable(f"input has {x.ndim} axes; the other-axis variant needs (batch, tokens, features)")
    axis = attrs.get("axis", 1) % 3
    return x.mean(axis=3 - axis)


def variants(attrs):
    return [
        Variant("sum", "sum instead of mean", _sum),
        Variant(
            "mean_other_axis", "mean over the other non-batch axis (features instead of tokens, or back)", _other_axis
        ),
    ]
