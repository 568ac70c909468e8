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


KINDS = {name: importlib.import_module(f"{__name__}.{name}") for name in LAYER_KINDS}
assert all(module.KIND == name for name, module in KINDS.items())


def get(kind: str):
    """The module implementing ``kind``; ``KeyError`` for an unknown kind."""
    try:
        return KINDS[kind]
    except KeyError:
        raise KeyError(f"unknown layer kind {kind!r}; known: {', '.join(KINDS)}") from None
