"""Precision repair: a float16 path that fails where its float32 twin passes gets the smallest set of nodes to keep
in float32 (or the converter option) that makes it pass, tested, in the toolchain's form."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from parity.cli import cli
from tests.conftest import REPO

BUGS = REPO / "tests" / "converterbugs.py"


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _fp16_diagnosis(root, name, factory):
    assert _invoke("init", name, "--workspace", root, "--torch", f"{BUGS}:{factory}", "--input", "x=4x8").exit_code == 0
    assert _invoke("golden", "build", "--workspace", root, "--model", name).exit_code == 0
    checks = {}
    for precision in ("fp32", "fp16"):
        result = _invoke("check", "--workspace", root, "--model", name, "--path", "torch/onnx/ort",
                         "--precision", precision, "--json", "-")
        checks[precision] = json.loads(result.output[result.output.index("{"):])["results"][0]
    assert checks["fp32"]["verdict"] == "pass" and checks["fp16"]["verdict"] == "fail"
    return checks["fp16"]["diagnosis"]["repair"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("fp16")


def test_a_constant_float16_cannot_hold_is_kept_in_float32_and_the_list_is_minimal(root):
    from onnxconverter_common import float16  # noqa: F401 - the converter the repair speaks for

    repair = _fp16_diagnosis(root, "offsets", "make_fp16_offsets")
    assert repair["passes"] and repair["minimal"] and repair["op_types"] == {"Add": 1}
    assert len(repair["node_block_list"]) == 1 and repair["after"]["tol_units"] <= 1 < repair["before"]["tol_units"]
    assert f"node_block_list={repair['node_block_list']!r}" in repair["toolchain"]["onnxconverter_common"]
    assert repair["toolchain"]["tensorrt"]["layers_in_float32"] == repair["node_block_list"]


def test_weights_the_converter_clips_are_named_with_the_option_that_passes(root):
    repair = _fp16_diagnosis(root, "clipped", "make_fp16_clipped_weights")
    assert repair["passes"] and repair["node_block_list"] == []
    assert repair["converter"]["clipped_weights"] > 0 and repair["converter"]["option"] == "max_finite_val=65504"
    assert repair["converter"]["passes"]


def test_keeping_a_node_in_float32_keeps_its_weights_in_float32():
    import numpy as np
    import onnxruntime as ort
    from onnx import helper, numpy_helper
    from onnxconverter_common import float16

    from parity.diagnose.precision_repair import keep_weights

    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    nodes = [helper.make_node("Add", ["x", "a"], ["s"], name="shift"),
             helper.make_node("Add", ["s", "b"], ["y"], name="unshift")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [4, 8])],
                              [helper.make_tensor_value_info("y", 1, [4, 8])],
                              initializer=[numpy_helper.from_array(np.array(1000.3, np.float32), "a"),
                                           numpy_helper.from_array(np.array(-1000.0, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8

    def error(block):
        converted = keep_weights(float16.convert_float_to_float16(model, keep_io_types=True, node_block_list=block),
                                 model, block)
        y = ort.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        return float(np.abs(y[0] - (x.astype(np.float64) + 0.3)).max())

    assert error([]) > 0.1 and error(["shift"]) < 1e-3
