"""attention: multi-head self-attention on ``(batch, tokens, features)``.

``q = x @ Wq + bq`` reshaped to (b, t, heads, hd) and transposed to (b, heads, t, hd); ``k``
and ``v`` likewise; ``w = softmax(q @ k^T * scale)`` over the keys (last axis); the output
``(w @ v)`` transposed back to (b, t, heads*hd), then ``@ Wo + bo``. Weights ``query/kernel``,
``query/bias``, ``key/...``, ``value/...``, ``out/...`` (dense, (in, out); biases optional).
Attributes: ``heads``; ``scale`` (default 1/sqrt(head_dim)); ``causal`` (default False: with
it, query i attends to keys j <= i only).

Grouped-query attention: ``kv_heads`` (default ``heads``; ``heads`` a multiple of it) key/value heads, the ``key``
and ``value`` kernels ``(in, kv_heads*head_dim)``; query head h reads key/value head ``h // (heads // kv_heads)``
(transformers' ``repeat_kv``, i.e. ``repeat_interleave`` over the heads; torch SDPA's ``enable_gqa``; ONNX
``Attention`` and the ``GroupQueryAttention`` contrib op). ``rotary: "half"`` (transformers' Llama, Mistral and
Qwen2 attention modules): the layer reads the rotary tables ``cos`` and ``sin`` ``(batch or 1, tokens, head_dim)`` as
its second and third inputs and rotates q and k, per head, as ``q * cos + rotate_half(q) * sin`` (``rotate_half(q)``
is ``cat(-q[half:], q[:half])``) before the logits. A mask, if any, is the input after them.

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

With grouped-query attention or rotary tables:

* ``kv_heads_tiled``: query head h reads key/value head ``h % kv_heads`` (``np.tile`` / ``kv.repeat(1, g, 1, 1)``
  where the model repeats each head, ``repeat_interleave``: a port's or converter's head order). The same as the
  declared form where ``kv_heads`` is 1 or ``heads``: not applicable there;
* ``rotary_pairs``: q and k rotated over adjacent pairs ``(x[2i], x[2i+1])`` by the angle of frequency i (GPT-J's,
  Meta's and GGML's ``NORM`` rope) instead of the halves ``(x[i], x[i + head_dim/2])``: a runtime rotating pairs on a
  checkpoint whose q/k projection rows were not permuted for it (llama.cpp's converter permutes q_proj and k_proj
  rows, ``(heads, 2, head_dim/2) -> (heads, head_dim/2, 2)``, so that pairs rotate as halves did). Not applicable
  where ``head_dim`` is 2 (one pair).

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

from parity.diagnose.causes.layers import NotApplicable, Variant, with_attrs

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


GROUPINGS = ("repeat", "tile")


def _parts(inputs, attrs):
    """``(x, (cos, sin) or None, mask or None)``: the layer's input, its rotary tables and its mask."""
    rest = list(inputs[1:])
    tables = None
    if attrs.get("rotary") is not None:
        if attrs["rotary"] != "half":
            raise ValueError(f"unknown attention rotary {attrs['rotary']!r}; known: half")
        if len(rest) < 2:
            raise ValueError("an attention layer with rotary: 'half' reads cos and sin as its second and third inputs")
        tables, rest = (np.asarray(rest[0], np.float64), np.asarray(rest[1], np.float64)), rest[2:]
    if len(rest) > 1:
        raise ValueError(f"an attention layer reads at most {len(inputs) - len(rest) + 1} inputs, got {len(inputs)}")
    return np.asarray(inputs[0], np.float64), tables, (rest[0] if rest else None)


def _kv_heads(attrs) -> int:
    heads, kv = attrs["heads"], attrs.get("kv_heads", attrs["heads"])
    if not isinstance(kv, int) or kv < 1 or heads % kv:
        raise ValueError(f"attention kv_heads {kv!r} is not a whole number that divides heads ({heads})")
    return kv


