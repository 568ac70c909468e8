"""``--junit-xml`` on ``check`` and ``run``: one testcase per model and path, failures with their reason and first
divergent layer, errors, skips, the check's seconds and parity's version; the file parses and its counts add up."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from click.testing import CliRunner

from parity import __version__
from parity.cli import cli
from parity.report import junit
from tests.conftest import mlp_variant


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def suite_of(path):
    """The file's one ``<testsuite>`` (parsed: the file is well-formed XML) and its testcases by name."""
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    return suite, {case.get("name"): case for case in suite.findall("testcase")}


def test_check_writes_a_failure_with_its_first_divergent_layer_and_a_skip(workspace_copy, tmp_path):
    """torch drifts from the golden at relu1 (a LeakyReLU where the golden has a ReLU): a failure naming relu1;
    torch/litert is not available here: skipped with the reason."""
    root = workspace_copy(mlp_variant({"self.relu1 = nn.ReLU()": "self.relu1 = nn.LeakyReLU(0.01)"}))
    out = tmp_path / "junit.xml"
    result = invoke(
        "check", "--workspace", root, "--path", "torch", "--path", "torch/litert", "--no-store", "--junit-xml", out
    )
    assert result.exit_code == 1, result.output
    suite, cases = suite_of(out)
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        "2",
        "1",
        "0",
        "1",
    )
    assert {case.get("classname") for case in cases.values()} == {"mlp"}
    failure = cases["torch"].find("failure")
    assert "output logits" in failure.get("message")
    assert "first divergent layer: relu1" in failure.text and "Diagnosis mlp torch" in failure.text
    assert float(cases["torch"].get("time")) > 0
    assert cases["torch/litert"].find("skipped").get("message")
    properties = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert properties["parity.version"] == __version__ and properties["package.torch"]
    assert f"wrote {out}" in result.output


def test_run_writes_a_passing_testcase(workspace_copy, tmp_path):
    root = workspace_copy()
    out = tmp_path / "junit.xml"
    result = invoke(
        "run",
        "--workspace",
        root,
        "--path",
        "torch/onnx/ort",
        "--no-store",
        "--budget",
        "0.05",
        "--min-runs",
        "3",
        "--junit-xml",
        out,
    )
    assert result.exit_code == 0, result.output
    suite, cases = suite_of(out)
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        "1",
        "0",
        "0",
        "0",
    )
    assert list(cases["torch/onnx/ort"]) == [] and float(cases["torch/onnx/ort"].get("time")) > 0


def test_an_unwritable_junit_target_is_refused_before_the_run(workspace_copy, tmp_path):
    root = workspace_copy()
    result = invoke(
        "check", "--workspace", root, "--path", "torch", "--no-store", "--junit-xml", tmp_path / "missing" / "junit.xml"
    )
    assert result.exit_code == 2 and "--junit-xml: folder" in result.output and "does not exist" in result.output
    assert "check torch" not in result.output


def result(path="onnx/ort", verdict="pass", **fields) -> dict:
    return {
        "model": "m",
        "path": path,
        "device": "cpu",
        "precision": "fp32",
        "verdict": verdict,
        "reason": None,
        "check_s": 0.5,
        **fields,
    }


def test_each_verdict_maps_to_its_junit_element_and_the_counts_add_up(tmp_path):
    """Errors, expected errors, unexpected passes, model errors, a device and precision in the name, a control
    character in a converter's message: the file still parses and says each."""
    report = {
        "env": {"packages": {"parity": __version__}},
        "results": [
            result(),
            result(
                "torch/onnx/ort",
                "fail",
                reason="output y: max_abs 1",
                diagnosis={
                    "first_divergent_path": ["encoder", "layer", "1"],
                    "first_divergent_tap": "encoder",
                    "taps": [],
                    "tolerance": {"atol": 1e-5, "rtol": 1e-4},
                },
            ),
            result("tf/onnx/ort", "error", reason="tf2onnx: Erfc is not supported\x1b[0m"),
            result("jax/tf/onnx/ort", "error", reason="XlaCallModule", expected=True, expected_reason="known"),
            result("jax", "pass", unexpected_pass=True, expected_reason="known"),
            result("torch", "skip", reason="no GPU", device="cuda:0", precision="fp16"),
        ],
        "model_errors": [{"model": "broken", "reason": "init: not an ONNX model"}],
    }
    out = junit.write(report, tmp_path / "j.xml")
    suite, cases = suite_of(out)
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        "7",
        "2",
        "2",
        "2",
    )
    assert list(cases["onnx/ort"]) == []
    assert "first divergent layer: encoder › layer › 1" in cases["torch/onnx/ort"].find("failure").text
    assert cases["tf/onnx/ort"].find("error").get("message").startswith("tf2onnx: Erfc is not supported")
    assert cases["jax/tf/onnx/ort"].find("skipped").get("message") == "expected error: XlaCallModule"
    assert "but passed" in cases["jax"].find("failure").get("message")
    assert cases["torch[cuda:0-fp16]"].find("skipped").get("message") == "no GPU"
    assert cases["model"].get("classname") == "broken" and cases["model"].find("error") is not None
    assert float(suite.get("time")) == 3.0
