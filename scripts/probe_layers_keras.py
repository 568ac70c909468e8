"""The Keras 3 (TensorFlow backend) layers and ops ``probe_layers.py`` runs: ``CASES`` (row name -> ``Case``).

Each ``make(dtype)`` builds a functional model whose layers compute in ``dtype`` (float64 for the reference); layers
holding weights are named, so their variables keep one path however often the model is built."""

from __future__ import annotations

import math

import keras
import tensorflow as tf
from keras import layers, ops
from probe_layers import FLOAT32_MIN, Case, scaled, spread, uniform


class Fn(layers.Layer):
    """A function of the input as a layer (no weights)."""

    def __init__(self, f, **kw):
        super().__init__(**kw)
        self.f = f

    def call(self, x):
        return self.f(x)


class RMSNorm(layers.Layer):
    """``x / sqrt(mean(x^2) + eps) * w``, the epsilon outside the root, or Gemma's ``(1 + w)`` weight."""

    def __init__(self, eps=1e-6, outside=False, offset=False, **kw):
        super().__init__(**kw)
        self.eps, self.outside, self.offset = eps, outside, offset

    def build(self, shape):
        self.scale = self.add_weight(name="scale", shape=(shape[-1],), initializer="ones")

    def call(self, x):
        ms = ops.mean(ops.square(x), axis=-1, keepdims=True)
        x = x / (ops.sqrt(ms) + self.eps) if self.outside else x * ops.rsqrt(ms + self.eps)
        return x * ((1 + self.scale) if self.offset else self.scale)


def model(shape, *stack):
    """``(dtype) -> keras.Model`` applying the layers ``stack(dtype)`` makes, in order, to input ``x``."""

    def make(dtype):
        x = keras.Input(shape, dtype=dtype, name="x")
        y = x
        for layer in stack:
            y = layer(dtype)(y)
        return keras.Model(x, y)

    return make


def fn(shape, f):
    return model(shape, lambda dtype: Fn(f, dtype=dtype))


def layer(shape, cls, **kw):
    return model(shape, lambda dtype: cls(dtype=dtype, **kw))


def sinusoidal(offset: int):
    def f(x):
        s, d = x.shape[-2:]
        pos = ops.cast(ops.arange(s), x.dtype) + offset
        inv = ops.exp(ops.cast(ops.arange(0, d, 2), x.dtype) * (-math.log(10000.0) / d))
        angle = pos[:, None] * inv[None, :]
        return x + ops.concatenate([ops.sin(angle), ops.cos(angle)], -1)

    return f


def rope(interleaved: bool, offset: int = 0):
    def f(x):
        s, d = x.shape[-2:]
        inv = 1.0 / ops.power(ops.cast(10000.0, x.dtype), ops.cast(ops.arange(0, d, 2), x.dtype) / d)
        freqs = (ops.cast(ops.arange(s), x.dtype) + offset)[:, None] * inv[None, :]
        if interleaved:
            x0, x1 = x[..., 0::2], x[..., 1::2]
            cos, sin = ops.cos(freqs), ops.sin(freqs)
            y = ops.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1)
            return ops.reshape(y, (-1, s, d))
        emb = ops.concatenate([freqs, freqs], -1)
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return x * ops.cos(emb) + ops.concatenate([-x2, x1], -1) * ops.sin(emb)

    return f


class GatedMLP(layers.Layer):
    def __init__(self, kind, **kw):
        super().__init__(**kw)
        self.kind = kind
        if kind == "swiglu":
            self.gate = layers.Dense(32, use_bias=False, name="gate", dtype=kw.get("dtype"))
            self.up = layers.Dense(32, use_bias=False, name="up", dtype=kw.get("dtype"))
        else:
            self.proj = layers.Dense(64, name="proj", dtype=kw.get("dtype"))
        self.down = layers.Dense(16, use_bias=False, name="down", dtype=kw.get("dtype"))

    def call(self, x):
        if self.kind == "swiglu":
            return self.down(ops.silu(self.gate(x)) * self.up(x))
        hidden, gate = ops.split(self.proj(x), 2, axis=-1)
        return self.down(hidden * ops.gelu(gate, approximate=False))


