"""The generation config matrix's architectures as a user runs them: ``parity init --hf FOLDER --task
text-generation``, ``golden build`` and ``check`` on tiny random-weight Qwen2 (q/k/v bias), Mistral (a sliding window
shorter than the prompt), Gemma-2 (softcapping that bites, embedding scale, a window of 4) and Phi-3 (longrope whose
switch length lies inside the prompt) folders, built by ``scripts/generation_matrix.py`` with random biases and norm
weights and a word-level tokenizer. Prompts (12, 7) and 8 new tokens cross the window and the switch."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from parity.cli import cli

REPO = Path(__file__).resolve().parents[2]
HAS_GENAI = importlib.util.find_spec("onnxruntime_genai") is not None
CONFIGS = ("qwen2_bias", "mistral_sw", "gemma2_sw", "phi3_longrope")


def _matrix():
    spec = importlib.util.spec_from_file_location("generation_matrix", REPO / "scripts" / "generation_matrix.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cli(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """config -> path -> the check JSON's row, every path checked."""
    matrix = _matrix()
    root = tmp_path_factory.mktemp("matrix")
    out = {}
    for name in CONFIGS:
        model_type, overrides, attn, _ = matrix.CONFIGS[name]
        matrix.build(model_type, overrides, attn, root / name, seed=sum(map(ord, name)))
        made = _cli("init", name, "--hf", root / name, "--task", "text-generation", "-w", root)
        assert made.exit_code == 0, made.output
        matrix._set_spec(root / "models" / f"{name}.py", matrix.PROMPT_LENGTHS, matrix.NEW_TOKENS, None)
        built = _cli("golden", "build", "--model", name, "-w", root)
        assert built.exit_code == 0 and f"{matrix.NEW_TOKENS} steps" in built.output, built.output
        report = root / f"{name}.json"
        _cli("check", "--model", name, "-w", root, "--json", report)
        assert report.is_file()
        out[name] = {row["path"]: row for row in json.loads(report.read_text())["results"]}
    return out


def _passes(row: dict) -> None:
    generation = row["generation"]
    assert row["verdict"] == "pass", (row["path"], row["reason"])
    assert generation["steps"] == 8 and generation["first_divergent_step"] is None
    assert generation["token_agreement"] == 1.0 and generation["kl_max"] < 1e-6
    assert all(c["ok"] is not False for c in generation["consistency"].values()), generation["consistency"]


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_torch_onnx_runtime_and_openvino_pass_step_by_step(rows, name):
    for path in ("torch", "torch/onnx/ort", "torch/onnx/openvino"):
        _passes(rows[name][path])


@pytest.mark.slow
@pytest.mark.skipif(not HAS_GENAI, reason="onnxruntime-genai is not installed")
@pytest.mark.parametrize("name", ["qwen2_bias", "gemma2_sw"])
def test_genai_departs_only_on_the_left_padded_batch(rows, name):
    """ONNX Runtime GenAI reads a row's left pads as trailing ones: the prompt alone (batch 1) is right at every step
    (q/k/v bias, softcapping, embedding scale and Gemma-2's window of 4 included), the left-padded batch departs at
    the prefill."""
    row = rows[name]["torch/genai"]
    generation = row["generation"]
    assert row["verdict"] == "fail", row["reason"]
    assert generation["first_divergent_step"] == 0 and generation["batch"] == "padded", generation["reason"]
    batch1 = [step for step in generation["per_step"] if step["batch"] == "batch1"]
    assert len(batch1) == 8 and all(step["tol_units"] <= 1.0 and step["top1"] for step in batch1), batch1


@pytest.mark.slow
@pytest.mark.skipif(not HAS_GENAI, reason="onnxruntime-genai is not installed")
def test_genai_attends_past_mistral_s_sliding_window(rows):
    """GenAI's builder (0.18) writes Mistral's window into genai_config.json but builds every GroupQueryAttention with
    local_window_size -1: a prompt of 12 attends to all of itself, not to the last 4, and batch 1 departs at the
    prefill."""
    generation = rows["mistral_sw"]["torch/genai"]["generation"]
    assert generation["first_divergent_step"] == 0 and generation["batch"] == "batch1", generation["reason"]
    assert generation["tol_units_max"] > 10


@pytest.mark.slow
@pytest.mark.skipif(not HAS_GENAI, reason="onnxruntime-genai is not installed")
def test_genai_builder_refuses_transformers_longrope_config(rows):
    """GenAI's Phi-3 builder reads ``rope_parameters["type"]``; transformers 5 writes ``rope_type``: the build stops
    with KeyError 'type', and the path is an error that says so in its first line."""
    row = rows["phi3_longrope"]["torch/genai"]
    assert row["verdict"] == "error" and "KeyError: 'type'" in row["reason"], row["reason"]
