"""``parity init --task text-generation``, ``golden build`` and ``check`` on tiny random-weight causal LMs, as a
user runs them: a save_pretrained folder, and a factory whose ONNX export restarts rotary positions at every call."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from parity.cli import cli

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

import lmmodels  # noqa: E402


def _cli(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("generation")
    lmmodels.save(lmmodels.llama(), root / "tiny_llama")
    return root


def _results(root: Path, model: str, *paths: str) -> dict:
    out = root / f"{model}.json"
    result = _cli("check", "--model", model, "-w", root, *[a for p in paths for a in ("--path", p)], "--json", out)
    assert out.is_file(), result.output
    return {r["path"]: r for r in json.loads(out.read_text())["results"]}


@pytest.mark.slow  # a second proof of init --hf --task text-generation, golden build and check at the command line;
# the fast set keeps test_prompts_of_your_own_from_an_npz_and_a_right_padded_file_refused, and the ONNX Runtime path
# step by step test_generation.py::test_ort_path_passes_on_a_correct_model
def test_a_save_pretrained_llama_passes_on_torch_and_onnx_runtime_step_by_step(workspace):
    made = _cli("init", "tiny", "--hf", workspace / "tiny_llama", "--task", "text-generation", "-w", workspace)
    assert made.exit_code == 0 and "text-generation" in made.output, made.output
    built = _cli("golden", "build", "--model", "tiny", "-w", workspace)
    assert built.exit_code == 0 and "float64 greedy generation, 8 steps" in built.output, built.output
    rows = _results(workspace, "tiny", "torch", "torch/onnx/ort")
    assert set(rows) == {"torch", "torch/onnx/ort"}
    for path, row in rows.items():
        generation = row["generation"]
        assert row["verdict"] == "pass", (path, row["reason"])
        assert generation["steps"] == 8 and generation["first_divergent_step"] is None, path
        assert generation["token_agreement"] == 1.0 and generation["kl_max"] < 1e-6, path
        assert all(check["ok"] for check in generation["consistency"].values()), (path, generation["consistency"])
    assert _cli("golden", "verify", "--model", "tiny", "-w", workspace).exit_code == 0


def test_a_changed_folder_or_bad_request_is_said_in_one_line(workspace, tmp_path):
    made = _cli("init", "listed", "--hf", workspace / "tiny_llama", "--task", "text-generation", "-w", tmp_path)
    assert made.exit_code == 0, made.output
    listed = _cli("paths", "--model", "listed", "-w", tmp_path)  # its generation paths, not the torch matrix
    assert "torch/onnx/openvino" in listed.output and "torch/compile" not in listed.output, listed.output
    bare = tmp_path / "bare"
    bare.mkdir()
    forward = _cli("init", "x", "--hf", bare, "-w", tmp_path)  # without --task: a forward check, from config.json
    assert forward.exit_code == 2 and "no readable config.json" in forward.output
    refused = _cli("init", "x", "--hf", bare, "--task", "text-generation", "-w", tmp_path)
    assert refused.exit_code == 2 and "no config.json" in refused.output


@pytest.mark.slow
def test_an_export_whose_rotary_positions_restart_fails_in_decode_and_the_eager_model_passes(workspace):
    made = _cli(
        "init", "faulty", "--torch", f"{TESTS / 'lmmodels.py'}:faulty_llama", "--task", "text-generation",
        "-w", workspace,
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    assert _cli("golden", "build", "--model", "faulty", "-w", workspace).exit_code == 0
    rows = _results(workspace, "faulty", "torch", "torch/onnx/ort")
    assert rows["torch"]["verdict"] == "pass", rows["torch"]["reason"]
    onnx = rows["torch/onnx/ort"]
    assert onnx["verdict"] == "fail" and onnx["generation"]["mode"] == "decode", onnx["reason"]
    assert onnx["generation"]["first_divergent_step"] >= 1, onnx["generation"]
    found = onnx["generation"]["diagnosis"]  # the module tree at that step names the rotary embedding and why
    assert found["leaf"]["path"] == "model.rotary_emb" and found["cause"]["variant"] == "positions_restart", found
    assert rows["torch"]["generation"].get("diagnosis") is None  # a passing path is not diagnosed


def test_prompts_of_your_own_from_an_npz_and_a_right_padded_file_refused(workspace, tmp_path):
    import numpy as np

    ids = np.array([[0, 0, 11, 12, 13], [21, 22, 23, 24, 25]], np.int64)
    mask = (ids != 0).astype(np.int64)
    np.savez(workspace / "prompts.npz", input_ids=ids, attention_mask=mask)
    made = _cli(
        "init", "own", "--hf", workspace / "tiny_llama", "--task", "text-generation",
        "--inputs", workspace / "prompts.npz", "-w", workspace,
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    assert "prompts='prompts.npz'" in (workspace / "models" / "own.py").read_text()
    assert _cli("golden", "build", "--model", "own", "-w", workspace).exit_code == 0
    row = _results(workspace, "own", "torch")["torch"]
    assert row["verdict"] == "pass" and row["batch_size"] == 2, row["reason"]
    np.savez(workspace / "prompts.npz", input_ids=ids[:, ::-1], attention_mask=mask[:, ::-1])  # right-padded
    stale = _results(workspace, "own", "torch")
    assert not stale, stale  # the golden no longer describes the prompts: a model error, no verdict
    rebuilt = _cli("golden", "build", "--model", "own", "-w", workspace)
    assert rebuilt.exit_code == 2 and "left padding" in rebuilt.output, rebuilt.output


def test_run_times_a_passing_generation_path_in_tokens_per_second(workspace):
    assert (
        _cli("init", "timed", "--hf", workspace / "tiny_llama", "--task", "text-generation", "-w", workspace).exit_code
        == 0
    )
    spec = workspace / "models" / "timed.py"
    spec.write_text(
        spec.read_text().replace(
            "    seed=0,\n", "    seed=0,\n    bench_batch_sizes=(1, 2),\n    bench_prompt_length=16,\n"
        )
    )
    assert _cli("golden", "build", "--model", "timed", "-w", workspace).exit_code == 0
    out = workspace / "timed.json"
    ran = _cli("run", "--model", "timed", "-w", workspace, "--path", "torch", "--budget", "0.2", "--json", out)
    assert "decode tokens/s" in ran.output, ran.output
    timing = json.loads(out.read_text())["results"][0]["generation"]["timing"]
    assert set(timing["batches"]) == {"1", "2"} and timing["prompt_length"] == 16
    for row in timing["batches"].values():
        assert row["ttft_ms"]["low"] <= row["ttft_ms"]["median"] <= row["ttft_ms"]["high"]
        assert row["decode_tokens_per_s"]["median"] > 0 and row["cache_bytes"] > 0
