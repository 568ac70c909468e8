"""The PyTorch decoder: prefill and greedy decode with the transformers ``DynamicCache``.

In float64 it is the reference the golden is made of; in float32 it is the ``torch`` path. Every method follows the
Decoder contract of this package: ``steps`` (prefill then one decode step per new token, teacher-forced or
free-running), ``full`` (every position of one pass without a cache) and ``chunked`` (a prompt fed in two chunks
through the cache).
"""

from __future__ import annotations

import numpy as np

from parity.generation.prompts import positions


class TorchDecoder:
    """Drives ``model`` (a transformers causal LM in eval mode) step by step."""

    def __init__(self, model):
        self.model = model

    def _run(self, ids: np.ndarray, mask: np.ndarray, cache):
        import torch

        with torch.no_grad():
            out = self.model(
                input_ids=torch.from_numpy(np.ascontiguousarray(ids, np.int64)),
                attention_mask=torch.from_numpy(np.ascontiguousarray(mask, np.int64)),
                position_ids=torch.from_numpy(positions(mask, ids.shape[1])),
                past_key_values=cache,
                use_cache=cache is not None,
                return_dict=True,
            )
        return out.logits.to(torch.float64).numpy(), out.past_key_values

    def _cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def steps(self, ids, mask, new_tokens: int, forced=None):
        """Per step the last position's logits (steps, B, V) and the greedy tokens (steps, B); ``forced`` (steps, B)
        is fed after each step instead of the greedy token."""
        cache = self._cache()
        cur, m = np.asarray(ids, np.int64), np.asarray(mask, np.int64)
        logits, tokens = [], []
        for step in range(new_tokens):
            out, cache = self._run(cur, m, cache)
            last = out[:, -1]
            logits.append(last)
            tokens.append(last.argmax(-1))
            fed = tokens[-1] if forced is None else np.asarray(forced[step], np.int64)
            cur = fed[:, None].astype(np.int64)
            m = np.concatenate([m, np.ones((m.shape[0], 1), np.int64)], 1)
        return np.stack(logits), np.stack(tokens).astype(np.int64)

    def full(self, ids, mask):
        """Every position's logits (B, T, V) of one pass without a cache."""
        out, _ = self._run(np.asarray(ids, np.int64), np.asarray(mask, np.int64), None)
        return out

    def chunked(self, ids, mask, split: int):
        """The last position's logits (B, V) of the prompt fed as columns ``[:split]`` then ``[split:]``."""
        ids, mask = np.asarray(ids, np.int64), np.asarray(mask, np.int64)
        cache = self._cache()
        _, cache = self._run(ids[:, :split], mask[:, :split], cache)
        out, _ = self._run(ids[:, split:], mask, cache)
        return out[:, -1]