def attention(kv_heads: int = 4, causal: bool = False, mask: str | None = None):
    """As the torch cases: 4 query heads of width 4 from (batch, 6, 16 + 2 * 4 * kv_heads)."""

    def f(x):
        s = x.shape[1]
        q = ops.reshape(x[..., :16], (-1, s, 4, 4))
        k = ops.reshape(x[..., 16 : 16 + 4 * kv_heads], (-1, s, kv_heads, 4))
        v = ops.reshape(x[..., 16 + 4 * kv_heads :], (-1, s, kv_heads, 4))
        kw = {}
        if mask == "padding":
            kw["mask"] = ops.convert_to_tensor([[k < s - 2 for k in range(s)]] * s)[None, None]
        elif mask == "bool-row":
            kw["mask"] = ops.convert_to_tensor([[r > 0] * s for r in range(s)])[None, None]
        elif mask in ("inf-row", "min-row"):
            fill = -math.inf if mask == "inf-row" else FLOAT32_MIN
            kw["bias"] = ops.cast(ops.convert_to_tensor([[fill if r == 0 else 0.0] * s for r in range(s)]), x.dtype)[
                None, None
            ]
        out = ops.dot_product_attention(q, k, v, is_causal=causal, **kw)
        return ops.reshape(out, (-1, s, 16))

    return f


def resize(size: int, interpolation: str, antialias: bool = False):
    return fn(IMAGE, lambda x: ops.image.resize(x, (size, size), interpolation=interpolation, antialias=antialias))


def variance_in_float64(x):
    h = ops.cast(x, "float64") + 1e4
    return ops.cast(ops.mean(h * h, -1) - ops.mean(h, -1) ** 2, x.dtype)


