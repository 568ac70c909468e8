"""attention: multi-head self-attention on ``(batch, tokens, features)``.

``q = x @ Wq + bq`` reshaped to (b, t, heads, hd) and transposed to (b, heads, t, hd); ``k``
and ``v`` likewise; ``w = softmax(q @ k^T * scale)`` over the keys (last axis); the output
``(w @ v)`` transposed back to (b, t, heads*hd), then ``@ Wo + bo``. Weights ``query/kernel``,
``query/bias``, ``key/...``, ``value/...``, ``out/...`` (dense, (in, out); biases optional).
Attributes: ``heads``; ``scale`` (default 1/sqrt(head_dim)); ``causal`` (default False: with
it, query i attends to keys j <= i only).

An optional second input is a mask (``Layer("attention", {"heads": 4, "mask": "keep"}, inputs=("embed",
"pad_mask"))``, the mask another tap): of shape ``(q, k)``, ``(b, q, k)`` or ``(b, heads or 1, q, k)``, or a key
padding mask ``(b, k)`` with ``key_padding: True``. Attribute ``mask`` (required with a mask input): ``"keep"``
(boolean, true where a query may attend: ``F.scaled_dot_product_attention``'s and Keras' ``attention_mask``
convention), ``"ignore"`` (boolean, true where masked: ``nn.MultiheadAttention``'s ``attn_mask`` and
``key_padding_mask``) or ``"additive"`` (added to the scaled logits: 0 or -inf). A query whose every key is masked
gets zero attention weights, so its attention output is 0 before the output projection: what torch's
``F.scaled_dot_product_attention`` returns for such a row (torch 2.13, boolean or -inf additive mask). Attribute
``masked_rows`` declares another convention for those rows: ``"nan"`` (``nn.MultiheadAttention``, whose softmax
over nothing but -inf gives NaN, fast path or not: torch 2.13; TensorFlow's softmax of an additive -inf row) or
``"uniform"`` (the mean of the values: ``jax.nn.dot_product_attention`` with a boolean mask, which it fills with a
large negative); default ``"zero"``.

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

With a mask:

* ``masked_row_nan``: a fully masked query row gives NaN (a plain softmax over nothing but -inf:
  ``nn.MultiheadAttention``, onnx.reference, ONNX Runtime and OpenVINO running torch's SDPA with an additive -inf
  mask, OpenVINO with a boolean one); ``masked_row_zero``: zero attention (the SDPA convention; ONNX Runtime running
  jax2onnx's ``dot_product_attention`` with a boolean mask) where NaN or the mean is declared;
* ``masked_row_uniform``: it attends to every key uniformly, the mean of the values (a mask filled with the
  dtype's lowest value, or -1e9 in float32, instead of -inf: ONNX Runtime running torch's SDPA with a boolean mask,
  LiteRT with TensorFlow's additive -inf);
* ``masked_row_unmasked``: it attends as if unmasked (an additive -1e9 mask in float64, Keras' softmax mask);
* ``mask_ignored``: the mask lost (a converter dropping the mask input);
* ``mask_inverted``: a boolean mask read in the other convention (true = attend versus true = masked).

Variants that equal the declared form on the inputs at hand (no fully masked row) are not applicable.
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


MASKS = ("keep", "ignore", "additive")
ROWS = ("zero", "nan", "uniform")


def _softmax(z, axis, rows="zero"):
    """Softmax over ``axis``; a row of nothing but -inf gives ``rows``: zero weights, NaN, or uniform weights."""
    top = z.max(axis=axis, keepdims=True)
    empty = top == -np.inf
    e = np.exp(z - np.where(empty, 0.0, top))
    w = e / np.where(empty, 1.0, e.sum(axis=axis, keepdims=True))
    if rows == "nan":
        return np.where(empty, np.nan, w)
    if rows == "uniform":
        return np.where(empty, 1.0 / z.shape[axis], w)
    return w


def _mask(mask, attrs, b, t_q, t_k):
    """The mask as a (b, heads or 1, q, k) array."""
    mask = np.asarray(mask, np.float64)
    if mask.ndim == 2 and attrs.get("key_padding", False):
        return mask.reshape(b, 1, 1, t_k)
    if mask.ndim in (2, 3):
        return mask.reshape((-1 if mask.ndim == 3 else 1), 1, t_q, t_k)
    if mask.ndim == 4:
        return mask
    raise ValueError(f"an attention mask of shape {mask.shape} is not (q, k), (b, q, k), (b, h, q, k) or (b, k)")


def _masked(logits, mask, kind):
    if kind == "additive":
        return logits + mask
    if kind not in ("keep", "ignore"):
        raise ValueError(f"unknown attention mask {kind!r}; known: {', '.join(MASKS)}")
    keep = (mask != 0) if kind == "keep" else (mask == 0)
    return np.where(keep, logits, -np.inf)


def _head_dim(weights, attrs):
    return weights["query/kernel"].shape[1] // attrs["heads"]


def forward(inputs, weights, attrs, axis=-1, interleaved=False, rows="declared", mask="declared"):
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
    raw = logits
    if len(inputs) > 1 and "mask" not in attrs:
        raise ValueError(
            "an attention layer with a mask input declares the mask's convention: attribute 'mask' "
            f"({', '.join(MASKS)})"
        )
    if len(inputs) > 1 and mask is not None:
        kind = attrs["mask"] if mask == "declared" else mask
        logits = _masked(logits, _mask(inputs[1], attrs, b, t, t), kind)
    rows = attrs.get("masked_rows", "zero") if rows == "declared" else rows
    if rows not in (*ROWS, "unmasked"):
        raise ValueError(f"unknown masked_rows {rows!r}; known: {', '.join(ROWS)}")
    if rows == "unmasked":  # a fully masked row attends as if nothing were masked
        empty = np.all(logits == -np.inf, axis=axis, keepdims=True)
        attention = np.where(empty, _softmax(raw, axis), _softmax(logits, axis))
    else:
        attention = _softmax(logits, axis, rows)
    out = attention @ v
    return _dense(out.transpose(np.argsort(order)).reshape(b, t, -1), weights, "out")


def _scale(of_head_dim):
    def compute(inputs, weights, attrs, observed):
        scale = of_head_dim(_head_dim(weights, attrs), attrs["heads"])
        if math.isclose(scale, attrs.get("scale", 1.0 / math.sqrt(_head_dim(weights, attrs))), rel_tol=1e-9):
            raise NotApplicable("equals the declared scale")
        return forward(inputs, weights, {**attrs, "scale": scale})

    return compute


def _with_mask(**options):
    def compute(inputs, weights, attrs, observed):
        if len(inputs) < 2:
            raise NotApplicable("the layer has no mask input")
        value = forward(inputs, weights, attrs, **options)
        if np.array_equal(value, forward(inputs, weights, attrs), equal_nan=True):
            raise NotApplicable(f"equals the declared form on these inputs ({options})")
        return value

    return compute


ROW_MEANS = {
    "zero": "zero attention (torch SDPA's convention)",
    "nan": "NaN (a plain softmax over -inf)",
    "uniform": "the mean of the values (uniform attention: a mask of the dtype's lowest value instead of -inf)",
}


def _mask_variants(declared, rows="zero"):
    found = [
        Variant(
            f"masked_row_{other}",
            f"a fully masked query row gives {ROW_MEANS[other]} where the declared form gives "
            f"{ROW_MEANS[rows].split(' (')[0]}",
            _with_mask(rows=other),
        )
        for other in ("nan", "zero", "uniform")
        if other != rows
    ]
    found += [
        Variant(
            "masked_row_unmasked",
            "a fully masked query row attends as if unmasked (an additive -1e9 mask)",
            _with_mask(rows="unmasked"),
        ),
        Variant("mask_ignored", "the attention mask lost", _with_mask(mask=None)),
    ]
    if declared in ("keep", "ignore"):
        other = "ignore" if declared == "keep" else "keep"
        meaning = {"keep": "attend", "ignore": "masked"}
        found.append(
            Variant(
                "mask_inverted",
                f"the boolean mask read as true = {meaning[other]} instead of true = {meaning[declared]}",
                _with_mask(mask=other),
            )
        )
    return found


def variants(attrs):
    found = [
        Variant(
            "scale_sqrt_d_model",
            "logits scaled by 1/sqrt(d_model) instead of the declared scale",
            _scale(lambda hd, heads: 1.0 / math.sqrt(hd * heads)),
        ),
        Variant(
            "scale_head_dim",
            "logits scaled by 1/head_dim (scaled twice) instead of the declared scale",
            _scale(lambda hd, heads: 1.0 / hd),
        ),
        Variant("no_scale", "logits not scaled", _scale(lambda hd, heads: 1.0)),
        Variant(
            "softmax_query_axis",
            "softmax over the queries instead of the keys",
            lambda inputs, weights, attrs, observed: forward(inputs, weights, attrs, axis=-2),
        ),
    ]
    if attrs["heads"] > 1:
        found.append(
            Variant(
                "heads_interleaved",
                "heads split as (tokens, head_dim, heads): interleaved features instead of contiguous blocks",
                lambda inputs, weights, attrs, observed: forward(inputs, weights, attrs, interleaved=True),
            )
        )
    if "mask" in attrs:
        found += _mask_variants(attrs["mask"], attrs.get("masked_rows", "zero"))
    causal = not attrs.get("causal", False)
    found.append(
        Variant(
            "causal" if causal else "non_causal",
            "causal mask applied, not declared" if causal else "causal mask dropped",
            with_attrs(forward, causal=causal),
        )
    )
    return found
