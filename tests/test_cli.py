"""CLI behaviour with click's CliRunner: help, usage errors, corrupted golden data."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from parity.cli import cli

COMMANDS = [["run"], ["check"], ["paths"], ["env"], ["golden"], ["golden", "build"], ["golden", "verify"]]


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help(command):
    result = invoke(*command, "--help")
    assert result.exit_code == 0
    assert "Example:" in result.output


def test_unknown_model_lists_known_ones(workspace_copy):
    root = workspace_copy()
    result = invoke("check", "--workspace", str(root), "--model", "nope")
    assert result.exit_code == 2
    assert "unknown model 'nope'" in result.output and "mlp" in result.output


def test_path_pattern_matching_nothing_lists_paths(workspace_copy):
    root = workspace_copy()
    result = invoke("check", "--workspace", str(root), "--path", "caffe/*")
    assert result.exit_code == 2
    assert "matches no path" in result.output and "torch/onnx/ort" in result.output


def test_tampered_golden_file_stops_check_naming_the_file(workspace_copy):
    root = workspace_copy()
    target = root / "golden" / "mlp" / "reference.npz"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    result = invoke("check", "--workspace", str(root), "--model", "mlp")
    assert result.exit_code == 2
    assert "reference.npz" in result.output and "sha256 mismatch" in result.output
    manifest = json.loads((root / "golden" / "mlp" / "manifest.json").read_text())
    assert manifest["files"]["reference.npz"]["sha256"] in result.output
    assert "Traceback" not in result.output
    assert invoke("golden", "verify", "--workspace", str(root)).exit_code == 2


@pytest.mark.parametrize("content", ["", "{not json", '{"schema": "other"}'])
def test_missing_or_malformed_manifest(workspace_copy, content):
    root = workspace_copy()
    manifest = root / "golden" / "mlp" / "manifest.json"
    if content:
        manifest.write_text(content)
    else:
        manifest.unlink()
    result = invoke("golden", "verify", "--workspace", str(root))
    assert result.exit_code == 2
    assert "manifest" in result.output and "Traceback" not in result.output


def test_golden_verify_passes_on_builtin_zoo():
    result = invoke("golden", "verify")
    assert result.exit_code == 0, result.output
    assert "mlp: ok" in result.output


def test_paths_lists_every_path_with_status():
    result = invoke("paths")
    assert result.exit_code == 0
    for path_id in ("torch", "torch/onnx/ort", "tf/onnx/onnxref", "jax/tf/onnx/ort"):
        assert path_id in result.output
    assert "available" in result.output


def test_env_is_json_with_threads_and_versions():
    result = invoke("env", "--threads", "3")
    data = json.loads(result.output)
    assert data["threads"] == 3 and "numpy" in data["packages"] and data["python"]


def test_model_file_that_fails_to_import_is_named(workspace_copy):
    root = workspace_copy()
    (root / "models" / "broken.py").write_text("import not_a_module_anywhere\n")
    result = invoke("check", "--workspace", str(root), "--model", "broken")
    assert result.exit_code == 1
    assert "broken" in result.output and "not_a_module_anywhere" in result.output
