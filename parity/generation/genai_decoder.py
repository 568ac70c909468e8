"""ONNX Runtime GenAI: a model built by its model builder from the save_pretrained folder, run by its own
``Generator`` and cache, as it is deployed.

``genai_export`` runs the builder (``python -m onnxruntime_genai.models.builder -i FOLDER -o OUT -p fp32 -e cpu``) in
a subprocess; ``GenAIDecoder`` drives the generator step by step under the Decoder contract of this package.

What GenAI does with a batch (onnxruntime-genai 0.18, CPU): it takes token ids only, no attention mask; a pad is a
token equal to the model's ``pad_token_id`` (``genai_config.json``), and its attention (``GroupQueryAttention``)
counts each row's pads as if they sat at the row's END. A left-padded batch, as transformers batches a prompt set, is
therefore read wrongly with no error: the rows without padding are right, each padded row attends to its pads and
misses its last real tokens, and its positions are shifted (on a tiny Llama: max |Δlogit| 0.4 at prefill on the
padded row). The decoder feeds the batch as it is given (pads replaced by ``pad_token_id``) and lets the
verification show the departure; it does not move the pads.

Teacher forcing: at batch 1 the forced token is appended (``append_tokens``); at batch > 1 GenAI accepts
``append_tokens`` only once per generator, so the step's logits are read and replaced by a one-hot on the forced
token (``set_logits``), which the greedy search then picks; ``chunked`` feeds its second chunk the same way at
batch > 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from parity.platform.errors import ExportError, Unavailable

BUILDER = "onnxruntime_genai.models.builder"
CONFIG = "genai_config.json"
LOG = "builder.log"
# files AutoTokenizer builds a tokenizer from: the builder saves the tokenizer beside the model and fails without one
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
EXPORT_TIMEOUT_S = 1800
ONE_HOT = 1e4


def _require_genai():
    try:
        import onnxruntime_genai as og
    except ImportError as error:
        raise Unavailable(
            f"onnxruntime-genai is not installed ({error}): pip install onnxruntime-genai (parity's 'cpu' extra)"
        ) from None
    return og


def _last_error(log: str) -> str:
    """The builder's reason: the last line of its log that names an error, else its last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error:" in line or "Exception" in line:
            return line[:300]
    return lines[-1][:300] if lines else "no output"


def genai_export(source: dict, out_dir: str, timeout_s: float = EXPORT_TIMEOUT_S) -> dict:
    """Build ``out_dir`` (fp32, CPU) from ``source["hf"]`` with ONNX Runtime GenAI's model builder and return its
    meta. The builder runs in a subprocess with ``timeout_s``; its output goes to a scratch folder beside ``out_dir``
    that replaces ``out_dir`` once complete; its log is kept as ``builder.log`` (as ``genai-builder-failed-*.log``
    beside ``out_dir`` when it fails)."""
    from parity.platform.safefs import owned_tempdir, replace_dir, write_text_atomic

    if "hf" not in source:
        raise Unavailable(
            "ONNX Runtime GenAI's model builder reads a save_pretrained folder (config, safetensors, tokenizer): "
            "a model built in code has none; save it with save_pretrained and give the folder (--hf)"
        )
    folder = Path(source["hf"])
    if not (folder / "config.json").is_file():
        raise Unavailable(f"{folder} is not a save_pretrained folder (no config.json) for ONNX Runtime GenAI's builder")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise Unavailable(
            f"ONNX Runtime GenAI's model builder needs a tokenizer in {folder} (one of {', '.join(TOKENIZER_FILES)}): "
            "save one there with tokenizer.save_pretrained"
        )
    og = _require_genai()
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = owned_tempdir(out.parent, f".{out.name}.genai-")
    command = [sys.executable, "-m", BUILDER, "-i", str(folder.resolve()), "-o", str(scratch / "model")]
    command += ["-p", "fp32", "-e", "cpu", "-c", str(scratch / "cache")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    started = time.perf_counter()
    try:
        try:
            done = subprocess.run(
                command, cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
            )
            log, failure = done.stdout + done.stderr, None if done.returncode == 0 else f"exit code {done.returncode}"
        except subprocess.TimeoutExpired as error:
            log = "".join(
                part.decode() if isinstance(part, bytes) else part or "" for part in (error.stdout, error.stderr)
            )
            failure = f"ran past its {timeout_s:.0f} s timeout"
        built = scratch / "model"
        if failure is None and not (built / CONFIG).is_file():
            failure = f"wrote no {CONFIG}"
        if failure:
            kept = out.parent / f"genai-builder-failed-{out.name.lstrip('.')}.log"  # outlives the build folders' sweep
            write_text_atomic(kept, log)
            raise ExportError(f"ONNX Runtime GenAI's builder {failure}: {_last_error(log)} (log: {kept})")
        write_text_atomic(built / LOG, log)
        decoder = json.loads((built / CONFIG).read_text())["model"]
        replace_dir(built, out)
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "format": "onnxruntime-genai",
        "file": CONFIG,
        "builder": f"onnxruntime-genai {og.__version__}",
        "precision": "fp32",
        "execution_provider": "cpu",
        "model_type": decoder.get("type"),
        "n_layers": decoder["decoder"].get("num_hidden_layers"),
        "kv_heads": decoder["decoder"].get("num_key_value_heads"),
        "head_dim": decoder["decoder"].get("head_size"),
        "context_length": decoder.get("context_length"),
        "pad_token_id": decoder.get("pad_token_id"),
        "log": LOG,
        "export_s": round(time.perf_counter() - started, 3),
    }


