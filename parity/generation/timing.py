"""Timing of a generation path in tokens per second: time to first token and decode steps, per batch size.

A Decoder of this package (``parity.generation.paths``) computes every step's logits for the verification;
timing it as it is would time the float64 copies of those logits too. A *stepper* drives the same decoder's runtime
as it is deployed instead: ``start(ids, mask, new_tokens)`` sets a sequence up (an empty cache, GenAI's generator),
``prefill()`` runs the prompt and returns the first greedy token (B,), ``decode(tokens)`` feeds them through the cache
and returns the next ones. Each path's stepper keeps what its decoder does (the same model, graph, session or
generator, and the same cache handling):

- ``torch``, ``torch/onnx/ort``, ``torch/onnx/openvino`` (``decoder.CachedDecoder``): the decoder's own ``start``
  and ``call_raw`` (a transformers ``DynamicCache``; the ``present.*`` outputs fed back as ``past_key_values.*``,
  copied through NumPy at each step, as parity drives the loop; the stateful model's states);
- ``torch/genai``: ONNX Runtime GenAI's generator (``append_tokens``, then ``generate_next_token`` per token), its
  cache preallocated to the sequence's full length.

Every path computes the logits of every prompt position in its prefill (the exported graphs do), and picks the
greedy token with an argmax of the last position's.

A series at one batch size: a seeded random prompt of ``prompt_length`` tokens per row (unpadded, rows distinct),
one generation discarded as warm-up, then generations of ``new_tokens`` tokens repeated until the medians' 95 %
intervals are within ``rel_ci`` or ``budget_s`` is spent (``min_runs`` first, whatever the budget). Each generation
gives one time to first token (set-up, prefill and its token; ``setup_ms`` is the set-up's part: GenAI's generator
costs milliseconds to create, the other paths microseconds) and one decode step time (the median of its
``new_tokens - 1`` steps); medians and their distribution-free 95 % intervals come from ``parity.bench.stats``.
"""

from __future__ import annotations

import time

import numpy as np

from parity.bench import footprint
from parity.bench.measure import ci_within
from parity.bench.stats import median, median_ci
from parity.generation.decoder import append_one
from parity.generation.prompts import prompt_set
from parity.platform.errors import Unavailable, UsageError

MAX_RUNS = 10_000
FLOAT_BYTES = 4  # every path's cache is float32
EOS_RETRIES = 4


class _Finished(Exception):
    """The generator stopped at its end-of-sequence id before the tokens asked for."""


class CacheStepper:
    """A ``decoder.CachedDecoder`` (torch, ONNX Runtime, OpenVINO): its own ``start`` and ``call_raw``, the logits
    left in the runtime's dtype."""

    def __init__(self, decoder):
        self.decoder = decoder
        self.cache_shape = decoder.cache_shape
        self.cache: object = None

    def _forward(self, ids: np.ndarray):
        logits, self.cache = self.decoder.call_raw(np.ascontiguousarray(ids, np.int64), self.mask, self.cache)
        return np.asarray(logits[:, -1]).argmax(-1)

    def start(self, ids, mask, new_tokens: int) -> None:
        self.ids, self.mask = ids, np.ascontiguousarray(mask, np.int64)
        self.cache = self.decoder.start(self.mask.shape[0])

    def prefill(self):
        return self._forward(self.ids)

    def decode(self, tokens):
        self.mask = append_one(self.mask)
        return self._forward(np.asarray(tokens, np.int64)[:, None])


class GenAIStepper:
    """``GenAIDecoder``'s generator: greedy search, one ``generate_next_token`` per token. Its end-of-sequence id is
    one that the prompt and the tokens generated so far do not take (``used`` grows when a run meets it)."""

    def __init__(self, decoder):
        import json

        from parity.generation.genai_decoder import CONFIG

        self.decoder = decoder
        settings = json.loads((decoder.model_dir / CONFIG).read_text())["model"]["decoder"]
        self.cache_shape = (
            int(settings["num_hidden_layers"]),
            int(settings["num_key_value_heads"]),
            int(settings["head_size"]),
        )
        self.used: set = set()

    def _next(self):
        self.generator.generate_next_token()
        tokens = np.asarray(self.generator.get_next_tokens(), np.int64)
        if (tokens == self.eos).any():  # that row is finished: GenAI would not run it on
            self.used |= set(tokens.tolist())
            raise _Finished
        return tokens

    def start(self, ids, mask, new_tokens: int) -> None:
        self.generator, self.ids32, self.eos = self.decoder._generator(ids, mask, new_tokens, self.used)

    def prefill(self):
        self.generator.append_tokens(self.ids32)
        return self._next()

    def decode(self, tokens):
        return self._next()


