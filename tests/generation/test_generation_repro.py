"""``parity repro`` of a generation path: the exported graph cut at the first divergent step's leaf module, fed the
values the path computed at that step, with the float64 reference's outputs, written as a folder whose repro.py
shows the departure; the whole step's graph where the leaf cannot be cut."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from parity.cli import cli
from parity.generation import diagnose, onnx_export, repro, tasks
from parity.platform.env import environment

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """The faulty Llama (rotary positions restart at each exported call): golden, export, check and diagnosis."""
    base = tmp_path_factory.mktemp("generation-repro")
    source = {"torch": "tests/lmmodels.py:faulty_llama", "root": str(ROOT)}
    golden = str(base / "golden.npz")
    tasks.golden(source, golden, 4, [7, 4], 0)
    folder = base / "onnx"
    meta = onnx_export.export_task(source, str(folder))
    generation = tasks.check(source, golden, "torch/onnx/ort", str(folder), meta, 1)["generation"]
    found = diagnose.diagnose(source, golden, "torch/onnx/ort", str(folder), meta, generation, 1)
    return {"base": base, "source": source, "golden": golden, "dir": folder, "meta": meta, "generation": generation,
            "diagnosis": found}  # fmt: skip


def _write(entry, out: Path, folder=None, diagnosis=None) -> dict:
    outcome = repro.write(
        entry["source"], entry["golden"], str(folder or entry["dir"]), entry["meta"], diagnosis or entry["diagnosis"],
        entry["generation"], str(out), 1, "faulty torch/onnx/ort", environment(1), "parity repro --model faulty",
    )  # fmt: skip
    json.dumps(outcome, allow_nan=False)
    return outcome


def _run(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(folder / "repro.py")], capture_output=True, text=True, timeout=120)


def test_the_decode_step_is_cut_to_the_rotary_embedding_and_its_repro_shows_the_departure(faulty, tmp_path):
    found = faulty["diagnosis"]
    assert (found["step"], found["mode"], found["leaf"]["path"]) == (1, "decode", "model.rotary_emb")
    out = tmp_path / "bug"
    outcome = _write(faulty, out)
    assert outcome["written"] and outcome["scope"] == "model.rotary_emb", outcome
    assert outcome["nodes_after"] <= 12 < outcome["nodes_before"], outcome
    assert {"Cos", "Sin"} <= set(outcome["ops"]) and "MatMul" not in outcome["ops"], outcome["ops"]
    assert all(e["tol_units"] > 1 for e in outcome["errors"].values()), outcome["errors"]
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "model.onnx", "repro.py", "test_data_set_0"]
    ran = _run(out)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "tolerance units" in ran.stdout and "the bug is present" in ran.stdout, ran.stdout
    readme = (out / "README.md").read_text()
    for said in ("faulty torch/onnx/ort", "step 1 (decode)", "model.rotary_emb", "positions restart at 0", "[[7]]"):
        assert said in readme, said


def test_a_graph_without_module_scopes_is_cut_as_the_whole_step_with_its_cache(faulty, tmp_path):
    import onnx

    bare = tmp_path / "bare"
    shutil.copytree(faulty["dir"], bare)
    model = onnx.load(str(bare / onnx_export.ONNX_FILE))
    for node in model.graph.node:
        del node.metadata_props[:]
    onnx.save(model, str(bare / onnx_export.ONNX_FILE))
    out = tmp_path / "bug"
    outcome = _write(faulty, out, folder=bare)
    assert outcome["written"] and outcome["scope"] == "step", outcome
    assert "no torch.onnx module scopes" in outcome["note"] and "whole step" in outcome["note"], outcome["note"]
    assert list(outcome["errors"]) == ["logits"] and outcome["errors"]["logits"]["tol_units"] > 1
    fed = {t.name: t for t in map(onnx.load_tensor, map(str, (out / "test_data_set_0").glob("input_*.pb")))}
    layers = range(faulty["meta"]["n_layers"])  # the step's tokens, mask and the past the path itself produced
    assert {
        "input_ids",
        "attention_mask",
        *(f"past_key_values.{i}.{k}" for i in layers for k in ("key", "value")),
    } <= set(fed)
    past = onnx.numpy_helper.to_array(fed["past_key_values.0.key"])
    assert past.shape[2] == 7 and np.abs(past).max() > 0  # the prompt's 7 positions, written by the prefill
    assert _run(out).returncode == 1
    assert "whole step" in (out / "README.md").read_text()


def _cli(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.slow
def test_parity_repro_writes_the_step_of_a_failing_generation_path(tmp_path):
    made = _cli(
        "init", "faulty", "--torch", f"{TESTS / 'lmmodels.py'}:faulty_llama", "--task", "text-generation",
        "-w", tmp_path,
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    assert _cli("golden", "build", "--model", "faulty", "-w", tmp_path).exit_code == 0
    out = tmp_path / "bug"
    done = _cli("repro", "--model", "faulty", "--path", "torch/onnx/ort", "--out", out, "-w", tmp_path)
    assert done.exit_code == 0 and "cut to model.rotary_emb" in done.output, done.output
    assert _run(out).returncode == 1
    passing = _cli("repro", "--model", "faulty", "--path", "torch", "--out", tmp_path / "none", "-w", tmp_path)
    assert passing.exit_code == 0 and "passes every step" in passing.output, passing.output
    unknown = _cli("repro", "--model", "faulty", "--path", "tf/litert", "--out", tmp_path / "none", "-w", tmp_path)
    assert unknown.exit_code == 2 and "not a path of the text-generation model" in unknown.output, unknown.output
    again = _cli("repro", "--model", "faulty", "--path", "torch/onnx/ort", "--out", out, "-w", tmp_path)
    assert again.exit_code == 2 and "not an empty folder" in again.output, again.output
