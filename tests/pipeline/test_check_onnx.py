"""``parity check-onnx``: ONNX files and folders of ONNX test-data cases checked in one session, one table, one exit
code; the cases are small graphs made with onnx.helper, their test data written with onnx.numpy_helper."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from parity.cli import cli

WEIGHTS = np.arange(12, dtype=np.float32).reshape(4, 3) / 10


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def onnx_model(batch: int | str = 2):
    """``relu(x @ w)``: a MatMul and a Relu, opset 17, x of shape (batch, 4)."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "relu_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
        [numpy_helper.from_array(WEIGHTS, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def make_case(folder: Path, shift: float = 0.0) -> Path:
    """A backend-test case folder: ``model.onnx`` and ``test_data_set_0/{input,output}_0.pb``; ``shift`` added to
    the expected output makes it wrong."""
    import onnx
    from onnx import numpy_helper

    data = folder / "test_data_set_0"
    data.mkdir(parents=True)
    onnx.save(onnx_model(), folder / "model.onnx")
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    y = np.maximum(x @ WEIGHTS, 0) + np.float32(shift)
    (data / "input_0.pb").write_bytes(numpy_helper.from_array(x, "x").SerializeToString())
    (data / "output_0.pb").write_bytes(numpy_helper.from_array(y.astype(np.float32), "y").SerializeToString())
    return folder


@pytest.fixture(scope="module")
def two_cases(tmp_path_factory):
    """A folder of two cases, one passing and one whose expected output is wrong, checked in one ``check-onnx``
    (counting the worker pools the session makes): its output, JSON, JUnit XML and pool count."""
    from parity.run.pool import WorkerPool

    root = tmp_path_factory.mktemp("check_onnx")
    make_case(root / "cases" / "good")
    make_case(root / "cases" / "wrong_output", shift=0.5)
    pools = []
    original = WorkerPool.__init__

    def counted(self, *args, **kwargs):
        pools.append(self)
        original(self, *args, **kwargs)

    WorkerPool.__init__ = counted
    try:
        result = invoke("check-onnx", root / "cases", "--json", root / "r.json", "--junit-xml", root / "j.xml")
    finally:
        WorkerPool.__init__ = original
    return result, json.loads((root / "r.json").read_text()), ET.parse(root / "j.xml").getroot(), len(pools)


def test_a_passing_case_and_a_wrong_expected_output_in_one_table(two_cases):
    result = two_cases[0]
    assert result.exit_code == 1, result.output
    rows = {
        line.split()[0]: line.split()
        for line in result.output.splitlines()
        if line.startswith(("good ", "wrong_output "))
    }
    assert rows["good"][1:3] == ["onnx/ort", "pass"]
    assert rows["wrong_output"][1:3] == ["onnx/ort", "FAIL"] and "output y: max_abs 0.5" in result.output
    assert result.stdout.splitlines()[0].split() == ["case", "path", "verdict", "reason", "seconds"]
    assert "2 cases (0 refused); paths: 1 FAIL, 1 pass" in result.output


def test_the_json_holds_every_case_and_each_paths_check_seconds(two_cases):
    _, report, _, _ = two_cases
    verdicts = {r["model"]: r["verdict"] for r in report["results"]}
    assert verdicts == {"good": "pass", "wrong_output": "fail"}
    assert all(r["check_s"] > 0 for r in report["results"])
    assert [c["label"] for c in report["cases"]] == ["good", "wrong_output"]
    assert all(c["test_data"] and c["error"] is None and c["seconds"] > 0 for c in report["cases"])
    assert report["env"]["packages"]["onnxruntime"]


def test_the_cases_share_one_worker_pool(two_cases):
    """init, golden build and check of every case in one pool: not three pools (three worker starts) per case."""
    _, _, _, pools = two_cases
    assert pools == 1


def test_junit_xml_of_check_onnx_has_a_testcase_per_case_and_path(two_cases):
    _, _, junit, _ = two_cases
    suite = junit.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("2", "1", "0")
    cases = {case.get("classname"): case for case in suite.iter("testcase")}
    assert cases["good"].get("name") == "onnx/ort" and not list(cases["good"])
    failure = cases["wrong_output"].find("failure")
    assert "output y: max_abs 0.5" in failure.get("message") and "Diagnosis wrong_output onnx/ort" in failure.text


def test_all_passing_exits_0_and_a_single_file_is_a_case(tmp_path):
    case = make_case(tmp_path / "one")
    result = invoke("check-onnx", case / "model.onnx", "--path", "onnx/ort", "--path", "onnx/onnx*")
    assert result.exit_code == 0, result.output
    paths = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("one ")]
    assert paths == ["onnx/ort", "onnx/onnxref"]  # --path globs as elsewhere


def test_a_folder_that_does_not_exist_is_an_input_error(tmp_path):
    result = invoke("check-onnx", tmp_path / "missing")
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {tmp_path / 'missing'}: no such file or folder"


def test_a_folder_without_onnx_files_or_a_file_that_is_no_onnx_is_an_input_error(tmp_path):
    (tmp_path / "empty" / "test_data_set_0").mkdir(parents=True)
    result = invoke("check-onnx", tmp_path / "empty")
    assert result.exit_code == 2 and "no ONNX file" in result.output and len(result.output.splitlines()) == 1
    (tmp_path / "notes.txt").write_text("x")
    result = invoke("check-onnx", tmp_path / "notes.txt")
    assert result.exit_code == 2 and "not an ONNX file" in result.output


def test_a_case_refused_at_init_is_its_error_and_the_next_case_is_checked(tmp_path):
    """A graph whose batch axis is dynamic, without test data, has no shape to feed: that case's error (the step
    and the reason), not the session's end."""
    import onnx

    make_case(tmp_path / "cases" / "good")
    (tmp_path / "cases" / "dynamic").mkdir()
    onnx.save(onnx_model(batch="N"), tmp_path / "cases" / "dynamic" / "dynamic.onnx")
    result = invoke("check-onnx", tmp_path / "cases", "--json", tmp_path / "r.json")
    assert result.exit_code == 1, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    (refused,) = report["model_errors"]
    assert refused["model"] == "dynamic" and refused["reason"].startswith("init: ") and "dynamic" in refused["reason"]
    assert [r["verdict"] for r in report["results"]] == ["pass"]
    assert "dynamic.onnx  -         ERROR    init:" in result.output


def test_a_named_workspace_keeps_each_case_for_parity_check(tmp_path):
    make_case(tmp_path / "cases" / "kept")
    workspace = tmp_path / "ws"
    assert invoke("check-onnx", tmp_path / "cases", "--workspace", workspace).exit_code == 0
    assert (workspace / "models" / "kept.py").is_file() and (workspace / "golden" / "kept").is_dir()
    again = invoke("check-onnx", tmp_path / "cases", "--workspace", workspace)
    assert again.exit_code == 1 and "pass --force" in " ".join(
        again.output.split()
    )  # the spec written before is not replaced silently
    assert invoke("check-onnx", tmp_path / "cases", "--workspace", workspace, "--force").exit_code == 0
    assert (
        invoke("check", "--workspace", workspace, "--model", "kept", "--path", "onnx/ort", "--no-store").exit_code == 0
    )


def test_case_names_are_model_names_and_unique(tmp_path):
    from parity.pipeline.check_onnx import find_cases

    make_case(tmp_path / "a" / "3d-conv")
    make_case(tmp_path / "b" / "3d-conv")
    cases = find_cases([tmp_path / "a", tmp_path / "b"])
    assert [(c.name, c.label) for c in cases] == [("m_3d_conv", "3d-conv"), ("m_3d_conv_2", "3d-conv")]
    assert all(c.test_data == c.model.parent for c in cases)


def test_check_onnx_has_help_with_an_example():
    result = invoke("check-onnx", "--help")
    assert result.exit_code == 0 and "Example:" in result.output and "--junit-xml" in result.output


def test_a_path_pattern_no_onnx_file_has_is_an_input_error_before_any_case(tmp_path):
    make_case(tmp_path / "cases" / "good")
    result = invoke("check-onnx", tmp_path / "cases", "--path", "torch/*")
    assert result.exit_code == 2 and "matches no path of an ONNX file" in result.output
    assert "good: init" not in result.output