def stepper(decoder):
    """The stepper that times ``decoder`` (a Decoder of ``parity.generation.paths``), or
    ``Unavailable`` naming a decoder this module cannot time step by step."""
    from parity.generation.decoder import CachedDecoder
    from parity.generation.genai_decoder import GenAIDecoder

    if isinstance(decoder, CachedDecoder):
        return CacheStepper(decoder)
    if isinstance(decoder, GenAIDecoder):
        return GenAIStepper(decoder)
    raise Unavailable(f"a {type(decoder).__name__} cannot be timed step by step (no prefill/decode stepper for it)")


def _generation(step, ids, mask, new_tokens: int, clock=time.perf_counter) -> tuple[float, float, list[float]]:
    """One generation: (time to first token, the part of it spent setting the sequence up, [each decode step's
    time]) in milliseconds."""
    started = clock()
    step.start(ids, mask, new_tokens)
    set_up = clock()
    tokens = step.prefill()
    first = clock()
    steps = []
    for _ in range(new_tokens - 1):
        t0 = clock()
        tokens = step.decode(tokens)
        steps.append(clock() - t0)
    return (first - started) * 1e3, (set_up - started) * 1e3, [s * 1e3 for s in steps]


def _warm(step, ids, mask, new_tokens: int) -> None:
    """The discarded generation; a generator that stops at its end-of-sequence id is given another."""
    for _ in range(EOS_RETRIES):
        try:
            _generation(step, ids, mask, new_tokens)
            return
        except _Finished:
            continue
    raise RuntimeError(f"the generator kept stopping at an end-of-sequence id within {new_tokens} tokens")


def interval(samples_ms: list[float]) -> dict:
    """``{"median", "low", "high", "n"}``: the median and its distribution-free 95 % interval."""
    low, high = median_ci(samples_ms, 0.95)
    return {"median": median(samples_ms), "low": low, "high": high, "n": len(samples_ms)}


def per_second(batch: int, step_ms: dict) -> dict:
    """Tokens per second from a step time's interval: ``batch / ms``, the interval's ends swapped (a monotone map
    of order statistics: the interval still covers the median)."""
    return {
        "median": batch / step_ms["median"] * 1e3,
        "low": batch / step_ms["high"] * 1e3,
        "high": batch / step_ms["low"] * 1e3,
        "n": step_ms["n"],
    }


def cache_bytes(cache_shape: tuple[int, int, int], batch: int, length: int) -> int:
    """Bytes of a float32 key/value cache: layers x 2 x batch x kv heads x length x head size x 4."""
    layers, kv_heads, head_dim = cache_shape
    return int(layers) * 2 * int(batch) * int(kv_heads) * int(length) * int(head_dim) * FLOAT_BYTES


