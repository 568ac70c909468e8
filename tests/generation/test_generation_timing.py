"""Timing of generation paths (parity.generation.timing) on the tiny random-weight Llama: torch and the ONNX Runtime
path, each row's fields and values, and that the steppers generate what the verified decoders generate."""

from __future__ import annotations

import importlib.util
import math

import lmmodels
import numpy as np
import pytest

from parity.generation import onnx_export

PROMPT, NEW, BATCHES = 8, 4, [1, 2]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The tiny Llama's folder as a source, and its ONNX export (folder and meta)."""

    root = tmp_path_factory.mktemp("timing")
    source = {"hf": str(lmmodels.save(lmmodels.llama(), root / "llama"))}
    meta = onnx_export.export_task(source, str(root / "onnx"))
    return {"source": source, "onnx": str(root / "onnx"), "meta": meta}


def _artifacts(llama, path_id):
    return (None, {}) if path_id == "torch" else (llama["onnx"], llama["meta"])


@pytest.mark.parametrize("path_id", ["torch", "torch/onnx/ort"])
def test_time_path_gives_a_sane_row_per_batch_size(llama, path_id):
    from parity.generation.timing import time_path

    artifact_dir, meta = _artifacts(llama, path_id)
    result = time_path(llama["source"], path_id, artifact_dir, meta, 1, PROMPT, NEW, BATCHES, 0.3, 5)
    assert (result["prompt_length"], result["new_tokens"], result["threads"]) == (PROMPT, NEW, 1)
    assert sorted(result["batches"]) == ["1", "2"]
    layers, kv_heads, head_dim = 2, 2, 16  # lmmodels.TINY: hidden 64 over 4 heads, 2 key/value heads
    for batch, row in result["batches"].items():
        for key in ("ttft_ms", "decode_tokens_per_s", "decode_step_ms"):
            stat = row[key]
            assert stat["n"] >= 5, (key, stat)
            assert 0 < stat["low"] <= stat["median"] <= stat["high"] < math.inf, (key, stat)
        setup = row["setup_ms"]
        assert 0 <= setup["low"] <= setup["median"] <= setup["high"] and setup["median"] <= row["ttft_ms"]["median"]
        step, rate = row["decode_step_ms"], row["decode_tokens_per_s"]
        assert rate["median"] == pytest.approx(int(batch) * 1e3 / step["median"])
        assert rate["low"] == pytest.approx(int(batch) * 1e3 / step["high"])
        assert row["cache_length"] == PROMPT + NEW - 1
        assert row["cache_bytes"] == layers * 2 * int(batch) * kv_heads * (PROMPT + NEW - 1) * head_dim * 4
        assert row["stopped"] in ("ci", "budget", "max_runs")
        assert len(row["samples_ms"]["ttft"]) == len(row["samples_ms"]["decode_step"]) == row["ttft_ms"]["n"]
        if row["peak_rss_mb"] is None:
            assert row["memory_reason"]
        else:
            assert row["peak_rss_mb"] > 0 and row["idle_rss_mb"] > 0


def _same_tokens(decoder):
    from parity.generation.prompts import prompt_set
    from parity.generation.timing import stepper

    prompts = prompt_set(256, [PROMPT] * 3, 1)
    ids, mask = prompts["input_ids"], prompts["attention_mask"]
    _, expected = decoder.steps(ids, mask, 6)
    step = stepper(decoder)
    step.start(ids, mask, 6)
    tokens = [step.prefill()]
    for _ in range(5):
        tokens.append(step.decode(tokens[-1]))
    np.testing.assert_array_equal(np.stack(tokens), expected)


@pytest.mark.parametrize("path_id", ["torch", "torch/onnx/ort", "torch/onnx/openvino"])
def test_stepper_generates_the_decoders_greedy_tokens(llama, path_id):
    """What is timed is the verified computation: the stepper's greedy tokens are the decoder's."""
    from parity.generation import paths

    artifact_dir, meta = _artifacts(llama, path_id)
    _same_tokens(paths.decoder(path_id, artifact_dir, {**meta, "source": llama["source"]}, 1))


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("onnxruntime_genai") is None, reason="onnxruntime-genai is not installed")
def test_genai_stepper_generates_the_decoders_greedy_tokens_and_times(tmp_path):
    from test_generation_runtimes import save_llama

    from parity.generation.genai_decoder import GenAIDecoder, genai_export
    from parity.generation.timing import time_path

    save_llama(tmp_path / "llama")
    source = {"hf": str(tmp_path / "llama")}
    meta = genai_export(source, str(tmp_path / "genai"))
    _same_tokens(GenAIDecoder(tmp_path / "genai", 1))
    row = time_path(source, "torch/genai", str(tmp_path / "genai"), meta, 1, PROMPT, NEW, [2], 0.3, 5)["batches"]["2"]
    assert 0 < row["decode_tokens_per_s"]["low"] <= row["decode_tokens_per_s"]["median"]
    assert 0 < row["setup_ms"]["median"] < row["ttft_ms"]["median"]
    assert row["cache_bytes"] == 2 * 2 * 2 * 2 * (PROMPT + NEW - 1) * 16 * 4


def test_a_decoder_without_a_stepper_is_said_unavailable():
    from parity.generation.timing import stepper
    from parity.platform.errors import Unavailable

    with pytest.raises(Unavailable, match="cannot be timed step by step"):
        stepper(object())


@pytest.mark.parametrize(
    "change, message",
    [
        ({"path_id": "torch/tflite"}, "unknown generation path"),
        ({"new_tokens": 1}, "at least 2 new tokens"),
        ({"batch_sizes": [1, 0]}, "batch sizes"),
        ({"prompt_length": 0}, "prompt length"),
        ({"budget_s": 0}, "budget"),
    ],
)
def test_bad_arguments_are_usage_errors(change, message):
    from parity.generation.timing import time_path
    from parity.platform.errors import UsageError

    args = {
        "source": {"hf": "/nonexistent"},
        "path_id": "torch",
        "artifact_dir": None,
        "meta": None,
        "threads": 1,
        "prompt_length": 8,
        "new_tokens": 4,
        "batch_sizes": [1],
        "budget_s": 1.0,
        "min_runs": 5,
    }
    with pytest.raises(UsageError, match=message):
        time_path(**{**args, **change})


def test_tokens_per_second_interval_is_the_step_interval_mapped():
    from parity.generation.timing import cache_bytes, interval, per_second

    step = interval([2.0, 4.0, 3.0, 5.0, 1.0, 3.5, 2.5])
    assert step["low"] <= step["median"] == 3.0 <= step["high"]
    rate = per_second(4, step)
    assert rate["median"] == pytest.approx(4e3 / 3.0)
    assert rate["low"] == pytest.approx(4e3 / step["high"]) and rate["high"] == pytest.approx(4e3 / step["low"])
    assert cache_bytes((30, 3, 64), 1, 100) == 30 * 2 * 3 * 100 * 64 * 4
