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
* ``no_affine``: ``gamma``/``beta`` not applied (``elementwise_affine=False``, or weights
  not exported).
"""

from __future__ import annotations

import numpy as np

from parity.diagnose.layers import NotApplicable, Variant, epsilon_variants

KIND = "layer_norm"
EPSILONS = ((1e-3, "1e-3", "Keras default"), (1e-5, "1e-5", "PyTorch default"), (1e-6, "1e-6", "Flax default"),
            (1e-12, "1e-12", "HF BERT"), (0.0, "0", "none"))


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


def variants(attrs):
    declared = attrs.get("eps", 1e-5)
    found = epsilon_variants("LayerNorm", forward, declared, EPSILONS)
    return found + [
        Variant("unbiased_variance", "unbiased (N-1) variance, as torch.var computes by default",
                _form(ddof=1)),
        Variant("eps_outside_sqrt", "epsilon added to the standard deviation, not the variance",
                _form(eps_inside=False)),
        Variant("no_affine", "gamma and beta not applied", _no_affine),
    ]
