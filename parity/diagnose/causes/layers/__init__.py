"""NumPy re-implementations of the layer kinds a ``parity.model.spec.Layer`` can declare.

Each module (one per kind, named like the kind) is a small specification:

* ``KIND``: the kind name;
* ``forward(inputs, weights, attrs)``: the declared form, in float64, canonical layout (NCHW
  images, OIHW conv kernels, ``(in, out)`` dense kernels, ``(batch, tokens, features)`` tokens);
* ``variants(attrs)``: the known alternative forms (porting and conversion bugs), excluding
  the declared one, each a ``Variant``.

``weights`` are the layer's own weights keyed by the suffix after its prefix
(``logits/kernel`` arrives as ``kernel``). A variant's ``compute`` also receives the observed
activation, so stochastic variants (dropout) can align with its mask; the others ignore it. A
variant that cannot apply to the inputs at hand (or would equal the declared form there)
raises ``NotApplicable``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from parity.model.spec import LAYER_KINDS


@dataclass(frozen=True)
class Variant:
    """One known alternative form of a layer: ``compute(inputs, weights, attrs, observed) -> array``."""

    name: str
    description: str
    compute: Callable


@dataclass(frozen=True)
class Fitted:
    """What a variant that fits a parameter to the observed activation returns: its value, and its description with
    the fitted value in it (``LayerNorm epsilon 0.1, fitted to the observed output``)."""

    value: object
    description: str


class NotApplicable(ValueError):
    """A variant that cannot apply to these inputs, or that would equal the declared form on them."""


def with_attrs(forward: Callable, **changes) -> Callable:
    """A variant ``compute``: the declared ``forward`` with some attributes changed."""

    def compute(inputs, weights, attrs, observed):
        return forward(inputs, weights, {**attrs, **changes})

    return compute


def epsilon_variants(layer: str, forward: Callable, declared: float, epsilons) -> list[Variant]:
    """One variant per other epsilon in ``epsilons`` (``(value, label, where it is the default)``);
    values within 1 % of the declared one cannot be told apart and are left out."""
    return [
        Variant(
            f"eps={label}",
            f"{layer} epsilon {label}{f' ({why})' if why else ''} instead of {declared:g}",
            with_attrs(forward, eps=eps),
        )
        for eps, label, why in epsilons
        if abs(eps - declared) > 0.01 * max(eps, declared)
    ]


def fitted_epsilon(layer: str, forward: Callable, inputs, weights, attrs, fit: tuple, declared: float, known) -> Fitted:
    """The declared ``forward`` at the epsilon that best maps the normalised input onto the observed output.
    ``fit`` is ``(x, z, square, empty)``: the input as the layer normalises it (centred for a LayerNorm) and the
    observed output with its affine map undone, both over the features of a non-zero scale, each row's variance or
    mean square, and what an all-zero ``z`` says of the output. Per row, the scale that maps ``x`` onto ``z`` is
    ``sqrt(square + eps)`` (least squares); the median over rows. ``NotApplicable`` where every row of ``z`` is zero
    or the fit is within 5 % of ``declared`` or of one of the ``known`` epsilons (already tested)."""
    x, z, square, empty = fit
    power = np.sum(z * z, axis=-1)
    rows = power > 0
    if not np.any(rows):
        raise NotApplicable(f"the observed output is {empty} over every row")
    spread = np.sum(x * z, axis=-1)[rows] / power[rows]
    eps = float(np.median(spread**2 - square[rows]))
    if not np.isfinite(eps) or eps <= 0 or any(abs(eps - k) <= 0.05 * max(eps, k) for k in [*known, declared]):
        raise NotApplicable(f"the fitted epsilon ({eps:.3g}) is no other value than those tested")
    eps = float(f"{eps:.2g}")
    return Fitted(
        forward(inputs, weights, {**attrs, "eps": eps}),
        f"{layer} epsilon {eps:g} (fitted to the observed output) instead of {declared:g}",
    )


KINDS = {name: importlib.import_module(f"{__name__}.{name}") for name in LAYER_KINDS}
assert all(module.KIND == name for name, module in KINDS.items())


def get(kind: str):
    """The module implementing ``kind``; ``KeyError`` for an unknown kind."""
    try:
        return KINDS[kind]
    except KeyError:
        raise KeyError(f"unknown layer kind {kind!r}; known: {', '.join(KINDS)}") from None
