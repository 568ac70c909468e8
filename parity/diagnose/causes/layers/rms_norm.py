"""rms_norm: root-mean-square normalisation over the last axis with a per-feature scale.

``y = x / sqrt(mean(x**2) + eps) * (offset + gamma)``, the mean over the last axis. Attributes ``eps`` (default
1e-6), ``offset`` (0, or 1 for Gemma's ``1 + w`` weight), ``by_variance`` (False; True divides ``x`` by
``sqrt(var(x) + eps)``, the variance in place of the mean square and ``x`` itself not centred, as Keras'
``LayerNormalization(rms_scaling=True)`` does). Weight ``gamma`` (optional: 1; torch's ``weight``, Keras' and Flax's
``scale``). ``eps_from_dtype`` (``torch.nn.RMSNorm(eps=None)``): the epsilon is the machine epsilon of the type the
layer computes in, ``eps`` float64's (the golden's); torch computes float32, float16 and bfloat16 inputs in float32
and takes float32's (torch 2.13; ``eps=float32_eps`` names such a path where it differs from the golden), while an
export that reads the epsilon off a float16 or bfloat16 input's own type gives ``eps=float16_eps`` (9.8e-4) or
``eps=bfloat16_eps`` (7.8e-3), offered there in place of ``eps=1e-3``.

Variants:

* ``eps=<value>``: another epsilon among 1e-5 (Mistral, many exports), 1e-6 (Llama, Qwen2, T5, Gemma, Keras,
  Flax), 1e-8, float32's machine epsilon (``torch.nn.RMSNorm(eps=None)``), 1e-3 (Keras ``LayerNormalization``),
  0; values within 1 % of the declared one are left out;
* ``eps_fitted``: an epsilon none of those, fitted to the observed output and reported with its value;
* ``eps_outside_sqrt``: ``x / (sqrt(mean(x**2)) + eps)``;
* ``weight_offset``: the ``1 + w`` offset toggled (a Gemma norm exported as a Llama one, or the reverse);
* ``by_variance`` / ``by_mean_square``: the variance in place of the mean square, or the reverse (an RMSNorm
  exported as Keras' ``rms_scaling`` LayerNormalization computes it, or that layer exported as an RMSNorm);
* ``no_scale``: ``gamma`` not applied;
* ``no_upcast_float16`` / ``no_upcast_bfloat16``: every step computed in that type (the square, the mean, the
  reciprocal square root), as an export that drops the float32 upcast of a half-precision model does.
"""

from __future__ import annotations

import numpy as np

from parity.diagnose.causes.layers import NotApplicable, Variant, epsilon_variants, fitted_epsilon

KIND = "rms_norm"
EPSILONS = (
    (1e-5, "1e-5", "Mistral, many exports"),
    (1e-6, "1e-6", "Llama, T5, Gemma, Keras, Flax default"),
    (1e-8, "1e-8", ""),
    (float(np.finfo(np.float32).eps), "float32_eps", "torch.nn.RMSNorm eps=None computed in float32"),
    (1e-3, "1e-3", "Keras LayerNormalization default"),
    (0.0, "0", "none"),
)


DTYPE_EPSILONS = (
    (float(np.finfo(np.float16).eps), "float16_eps", "eps=None read off a float16 input's type"),
    (2.0**-7, "bfloat16_eps", "eps=None read off a bfloat16 input's type"),
)


def _near(a: float, b: float) -> bool:
    return abs(a - b) <= 0.05 * max(a, b)


def _epsilons(attrs) -> tuple:
    """The epsilons to try: with ``eps_from_dtype``, a reduced type's machine epsilon in place of a value near it."""
    if not attrs.get("eps_from_dtype"):
        return EPSILONS
    kept = tuple(e for e in EPSILONS if not any(_near(e[0], d) for d, _, _ in DTYPE_EPSILONS))
    return kept + DTYPE_EPSILONS


def _gamma(weights, attrs, offset=None):
    gamma = np.asarray(weights.get("gamma", 0.0 if attrs.get("offset", 0) else 1.0), np.float64)
    return gamma + float(attrs.get("offset", 0) if offset is None else offset)


