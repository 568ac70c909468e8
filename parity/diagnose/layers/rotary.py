"""rotary: the cosine table of a rotary position embedding (RoPE), as a Hugging Face ``*RotaryEmbedding`` module
computes it from the token positions.

Inputs: ``x`` (read for nothing but its presence: the module's first argument) and ``position_ids``
``(batch, tokens)``; output ``cos(positions * inv_freq)`` ``(batch, tokens, dim)`` with
``inv_freq[i] = base ** (-2i / dim)``, the frequencies laid out half-split (``cat(freqs, freqs)``, as
``rotate_half`` reads them) or interleaved (``repeat_interleave(freqs, 2)``, GPT-J's and Meta's original layout).
Attributes ``base`` (default 10000), ``dim`` (the head dimension), ``rotation`` (``"half"`` or ``"interleaved"``: how the pairs the rotation turns are laid out).
The module's second output (the sine table) carries the same frequencies: the cosine is what the diagnosis compares.

Variants:

* ``rotation_interleaved`` / ``rotation_half``: the other layout of the frequencies (a converter or port that applies
  the rotation to interleaved pairs where the model rotates halves, or the reverse);
* ``position_offset+1`` / ``position_offset-1``: the positions shifted by one (counted from 1, or a cache position
  off by one);
* ``base=<value>``: another base among 10000 (Llama 2), 500000 (Llama 3), 1000000 (Qwen2); values within 1 % of
  the declared one are left out.
"""

from __future__ import annotations

import numpy as np

from parity.diagnose.layers import NotApplicable, Variant

KIND = "rotary"
BASES = ((10000.0, "10000", "Llama 2, Mistral"), (500000.0, "500000", "Llama 3"), (1000000.0, "1e6", "Qwen2"))
ROTATIONS = ("half", "interleaved")


def forward(inputs, weights, attrs, offset: int = 0):
    if len(inputs) < 2:
        raise ValueError("rotary reads the token positions as its second input")
    positions = np.asarray(inputs[1], np.float64) + offset
    dim = int(attrs["dim"])
    inv_freq = 1.0 / (float(attrs.get("base", 10000.0)) ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    freqs = positions[..., None] * inv_freq
    rotation = attrs.get("rotation", "half")
    if rotation == "half":
        table = np.concatenate([freqs, freqs], axis=-1)
    elif rotation == "interleaved":
        table = np.repeat(freqs, 2, axis=-1)
    else:
        raise ValueError(f"unknown rotary rotation {rotation!r}; known: {', '.join(ROTATIONS)}")
    return np.cos(table)


def _offset(offset: int):
    def compute(inputs, weights, attrs, observed):
        if offset < 0 and np.min(inputs[1]) + offset < 0:
            raise NotApplicable("the positions start at 0: none precedes them")
        return forward(inputs, weights, attrs, offset=offset)

    return compute


def variants(attrs):
    declared = float(attrs.get("base", 10000.0))
    rotation = attrs.get("rotation", "half")
    other = "interleaved" if rotation == "half" else "half"
    return [
        Variant(
            f"rotation_{other}",
            f"the rotary frequencies laid out for a {other} rotation instead of a {rotation} one",
            lambda inputs, weights, attrs_, observed: forward(inputs, weights, {**attrs_, "rotation": other}),
        ),
        Variant("position_offset+1", "the token positions shifted by +1", _offset(1)),
        Variant("position_offset-1", "the token positions shifted by -1", _offset(-1)),
        *[
            Variant(
                f"base={label}",
                f"rotary base {label} ({why}) instead of {declared:g}",
                lambda inputs, weights, attrs_, observed, base=base: forward(inputs, weights, {**attrs_, "base": base}),
            )
            for base, label, why in BASES
            if abs(base - declared) > 0.01 * max(base, declared)
        ],
    ]
