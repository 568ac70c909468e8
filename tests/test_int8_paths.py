"""Quantized paths end to end: selected only by name and bringing their float path, checked by the accuracy gate
(not elementwise), timed beside the float path with their speed-up, shown in the terminal, JSON, HTML and history;
a gate that cannot decide is not timed."""

from __future__ import annotations

import json

from click.testing import CliRunner

from parity.cli import cli
from parity.run import paths
from tests.conftest import zoo_copy


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_int8_paths_are_opt_in_and_bring_the_float_path_they_are_quantized_from():
    every = [p.id for p in paths.select(())]
    assert not any("int8" in p for p in every)
    assert not any("int8" in p.id for p in paths.select(("torch/*",)))
    chosen = [p.id for p in paths.select(("torch/onnx/ort-int8",))]
    assert chosen == ["torch/onnx/ort", "torch/onnx/ort-int8"]
    quantized = paths.by_id("tf/litert-int8")
    assert quantized.quantized and quantized.float_path == "tf/litert" and not quantized.differentiable
    assert "int8" in paths.unavailable_reason(paths.variant(paths.CHAIN_IDS["torch/onnx/ort-int8"], "cpu", "fp16"))


def test_the_zoo_mlp_int8_path_passes_its_gate_and_is_timed_against_the_float_path(tmp_path):
    root = zoo_copy(tmp_path / "ws", "mlp")
    out = _invoke(
        "bench",
        "--workspace",
        root,
        "--model",
        "mlp",
        "--path",
        "torch/onnx/ort-int8",
        "--budget",
        "0.2",
        "--threads",
        "1",
        "--json",
        tmp_path / "r.json",
        "--store",
        tmp_path / "r.sqlite",
        "--report",
        tmp_path / "html",
    )
    assert out.exit_code == 0, out.output
    report = json.loads((tmp_path / "r.json").read_text())
    results = {r["path"]: r for r in report["results"]}
    int8 = results["torch/onnx/ort-int8"]
    gate = int8["gate"]
    assert int8["verdict"] == "pass" and gate["decision"] == "pass" and gate["metric"] == "accuracy"
    assert gate["samples"] == 449 and gate["interval"][1] <= gate["allowed"]
    assert gate["golden"] == results["torch/onnx/ort"]["metrics"]["accuracy"]["golden"]
    # int8 outputs are far beyond the float tolerance, and judged by the gate instead, with their SQNR
    logits = int8["outputs"]["logits"]
    assert logits["tol_units"] > 1 and logits["ok"] and logits["judged_by"] == "accuracy gate"
    assert 20 < logits["sqnr_db"] < 80
    assert int8["gradients"] is None
    quantization = int8["export"]["quantization"]
    assert quantization["calibration"] == "MinMax" and quantization["quantized_layers"] >= 2
    assert int8["export"]["calibration_data"].startswith("the digits' training split")
    # timed, with its speed-up over the float path measured in the same run
    vs = int8["timing"]["batches"]["64"]["vs_float"]
    assert vs["baseline"] == "torch/onnx/ort" and ("ratio" in vs or vs.get("withheld"))
    assert "Accuracy gates of the quantized paths" in out.output
    assert "Quantized paths: speed-up over the float path" in out.output
    page = (tmp_path / "html" / "index.html").read_text()
    assert "Accuracy gates of the quantized paths" in page and "speed-up over the float path" in page
    history = _invoke(
        "history", "--workspace", root, "--model", "mlp", "--path", "*int8*", "--store", tmp_path / "r.sqlite"
    )
    assert history.exit_code == 0 and "gate 97.33% / 97.33%" in history.output, history.output


def test_a_gate_the_split_cannot_decide_is_inconclusive_and_not_timed(tmp_path):
    """keep=1.0 allows no drop at all: no eval split can prove a drop of exactly zero, so the gate says it cannot
    decide (however many samples), the path fails with that reason and is not timed."""
    root = zoo_copy(tmp_path / "ws", "mlp")
    spec_file = root / "models" / "mlp.py"
    source = spec_file.read_text()
    assert "ModelSpec(" in source
    spec_file.write_text(
        source.replace("ModelSpec(", "ModelSpec(\n    gate=Gate(keep=1.0),", 1).replace(
            "from parity.model.spec import ", "from parity.model.spec import Gate, ", 1
        )
    )
    out = _invoke(
        "bench",
        "--workspace",
        root,
        "--model",
        "mlp",
        "--path",
        "torch/onnx/ort-int8dyn",
        "--budget",
        "0.2",
        "--threads",
        "1",
        "--json",
        tmp_path / "r.json",
        "--no-store",
    )
    assert out.exit_code == 1, out.output
    int8 = {r["path"]: r for r in json.loads((tmp_path / "r.json").read_text())["results"]}["torch/onnx/ort-int8dyn"]
    assert int8["verdict"] == "fail" and int8["gate"]["decision"] == "inconclusive"
    assert int8["gate"]["more_samples"] is None and "no number of samples would decide" in int8["reason"]
    assert not int8.get("timing")


LINEAR = """
import torch

def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
"""


def _user_workspace(tmp_path, eval_apart: bool):
    import numpy as np

    from parity.golden import store as golden
    from parity.model.workspace import Workspace

    tmp_path.mkdir()
    rng = np.random.default_rng(0)
    arrays = {"x": rng.normal(size=(100, 8)).astype(np.float32), "labels": rng.integers(0, 3, 100)}
    if eval_apart:
        arrays.update(eval_x=rng.normal(size=(50, 8)).astype(np.float32), eval_labels=rng.integers(0, 3, 50))
    np.savez(tmp_path / "data.npz", **arrays)
    (tmp_path / "net.py").write_text(LINEAR)
    assert (
        _invoke(
            "init",
            "net",
            "--workspace",
            tmp_path,
            "--torch",
            f"{tmp_path / 'net.py'}:make",
            "--inputs",
            tmp_path / "data.npz",
        ).exit_code
        == 0
    )
    assert _invoke("golden", "build", "--workspace", tmp_path, "--model", "net").exit_code == 0
    ws = Workspace(tmp_path)
    spec = ws.load_spec("net")
    return spec, golden.load(ws.golden_dir("net"), spec)


def test_a_user_model_calibrates_on_every_input_of_its_file_apart_from_its_eval_set(tmp_path):
    import numpy as np
    import pytest

    from parity.golden.calibration import calibration_feeds
    from parity.platform.errors import Unavailable

    spec, verified = _user_workspace(tmp_path / "apart", eval_apart=True)
    samples, where = calibration_feeds(spec, verified, tmp_path / "apart")
    assert samples["x"].shape == (100, 8) and samples["x"].dtype == np.float32  # not the golden's one batch
    assert where == "the inputs of data.npz (100 of 100 samples, apart from its eval set)"
    spec, verified = _user_workspace(tmp_path / "same", eval_apart=False)
    with pytest.raises(Unavailable, match="no calibration data apart from the eval set"):
        calibration_feeds(spec, verified, tmp_path / "same")
