"""attention: multi-head self-attention on ``(batch, tokens, features)``.

``q = x @ Wq + bq`` reshaped to (b, t, heads, hd) and transposed to (b, heads, t, hd); ``k``
and ``v`` likewise; ``w = softmax(q @ k^T * scale)`` over the keys (last axis); the output
``(w @ v)`` transposed back to (b, t, heads*hd), then ``@ Wo + bo``. Weights ``query/kernel``,
``query/bias``, ``key/...``, ``value/...``, ``out/...`` (dense, (in, out); biases optional).
Attributes: ``heads``; ``scale`` (default 1/sqrt(head_dim)); ``causal`` (default False: with
it, query i attends to keys j <= i only).

Variants:

* ``scale_sqrt_d_model``: 1/sqrt(d_model) instead of 1/sqrt(head_dim) (scaling by the model
  width, a common hand-port bug); ``scale_head_dim``: 1/head_dim (q and k each pre-scaled by
  1/sqrt(head_dim) *and* the logits scaled again); ``no_scale``: no scaling (fused kernels or
  converters that assume q is pre-scaled). Not applicable where it equals the declared scale;
* ``softmax_query_axis``: softmax over the queries (axis -2) instead of the keys, a wrong
  axis in a port (Keras ``axis`` or ``dim`` arguments);
* ``heads_interleaved``: heads split as (b, t, hd, heads), i.e. head h takes features
  h, h+heads, ... instead of a contiguous block (reshape-order bug), merged back the same way;
* ``causal`` / ``non_causal``: the causal mask applied when not declared, or dropped.
"""

from __future__ import annotations

import math

import numpy as np

from parity.diagnose.layers import NotApplicable, Variant, with_attrs

KIND = "attention"


def _dense(x, weights, name):
    y = x @ np.asarray(weights[f"{name}/kernel"], np.float64)
    bias = weights.get(f"{name}/bias")
    return y if bias is None else y + bias


def _softmax(z, axis):
    z = z - z.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def _head_dim(weights, attrs):
    return weights["query/kernel"].shape[1] // attrs["heads"]


def forward(inputs, weights, attrs, axis=-1, interleaved=False):
    x = np.asarray(inputs[0], np.float64)
    b, t, _ = x.shape
    heads = attrs["heads"]
    hd = _head_dim(weights, attrs)
    order = (0, 3, 1, 2) if interleaved else (0, 2, 1, 3)  # -> (b, heads, t, hd)
    split = (b, t, hd, heads) if interleaved else (b, t, heads, hd)
    q, k, v = (_dense(x, weights, name).reshape(split).transpose(order) for name in ("query", "key", "value"))
    logits = (q @ k.transpose(0, 1, 3, 2)) * attrs.get("scale", 1.0 / math.sqrt(hd))
    if attrs.get("causal", False):
        logits = np.where(np.triu(np.ones((t, t), bool), 1), -np.inf, logits)
    out = _softmax(logits, axis) @ v
    return _dense(out.transpose(np.argsort(order)).reshape(b, t, -1), weights, "out")


def _scale(of_head_dim):
    def compute(inputs, weights, attrs, observed):
        scale = of_head_dim(_head_dim(weights, attrs), attrs["heads"])
        if math.isclose(scale, attrs.get("scale", 1.0 / math.sqrt(_head_dim(weights, attrs))), rel_tol=1e-9):
            raise NotApplicable("equals the declared scale")
        return forward(inputs, weights, {**attrs, "scale": scale})

    return compute


def variants(attrs):
    found = [
        Variant("scale_sqrt_d_model", "logits scaled by 1/sqrt(d_model) instead of the declared scale",
                _scale(lambda hd, heads: 1.0 / math.sqrt(hd * heads))),
        Variant("scale_head_dim", "logits scaled by 1/head_dim (scaled twice) instead of the declared scale",
                _scale(lambda hd, heads: 1.0 / hd)),
        Variant("no_scale", "logits not scaled", _scale(lambda hd, heads: 1.0)),
        Variant("softmax_query_axis", "softmax over the queries instead of the keys",
                lambda inputs, weights, attrs, observed: forward(inputs, weights, attrs, axis=-2)),
    ]
    if attrs["heads"] > 1:
        found.append(Variant("heads_interleaved", "heads split as (tokens, head_dim, heads): interleaved features "
                             "instead of contiguous blocks",
                             lambda inputs, weights, attrs, observed: forward(inputs, weights, attrs, interleaved=True)))
    causal = not attrs.get("causal", False)
    found.append(Variant("causal" if causal else "non_causal",
                         "causal mask applied, not declared" if causal else "causal mask dropped",
                         with_attrs(forward, causal=causal)))
    return found