class GenAIDecoder:
    """The model in ``model_dir`` (``genai_export``'s folder) on ONNX Runtime GenAI's CPU provider with ``threads``
    intra-op threads; greedy search. See the module's note on left-padded batches.

    GenAI's generator stops a row at its end-of-sequence id, and a finished generator returns its last logits again
    without an error. The golden generates a fixed number of tokens whatever they are, so each run gives the
    generator an ``eos_token_id`` that none of the tokens it is fed or generates takes (a free-running run that meets
    it runs again with another)."""

    def __init__(self, model_dir, threads: int = 1):
        og = _require_genai()
        self.og = og
        self.model_dir = Path(model_dir)
        settings = json.loads((self.model_dir / CONFIG).read_text())["model"]
        self.pad_id = settings.get("pad_token_id")
        if isinstance(self.pad_id, list):
            self.pad_id = self.pad_id[0]
        self.vocab = int(settings["vocab_size"])
        self.context = int(settings.get("context_length") or 0)
        self.window = int((settings["decoder"].get("sliding_window") or {}).get("window_size") or 0)
        self.threads = max(1, int(threads))
        self._models: dict[int, object] = {}

    def record(self) -> dict:
        return {"runtime": "onnxruntime-genai", "onnxruntime_genai": self.og.__version__, "pad_token_id": self.pad_id}

    def _model(self, eos: int):
        """The model with ``eos`` as its end-of-sequence id (one session per id, kept)."""
        if eos not in self._models:
            config = self.og.Config(str(self.model_dir))
            options = {"intra_op_num_threads": self.threads, "inter_op_num_threads": 1}
            config.overlay(json.dumps({"model": {"eos_token_id": eos, "decoder": {"session_options": options}}}))
            self._models[eos] = self.og.Model(config)
        return self._models[eos]

    def _eos(self, used: set) -> int:
        """An id of the vocabulary that is neither the pad nor among ``used``, the highest first."""
        for token in range(self.vocab - 1, -1, -1):
            if token not in used and token != self.pad_id:
                return token
        raise Unavailable("every id of the vocabulary is used: GenAI's generator would stop at one of them")

    def _generator(self, ids: np.ndarray, mask: np.ndarray, new_tokens: int, used: set):
        """A greedy generator with the prompt appended: its pads (mask 0) are given as ``pad_token_id``."""
        ids = np.asarray(ids, np.int64).copy()
        mask = np.asarray(mask, np.int64)
        if (mask == 0).any():
            if self.pad_id is None:
                raise Unavailable("the GenAI model has no pad_token_id: it cannot take a padded batch")
            ids[mask == 0] = self.pad_id
        # the cache holds max_length tokens, at least the window where the window fits in the context (a window
        # longer than the context is no window at all)
        window = min(self.window, self.context) if self.context else self.window
        length = max(ids.shape[1] + new_tokens, window)
        if self.context and length > self.context:
            raise Unavailable(f"{length} tokens exceed the GenAI model's context length {self.context}")
        eos = self._eos(used | set(ids.ravel().tolist()))
        params = self.og.GeneratorParams(self._model(eos))
        params.set_search_options(do_sample=False, max_length=length, batch_size=ids.shape[0])
        return self.og.Generator(self._model(eos), params), ids.astype(np.int32), eos

    def steps(self, ids, mask, new_tokens: int, forced=None):
        """Per step the last position's logits (steps, B, V) and the greedy tokens (steps, B); ``forced`` (steps, B)
        is fed after each step instead (teacher forcing)."""
        used = set() if forced is None else set(np.asarray(forced, np.int64).ravel().tolist())
        while True:
            logits, tokens, finished = self._steps(ids, mask, new_tokens, forced, used)
            if not finished:
                return np.stack(logits), np.stack(tokens).astype(np.int64)
            if forced is not None:
                raise RuntimeError("ONNX Runtime GenAI's generator stopped before the last forced token")
            used |= set(np.stack(tokens).ravel().tolist())

    def _steps(self, ids, mask, new_tokens: int, forced, used: set):
        generator, ids32, eos = self._generator(ids, mask, new_tokens, used)
        batch = ids32.shape[0]
        generator.append_tokens(ids32)
        logits, tokens = [], []
        for step in range(new_tokens):
            last = np.array(generator.get_logits(), np.float64).reshape(batch, -1)  # runs the pending tokens
            logits.append(last)
            tokens.append(last.argmax(-1))
            if step + 1 == new_tokens:
                break
            if forced is None:
                generator.generate_next_token()
            elif batch == 1:
                generator.append_tokens(np.asarray(forced[step], np.int32).reshape(1, 1))
            else:
                one_hot = np.full((batch, last.shape[1]), -ONE_HOT, np.float32)
                one_hot[np.arange(batch), np.asarray(forced[step], np.int64)] = ONE_HOT
                generator.set_logits(one_hot)
                generator.generate_next_token()
            if forced is None and (tokens[-1] == eos).any():  # that row is finished: its next logits are stale
                return logits, tokens, True
        return logits, tokens, False

    def full(self, ids, mask):
        """Every position's logits (B, T, V) of the prompt's one pass from an empty cache (the model's raw
        ``logits`` output)."""
        generator, ids32, _ = self._generator(ids, mask, 1, set())
        generator.append_tokens(ids32)
        generator.get_logits()
        return np.array(generator.get_output("logits"), np.float64).reshape(ids32.shape[0], ids32.shape[1], -1)

    def chunked(self, ids, mask, split: int):
        """The last position's logits (B, V) of the prompt fed as columns ``[:split]``, then ``[split:]`` through the
        cache. At batch 1 both chunks are appended (``append_tokens``); at batch > 1 GenAI appends a prompt once per
        generator, so the second chunk is fed one column at a time as decode steps (``set_logits`` one-hot)."""
        ids, mask = np.asarray(ids, np.int64), np.asarray(mask, np.int64)
        if not 0 < split < ids.shape[1]:
            raise ValueError(f"split {split} must lie inside the prompt's {ids.shape[1]} columns")
        generator, ids32, _ = self._generator(ids, mask, 1, set())
        batch = ids32.shape[0]
        generator.append_tokens(ids32[:, :split])
        if batch == 1:
            generator.append_tokens(ids32[:, split:])
        else:
            for column in range(split, ids32.shape[1]):
                last = np.array(generator.get_logits(), np.float32).reshape(batch, -1)
                one_hot = np.full_like(last, -ONE_HOT)
                one_hot[np.arange(batch), ids32[:, column]] = ONE_HOT
                generator.set_logits(one_hot)
                generator.generate_next_token()
        return np.array(generator.get_logits(), np.float64).reshape(batch, -1)


def open_decoder(artifact_dir, meta: dict, threads: int = 1) -> GenAIDecoder:
    """The ``torch/genai`` path: ``genai_export``'s folder ``artifact_dir``."""
    from parity.platform.errors import UsageError

    if not artifact_dir or not (Path(artifact_dir) / CONFIG).is_file():
        raise UsageError(f"the torch/genai path needs the folder ONNX Runtime GenAI's builder wrote (with {CONFIG})")
    return GenAIDecoder(artifact_dir, threads)


def export_task(source: dict, out_dir: str) -> dict:
    """Worker task: ``genai_export``, or ``{"unavailable": reason}`` where it cannot run here (no folder, no
    tokenizer in it)."""
    try:
        return genai_export(source, out_dir)
    except Unavailable as error:
        return {"unavailable": str(error)}
