"""The PyTorch decoder: prefill and greedy decode with the transformers ``DynamicCache``.

In float64 it is the reference the golden is made of; in float32 it is the ``torch`` path. Every method follows the
Decoder contract of this package: ``steps`` (prefill then one decode step per new token, teacher-forced or
free-running), ``full`` (every position of one pass without a cache) and ``chunked`` (a prompt fed in two chunks
through the cache).
"""

from __future__ import annotations

import numpy as np

from parity.generation.decoder import CachedDecoder
from parity.generation.prompts import positions


class TorchDecoder(CachedDecoder):
    """Drives ``model`` (a transformers causal LM in eval mode) step by step, its cache a ``DynamicCache``."""

    def __init__(self, model):
        from parity.generation.model import kv_shape

        self.model = model
        self.cache_shape = kv_shape(model)

    def start(self, batch: int):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def call_raw(self, ids: np.ndarray, mask: np.ndarray, cache):
        import torch

        with torch.no_grad():
            out = self.model(
                input_ids=torch.from_numpy(ids),
                attention_mask=torch.from_numpy(mask),
                position_ids=torch.from_numpy(positions(mask, ids.shape[1])),
                past_key_values=cache,
                use_cache=True,
                return_dict=True,
            )
        return out.logits.numpy(), out.past_key_values


def open_decoder(artifact_dir, meta: dict, threads: int = 1) -> TorchDecoder:
    """The ``torch`` path: the float32 model of ``meta["source"]`` in eager torch."""
    import torch

    from parity.generation.model import load

    torch.set_num_threads(max(1, int(threads)))
    return TorchDecoder(load(meta["source"], "float32"))
