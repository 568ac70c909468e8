"""rotary: the cosine table of a rotary position embedding (RoPE), as a Hugging Face ``*RotaryEmbedding`` module
computes it from the token positions.

Inputs: ``x`` (read for nothing but its presence: the module's first argument) and ``position_ids``
``(batch, tokens)``; output ``cos(positions * inv_freq)`` ``(batch, tokens, dim)`` with
``inv_freq[i] = base ** (-2i / dim)``, the frequencies laid out half-split (``cat(freqs, freqs)``, as
``rotate_half`` reads them) or interleaved (``repeat_interleave(freqs, 2)``, GPT-J's and Meta's original layout).
Attributes ``base`` (default 10000), ``dim`` (the head dimension), ``rotation`` (``"half"`` or ``"interleaved"``: the
layout of the table), ``inv_freq`` (the module's own float32 frequencies, as typing reads them off its buffer).

transformers computes the angles in float32 whatever the model's dtype (``position_ids.float() * inv_freq.float()``,
a float64 golden too): rounded to float32, an angle of 2048 radians is off by up to 1.2e-4, far above a float64
tolerance, so the declared form does the same: ``float32(positions) * float32(inv_freq)`` rounded to float32, then
the cosine in float64 (transformers takes it in float32, within float32's rounding, 6e-8, of this). Without
``inv_freq`` the frequencies are ``base ** (-float32(2i / dim))`` in float64 rounded to float32, the correctly rounded
value: torch's float32 ``pow`` may be one unit in the last place off it, which at thousands of positions is above
tolerance, hence typing stores the module's own.
The module's second output (the sine table) carries the same frequencies: the cosine is what the diagnosis compares.

Variants:

* ``rotation_interleaved`` / ``rotation_half``: the table laid out for the other pairing of the rotation (a port or
  converter that builds the table for interleaved pairs, Meta's and GPT-J's checkpoints, where the model rotates
  halves, or the reverse). This is the table's layout alone: the rotation applied downstream is another layer;
* ``position_offset+1`` / ``position_offset-1``: the positions shifted by one (counted from 1, or a cache position
  off by one);
* ``base=<value>``: another base among 10000 (Llama 2), 500000 (Llama 3), 1000000 (Qwen2), its frequencies computed
  as without ``inv_freq``, each moved by a unit in the last place where that is nearer the observed table (the path's
  own float32 ``pow``); values within 1 % of the declared one are left out.
"""

from __future__ import annotations

import numpy as np

from parity.diagnose.causes.layers import NotApplicable, Variant

KIND = "rotary"
BASES = ((10000.0, "10000", "Llama 2, Mistral"), (500000.0, "500000", "Llama 3"), (1000000.0, "1e6", "Qwen2"))
LAYOUTS = {"half": "cat(freqs, freqs)", "interleaved": "repeat_interleave(freqs, 2)"}
ROTATIONS = tuple(LAYOUTS)


def inv_freq(base: float, dim: int) -> np.ndarray:
    """transformers' default frequencies ``1 / base ** (arange(0, dim, 2) / dim)``, exponents in float32, the power
    correctly rounded to float32."""
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    return (1.0 / np.float64(base) ** exponents.astype(np.float64)).astype(np.float32)


def forward(inputs, weights, attrs, offset: int = 0):
    if len(inputs) < 2:
        raise ValueError("rotary reads the token positions as its second input")
    dim = int(attrs["dim"])
    given = attrs.get("inv_freq")
    freq = np.asarray(given, np.float32) if given is not None else inv_freq(float(attrs.get("base", 10000.0)), dim)
    if freq.shape != (dim // 2,):
        raise ValueError(f"rotary inv_freq has {freq.size} frequencies; dim {dim} takes {dim // 2}")
    positions = np.asarray(inputs[1], np.float64) + offset
    freqs = (positions.astype(np.float32)[..., None] * freq).astype(np.float64)  # a float32 product, as transformers
    rotation = attrs.get("rotation", "half")
    if rotation not in LAYOUTS:
        raise ValueError(f"unknown rotary rotation {rotation!r}; known: {', '.join(ROTATIONS)}")
    if rotation == "half":
        table = np.concatenate([freqs, freqs], axis=-1)
    else:
        table = np.repeat(freqs, 2, axis=-1)
    return np.cos(table)


def _offset(offset: int):
    def compute(inputs, weights, attrs, observed):
        if offset < 0 and np.min(inputs[1]) + offset < 0:
            raise NotApplicable("the positions start at 0: none precedes them")
        return forward(inputs, weights, attrs, offset=offset)

    return compute


def _base(base: float):
    """The table with base ``base``: each frequency the correctly rounded float32 one or a unit in the last place
    either side (a float32 ``pow``'s error), whichever is nearer the observed table, column by column."""

    def compute(inputs, weights, attrs, observed):
        dim = int(attrs["dim"])
        freq = inv_freq(base, dim)
        candidates = [np.nextafter(freq, np.float32(0)), freq, np.nextafter(freq, np.float32(np.inf))]
        own = {k: v for k, v in attrs.items() if k not in ("inv_freq", "base")}
        tables = [forward(inputs, weights, {**own, "inv_freq": c}) for c in candidates]
        if observed is None or np.shape(observed) != tables[1].shape:
            return tables[1]
        observed = np.asarray(observed, np.float64)
        columns = tables[1].reshape(-1, dim).shape[0]
        errors = [np.nansum(((t - observed) ** 2).reshape(columns, dim), axis=0) for t in tables]
        half = dim // 2  # a frequency's error summed over its two columns of the table
        pairs = [e[:half] + e[half:] if attrs.get("rotation", "half") == "half" else e[0::2] + e[1::2] for e in errors]
        best = np.asarray(candidates)[np.argmin(pairs, axis=0), np.arange(half)]
        return forward(inputs, weights, {**own, "inv_freq": best})

    return compute


def variants(attrs):
    declared = float(attrs.get("base", 10000.0))
    rotation = attrs.get("rotation", "half")
    other = "interleaved" if rotation == "half" else "half"
    return [
        Variant(
            f"rotation_{other}",
            f"the rotary table laid out for the {other} rotation ({LAYOUTS[other]}) instead of the {rotation} one "
            f"({LAYOUTS[rotation]})",
            lambda inputs, weights, attrs_, observed: forward(inputs, weights, {**attrs_, "rotation": other}),
        ),
        Variant("position_offset+1", "the token positions shifted by +1", _offset(1)),
        Variant("position_offset-1", "the token positions shifted by -1", _offset(-1)),
        *[
            Variant(f"base={label}", f"rotary base {label} ({why}) instead of {declared:g}", _base(base))
            for base, label, why in BASES
            if abs(base - declared) > 0.01 * max(base, declared)
        ],
    ]