def _square(x, by_variance: bool, dtype=np.float64):
    """The mean square of ``x`` over the last axis, or its variance."""
    if by_variance:
        x = x - x.mean(axis=-1, keepdims=True, dtype=dtype).astype(dtype)
    return np.mean(x * x, axis=-1, keepdims=True, dtype=dtype).astype(dtype)


def forward(inputs, weights, attrs, eps_inside=True, offset=None, by_variance=None, scale=True, dtype=np.float64):
    x = np.asarray(inputs[0], np.float64).astype(dtype)
    eps = dtype(attrs.get("eps", 1e-6))
    square = _square(x, attrs.get("by_variance", False) if by_variance is None else by_variance, dtype)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        y = x / (np.sqrt(square + eps) if eps_inside else np.sqrt(square) + eps)
        y = y.astype(dtype)
        if scale:
            y = (y * _gamma(weights, attrs, offset).astype(dtype)).astype(dtype)
    return y.astype(np.float64)


def _form(**options):
    return lambda inputs, weights, attrs, observed: forward(inputs, weights, attrs, **options)


def _offset(inputs, weights, attrs, observed):
    return forward(inputs, weights, attrs, offset=0 if attrs.get("offset", 0) else 1)


def _by_variance(value: bool):
    def compute(inputs, weights, attrs, observed):
        return forward(inputs, weights, attrs, by_variance=value)

    return compute


def _no_scale(inputs, weights, attrs, observed):
    if np.all(_gamma(weights, attrs) == 1.0):
        raise NotApplicable("the scale is 1: dropping it changes nothing")
    return forward(inputs, weights, attrs, scale=False)


def _reduced(name: str):
    def compute(inputs, weights, attrs, observed):
        if name == "bfloat16":
            import ml_dtypes

            return forward(inputs, weights, attrs, dtype=ml_dtypes.bfloat16)
        return forward(inputs, weights, attrs, dtype=np.float16)

    return compute


def _eps_fitted(inputs, weights, attrs, observed):
    """The declared form at the epsilon that best maps the normalised input onto ``observed``: per row, the scale
    that maps ``x`` onto ``observed / gamma`` is ``sqrt(mean(x**2) + eps)`` (least squares; the median over rows)."""
    x = np.asarray(inputs[0], np.float64)
    gamma = np.broadcast_to(_gamma(weights, attrs), x.shape[-1:])
    if observed is None or np.asarray(observed).shape != x.shape or not np.all(np.isfinite(observed)):
        raise NotApplicable("no finite observed output of the input's shape to fit an epsilon to")
    scaled = np.abs(gamma) > 1e-6
    z = (np.asarray(observed, np.float64) / np.where(scaled, gamma, 1.0))[..., scaled]
    known = [value for value, _, _ in _epsilons(attrs)]
    fit = (x[..., scaled], z, _square(x, attrs.get("by_variance", False))[..., 0], "zero")
    return fitted_epsilon("RMSNorm", forward, inputs, weights, attrs, fit, attrs.get("eps", 1e-6), known)


def variants(attrs):
    declared = attrs.get("eps", 1e-6)
    offset = attrs.get("offset", 0)
    by_variance = attrs.get("by_variance", False)
    return [
        *epsilon_variants("RMSNorm", forward, declared, _epsilons(attrs)),
        Variant("eps_fitted", "another RMSNorm epsilon, fitted to the observed output", _eps_fitted),
        Variant(
            "eps_outside_sqrt", "epsilon added to the root mean square, not the mean square", _form(eps_inside=False)
        ),
        Variant(
            "weight_offset",
            "the scale applied as gamma, without Gemma's 1 + gamma offset"
            if offset
            else "the scale applied as 1 + gamma (Gemma's offset), not gamma",
            _offset,
        ),
        Variant(
            "by_mean_square" if by_variance else "by_variance",
            "x divided by its root mean square (an RMSNorm), not its standard deviation"
            if by_variance
            else "x divided by its standard deviation (Keras' LayerNormalization rms_scaling), not its root mean square",
            _by_variance(not by_variance),
        ),
        Variant("no_scale", "the scale (gamma) not applied", _no_scale),
        Variant("no_upcast_float16", "computed in float16 throughout (no float32 upcast)", _reduced("float16")),
        Variant("no_upcast_bfloat16", "computed in bfloat16 throughout (no float32 upcast)", _reduced("bfloat16")),
    ]
