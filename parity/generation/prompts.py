"""Prompt sets for generation checks: seeded random token ids, left-padded, and the positions they take.

A prompt set is ``{"input_ids": int64 (B, T), "attention_mask": int64 (B, T)}``, LEFT-padded with id 0 and mask 0,
as decoder language models are batched for generation. Positions follow transformers: ``cumsum(mask) - 1``, pads
set to 1.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

PAD_ID = 0
FIRST_ID = 3  # ids 0, 1, 2 are pad, bos and eos in most vocabularies: random prompts avoid them


def prompt_set(vocab_size: int, lengths=(7, 4), seed: int = 0) -> dict[str, np.ndarray]:
    """One row per length of random ids in ``[FIRST_ID, vocab_size)``, every row distinct, left-padded to the
    longest."""
    lengths = [int(n) for n in lengths]
    if not lengths or min(lengths) < 1:
        raise ValueError(f"prompt lengths must be positive integers, got {lengths}")
    if vocab_size - FIRST_ID < 2:
        raise ValueError(f"a vocabulary of {vocab_size} ids leaves no room for random prompts")
    rng = np.random.default_rng(seed)
    width = max(lengths)
    ids = np.full((len(lengths), width), PAD_ID, np.int64)
    mask = np.zeros((len(lengths), width), np.int64)
    seen: set[tuple] = set()
    for row, n in enumerate(lengths):
        while True:
            tokens = rng.integers(FIRST_ID, vocab_size, n)
            if tuple(tokens) not in seen:
                break
        seen.add(tuple(tokens))
        ids[row, width - n :] = tokens
        mask[row, width - n :] = 1
    return {"input_ids": ids, "attention_mask": mask}


def read_prompt_set(path: str, vocab_size: int) -> dict[str, np.ndarray]:
    """A user's prompts from a ``.npz`` (``input_ids`` and ``attention_mask``, never unpickled), checked: integer
    ``(prompts, length)`` arrays of one shape, a 0/1 mask that is 0 then 1 on each row (left-padded), every row with a
    token, ids inside the vocabulary. A ``ValueError`` naming the problem otherwise."""
    from parity.platform.safefs import read_npz

    arrays = read_npz(Path(path), ValueError, "prompts file")
    missing = {"input_ids", "attention_mask"} - set(arrays)
    if missing:
        raise ValueError(f"{path}: no {', '.join(sorted(missing))} (a prompts file holds input_ids and attention_mask)")
    ids, mask = arrays["input_ids"], arrays["attention_mask"]
    if ids.ndim != 2 or ids.shape != mask.shape or ids.dtype.kind not in "iu" or mask.dtype.kind not in "iub":
        raise ValueError(f"{path}: input_ids and attention_mask must be integer arrays of one (prompts, length) shape")
    mask = mask.astype(np.int64)
    if not np.isin(mask, (0, 1)).all() or (np.diff(mask, axis=1) < 0).any() or not mask[:, -1].all():
        raise ValueError(
            f"{path}: attention_mask must be 0 then 1 on each row, every row ending on a token (left padding)"
        )
    real = ids[mask == 1]
    if real.min() < 0 or real.max() >= vocab_size:
        raise ValueError(f"{path}: token ids must lie in [0, {vocab_size}), the model's vocabulary")
    return {"input_ids": np.where(mask == 1, ids, PAD_ID).astype(np.int64), "attention_mask": mask}


def positions(mask: np.ndarray, new_len: int) -> np.ndarray:
    """The position ids of the last ``new_len`` columns of ``mask`` (B, T): ``cumsum - 1``, pads at 1."""
    pos = np.cumsum(mask, axis=1) - 1
    pos = np.where(mask == 0, 1, pos)
    return pos[:, pos.shape[1] - new_len :].astype(np.int64)


def batches(prompts: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """``batch1``: row 0 alone, without its padding; ``padded``: every row as given."""
    ids, mask = prompts["input_ids"], prompts["attention_mask"]
    keep = mask[0] == 1
    return {
        "batch1": {"input_ids": ids[:1, keep].copy(), "attention_mask": mask[:1, keep].copy()},
        "padded": {"input_ids": ids.copy(), "attention_mask": mask.copy()},
    }
