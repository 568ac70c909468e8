"""Quantized paths end to end: selected only by name and bringing their float path, checked by the accuracy gate
(not elementwise), timed beside the float path with their speed-up, shown in the terminal, JSON, HTML and history;
a gate that cannot decide is not timed."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from parity.cli import cli
from parity.platform import cpu_int8
from parity.run import paths
from tests.conftest import zoo_copy
from tests.diagnose.precision.test_int8_ort import KEEP, keep_gate


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
    """Gated to keep 95 %: the default 99 % on 449 samples passes only while not one sample changes, a decision on
    its edge that one CPU's int8 kernel tips (tests.diagnose.precision.test_int8_ort)."""
    root = zoo_copy(tmp_path / "ws", "mlp")
    keep_gate(root / "models" / "mlp.py", KEEP)
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
    assert quantization["int8_cpu"]["kind"] in cpu_int8.KINDS and isinstance(quantization["reduce_range"], bool)
    assert quantization["u8s8_pair_bound"] <= cpu_int8.PAIR_LIMIT or not quantization["int8_cpu"]["saturates"]
    assert len(quantization["calibration_sha256"]) == 64
    assert int8["export"]["calibration_data"].startswith("the digits' training split")
    # timed, with its speed-up over the float path measured in the same run
    vs = int8["timing"]["batches"]["64"]["vs_float"]
    assert vs["baseline"] == "torch/onnx/ort" and ("ratio" in vs or vs.get("withheld"))
    assert "Accuracy gates of the quantized paths" in out.output
    assert "Quantized paths: speed-up over the float path" in out.output
    assert f"for {quantization['int8_cpu']['kind']}" in out.output  # the quantizer's setting, in the table line
    page = (tmp_path / "html" / "index.html").read_text()
    assert "Accuracy gates of the quantized paths" in page and "speed-up over the float path" in page
    history = _invoke(
        "history", "--workspace", root, "--model", "mlp", "--path", "*int8*", "--store", tmp_path / "r.sqlite"
    )
    shown = f"gate {100 * gate['value']:.2f}% / {100 * gate['golden']:.2f}%"
    assert history.exit_code == 0 and shown in history.output, history.output


@pytest.mark.slow  # a second proof of an int8 path's gate through bench; the fast set keeps
# test_the_zoo_mlp_int8_path_passes_its_gate_and_is_timed_against_the_float_path, the inconclusive decision
# test_accuracy_gate.py::test_too_small_a_split_is_inconclusive_and_says_how_many_more, and a failing path left untimed
# test_check.py::test_gate_times_passing_paths_only
def test_a_gate_the_split_cannot_decide_is_inconclusive_and_not_timed(tmp_path):
    """keep=1.0 allows no drop at all: no eval split can prove a drop of exactly zero, so the gate says it cannot
    decide (however many samples), the path fails with that reason and is not timed."""
    root = zoo_copy(tmp_path / "ws", "mlp")
    keep_gate(root / "models" / "mlp.py", 1.0)
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


def _onnx_mlp(path) -> None:
    """A float 8-16-3 MLP as an ONNX file (Gemm, Relu, Gemm), seeded weights."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.normal(size=(8, 16)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(size=(16,)).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.normal(size=(16, 3)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.normal(size=(3,)).astype(np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))


def _onnx_workspace(root, x, eval_x) -> None:
    """``root``: the MLP of ``_onnx_mlp`` brought in with ``parity init --onnx`` (inputs ``x``, eval set ``eval_x``
    apart, gated by agreement) and its golden built."""
    import numpy as np

    np.savez(root / "data.npz", x=x, eval_x=eval_x)
    init = _invoke("init", "m", "-w", root, "--onnx", root / "m.onnx", "--inputs", root / "data.npz", "--force")
    assert init.exit_code == 0, init.output
    built = _invoke("golden", "build", "--workspace", root, "--model", "m")
    assert built.exit_code == 0, built.output


def test_the_calibration_identity_is_the_digest_of_the_rows_themselves(tmp_path):
    import numpy as np

    from parity.golden import calibration
    from parity.model.workspace import Workspace

    rng = np.random.default_rng(0)
    x, eval_x = rng.normal(size=(64, 8)).astype(np.float32), rng.normal(size=(256, 8)).astype(np.float32)
    _onnx_mlp(tmp_path / "m.onnx")
    found = []
    for rows in (x, x * 1000, x):
        _onnx_workspace(tmp_path, rows, eval_x)
        ws = Workspace(tmp_path)
        found.append(calibration.identity(str(tmp_path), "m", str(ws.golden_dir("m"))))
    assert (
        found[0]["where"] == found[1]["where"] == "the inputs of data.npz (64 of 64 samples, apart from its eval set)"
    )
    assert found[0]["sha256"] != found[1]["sha256"] and found[0] == found[2]
    x[5, 2] = np.nan
    _onnx_workspace(tmp_path, x, eval_x)
    refused = calibration.identity(str(tmp_path), "m", str(Workspace(tmp_path).golden_dir("m")))
    assert (
        "calibration input 'x' (the inputs of data.npz" in refused["unavailable"]
        and "first sample 5" in refused["unavailable"]
    )


@pytest.mark.slow
def test_the_int8_export_is_keyed_on_the_rows_it_calibrates_on(tmp_path, monkeypatch):
    """Only the calibration rows change (the inputs of data.npz; its eval split, apart, stays the same): the int8
    model is made again on the new rows (their digest in the record) and judged again, not taken from the cache.
    Rows 1000 times too large set every activation range 1000 times too wide: the eval inputs round to zero."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype(np.float32)
    eval_x = rng.normal(size=(256, 8)).astype(np.float32)
    _onnx_mlp(tmp_path / "m.onnx")
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))
    runs = []
    for scale in (1.0, 1000.0):
        _onnx_workspace(tmp_path, x * scale, eval_x)
        report = tmp_path / f"r{scale:g}.json"
        out = _invoke("check", "-w", tmp_path, "--model", "m", "--path", "onnx/ort-int8", "--json", report)
        assert out.exit_code in (0, 1), out.output
        runs.append(next(r for r in json.loads(report.read_text())["results"] if r["path"] == "onnx/ort-int8"))
    first, second = runs
    assert first["export"]["cached"] is False and second["export"]["cached"] is False, second["export"]
    assert "calibration data" in second["export"]["rebuilt"]
    digests = [r["export"]["quantization"]["calibration_sha256"] for r in runs]
    assert digests[0] != digests[1]
    assert first["gate"]["value"] > second["gate"]["value"] + 0.2, (first["gate"], second["gate"])
