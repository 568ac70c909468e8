"""Trained models brought in as a user brings them (``tests/int8models.py``: factory file, weights in the model's
own format, inputs ``.npz`` with a held-out eval split) through ``parity init`` -> ``golden build`` -> ``check``:
the float paths pass, and the int8 paths are judged by the accuracy gate on the held-out split."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from parity.cli import cli
from tests import int8models

FLOAT_PATHS = ("torch", "torch/onnx/ort")


def invoke(root, *args):
    return CliRunner().invoke(cli, [*args, "--workspace", str(root)], catch_exceptions=False)


def check(root, name, *paths):
    args = [arg for path in paths for arg in ("--path", path)]
    result = invoke(root, "check", "--model", name, "--json", str(root / "r.json"), "--no-store", *args)
    return result, {r["path"]: r for r in json.loads((root / "r.json").read_text())["results"]}


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """The workspace as the current folder, as a user's is when they run ``parity init``."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def brought_in(root, name, **train):
    """Train ``name``, write its workspace into ``root``, ``init`` and ``golden build`` it; the training facts."""
    facts = int8models.build_workspace(name, root, **train)
    result = invoke(root, "init", name, *facts["init"])
    assert result.exit_code == 0, result.output
    result = invoke(root, "golden", "build", "--model", name)
    assert result.exit_code == 0, result.output
    return facts


@pytest.mark.slow
def test_outlier_mlp_keeps_its_float_function_and_fails_per_tensor_int8(workspace):
    facts = brought_in(workspace, "outlier_mlp")
    assert facts["accuracy"] > 0.9 and facts["outlier_logits_change"] < 1e-4
    from parity.golden.weights import canonical
    from parity.model.workspace import Workspace

    weights = canonical(Workspace(workspace).load_spec("outlier_mlp"))  # the model's own: its golden keeps no copy
    rows = np.abs(weights["fc1.weight"]).max(axis=1)
    assert rows.max() > 100 * np.median(rows)
    spec = (workspace / "models" / "outlier_mlp.py").read_text()
    assert 'InputData(file="inputs.npz")' in spec and 'loss="cross_entropy"' in spec
    manifest = json.loads((workspace / "golden" / "outlier_mlp" / "manifest.json").read_text())
    assert manifest["data"]["eval"] == facts["eval"] >= 400
    assert manifest["metrics"]["accuracy"] == pytest.approx(facts["accuracy"], abs=1 / facts["eval"])
    result, by_path = check(workspace, "outlier_mlp", *FLOAT_PATHS)
    assert result.exit_code == 0, result.output
    assert {p: r["verdict"] for p, r in by_path.items()} == dict.fromkeys(FLOAT_PATHS, "pass")

    result, by_path = check(workspace, "outlier_mlp", "torch/onnx/ort-int8")
    gate = by_path["torch/onnx/ort-int8"]["gate"]
    assert gate["decision"] == "fail" and gate["value"] < 0.5 * gate["golden"], gate
    repair = by_path["torch/onnx/ort-int8"]["diagnosis"]["int8"]["repair"]
    assert repair["passes"] and "node_linear_1" in repair["nodes_to_exclude"], repair  # fc2 reads the outlier


@pytest.mark.slow
def test_bert_classifier_from_its_saved_folder_passes_its_float_paths(workspace):
    facts = brought_in(workspace, "bert")
    assert facts["accuracy"] > 0.5  # ten classes: chance is 10 %
    assert (workspace / "bert" / "model.safetensors").is_file()
    spec = (workspace / "models" / "bert.py").read_text()
    assert 'InputSpec("input_ids", (65,), layout="native", dtype="int64"' in spec
    result, by_path = check(workspace, "bert", *FLOAT_PATHS)
    assert result.exit_code == 0, result.output
    for path, r in by_path.items():
        assert r["verdict"] == "pass", (path, r["reason"])
        assert r["metrics"]["accuracy"]["golden"] == pytest.approx(facts["accuracy"], abs=1 / facts["eval"])
