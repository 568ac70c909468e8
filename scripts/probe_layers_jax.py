"""The JAX / Flax layers and ops ``probe_layers.py`` runs: ``CASES`` (row name -> ``Case``), each ``make(params, x)``
with its parameters' shapes by name (the float64 reference runs with ``jax_enable_x64``; the paths without it)."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.scipy import special
from probe_layers import FLOAT32_MIN, Case, scaled, spread, uniform


def rmsnorm(eps=1e-6, outside=False, offset=False):
    def f(p, x):
        ms = jnp.mean(x * x, -1, keepdims=True)
        x = x / (jnp.sqrt(ms) + eps) if outside else x * jax.lax.rsqrt(ms + eps)
        return x * ((1 + p["scale"]) if offset else p["scale"])

    return f


def flax_layer(module, collections=("params",)):
    """A flax.linen module applied with its variables from the flat params (``collection/name``)."""

    def f(p, x):
        variables: dict = {}
        for key, value in p.items():
            collection, name = key.split("/")
            variables.setdefault(collection, {})[name] = value
        return module.apply(variables, x)

    return f


def sinusoidal(offset: int):
    def f(p, x):
        s, d = x.shape[-2:]
        pos = jnp.arange(s, dtype=x.dtype) + offset
        inv = jnp.exp(jnp.arange(0, d, 2, dtype=x.dtype) * (-math.log(10000.0) / d))
        angle = pos[:, None] * inv[None, :]
        return x + jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], -1)

    return f


def rope(interleaved: bool, offset: int = 0):
    def f(p, x):
        s, d = x.shape[-2:]
        inv = 1.0 / (10000.0 ** (jnp.arange(0, d, 2, dtype=x.dtype) / d))
        freqs = (jnp.arange(s, dtype=x.dtype) + offset)[:, None] * inv[None, :]
        if interleaved:
            x0, x1 = x[..., 0::2], x[..., 1::2]
            cos, sin = jnp.cos(freqs), jnp.sin(freqs)
            return jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).reshape(x.shape)
        emb = jnp.concatenate([freqs, freqs], -1)
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return x * jnp.cos(emb) + jnp.concatenate([-x2, x1], -1) * jnp.sin(emb)

    return f


def swiglu(p, x):
    return (jax.nn.silu(x @ p["gate"]) * (x @ p["up"])) @ p["down"]


def geglu(p, x):
    hidden, gate = jnp.split(x @ p["proj"] + p["bias"], 2, axis=-1)
    return (hidden * jax.nn.gelu(gate, approximate=False)) @ p["down"]


def attention(kv_heads: int = 4, causal: bool = False, mask: str | None = None):
    def f(p, x):
        b, s, _ = x.shape
        q = x[..., :16].reshape(b, s, 4, 4)
        k = x[..., 16 : 16 + 4 * kv_heads].reshape(b, s, kv_heads, 4)
        v = x[..., 16 + 4 * kv_heads :].reshape(b, s, kv_heads, 4)
        kw = {}
        rows = jnp.arange(s)[:, None]
        cols = jnp.arange(s)[None, :]
        if mask == "padding":
            kw["mask"] = jnp.broadcast_to(cols < s - 2, (s, s))[None, None]
        elif mask == "bool-row":
            kw["mask"] = jnp.broadcast_to(rows > 0, (s, s))[None, None]
        elif mask in ("inf-row", "min-row"):
            fill = -jnp.inf if mask == "inf-row" else FLOAT32_MIN
            kw["bias"] = jnp.where(jnp.broadcast_to(rows == 0, (s, s)), fill, 0.0).astype(x.dtype)[None, None]
        out = jax.nn.dot_product_attention(q, k, v, is_causal=causal, **kw)
        return out.reshape(b, s, 16)

    return f


def conv(groups: int):
    def f(p, x):
        return jax.lax.conv_general_dilated(
            x, p["kernel"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=groups
        )

    return f


def resize(size: int, method: str, antialias: bool = False):
    return lambda p, x: jax.image.resize(x, (x.shape[0], size, size, x.shape[3]), method, antialias=antialias)


def avg_pool(include: bool):
    return lambda p, x: nn.avg_pool(x, (3, 3), (2, 2), ((1, 1), (1, 1)), count_include_pad=include)


def variance_in_float64(p, x):
    h = x.astype(jnp.float64) + 1e4
    return (jnp.mean(h * h, -1) - jnp.mean(h, -1) ** 2).astype(x.dtype)


def act(f):
    return lambda p, x: f(x)


IMAGE = (6, 6, 8)
SEQ = (5, 16)
TAILS = spread(-30.0, 30.0)
_RMS = {"scale": (16,)}
CASES = {
    "norm/layernorm": Case(
        SEQ, flax_layer(nn.LayerNorm(epsilon=1e-5)), params={"params/scale": (16,), "params/bias": (16,)}
    ),
    "norm/rmsnorm": Case(SEQ, rmsnorm(), scaled(1e-3), _RMS),
    "norm/rmsnorm-eps-outside": Case(SEQ, rmsnorm(outside=True), scaled(1e-3), _RMS),
    "norm/rmsnorm-gemma(1+w)": Case(SEQ, rmsnorm(offset=True), scaled(1e-3), _RMS),
    "norm/rmsnorm-builtin": Case(SEQ, flax_layer(nn.RMSNorm(epsilon=1e-6)), scaled(1e-3), {"params/scale": (16,)}),
    "norm/batchnorm": Case(
        IMAGE,
        flax_layer(nn.BatchNorm(use_running_average=True)),
        params={"params/scale": (8,), "params/bias": (8,), "batch_stats/mean": (8,), "batch_stats/var": (8,)},
    ),
    "norm/groupnorm": Case(
        IMAGE, flax_layer(nn.GroupNorm(num_groups=4)), params={"params/scale": (8,), "params/bias": (8,)}
    ),
    "pos/sinusoidal": Case((6, 16), sinusoidal(0)),
    "pos/sinusoidal-offset4096": Case((6, 16), sinusoidal(4096)),
    "rope/half-split": Case((6, 8), rope(False)),
    "rope/interleaved": Case((6, 8), rope(True)),
    "rope/half-split-offset2048": Case((6, 8), rope(False, 2048)),
    "mlp/swiglu": Case(SEQ, swiglu, params={"gate": (16, 32), "up": (16, 32), "down": (32, 16)}),
    "mlp/geglu-fused": Case(SEQ, geglu, params={"proj": (16, 64), "bias": (64,), "down": (32, 16)}),
    "attn/sdpa": Case((6, 48), attention()),
    "attn/causal": Case((6, 48), attention(causal=True)),
    "attn/gqa-4q-2kv": Case((6, 32), attention(kv_heads=2)),
    "attn/mask-bool-padding": Case((6, 48), attention(mask="padding")),
    "attn/mask-bool-masked-row": Case((6, 48), attention(mask="bool-row")),
    "attn/mask-inf-masked-row": Case((6, 48), attention(mask="inf-row")),
    "attn/mask-min-masked-row": Case((6, 48), attention(mask="min-row")),
    "conv/depthwise": Case(IMAGE, conv(8), params={"kernel": (3, 3, 1, 8)}),
    "conv/grouped": Case(IMAGE, conv(2), params={"kernel": (3, 3, 4, 8)}),
    "resize/nearest-x2": Case(IMAGE, resize(12, "nearest")),
    "resize/nearest-6to9": Case(IMAGE, resize(9, "nearest")),
    "resize/nearest-6to4": Case(IMAGE, resize(4, "nearest")),
    "resize/bilinear-6to9": Case(IMAGE, resize(9, "linear")),
    "resize/bilinear-6to4-antialias": Case(IMAGE, resize(4, "linear", antialias=True)),
    "resize/bicubic-6to9": Case(IMAGE, resize(9, "cubic")),
    "resize/bicubic-6to4-antialias": Case(IMAGE, resize(4, "cubic", antialias=True)),
    "resize/lanczos3-6to9": Case(IMAGE, resize(9, "lanczos3")),
    "pool/max-same": Case(IMAGE, lambda p, x: nn.max_pool(x, (3, 3), (2, 2), "SAME")),
    "pool/avg-pad-count_include_pad": Case(IMAGE, avg_pool(True)),
    "pool/avg-pad-exclude_pad": Case(IMAGE, avg_pool(False)),
    "act/gelu": Case((64,), act(lambda x: jax.nn.gelu(x, approximate=False)), TAILS),
    "act/gelu-tanh": Case((64,), act(lambda x: jax.nn.gelu(x, approximate=True)), TAILS),
    "act/silu": Case((64,), act(jax.nn.silu), TAILS),
    "act/mish": Case((64,), act(jax.nn.mish), TAILS),
    "act/hardswish": Case((64,), act(jax.nn.hard_swish), TAILS),
    "act/softplus": Case((64,), act(jax.nn.softplus), TAILS),
    "act/elu": Case((64,), act(jax.nn.elu), TAILS),
    "act/selu": Case((64,), act(jax.nn.selu), TAILS),
    "act/logsigmoid": Case((64,), act(jax.nn.log_sigmoid), spread(-120.0, 30.0)),
    "act/log_softmax": Case(SEQ, act(lambda x: jax.nn.log_softmax(x, -1)), scaled(10.0)),
    "special/erf": Case((64,), act(special.erf), spread(-4.0, 4.0)),
    "special/erfinv": Case((64,), act(special.erfinv), uniform(-0.99, 0.99)),
    "special/lgamma": Case((64,), act(special.gammaln), uniform(0.1, 20.0)),
    "special/digamma": Case((64,), act(special.digamma), uniform(0.1, 20.0)),
    "island/float64-variance": Case(SEQ, variance_in_float64),
}
