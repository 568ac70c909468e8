"""gated_mlp: a gated feed-forward block, ``down(act(gate(x)) * up(x))`` (Llama's, Mistral's, Qwen's, Gemma's MLP).

Weights: ``gate/kernel``, ``up/kernel`` ``(in, hidden)``, ``down/kernel`` ``(hidden, out)``, each with an optional
``bias``. Attribute ``act``: a form of the ``activation`` kind (default ``silu``; Gemma's ``gelu_tanh``).

Variants:

* ``halves_swapped``: ``down(act(up(x)) * gate(x))``, the other projection gating (a fused ``gate_up`` weight split
  in the other order, or the two projections' names swapped in a port);
* ``act=<form>``: another activation on the gate among ``silu``, ``gelu_erf``, ``gelu_tanh``, ``relu``
  (``hidden_act`` read as another: Gemma's ``gelu_pytorch_tanh`` exported as exact GELU, or the reverse);
* ``ungated``: ``down(act(gate(x)))``, the up projection's product lost.
"""

from __future__ import annotations

import numpy as np

from parity.diagnose.causes.layers import Variant, activation

KIND = "gated_mlp"
ACTS = ("silu", "gelu_erf", "gelu_tanh", "relu")


def _project(x, weights, name):
    y = x @ np.asarray(weights[f"{name}/kernel"], np.float64)
    bias = weights.get(f"{name}/bias")
    return y if bias is None else y + np.asarray(bias, np.float64)


def _act(form: str):
    """The ``activation`` kind's form ``form`` with its defaults (leaky_relu's and hard_sigmoid's alpha)."""
    if form not in activation.FORMS:
        raise ValueError(f"unknown gated_mlp act {form!r}; known: {', '.join(activation.FORMS)}")
    return lambda x: activation.forward([x], {}, {"form": form})


def forward(inputs, weights, attrs, swapped=False, gated=True):
    x = np.asarray(inputs[0], np.float64)
    act = _act(attrs.get("act", "silu"))
    gate, up = _project(x, weights, "gate"), _project(x, weights, "up")
    if swapped:
        gate, up = up, gate
    return _project(act(gate) * up if gated else act(gate), weights, "down")


def variants(attrs):
    declared = attrs.get("act", "silu")
    return [
        Variant(
            "halves_swapped",
            "the up projection gates and the gate projection is multiplied (act(up(x)) * gate(x))",
            lambda inputs, weights, attrs_, observed: forward(inputs, weights, attrs_, swapped=True),
        ),
        *[
            Variant(
                f"act={form}",
                f"the gate's activation {form} instead of {declared}",
                lambda inputs, weights, attrs_, observed, form=form: forward(inputs, weights, {**attrs_, "act": form}),
            )
            for form in ACTS
            if form != declared
        ],
        Variant(
            "ungated",
            "the up projection's product lost (down(act(gate(x))))",
            lambda inputs, weights, attrs_, observed: forward(inputs, weights, attrs_, gated=False),
        ),
    ]
