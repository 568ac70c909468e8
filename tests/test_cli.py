"""CLI behaviour with click's CliRunner: help, usage errors, corrupted golden data."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from parity.cli import cli
from tests.conftest import REPO

COMMANDS = [["run"], ["check"], ["diagnose"], ["bench"], ["compare"], ["paths"], ["env"], ["golden"], ["golden", "build"],
            ["golden", "verify"], ["init"], ["export-testdata"]]


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
    result = invoke("paths", "--device", "cpu", "--precision", "fp32")
    assert result.exit_code == 0
    for path_id in ("torch", "torch/onnx/ort", "tf/onnx/onnxref", "jax/tf/onnx/ort"):
        assert path_id in result.output
    assert " ok " in result.output and "cuda" not in result.output


def test_env_is_json_with_threads_and_versions():
    result = invoke("env", "--threads", "3")
    data = json.loads(result.output)
    assert data["threads"] == 3 and "numpy" in data["packages"] and data["python"]


def test_model_file_that_fails_to_import_is_an_input_error(workspace_copy):
    root = workspace_copy()
    (root / "models" / "broken.py").write_text("import not_a_module_anywhere\n")
    result = invoke("check", "--workspace", str(root), "--model", "broken")
    assert result.exit_code == 2  # nothing else ran
    assert "broken" in result.output and "not_a_module_anywhere" in result.output
    assert "Traceback" not in result.output and "model  path" not in result.output  # no empty table


def test_model_file_that_exits_at_import_is_that_models_error(workspace_copy):
    """A model file calling sys.exit(3) once made parity exit 3 with no message."""
    root = workspace_copy()
    (root / "models" / "quits.py").write_text("import sys\nsys.exit(3)\n")
    result = invoke("check", "--workspace", str(root), "--model", "quits")
    assert result.exit_code == 2
    assert "model 'quits'" in result.output and "SystemExit: 3" in result.output
    both = invoke("check", "--workspace", str(root), "--model", "quits", "--model", "mlp", "--path", "torch")
    assert both.exit_code == 1, both.output  # mlp ran and passed; the broken model is still a failure
    assert "mlp    torch" in both.output and "SystemExit: 3" in both.output


def test_golden_verify_reports_every_model(workspace_copy):
    root = workspace_copy()
    workspace_copy(name="second")
    (root / "golden" / "mlp" / "inputs.npz").write_bytes(b"broken")
    result = invoke("golden", "verify", "--workspace", str(root))
    assert result.exit_code == 2
    assert "mlp: FAILED" in result.output and "inputs.npz" in result.output
    assert "second:" in result.output  # verified after the first one failed


def test_unwritable_json_target_is_refused_before_the_run(workspace_copy, tmp_path):
    root = workspace_copy()
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    result = invoke("check", "--workspace", str(root), "--path", "torch", "--json", str(blocker / "r.json"))
    assert result.exit_code == 2
    assert "--json" in result.output and "cannot be written" in result.output
    assert "check torch" not in result.output  # refused before any check ran
    assert "Traceback" not in result.output


def test_no_silent_fallback_to_the_builtin_zoo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    verified = invoke("golden", "verify", "--model", "mlp")
    assert verified.exit_code == 0
    assert f"no models/ in {tmp_path}: using the built-in zoo" in verified.output
    manifest = REPO / "golden" / "mlp" / "manifest.json"
    before = manifest.stat().st_mtime_ns
    built = invoke("golden", "build", "--model", "mlp")
    assert built.exit_code == 2
    assert "golden build writes only into a workspace you name" in built.output
    assert manifest.stat().st_mtime_ns == before
