"""The PyTorch layers and ops ``probe_layers.py`` runs: ``CASES`` (row name -> ``Case``), one input each.

Every case computes in its input's dtype (float64 for the reference, float32 on the paths), so what a path changes is
the path's, not a cast the layer wrote."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from probe_layers import FLOAT32_MIN, Case, scaled, spread, uniform
from torch import nn


class Fn(nn.Module):
    """A function of the input as a module (no weights)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def fn(f) -> type:
    return lambda: Fn(f)


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * w`` (Llama), the epsilon outside the root, or Gemma's ``(1 + w)`` weight."""

    def __init__(self, width: int, eps: float = 1e-6, outside: bool = False, offset: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps, self.outside, self.offset = eps, outside, offset

    def forward(self, x):
        ms = x.pow(2).mean(-1, keepdim=True)
        x = x / (ms.sqrt() + self.eps) if self.outside else x * torch.rsqrt(ms + self.eps)
        return x * ((1 + self.weight) if self.offset else self.weight)


def sinusoidal(offset: int):
    def f(x):
        s, d = x.shape[-2:]
        pos = torch.arange(s, dtype=x.dtype) + offset
        inv = torch.exp(torch.arange(0, d, 2, dtype=x.dtype) * (-math.log(10000.0) / d))
        angle = pos[:, None] * inv[None, :]
        return x + torch.cat([angle.sin(), angle.cos()], -1)

    return f


def rope(interleaved: bool, offset: int = 0):
    """Rotary embedding of (batch, seq, dim): half-split (HF ``rotate_half``) or interleaved pairs (GPT-J)."""

    def f(x):
        s, d = x.shape[-2:]
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=x.dtype) / d))
        freqs = (torch.arange(s, dtype=x.dtype) + offset)[:, None] * inv[None, :]
        if interleaved:
            x0, x1 = x[..., 0::2], x[..., 1::2]
            cos, sin = freqs.cos(), freqs.sin()
            return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).flatten(-2)
        emb = torch.cat([freqs, freqs], -1)
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return x * emb.cos() + torch.cat([-x2, x1], -1) * emb.sin()

    return f


class GatedMLP(nn.Module):
    """SwiGLU (``down(silu(gate(x)) * up(x))``) or a fused GeGLU projection whose second half gates (diffusers)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        if kind == "swiglu":
            self.gate, self.up = nn.Linear(16, 32, bias=False), nn.Linear(16, 32, bias=False)
        else:
            self.proj = nn.Linear(16, 64)
        self.down = nn.Linear(32, 16, bias=False)

    def forward(self, x):
        if self.kind == "swiglu":
            return self.down(F.silu(self.gate(x)) * self.up(x))
        hidden, gate = self.proj(x).chunk(2, dim=-1)
        return self.down(hidden * F.gelu(gate))


def attention(kv_heads: int = 4, causal: bool = False, mask: str | None = None):
    """4 query heads of width 4 from (batch, 6, 16 + 2 * 4 * kv_heads); ``mask``: ``padding`` (bool, the last two
    keys off), ``bool-row`` (query 0 sees no key), ``inf-row`` / ``min-row`` (additive: -inf or float32's minimum
    on query 0's row)."""

    def f(x):
        b, s, _ = x.shape
        q = x[..., :16].reshape(b, s, 4, 4).transpose(1, 2)
        k = x[..., 16 : 16 + 4 * kv_heads].reshape(b, s, kv_heads, 4).transpose(1, 2)
        v = x[..., 16 + 4 * kv_heads :].reshape(b, s, kv_heads, 4).transpose(1, 2)
        attn_mask = None
        if mask in ("padding", "bool-row"):
            attn_mask = torch.ones(s, s, dtype=torch.bool)
            if mask == "padding":
                attn_mask[:, -2:] = False
            else:
                attn_mask[0] = False
        elif mask in ("inf-row", "min-row"):
            attn_mask = torch.zeros(s, s, dtype=x.dtype)
            attn_mask[0] = -math.inf if mask == "inf-row" else FLOAT32_MIN
        out = F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=causal, enable_gqa=kv_heads != 4)
        return out.transpose(1, 2).reshape(b, s, 16)

    return f


def resize(size: int, mode: str, **kw):
    return fn(lambda x: F.interpolate(x, size=(size, size), mode=mode, **kw))


def variance_in_float64(x):
    """A float64 island: the variance of ``x + 1e4`` as E[h^2] - E[h]^2, which float32 cannot hold."""
    h = x.to(torch.float64) + 1e4
    return ((h * h).mean(-1) - h.mean(-1) ** 2).to(x.dtype)


