"""Taps and outputs without a batch axis (a position table computed once and broadcast over the batch): recorded as
such from the model's own run, compared whole, never cut into rows, never a reason to refuse the model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from parity.cli import cli
from parity.model import batch_axes

GPT2_FACTORY = """
def make():
    import torch
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    return GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=100, use_cache=False))
"""

# a learned position table beside batched outputs: ``table`` (1, 6, 8) is the same for any batch, ``logits``
# (batch, 4) is batched on axis 0 and ``time_major`` (6, batch, 4) on axis 1; the export clamps the features at 3,
# which only the large eval samples reach (a failure on the eval split only)
TABLE_FACTORY = """
import torch
from torch import nn


class PositionTable(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.positions = nn.Embedding(6, 8)
        self.proj = nn.Linear(8, 8)
        self.mix = nn.Linear(8, 4)

    def forward(self, x):
        table = self.positions(torch.arange(x.shape[1]))[None]
        h = self.proj(x) + table
        if torch.onnx.is_in_onnx_export():
            h = torch.clamp(h, max=3.0)
        out = self.mix(h)
        return {"table": table, "logits": out.mean(1), "time_major": out.transpose(0, 1)}


def make():
    return PositionTable().eval()
"""


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def init_and_build(root, name, factory, *options) -> dict:
    (root / f"{name}_factory.py").write_text(factory)
    result = invoke("init", name, "--workspace", root, "--torch", f"{root / f'{name}_factory.py'}:make", *options)
    assert result.exit_code == 0, result.output
    result = invoke("golden", "build", "--workspace", root, "--model", name)
    assert result.exit_code == 0, result.output
    return json.loads((root / "golden" / name / "manifest.json").read_text())


def check(root, name, *args) -> tuple[int, dict]:
    result = invoke("check", "--workspace", root, "--model", name, "--json", "-", *args)
    report = json.loads(result.output[result.output.index("{") :])
    return result.exit_code, {r["path"]: r for r in report["results"]}


@pytest.mark.slow
def test_gpt2_with_its_default_taps_builds_and_passes_on_torch_and_its_onnx_export(tmp_path):
    pytest.importorskip("transformers")
    manifest = init_and_build(tmp_path, "gpt2", GPT2_FACTORY, "--input", "input_ids=2x16:int64")
    # position embeddings are computed once, (1, 16, 32), and broadcast over the batch
    assert manifest["batch_axes"]["tap/wpe"] is None
    assert manifest["batch_axes"]["tap/wte"] == 0 and manifest["batch_axes"]["last_hidden_state"] == 0
    assert manifest["files"]["reference.npz"]["arrays"]["tap/wpe"]["shape"] == [1, 16, 32]
    code, results = check(tmp_path, "gpt2", "--path", "torch", "--path", "torch/onnx/ort")
    assert code == 0, results
    assert {p: r["verdict"] for p, r in results.items()} == {"torch": "pass", "torch/onnx/ort": "pass"}


def test_a_position_table_output_and_tap_are_compared_whole_and_diagnosed(tmp_path):
    rng = np.random.default_rng(0)
    eval_x = rng.standard_normal((8, 6, 8)).astype(np.float32) * 0.1
    eval_x[[2, 5]] *= 100  # these two eval samples reach the export's clamp; the fixed input set does not
    np.savez(tmp_path / "data.npz", x=eval_x[:2], eval_x=eval_x)
    manifest = init_and_build(tmp_path, "table", TABLE_FACTORY, "--input", "x=2x6x8", "--inputs", tmp_path / "data.npz")
    assert manifest["batch_axes"] == {
        "table": None,
        "logits": 0,
        "time_major": 1,
        "tap/positions": None,
        "tap/proj": 0,
        "tap/mix": 0,
    }
    # the eval split is checked on the first output with a row per sample, joined along its batch axis
    assert manifest["files"]["reference.npz"]["arrays"]["eval/logits"]["shape"] == [8, 4]

    code, results = check(tmp_path, "table", "--path", "torch", "--path", "torch/onnx/ort")
    assert results["torch"]["verdict"] == "pass", results["torch"]["reason"]
    assert all(entry["ok"] for entry in results["torch"]["shapes"])  # batch 1 and 3: the table whole at each
    exported = results["torch/onnx/ort"]
    assert code == 1 and exported["verdict"] == "fail"
    assert all(s["ok"] for s in exported["outputs"].values()) and "eval split" in exported["reason"]
    diagnosis = exported["diagnosis"]
    assert "error" not in diagnosis, diagnosis
    assert diagnosis["split"]["name"] == "eval" and set(diagnosis["split"]["rows"]) == {2, 5}
    assert diagnosis["first_divergent_tap"] == "mix"  # the clamp is on mix's input (after proj and the table)
    positions = next(row for row in diagnosis["taps"] if row["tap"] == "positions")
    assert positions["stats"] is None or positions["stats"]["ok"]

    result = invoke("diagnose", "--workspace", tmp_path, "--model", "table", "--path", "torch")
    assert result.exit_code == 0, result.output
    assert "positions" in result.output


def test_the_export_keeps_only_batched_outputs_dynamic_on_the_batch(tmp_path):
    from parity.run import paths
    from parity.run.tasks import export_step

    manifest = init_and_build(tmp_path, "table", TABLE_FACTORY, "--input", "x=2x6x8")
    assert manifest["batch_axes"]["table"] is None
    target = paths.by_id("torch/onnx/ort").exports[0].targets["cpu"]
    (tmp_path / "onnx").mkdir()
    meta = export_step(
        str(tmp_path), "table", target, str(tmp_path / "golden" / "table"), 18, str(tmp_path / "onnx"), None, None
    )
    import onnx

    graph = onnx.load(str(tmp_path / "onnx" / meta["file"])).graph
    dims = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in graph.output}
    assert dims["table"] == [1, 6, 8]
    assert isinstance(dims["logits"][0], str) and isinstance(dims["time_major"][1], str)


def test_batch_axes_from_two_runs_and_golden_data_that_records_none():
    shapes = {"out": (2, 4), "tap/table": (1, 6, 8), "tap/time": (6, 2, 4), "tap/flat": (12, 8)}
    other = {"out": (3, 4), "tap/table": (1, 6, 8), "tap/time": (6, 3, 4), "tap/flat": (18, 8)}
    assert batch_axes.detect(shapes, other, 2, 3) == {"out": 0, "tap/table": None, "tap/time": 1, "tap/flat": None}
    assert batch_axes.guess(shapes, 2) == {"out": 0, "tap/table": None, "tap/time": None, "tap/flat": None}
    old = batch_axes.recorded({"schema": "parity.golden/3"})  # built before the field: axis 0 for every key
    assert batch_axes.axis_of(old, "tap/anything") == 0
    chunks = [np.arange(6).reshape(3, 2), np.arange(6, 12).reshape(3, 2)]
    assert batch_axes.join(chunks, 1, 3).tolist() == [[0, 1, 6], [2, 3, 8], [4, 5, 10]]
    assert batch_axes.join(chunks, None, 3) is chunks[0]