def _rotate(x, tables, pairs=False):
    """``x`` (b, heads, t, hd) rotated by the tables (b or 1, t, hd): halves as transformers' ``rotate_half``, or
    adjacent pairs, each by the angle of its frequency (the first half of the half-split table)."""
    cos, sin = (table[:, None] for table in tables)
    if cos.shape[-1] != x.shape[-1]:
        raise ValueError(f"rotary tables of {cos.shape[-1]} columns for a head dimension of {x.shape[-1]}")
    if not pairs:
        half = x.shape[-1] // 2
        return x * cos + np.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin
    half = x.shape[-1] // 2
    cos, sin = (np.repeat(t[..., :half], 2, axis=-1) for t in (cos, sin))
    turned = np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)
    return x * cos + turned * sin


def forward(
    inputs, weights, attrs, axis=-1, interleaved=False, rows="declared", mask="declared", grouping="repeat", pairs=False
):
    x, tables, given = _parts(inputs, attrs)
    b, t, _ = x.shape
    heads, kv = attrs["heads"], _kv_heads(attrs)
    hd = _head_dim(weights, attrs)
    order = (0, 3, 1, 2) if interleaved else (0, 2, 1, 3)  # -> (b, heads, t, hd)

    def split(name, n):
        return _dense(x, weights, name).reshape((b, t, hd, n) if interleaved else (b, t, n, hd)).transpose(order)

    q, k, v = split("query", heads), split("key", kv), split("value", kv)
    if tables is not None:
        q, k = _rotate(q, tables, pairs), _rotate(k, tables, pairs)
    if kv != heads:  # query head h reads kv head h // group (repeat), or h % kv_heads (tile)
        if grouping not in GROUPINGS:
            raise ValueError(f"unknown grouping {grouping!r}; known: {', '.join(GROUPINGS)}")
        group = heads // kv
        k, v = ((np.repeat(a, group, axis=1) if grouping == "repeat" else np.tile(a, (1, group, 1, 1))) for a in (k, v))
    logits = (q @ k.transpose(0, 1, 3, 2)) * attrs.get("scale", 1.0 / math.sqrt(hd))
    if attrs.get("causal", False):
        logits = np.where(np.triu(np.ones((t, t), bool), 1), -np.inf, logits)
    raw = logits
    if given is not None and "mask" not in attrs:
        raise ValueError(
            "an attention layer with a mask input declares the mask's convention: attribute 'mask' "
            f"({', '.join(MASKS)})"
        )
    if given is not None and mask is not None:
        kind = attrs["mask"] if mask == "declared" else mask
        logits = _masked(logits, _mask(given, attrs, b, t, t), kind)
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
        if _parts(inputs, attrs)[2] is None:
            raise NotApplicable("the layer has no mask input")
        value = forward(inputs, weights, attrs, **options)
        if np.array_equal(value, forward(inputs, weights, attrs), equal_nan=True):
            raise NotApplicable(f"equals the declared form on these inputs ({options})")
        return value

    return compute


def _tiled(inputs, weights, attrs, observed):
    if _kv_heads(attrs) in (1, attrs["heads"]):
        raise NotApplicable("one key/value head, or one per query head: tiled and repeated heads are the same")
    return forward(inputs, weights, attrs, grouping="tile")


def _pairs(inputs, weights, attrs, observed):
    if _head_dim(weights, attrs) <= 2:
        raise NotApplicable("a head dimension of 2 holds one pair: pairs and halves are the same")
    return forward(inputs, weights, attrs, pairs=True)


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
    if attrs.get("kv_heads", attrs["heads"]) != attrs["heads"]:
        found.append(
            Variant(
                "kv_heads_tiled",
                f"query head h reads key/value head h % {attrs['kv_heads']} (the heads tiled) instead of "
                f"h // {attrs['heads'] // max(attrs['kv_heads'], 1)} (each key/value head repeated, transformers' "
                "repeat_kv)",
                _tiled,
            )
        )
    if attrs.get("rotary") is not None:
        found.append(Variant("rotary_pairs", "q and k rotated over adjacent pairs instead of halves", _pairs))
    causal = not attrs.get("causal", False)
    found.append(
        Variant(
            "causal" if causal else "non_causal",
            "causal mask applied, not declared" if causal else "causal mask dropped",
            with_attrs(forward, causal=causal),
        )
    )
    return found
