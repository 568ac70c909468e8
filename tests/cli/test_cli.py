"""CLI behaviour with click's CliRunner: help, usage errors, corrupted golden data."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from parity.cli import cli
from tests.conftest import REPO

COMMANDS = [
    ["run"],
    ["check"],
    ["diagnose"],
    ["bench"],
    ["compare"],
    ["paths"],
    ["env"],
    ["golden"],
    ["golden", "build"],
    ["golden", "verify"],
    ["init"],
    ["export-testdata"],
]


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


# --- progress, and verdicts before timing (a stand-in orchestrator: no worker, no framework) ---


def _timed_result(path: str) -> dict:
    batch = {
        "verdict": "pass",
        "median_ms": 0.5,
        "ci95_ms": [0.4, 0.6],
        "cv": 0.01,
        "runs": 30,
        "throughput": 2000.0,
        "vs_baseline": {"baseline": "torch", "self": True},
    }
    return {
        "model": "mlp",
        "path": path,
        "stages": path.split("/"),
        "device": "cpu",
        "precision": "fp32",
        "batch_size": 64,
        "verdict": "pass",
        "reason": None,
        "expected": False,
        "outputs": None,
        "gradients": None,
        "metrics": None,
        "deterministic": None,
        "timing": None,
        "diagnosis": None,
        "_batch": batch,
    }


def _stand_in(monkeypatch, with_on_checked: bool, calls: list):
    from parity.pipeline import orchestrate

    def finish(report):
        for r in report["results"]:
            r["timing"] = {"batches": {"1": r.pop("_batch")}, "train_step": None, "first_result": None}
        report["stage_seconds"] = {"verify": 0.1, "export": 2.0, "check": 1.5, "bench": 3.3}
        return report

    def check(workspace, names, options, progress=lambda m: None, on_checked=None, pool=None):
        if pool is not None:  # the pool the caller started early is the run's to close
            pool.close()
        report = {"schema": "parity.result/2", "env": {}, "results": [_timed_result("torch")], "model_errors": []}
        progress("mlp: check torch", step=1, steps=1)
        if with_on_checked and on_checked is not None:  # otherwise: the verdicts are shown at the end
            calls.append("on_checked")
            on_checked(report)
        progress("mlp: time torch")
        return finish(report)

    monkeypatch.setattr(orchestrate, "check", check)


@pytest.mark.parametrize("with_on_checked", [True, False], ids=["on_checked", "verdicts at the end"])
def test_verdicts_print_once_and_before_the_timing(monkeypatch, with_on_checked):
    calls = []
    _stand_in(monkeypatch, with_on_checked, calls)
    result = CliRunner().invoke(cli, ["run", "--workspace", str(REPO), "--model", "mlp"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert calls == (["on_checked"] if with_on_checked else [])
    out = result.stdout
    assert out.count("model  path") == 2  # the verdict table, then the timing table: each once
    assert out.index("pass | FAIL: out of tolerance") < out.index(
        "Timing (median"
    )  # the verdict legend before the timing
    assert ("median ms" in out.splitlines()[2]) is not with_on_checked  # printed before timing: no median column
    assert "Time by stage: verify 0.1 s, export 2.0 s, check 1.5 s, bench 3.3 s; 6.9 s in all" in out
    # piped: one plain line per finished step on stderr
    assert "  mlp: check torch  (step 1 of 1, " in result.stderr
    assert "  mlp: time torch  (" in result.stderr


def test_json_to_stdout_stays_json_with_the_new_orchestrator(monkeypatch):
    _stand_in(monkeypatch, True, [])
    result = CliRunner().invoke(
        cli, ["run", "--workspace", str(REPO), "--model", "mlp", "--json", "-"], catch_exceptions=False
    )
    assert result.exit_code == 0
    assert json.loads(result.output)["stage_seconds"]["bench"] == 3.3  # nothing else printed, stderr included


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_plain_progress_is_one_line_per_finished_step():
    from parity.cli.progress import Progress

    clock, lines = Clock(), []
    with Progress("lines", clock=clock, echo=lines.append) as progress:
        progress("mlp: export torch/onnx/ort (torch.onnx)", step=1, steps=2)
        clock.now += 12.5
        progress("mlp: export tf/onnx/ort (tf2onnx)", step=2, steps=2)
        clock.now += 7.5
        progress("mlp: time torch")  # the old one-argument form too
        assert len(lines) == 2  # a step is printed once finished
        clock.now += 30
    assert lines == [
        "  mlp: export torch/onnx/ort (torch.onnx)  (step 1 of 2, 12.5 s)",
        "  mlp: export tf/onnx/ort (tf2onnx)  (step 2 of 2, 7.5 s)",
        "  mlp: time torch  (30.0 s)",
    ]


def test_live_line_counts_steps_and_estimates_the_time_left():
    from parity.cli.progress import Progress

    clock = Clock()
    progress = Progress("live-but-not-started", clock=clock)
    progress.started = clock.now
    progress("mlp: check torch", step=1, steps=4)
    assert progress.line() == "[step 1 of 4 | 0 s in all] mlp: check torch  (this step: 0 s)"
    clock.now += 10
    progress("mlp: check torch/onnx/ort", step=2, steps=4)
    clock.now += 4
    # 10 s a step: this one and 2 more to go, 4 s into this one
    assert (
        progress.line() == "[step 2 of 4 | 14 s in all | about 26 s left] mlp: check torch/onnx/ort  (this step: 4 s)"
    )
    clock.now += 80  # a long step: the estimate never counts down below the steps still to start
    assert "| about 20 s left]" in progress.line() and "(this step: 1 min 24 s)" in progress.line()
    with progress.pause():
        assert progress.message is None  # the step is closed before anything is printed
    progress("mlp: diagnose torch")  # unnumbered: its time only
    assert progress.line() == "[1 min 34 s in all] mlp: diagnose torch  (this step: 0 s)"


def test_the_orchestrator_sees_that_progress_takes_step_numbers():
    from parity.cli.progress import Progress
    from parity.pipeline import orchestrate

    accepts = getattr(orchestrate, "accepts_steps", None)
    if accepts is None:
        pytest.skip("this orchestrator does not number steps")
    assert accepts(Progress("off"))


def test_run_help_says_what_a_full_cycle_costs():
    text = " ".join(invoke("run", "--help").output.split())
    assert "about 2-3 minutes" in text and "2 cores" in text and "cold export cache" in text