IMAGE = (6, 6, 8)
SEQ = (5, 16)
TAILS = spread(-30.0, 30.0)
CASES = {
    "norm/layernorm": Case(SEQ, layer(SEQ, layers.LayerNormalization, epsilon=1e-5, name="ln")),
    "norm/rmsnorm": Case(SEQ, layer(SEQ, RMSNorm, name="rms"), scaled(1e-3)),
    "norm/rmsnorm-eps-outside": Case(SEQ, layer(SEQ, RMSNorm, outside=True, name="rms"), scaled(1e-3)),
    "norm/rmsnorm-gemma(1+w)": Case(SEQ, layer(SEQ, RMSNorm, offset=True, name="rms"), scaled(1e-3)),
    "norm/rmsnorm-builtin": Case(SEQ, layer(SEQ, layers.RMSNormalization, epsilon=1e-6, name="rms"), scaled(1e-3)),
    "norm/batchnorm": Case(IMAGE, layer(IMAGE, layers.BatchNormalization, name="bn")),
    "norm/groupnorm": Case(IMAGE, layer(IMAGE, layers.GroupNormalization, groups=4, name="gn")),
    "pos/sinusoidal": Case((6, 16), fn((6, 16), sinusoidal(0))),
    "pos/sinusoidal-offset4096": Case((6, 16), fn((6, 16), sinusoidal(4096))),
    "rope/half-split": Case((6, 8), fn((6, 8), rope(False))),
    "rope/interleaved": Case((6, 8), fn((6, 8), rope(True))),
    "rope/half-split-offset2048": Case((6, 8), fn((6, 8), rope(False, 2048))),
    "mlp/swiglu": Case(SEQ, layer(SEQ, GatedMLP, kind="swiglu", name="mlp")),
    "mlp/geglu-fused": Case(SEQ, layer(SEQ, GatedMLP, kind="geglu", name="mlp")),
    "attn/sdpa": Case((6, 48), fn((6, 48), attention())),
    "attn/causal": Case((6, 48), fn((6, 48), attention(causal=True))),
    "attn/gqa-4q-2kv": Case((6, 32), fn((6, 32), attention(kv_heads=2))),
    "attn/mask-bool-padding": Case((6, 48), fn((6, 48), attention(mask="padding"))),
    "attn/mask-bool-masked-row": Case((6, 48), fn((6, 48), attention(mask="bool-row"))),
    "attn/mask-inf-masked-row": Case((6, 48), fn((6, 48), attention(mask="inf-row"))),
    "attn/mask-min-masked-row": Case((6, 48), fn((6, 48), attention(mask="min-row"))),
    "conv/depthwise": Case(IMAGE, layer(IMAGE, layers.DepthwiseConv2D, kernel_size=3, padding="same", name="dw")),
    "conv/grouped": Case(
        IMAGE, layer(IMAGE, layers.Conv2D, filters=8, kernel_size=3, padding="same", groups=2, name="gc")
    ),
    "resize/nearest-x2": Case(IMAGE, resize(12, "nearest")),
    "resize/nearest-6to9": Case(IMAGE, resize(9, "nearest")),
    "resize/nearest-6to4": Case(IMAGE, resize(4, "nearest")),
    "resize/bilinear-6to9": Case(IMAGE, resize(9, "bilinear")),
    "resize/bilinear-6to4-antialias": Case(IMAGE, resize(4, "bilinear", antialias=True)),
    "resize/bicubic-6to9": Case(IMAGE, resize(9, "bicubic")),
    "resize/bicubic-6to4-antialias": Case(IMAGE, resize(4, "bicubic", antialias=True)),
    "resize/lanczos3-6to9": Case(IMAGE, resize(9, "lanczos3")),
    "resize/upsampling2d-bilinear-x2": Case(IMAGE, layer(IMAGE, layers.UpSampling2D, interpolation="bilinear")),
    "pool/max-same": Case(IMAGE, layer(IMAGE, layers.MaxPooling2D, pool_size=3, strides=2, padding="same")),
    "pool/avg-same-exclude_pad": Case(
        IMAGE, layer(IMAGE, layers.AveragePooling2D, pool_size=3, strides=2, padding="same")
    ),
    "pool/adaptive-avg-6to4": Case(IMAGE, layer(IMAGE, layers.AdaptiveAveragePooling2D, output_size=4)),
    "pool/adaptive-max-6to4": Case(IMAGE, layer(IMAGE, layers.AdaptiveMaxPooling2D, output_size=4)),
    "act/gelu": Case((64,), fn((64,), lambda x: ops.gelu(x, approximate=False)), TAILS),
    "act/gelu-tanh": Case((64,), fn((64,), lambda x: ops.gelu(x, approximate=True)), TAILS),
    "act/silu": Case((64,), fn((64,), ops.silu), TAILS),
    "act/mish": Case((64,), fn((64,), keras.activations.mish), TAILS),
    "act/hardswish": Case((64,), fn((64,), ops.hard_swish), TAILS),
    "act/softplus": Case((64,), fn((64,), ops.softplus), TAILS),
    "act/elu": Case((64,), fn((64,), ops.elu), TAILS),
    "act/selu": Case((64,), fn((64,), ops.selu), TAILS),
    "act/logsigmoid": Case((64,), fn((64,), ops.log_sigmoid), spread(-120.0, 30.0)),
    "act/log_softmax": Case(SEQ, fn(SEQ, lambda x: ops.log_softmax(x, -1)), scaled(10.0)),
    "special/erf": Case((64,), fn((64,), ops.erf), spread(-4.0, 4.0)),
    "special/erfinv": Case((64,), fn((64,), ops.erfinv), uniform(-0.99, 0.99)),
    "special/lgamma": Case((64,), fn((64,), tf.math.lgamma), uniform(0.1, 20.0)),
    "special/digamma": Case((64,), fn((64,), tf.math.digamma), uniform(0.1, 20.0)),
    "island/float64-variance": Case(SEQ, fn(SEQ, variance_in_float64)),
}
