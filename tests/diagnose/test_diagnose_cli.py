"""``parity diagnose`` and the automatic diagnosis in ``check``: output, JSON, bad input."""

from __future__ import annotations

import json

from click.testing import CliRunner

from parity.cli import cli
from tests.conftest import mlp_variant

# forward unchanged, backward of relu2 without its mask: only the gradients differ
STRAIGHT_THROUGH_RELU = {
    "from torch import nn\n": "import torch\n    from torch import nn\n\n    class StraightThroughReLU(nn.Module):\n"
    "        def forward(self, h):\n"
    "            return h + (torch.relu(h) - h).detach()\n",
    "self.relu2 = nn.ReLU()": "self.relu2 = StraightThroughReLU()",
}


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_diagnose_prints_first_divergent_tap_and_cause(workspace_copy, tmp_path):
    root = workspace_copy(mlp_variant({"self.relu1 = nn.ReLU()": "self.relu1 = nn.LeakyReLU(0.01)"}))
    out, report = tmp_path / "d.json", tmp_path / "report"
    result = invoke(
        "diagnose", "--workspace", str(root), "--path", "torch", "--json", str(out), "--report", str(report)
    )
    assert result.exit_code == 1
    assert "first divergent tap: relu1" in result.output
    page = (report / "index.html").read_text()
    assert "<svg" in page and "leaky_relu_0.01" in page and "relu1" in page
    assert "[leaky_relu_0.01]" in result.output and "as declared ->" in result.output
    diagnosis = json.loads(out.read_text())["results"][0]["diagnosis"]
    assert diagnosis["first_divergent_tap"] == "relu1"
    assert diagnosis["cause"]["variant"] == "leaky_relu_0.01"
    assert diagnosis["cause"]["before"]["tol_units"] > 1 >= diagnosis["cause"]["after"]["tol_units"]


def test_gradient_only_fault_names_the_first_departing_parameter(workspace_copy, tmp_path):
    root = workspace_copy(mlp_variant(STRAIGHT_THROUGH_RELU))
    out = tmp_path / "d.json"
    result = invoke("check", "--workspace", str(root), "--path", "torch", "--json", str(out))
    assert result.exit_code == 1
    d = json.loads(out.read_text())["results"][0]["diagnosis"]
    assert d["first_divergent_tap"] is None and d["cause"] is None
    assert d["gradients"]["first_departing_param"] == "dense2/bias"


def test_passing_paths_are_not_diagnosed_by_check_but_are_by_diagnose(workspace_copy, tmp_path):
    root = workspace_copy()
    result = invoke("check", "--workspace", str(root), "--path", "torch")
    assert result.exit_code == 0 and "Diagnosis" not in result.output
    result = invoke("diagnose", "--workspace", str(root), "--path", "torch")
    assert result.exit_code == 0
    assert "first divergent tap: none" in result.output


def test_errored_path_has_nothing_to_diagnose(workspace_copy):
    root = workspace_copy(
        mlp_variant({"return self.logits(": "raise RuntimeError('broken forward')\n            return self.logits("})
    )
    result = invoke("diagnose", "--workspace", str(root), "--path", "torch")
    assert result.exit_code == 1
    assert "nothing to diagnose: the path ended in error" in result.output and "broken forward" in result.output


def test_model_without_taps_still_compares_outputs_and_gradients(workspace_copy, tmp_path):
    source = mlp_variant({'    taps=("dense1", "relu1", "dense2", "relu2", "logits"),': "    taps=(),"})
    start = source.index("    layers={")
    end = source.index("    },\n", start) + len("    },\n")
    root = workspace_copy(source[:start] + source[end:])
    out = tmp_path / "d.json"
    result = invoke("diagnose", "--workspace", str(root), "--path", "torch", "--json", str(out))
    assert result.exit_code == 0, result.output
    d = json.loads(out.read_text())["results"][0]["diagnosis"]
    assert d["taps"] == [] and "declares no taps" in d["notes"][0]
    assert d["gradients"]["first_departing_param"] is None


def test_unknown_path_or_model_is_a_usage_error(workspace_copy):
    root = workspace_copy()
    result = invoke("diagnose", "--workspace", str(root), "--path", "torch/onnx/nope")
    assert result.exit_code == 2 and "matches no path" in result.output
    result = invoke("diagnose", "--workspace", str(root), "--model", "nope")
    assert result.exit_code == 2 and "unknown model 'nope'" in result.output
