"""Worker tasks of generation checks: the float64 golden, the ONNX export, and the check of one path.

Each takes plain arguments (paths as strings, dicts) and returns a plain dict; arrays go to ``.npz`` files written
atomically. ``parity.generation.paths`` says which function opens each path's decoder and which task exports it.
"""

from __future__ import annotations

import hashlib
import io
import time
from pathlib import Path

import numpy as np

from parity.generation import paths
from parity.generation.prompts import batches, prompt_set, read_prompt_set
from parity.generation.verify import FLOAT32_TOLERANCES, compare, logsumexp
from parity.platform.errors import Unavailable, UsageError
from parity.platform.safefs import write_bytes_atomic

TOPK_VOCAB = 4096  # above this vocabulary size the golden keeps the top TOPK ids of each row, not every logit
TOPK = 64


def _save(path: str | Path, arrays: dict) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_bytes_atomic(Path(path), buffer.getvalue())


def chunk_split(mask: np.ndarray) -> int | None:
    """Where a chunked prefill splits the prompt: every row keeps a real token in each chunk where it can (None for a
    one-token prompt)."""
    width = mask.shape[1]
    if width < 2:
        return None
    pads = int((mask == 0).sum(1).max())
    shortest = width - pads
    return min(width - 1, pads + max(1, (shortest + 1) // 2))


def _extended(ids: np.ndarray, mask: np.ndarray, fed: np.ndarray):
    """The prompt followed by the tokens fed after each step but the last: the sequence a cache-less pass sees."""
    tail = np.asarray(fed[:-1], np.int64).T  # (B, steps - 1)
    return np.concatenate([ids, tail], 1), np.concatenate([mask, np.ones_like(tail)], 1)


def consistency_pairs(decoder, sets: dict, forced: dict, logits: dict) -> dict:
    """(expected, got) per consistency check, from ``decoder``'s own results: ``logits`` are its teacher-forced
    steps fed ``forced`` tokens per batch."""
    padded = sets["padded"]
    ids, mask = padded["input_ids"], padded["attention_mask"]
    steps = logits["padded"].shape[0]
    full_ids, full_mask = _extended(ids, mask, forced["padded"])
    full = decoder.full(full_ids, full_mask)[:, ids.shape[1] - 1 :]  # (B, steps, V)
    pairs: dict = {"cache_vs_full": (full.transpose(1, 0, 2), logits["padded"])}
    same = int(np.argmax(np.r_[forced["batch1"][:, 0] != forced["padded"][:, 0], True]))  # steps fed alike
    pairs["batch1_vs_padded"] = (logits["batch1"][: same + 1, 0], logits["padded"][: same + 1, 0]) if steps else None
    split = chunk_split(mask)
    pairs["chunked_prefill"] = (logits["padded"][0], decoder.chunked(ids, mask, split)) if split else None
    for name in getattr(decoder, "not_applicable", {}):  # a check the path cannot be asked (its reason in the decoder)
        pairs[name] = None
    return pairs


def golden(
    source: dict, out_file: str, new_tokens: int, lengths: list[int], seed: int, prompts_file: str | None = None
) -> dict:
    """The float64 reference's greedy generation per batch (``batch1``, ``padded``), written to ``out_file``, on
    seeded random prompts of ``lengths`` or on those of ``prompts_file`` (``prompts.read_prompt_set``)."""
    from parity.generation.model import kv_shape, load, text_config
    from parity.generation.torch_decoder import TorchDecoder

    started = time.perf_counter()
    if int(new_tokens) < 1:
        raise UsageError(f"new tokens must be at least 1, got {new_tokens}")
    model = load(source, "float64")
    vocab = int(text_config(model).vocab_size)
    if prompts_file is not None:
        try:
            prompts = read_prompt_set(prompts_file, vocab)
        except ValueError as error:
            raise UsageError(str(error)) from None
    else:
        prompts = prompt_set(vocab, lengths, seed)
    sets = batches(prompts)
    decoder = TorchDecoder(model)
    arrays = {"prompts/input_ids": prompts["input_ids"], "prompts/attention_mask": prompts["attention_mask"]}
    logits, tokens = {}, {}
    topk = vocab > TOPK_VOCAB
    for name, batch in sets.items():
        logits[name], tokens[name] = decoder.steps(batch["input_ids"], batch["attention_mask"], int(new_tokens))
        arrays[f"{name}/tokens"] = tokens[name]
        if not np.isfinite(logits[name]).all():
            raise UsageError(f"the float64 reference gives non-finite logits on the {name} prompts")
        if topk:
            order = np.argsort(-logits[name], -1, kind="stable")[..., :TOPK]
            arrays[f"{name}/topk_ids"] = order.astype(np.int64)
            arrays[f"{name}/topk_logits"] = np.take_along_axis(logits[name], order, -1)
            arrays[f"{name}/lse"] = logsumexp(logits[name])
            arrays[f"{name}/sha256"] = np.array(
                hashlib.sha256(np.ascontiguousarray(logits[name]).tobytes()).hexdigest()
            )
        else:
            arrays[f"{name}/logits"] = logits[name]
    pairs = consistency_pairs(decoder, sets, tokens, logits)
    if not topk:
        arrays["padded/full"], arrays["padded/chunked"] = pairs["cache_vs_full"][0], pairs["chunked_prefill"][1]
    from parity.generation.verify import consistency

    reference = consistency(pairs, {"atol": 1e-9, "rtol": 1e-9})
    _save(out_file, arrays)
    n_layers, kv_heads, head_dim = kv_shape(model)
    del decoder, model, pairs  # the float32 model is loaded once the float64 one is freed
    floor, tolerances = float32_floor(source, sets, tokens, logits)
    return {
        "float32_floor": floor,
        "tolerances": tolerances,
        "steps": int(new_tokens),
        "prompts": int(prompts["input_ids"].shape[0]),
        "prompt_length": int(prompts["input_ids"].shape[1]),
        "vocab": vocab,
        "n_layers": n_layers,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "logits": f"top {TOPK} per step and a sha256 of the float64 logits" if topk else "full",
        "reference_consistency": reference,
        "seconds": round(time.perf_counter() - started, 3),
    }


FLOOR_FACTOR = 32  # a path's tolerance: at least this many times the model's own float32 error, as for any model


def float32_floor(source: dict, sets: dict, tokens: dict, logits: dict) -> tuple[dict, dict]:
    """The model's own float32 error (eager torch, teacher-forced on the golden's tokens) against the float64
    logits, and the tolerances a path is judged at: ``FLOAT32_TOLERANCES``, with ``atol`` widened to
    ``FLOOR_FACTOR`` times that error where the model's logits are larger or its layers more (the tiny models' floor
    is far below them)."""
    import gc

    from parity.generation.model import load
    from parity.generation.torch_decoder import TorchDecoder

    gc.collect()
    decoder = TorchDecoder(load(source, "float32"))
    worst, scale = 0.0, 0.0
    for name, batch in sets.items():
        got, _ = decoder.steps(batch["input_ids"], batch["attention_mask"], len(tokens[name]), forced=tokens[name])
        worst = max(worst, float(np.abs(got - logits[name]).max()))
        scale = max(scale, float(np.abs(logits[name]).max()))
    atol = max(FLOAT32_TOLERANCES["atol"], FLOOR_FACTOR * worst)
    floor = {"max_abs": worst, "logit_max_abs": scale, "factor": FLOOR_FACTOR}
    return floor, {**FLOAT32_TOLERANCES, "atol": float(f"{atol:.3g}")}


def read_golden(golden_file: str) -> tuple[dict, dict]:
    """(prompt batches, golden batches) of a golden ``.npz``."""
    with np.load(golden_file, allow_pickle=False) as data:
        arrays = {key: data[key] for key in data.files}
    prompts = {"input_ids": arrays["prompts/input_ids"], "attention_mask": arrays["prompts/attention_mask"]}
    sets = batches(prompts)
    gold = {
        name: {key.split("/", 1)[1]: value for key, value in arrays.items() if key.startswith(f"{name}/")}
        for name in sets
    }
    return sets, gold


def run_path(decoder, golden_file: str, tolerances: dict | None = None) -> dict:
    """The generation block of ``decoder`` against the golden in ``golden_file``."""
    sets, gold = read_golden(golden_file)
    steps = int(gold["batch1"]["tokens"].shape[0])
    path: dict = {}
    logits, forced = {}, {}
    for name, batch in sets.items():
        forced[name] = gold[name]["tokens"]
        logits[name], _ = decoder.steps(batch["input_ids"], batch["attention_mask"], steps, forced=forced[name])
        _, free = decoder.steps(batch["input_ids"], batch["attention_mask"], steps)
        path[name] = {"logits": logits[name], "tokens": free}
    path["consistency"] = consistency_pairs(decoder, sets, forced, logits)
    return compare(gold, path, tolerances or FLOAT32_TOLERANCES)


def check(
    source: dict,
    golden_file: str,
    path_id: str,
    artifact_dir: str | None,
    meta: dict | None,
    threads: int,
    tolerances: dict | None = None,
) -> dict:
    """Verify one generation path step by step: ``{"verdict", "reason", "generation"}`` (a skip with its reason
    where the path's runtime cannot run here); ``tolerances``: the spec's ``{"atol", "rtol"}``."""
    started = time.perf_counter()
    try:
        decoder = paths.decoder(path_id, artifact_dir, {**(meta or {}), "source": source}, threads)
    except Unavailable as error:
        return {"verdict": "skip", "reason": str(error)}
    generation = run_path(decoder, golden_file, {**FLOAT32_TOLERANCES, **(tolerances or {})})
    generation["seconds"] = round(time.perf_counter() - started, 3)
    return {"verdict": generation["verdict"], "reason": generation["reason"], "generation": generation}
