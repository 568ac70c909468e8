"""layer_norm: normalisation over the last axis with a per-feature affine map.

``y = (x - mean) / sqrt(var + eps) * gamma + beta``, ``mean`` and biased ``var`` over the last
axis. Attribute ``eps`` (default 1e-5). Weights ``gamma``, ``beta`` (optional: 1 and 0).

Variants:

* ``eps=<value>``: another epsilon among 1e-3 (Keras ``LayerNormalization`` default), 1e-5
  (PyTorch ``nn.LayerNorm`` default), 1e-6 (JAX/Flax ``LayerNorm`` and many ViTs), 1e-12
  (Hugging Face BERT), 0; values within 1% of the declared one are left out;
* ``unbiased_variance``: the N-1 variance (``torch.var``/``Tensor.std`` default ``unbiased``);
* ``eps_outside_sqrt``: ``(x - mean) / (std + eps)`` (hand-written LayerNorms, e.g. the
  Annotated Transformer);
* ``eps_fitted``: an epsilon none of those, fitted to the observed output (per row, the scale that maps the
  normalised input onto it is ``sqrt(var + eps)``; the median over rows), reported with its value;
* ``no_affine``: ``gamma``/``beta`` not applied (``elementwise_affine=False``, or weights
  not exported);
* ``no_bias``: ``gamma`` applied, ``beta`` not (a bias lost in the export, or a ``LayerNorm(bias=False)`` read
  as one with a bias).
"""

from __future__ import annotations

import numpy as np

from parity.diagnose.causes.layers import NotApplicable, Variant, epsilon_variants, fitted_epsilon

KIND = "layer_norm"
EPSILONS = (
    (1e-3, "1e-3", "Keras default"),
    (1e-5, "1e-5", "PyTorch default"),
    (1e-6, "1e-6", "Flax default"),
    (1e-12, "1e-12", "HF BERT"),
    (0.0, "0", "none"),
)


def forward(inputs, weights, attrs, ddof=0, eps_inside=True, affine=True):
    x = np.asarray(inputs[0], np.float64)
    eps = attrs.get("eps", 1e-5)
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, ddof=ddof, keepdims=True)
    y = (x - mean) / (np.sqrt(var + eps) if eps_inside else np.sqrt(var) + eps)
    if not affine:
        return y
    return y * np.asarray(weights.get("gamma", 1.0), np.float64) + np.asarray(weights.get("beta", 0.0), np.float64)


def _form(**options):
    return lambda inputs, weights, attrs, observed: forward(inputs, weights, attrs, **options)


def _no_affine(inputs, weights, attrs, observed):
    if np.all(weights.get("gamma", 1.0) == 1.0) and np.all(weights.get("beta", 0.0) == 0.0):
        raise NotApplicable("gamma is 1 and beta 0: the affine map is the identity")
    return forward(inputs, weights, attrs, affine=False)


def _no_bias(inputs, weights, attrs, observed):
    if np.all(weights.get("beta", 0.0) == 0.0):
        raise NotApplicable("beta is 0: dropping it changes nothing")
    return forward(inputs, {k: v for k, v in weights.items() if k != "beta"}, attrs)


def _eps_fitted(inputs, weights, attrs, observed):
    """The declared form at the epsilon that best maps the normalised input onto ``observed``."""
    x = np.asarray(inputs[0], np.float64)
    gamma = np.broadcast_to(np.asarray(weights.get("gamma", 1.0), np.float64), x.shape[-1:])
    beta = np.asarray(weights.get("beta", 0.0), np.float64)
    if observed is None or np.asarray(observed).shape != x.shape or not np.all(np.isfinite(observed)):
        raise NotApplicable("no finite observed output of the input's shape to fit an epsilon to")
    scaled = np.abs(gamma) > 1e-6
    z = ((np.asarray(observed, np.float64) - beta) / np.where(scaled, gamma, 1.0))[..., scaled]
    centred = (x - x.mean(axis=-1, keepdims=True))[..., scaled]
    known = [value for value, _, _ in EPSILONS]
    fit = (centred, z, x.var(axis=-1), "constant")
    return fitted_epsilon("LayerNorm", forward, inputs, weights, attrs, fit, attrs.get("eps", 1e-5), known)


def variants(attrs):
    declared = attrs.get("eps", 1e-5)
    found = epsilon_variants("LayerNorm", forward, declared, EPSILONS)
    return found + [
        Variant("unbiased_variance", "unbiased (N-1) variance, as torch.var computes by default", _form(ddof=1)),
        Variant(
            "eps_outside_sqrt", "epsilon added to the standard deviation, not the variance", _form(eps_inside=False)
        ),
        Variant("eps_fitted", "another LayerNorm epsilon, fitted to the observed output", _eps_fitted),
        Variant("no_affine", "gamma and beta not applied", _no_affine),
        Variant("no_bias", "beta (the bias) not applied, gamma applied", _no_bias),
    ]
