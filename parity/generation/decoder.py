"""The Decoder contract's loops, shared by every runtime that runs one call per step on a key/value cache.

A runtime supplies ``start(batch)`` (an empty cache, or its own states reset) and ``call_raw(ids, mask, cache)`` (one
call: the logits of every position fed, ``(B, S, V)`` in the runtime's own dtype, and the cache extended by them);
``cache_shape`` is ``(layers, key/value heads, head size)``. ``steps``, ``full`` and ``chunked`` follow, in float64:

- ``steps(ids, mask, new_tokens, forced=None)``: step 0 the prefill's last position, then one decode step per token
  through the cache; ``forced`` (steps, B) is fed after each step instead of the greedy token (teacher forcing);
- ``full(ids, mask)``: every position's logits of one pass from an empty cache;
- ``chunked(ids, mask, split)``: the prompt's last logits when it is fed as columns ``[:split]``, then ``[split:]``.

Positions follow transformers (``prompts.positions``); the timing drives ``start`` and ``call_raw`` alone
(``parity.generation.timing``), so what is timed is what is verified.
"""

from __future__ import annotations

import numpy as np


class CachedDecoder:
    cache_shape: tuple[int, int, int]

    def start(self, batch: int):
        """An empty cache for ``batch`` rows (what ``call_raw`` takes first)."""
        raise NotImplementedError

    def call_raw(self, ids: np.ndarray, mask: np.ndarray, cache) -> tuple:
        """One call: ``(logits (B, S, V), cache)``; ``ids`` and ``mask`` are int64 and contiguous."""
        raise NotImplementedError

    def call(self, ids, mask, cache) -> tuple[np.ndarray, object]:
        logits, cache = self.call_raw(np.ascontiguousarray(ids, np.int64), np.ascontiguousarray(mask, np.int64), cache)
        return np.array(logits, np.float64), cache

    def steps(self, ids, mask, new_tokens: int, forced=None) -> tuple[np.ndarray, np.ndarray]:
        cur, m = np.asarray(ids, np.int64), np.asarray(mask, np.int64)
        cache = self.start(cur.shape[0])
        logits, tokens = [], []
        for step in range(new_tokens):
            out, cache = self.call(cur, m, cache)
            last = out[:, -1]
            logits.append(last)
            tokens.append(last.argmax(-1))
            fed = tokens[-1] if forced is None else np.asarray(forced[step], np.int64)
            cur = fed[:, None].astype(np.int64)
            m = append_one(m)
        return np.stack(logits), np.stack(tokens).astype(np.int64)

    def full(self, ids, mask) -> np.ndarray:
        ids = np.asarray(ids, np.int64)
        return self.call(ids, mask, self.start(ids.shape[0]))[0]

    def chunked(self, ids, mask, split: int) -> np.ndarray:
        ids, mask = np.asarray(ids, np.int64), np.asarray(mask, np.int64)
        if not 0 < split < ids.shape[1]:
            raise ValueError(f"split {split} must lie inside the prompt's {ids.shape[1]} columns")
        _, cache = self.call(ids[:, :split], mask[:, :split], self.start(ids.shape[0]))
        return self.call(ids[:, split:], mask, cache)[0][:, -1]


def append_one(mask: np.ndarray) -> np.ndarray:
    """``mask`` with one more attended column (the token a decode step feeds)."""
    return np.concatenate([mask, np.ones((mask.shape[0], 1), np.int64)], 1)