IMAGE = (8, 6, 6)
SEQ = (5, 16)
TAILS = spread(-30.0, 30.0)
CASES = {
    "norm/layernorm": Case(SEQ, lambda: nn.LayerNorm(16)),
    "norm/rmsnorm": Case(SEQ, lambda: RMSNorm(16), scaled(1e-3)),
    "norm/rmsnorm-eps-outside": Case(SEQ, lambda: RMSNorm(16, outside=True), scaled(1e-3)),
    "norm/rmsnorm-gemma(1+w)": Case(SEQ, lambda: RMSNorm(16, offset=True), scaled(1e-3)),
    "norm/rmsnorm-builtin": Case(SEQ, lambda: nn.RMSNorm(16, eps=1e-6), scaled(1e-3)),
    "norm/batchnorm": Case(IMAGE, lambda: nn.BatchNorm2d(8)),
    "norm/groupnorm": Case(IMAGE, lambda: nn.GroupNorm(4, 8)),
    "pos/sinusoidal": Case((6, 16), fn(sinusoidal(0))),
    "pos/sinusoidal-offset4096": Case((6, 16), fn(sinusoidal(4096))),
    "rope/half-split": Case((6, 8), fn(rope(False))),
    "rope/interleaved": Case((6, 8), fn(rope(True))),
    "rope/half-split-offset2048": Case((6, 8), fn(rope(False, 2048))),
    "mlp/swiglu": Case(SEQ, lambda: GatedMLP("swiglu")),
    "mlp/geglu-fused": Case(SEQ, lambda: GatedMLP("geglu")),
    "attn/sdpa": Case((6, 48), fn(attention())),
    "attn/causal": Case((6, 48), fn(attention(causal=True))),
    "attn/gqa-4q-2kv": Case((6, 32), fn(attention(kv_heads=2))),
    "attn/mask-bool-padding": Case((6, 48), fn(attention(mask="padding"))),
    "attn/mask-bool-masked-row": Case((6, 48), fn(attention(mask="bool-row"))),
    "attn/mask-inf-masked-row": Case((6, 48), fn(attention(mask="inf-row"))),
    "attn/mask-min-masked-row": Case((6, 48), fn(attention(mask="min-row"))),
    "conv/depthwise": Case(IMAGE, lambda: nn.Conv2d(8, 8, 3, padding=1, groups=8)),
    "conv/grouped": Case(IMAGE, lambda: nn.Conv2d(8, 8, 3, padding=1, groups=2)),
    "resize/nearest-x2": Case(IMAGE, resize(12, "nearest")),
    "resize/nearest-6to9": Case(IMAGE, resize(9, "nearest")),
    "resize/nearest-6to4": Case(IMAGE, resize(4, "nearest")),
    "resize/nearest-exact-6to9": Case(IMAGE, resize(9, "nearest-exact")),
    "resize/bilinear-6to9": Case(IMAGE, resize(9, "bilinear", align_corners=False)),
    "resize/bilinear-6to9-align_corners": Case(IMAGE, resize(9, "bilinear", align_corners=True)),
    "resize/bilinear-6to4-antialias": Case(IMAGE, resize(4, "bilinear", antialias=True)),
    "resize/bicubic-6to9": Case(IMAGE, resize(9, "bicubic", align_corners=False)),
    "resize/bicubic-6to9-align_corners": Case(IMAGE, resize(9, "bicubic", align_corners=True)),
    "resize/bicubic-6to4-antialias": Case(IMAGE, resize(4, "bicubic", antialias=True)),
    "pool/max-ceil": Case(IMAGE, fn(lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True))),
    "pool/avg-pad-count_include_pad": Case(IMAGE, fn(lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=True))),
    "pool/avg-pad-exclude_pad": Case(IMAGE, fn(lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False))),
    "pool/avg-ceil": Case(IMAGE, fn(lambda x: F.avg_pool2d(x, 3, 2, ceil_mode=True))),
    "pool/adaptive-avg-6to4": Case(IMAGE, fn(lambda x: F.adaptive_avg_pool2d(x, 4))),
    "pool/adaptive-max-6to4": Case(IMAGE, fn(lambda x: F.adaptive_max_pool2d(x, 4))),
    "act/gelu": Case((64,), fn(F.gelu), TAILS),
    "act/gelu-tanh": Case((64,), fn(lambda x: F.gelu(x, approximate="tanh")), TAILS),
    "act/silu": Case((64,), fn(F.silu), TAILS),
    "act/mish": Case((64,), fn(F.mish), TAILS),
    "act/hardswish": Case((64,), fn(F.hardswish), TAILS),
    "act/softplus": Case((64,), fn(F.softplus), TAILS),
    "act/softplus-beta2-threshold5": Case((64,), fn(lambda x: F.softplus(x, beta=2.0, threshold=5.0)), TAILS),
    "act/elu": Case((64,), fn(F.elu), TAILS),
    "act/selu": Case((64,), fn(F.selu), TAILS),
    "act/logsigmoid": Case((64,), fn(F.logsigmoid), spread(-120.0, 30.0)),
    "act/log_softmax": Case(SEQ, fn(lambda x: F.log_softmax(x, -1)), scaled(10.0)),
    "special/erf": Case((64,), fn(torch.erf), spread(-4.0, 4.0)),
    "special/erfinv": Case((64,), fn(torch.erfinv), uniform(-0.99, 0.99)),
    "special/lgamma": Case((64,), fn(torch.lgamma), uniform(0.1, 20.0)),
    "special/digamma": Case((64,), fn(torch.digamma), uniform(0.1, 20.0)),
    "island/float64-variance": Case(SEQ, fn(variance_in_float64)),
}
