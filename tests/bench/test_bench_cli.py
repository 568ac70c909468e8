"""``parity bench`` and ``parity compare`` at the command line: bad input, JSON to stdout, the gate forced."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from parity.cli import cli
from tests.conftest import mlp_variant


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--budget", "0"], "--budget must be a positive number of seconds"),
        (["--budget", "-1"], "--budget must be a positive number of seconds"),
        (["--batch-size", "0"], "--batch-size must be a positive integer"),
        (["--batch-size", "100000"], "batch size 100000 cannot be verified for model 'mlp'"),
        (["--baseline", "torch/onnx/nope"], "--baseline 'torch/onnx/nope' is not a path"),
    ],
)
def test_bad_timing_options_are_one_line_usage_errors(workspace_copy, args, message):
    result = invoke("bench", "--workspace", str(workspace_copy()), *args)
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_forced_failing_path_is_listed_without_a_number_and_json_goes_to_stdout(workspace_copy):
    root = workspace_copy(mlp_variant({"self.relu2 = nn.ReLU()": "self.relu2 = nn.LeakyReLU(0.2)"}))
    result = invoke("bench", "--workspace", str(root), "--path", "torch", "--budget", "0.05", "--json", "-")
    assert result.exit_code == 1
    report = json.loads(result.output)  # nothing else on stdout
    assert report["schema"] == "parity.result/2"
    assert report["results"][0]["verdict"] == "fail" and report["results"][0]["timing"] is None


def test_compare_refuses_what_is_not_a_parity_result(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    result = invoke("compare", str(other), str(other))
    assert result.exit_code == 2 and "not a parity result" in result.output
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert invoke("compare", str(broken), str(other)).exit_code == 2
