"""``torch/export``: the model exported with ``torch.export`` as deployed to ExecuTorch, a static key/value cache.

The program is transformers' ``TorchExportableModuleWithStaticCache`` (``transformers.integrations.executorch``):
batch 1, ``forward(input_ids (1, T), cache_position (T,)) -> logits (1, T, V)``, the cache a set of fixed-size buffers
of ``max_cache_len`` positions that the program updates in place, and no attention mask (causal over the cache, up
to the call's positions). ``T`` is dynamic between 1 and ``max_cache_len``. It is saved with ``torch.export.save``
and loaded with ``torch.export.load`` (no pickle), then run eagerly (``ExportedProgram.module()``).

A left-padded batch runs one row at a time without its pads, as a batch-1 runner does, so the check "batch 1 = the
same prompt in a left-padded batch" does not apply (``NOT_APPLICABLE``). "With cache = without" does: ``full`` is
one call from position 0, which reads nothing a previous call wrote; a chunked prefill is two calls, the second
reading the cache the first wrote.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np

from parity.platform.errors import Unavailable, UsageError, one_line

PT2_FILE = "model.pt2"
CACHE_LIMIT = 1024  # positions of the static cache: the model's own limit where smaller
NOT_APPLICABLE = {
    "batch1_vs_padded": "the static-cache program takes batch 1 and no mask: a padded batch runs one row at a time"
}


def cache_length(model) -> int:
    """The static cache's positions: the model's ``max_position_embeddings``, at most ``CACHE_LIMIT``."""
    from parity.generation.model import text_config

    return int(min(getattr(text_config(model), "max_position_embeddings", None) or CACHE_LIMIT, CACHE_LIMIT))


def exported(model, max_cache_len: int):
    """The static-cache wrapper of ``model`` exported (strict, as ``convert_and_export_with_cache`` does: ExecuTorch
    cannot lower a non-strict export of it) with the sequence axis dynamic in ``[1, max_cache_len]``."""
    import torch
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    model.generation_config.use_cache = True
    model.generation_config.cache_implementation = "static"
    wrapper = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=max_cache_len)
    seq = torch.export.Dim("seq", min=1, max=max_cache_len)
    example = {"input_ids": torch.tensor([[3, 4, 5, 6]], dtype=torch.long), "cache_position": torch.arange(4)}
    with torch.no_grad():
        return torch.export.export(
            wrapper,
            args=(),
            kwargs=example,
            dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}},
            strict=True,
        )


def export_program(source: dict):
    """``(program, meta)`` of the float32 model of ``source``; raises ``Unavailable`` with torch.export's reason
    where the wrapper cannot be exported."""
    from parity.generation.model import load

    model = load(source, "float32")
    max_len = cache_length(model)
    started = time.perf_counter()
    try:
        program = exported(model, max_len)
    except Exception as error:  # noqa: BLE001 - torch.export's own message is the reason the path cannot run
        raise Unavailable(
            one_line(f"torch.export of the static-cache wrapper failed: {type(error).__name__}: {error}", 300)
        ) from None
    meta = {"max_cache_len": max_len, "batch": 1, "export_s": round(time.perf_counter() - started, 3)}
    return program, meta


def export(source: dict, out_dir: str) -> dict:
    """The program written to ``out_dir/model.pt2`` with ``torch.export.save``; its meta, or ``{"unavailable":
    reason}`` where torch.export does not take the model."""
    import torch

    from parity.platform.safefs import write_bytes_atomic

    try:
        program, meta = export_program(source)
    except Unavailable as error:
        return {"unavailable": str(error)}
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    write_bytes_atomic(Path(out_dir) / PT2_FILE, buffer.getvalue())
    return {**meta, "format": "pt2", "file": PT2_FILE}


class StaticCacheDecoder:
    """The Decoder contract over a batch-1 static-cache program: subclasses implement ``call(ids, start)``, the
    logits (T, V) of the tokens ``ids`` (T,) at positions ``start .. start + T - 1``, reading the cache below
    ``start`` and writing the call's own positions."""

    not_applicable = NOT_APPLICABLE

    def __init__(self, max_cache_len: int):
        self.max_cache_len = int(max_cache_len)

    def call(self, ids: np.ndarray, start: int) -> np.ndarray:
        raise NotImplementedError

    def _fits(self, needed: int) -> None:
        if needed > self.max_cache_len:
            raise UsageError(
                f"the static cache holds {self.max_cache_len} positions; this prompt and its new tokens need {needed}"
            )

    @staticmethod
    def _rows(ids, mask):
        ids, mask = np.asarray(ids, np.int64), np.asarray(mask, np.int64)
        return [(ids[r][mask[r] == 1], mask[r] == 1) for r in range(ids.shape[0])]

    def steps(self, ids, mask, new_tokens: int, forced=None):
        """Per row: a prefill of its real tokens, then one decode step per new token; stacked (steps, B, V) and
        (steps, B)."""
        logits, tokens = [], []
        for row, (real, _) in enumerate(self._rows(ids, mask)):
            self._fits(len(real) + new_tokens - 1)
            out, picked = [], []
            last = self.call(real, 0)[-1]
            for step in range(new_tokens):
                out.append(last)
                picked.append(int(last.argmax()))
                if step + 1 < new_tokens:
                    fed = picked[-1] if forced is None else int(np.asarray(forced)[step, row])
                    last = self.call(np.array([fed], np.int64), len(real) + step)[-1]
            logits.append(np.stack(out))
            tokens.append(picked)
        return np.stack(logits, 1), np.asarray(tokens, np.int64).T

    def full(self, ids, mask):
        """Every position's logits (B, T, V) of one call per row from position 0; a pad's position is NaN (the
        program never sees pads)."""
        rows = []
        for real, keep in self._rows(ids, mask):
            self._fits(len(real))
            out = self.call(real, 0)
            row = np.full((keep.size, out.shape[-1]), np.nan)
            row[keep] = out
            rows.append(row)
        return np.stack(rows)

    def chunked(self, ids, mask, split: int):
        """Per row, its real tokens of columns ``[:split]`` at positions from 0, then those of ``[split:]`` after
        them through the cache; the last position's logits (B, V)."""
        ids, mask = np.asarray(ids, np.int64), np.asarray(mask, np.int64)
        rows = []
        for r in range(ids.shape[0]):
            first = ids[r, :split][mask[r, :split] == 1]
            second = ids[r, split:][mask[r, split:] == 1]
            self._fits(len(first) + len(second))
            if len(first):
                self.call(first, 0)
            rows.append(self.call(second, len(first))[-1])
        return np.stack(rows)


class ExportDecoder(StaticCacheDecoder):
    """The saved program, loaded with ``torch.export.load`` and run eagerly with ``threads`` intra-op threads."""

    def __init__(self, pt2_file, meta: dict, threads: int = 1):
        import torch

        super().__init__(meta["max_cache_len"])
        torch.set_num_threads(max(1, int(threads)))
        self.torch = torch
        self.module = torch.export.load(str(pt2_file)).module()

    def call(self, ids, start):
        torch = self.torch
        ids = np.asarray(ids, np.int64)
        with torch.no_grad():
            out = self.module(
                input_ids=torch.from_numpy(ids[None].copy()),
                cache_position=torch.arange(start, start + ids.size, dtype=torch.long),
            )
        return out[0].to(torch.float64).numpy()


def open_decoder(artifact_dir, meta: dict, threads: int):
    """The ``torch/export`` decoder (``parity.generation.paths``): the program of ``export`` in ``artifact_dir``."""
    if not artifact_dir or "max_cache_len" not in meta:
        raise UsageError("the torch/export path needs its exported program's folder and meta")
    return ExportDecoder(Path(artifact_dir) / meta.get("file", PT2_FILE), meta, threads)