def series(
    step,
    vocab: int,
    batch: int,
    prompt_length: int,
    new_tokens: int,
    budget_s: float,
    min_runs: int,
    rel_ci: float = 0.02,
    seed: int = 0,
    clock=time.perf_counter,
) -> dict:
    """The timing row of one batch size (see the module's note)."""
    prompts = prompt_set(vocab, [prompt_length] * batch, seed)
    ids, mask = prompts["input_ids"], prompts["attention_mask"]
    _warm(step, ids, mask, new_tokens)
    memory_reason = footprint.reset_peak()
    idle = footprint.resident_mb()
    ttft: list[float] = []
    setup: list[float] = []
    steps: list[float] = []
    started, stopped = clock(), "max_runs"
    while len(ttft) < MAX_RUNS:
        try:
            first, set_up, decode = _generation(step, ids, mask, new_tokens, clock)
        except _Finished:  # a new end-of-sequence id: this generation is not a full one
            _warm(step, ids, mask, new_tokens)
            continue
        ttft.append(first)
        setup.append(set_up)
        steps.append(median(decode))
        if len(ttft) < min_runs:
            continue
        if ci_within(ttft, rel_ci, 0.95) and ci_within(steps, rel_ci, 0.95):
            stopped = "ci"
            break
        if clock() - started >= budget_s:
            stopped = "budget"
            break
    peak = None if memory_reason else footprint.peak_mb()
    step_ms = interval(steps)
    length = prompt_length + new_tokens - 1  # the last token generated is not fed back
    row = {
        "ttft_ms": interval(ttft),
        "setup_ms": interval(setup),
        "decode_tokens_per_s": per_second(batch, step_ms),
        "decode_step_ms": step_ms,
        "peak_rss_mb": peak,
        "idle_rss_mb": idle,
        "cache_bytes": cache_bytes(step.cache_shape, batch, length),
        "cache_length": length,
        "stopped": stopped,
        "seconds": round(clock() - started, 3),
        "samples_ms": {"ttft": ttft, "decode_step": steps},  # per generation: what a comparison of two runs reads
    }
    if memory_reason:
        row["memory_reason"] = memory_reason
    return row


def _vocab(source: dict, meta: dict, decoder) -> int:
    """The vocabulary size: the meta's (the golden's), the torch module's config, the GenAI model's, else the
    source's config."""
    from parity.generation.model import load, text_config

    if meta.get("vocab"):
        return int(meta["vocab"])
    if hasattr(decoder, "model") and hasattr(decoder.model, "config"):
        return int(text_config(decoder.model).vocab_size)
    if getattr(decoder, "vocab", None):
        return int(decoder.vocab)
    if "hf" in source:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(source["hf"], local_files_only=True)
        return int(config.get_text_config(decoder=True).vocab_size)
    return int(text_config(load(source, "float32")).vocab_size)


def _validate(prompt_length, new_tokens, batch_sizes, budget_s, min_runs, threads) -> None:
    if int(prompt_length) < 1:
        raise UsageError(f"the prompt length must be at least 1, got {prompt_length}")
    if int(new_tokens) < 2:
        raise UsageError(f"timing decode steps needs at least 2 new tokens, got {new_tokens}")
    if not batch_sizes or min(int(b) for b in batch_sizes) < 1:
        raise UsageError(f"batch sizes must be positive integers, got {batch_sizes}")
    if not float(budget_s) > 0:
        raise UsageError(f"the timing budget must be > 0 seconds, got {budget_s}")
    if int(min_runs) < 1:
        raise UsageError(f"min_runs must be at least 1, got {min_runs}")
    if int(threads) < 1:
        raise UsageError(f"threads must be at least 1, got {threads}")


def time_path(
    source: dict,
    path_id: str,
    artifact_dir: str | None,
    meta: dict | None,
    threads: int,
    prompt_length: int,
    new_tokens: int,
    batch_sizes: list[int],
    budget_s: float,
    min_runs: int,
    rel_ci: float = 0.02,
    seed: int = 0,
) -> dict:
    """Time one generation path (a worker task): per batch size the time to first token, the decode step and
    tokens per second, each ``{"median", "low", "high", "n"}``, the peak resident memory during the series and the
    cache's size at the end. ``budget_s`` is per batch size; a path whose runtime cannot run here is a skip with its
    reason."""
    from parity.generation import paths

    if path_id not in paths.PATHS:
        raise UsageError(f"unknown generation path {path_id!r}; known: {', '.join(paths.PATHS)}")
    _validate(prompt_length, new_tokens, batch_sizes, budget_s, min_runs, threads)
    result: dict = {
        "path": path_id,
        "prompt_length": int(prompt_length),
        "new_tokens": int(new_tokens),
        "threads": int(threads),
    }
    try:
        decoder = paths.decoder(path_id, artifact_dir, {**(meta or {}), "source": source}, threads)
        step = stepper(decoder)
    except Unavailable as error:
        return {**result, "verdict": "skip", "reason": str(error)}
    vocab = _vocab(source, meta or {}, decoder)
    result["batches"] = {
        str(int(batch)): series(
            step, vocab, int(batch), int(prompt_length), int(new_tokens), float(budget_s), int(min_runs), rel_ci, seed
        )
        for batch in batch_sizes
    }
    return result
