"""Diagnosis on real divergences of the installed exporters and runtimes (no edited graphs): users' torch models
(tests/converterbugs.py) through init -> golden build -> check, each failing path diagnosed to the right node, link
and cause, with the instrumentation effect of ONNX Runtime's optimiser caught."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from parity.cli import cli
from tests.conftest import REPO, failing_export

BUGS = REPO / "tests" / "converterbugs.py"


def _invoke(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    return result


def _diagnosed(root, name, factory, input_decl, path, edit=None):
    return failing_export(root, name, ["--torch", f"{BUGS}:{factory}", "--input", input_decl], path, edit)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("bugs")


def test_an_optimiser_fusion_that_overflows_is_named_with_its_level_nodes_and_a_tested_fix(root):
    diagnosis, _ = _diagnosed(root, "scores", "make_prescaled_scores", "x=2x5x16", "torch/onnx/ort")
    effect = diagnosis["optimiser"]
    assert effect["passes_at"] == "ORT_ENABLE_BASIC" and effect["appears_at"] == "ORT_ENABLE_EXTENDED"
    assert {op for _, op in effect["rewritten"]["removed"]} >= {"Mul", "MatMul"}
    assert [op for _, op in effect["rewritten"]["added"]] == ["FusedMatMul"]
    assert any(t["name"] == "MatMulScaleFusion" and t["passes"] for t in effect["optimisations"])
    assert diagnosis["links"]["enters_at"] == "runtime"
    cause = diagnosis["node_cause"]
    assert cause["cause"] == "optimiser_rewrite" and cause["trusted"] == "ort-noopt"
    assert "disabled_optimizers=['MatMulScaleFusion']" in cause["fix"]


def test_a_failure_that_vanishes_when_a_tap_is_read_is_bisected_to_the_tap_that_disturbs(root):
    diagnosis, text = _diagnosed(root, "cscale", "make_conv_scale", "x=2x3x6x6", "torch/onnx/ort")
    seen = diagnosis["instrumentation"]
    assert [d["tap"] for d in seen["disturbing"]] == ["conv"]
    assert set(seen["observable"]) == {"pre", "post", "act", "out"}
    rows = {r["tap"]: r for r in diagnosis["taps"]}
    assert rows["conv"]["found"] == "unobservable" and rows["conv"]["stats"] is None
    assert any(t["name"] == "ConvMulFusion" and t["passes"] for t in diagnosis["optimiser"]["optimisations"])
    assert diagnosis["links"]["enters_at"] == "runtime"
    assert "unobservable: conv" in " ".join(text.split())


def test_log_of_an_underflowing_sigmoid_is_pinned_on_the_sigmoid_and_blamed_on_the_converter(root):
    diagnosis, _ = _diagnosed(root, "logsig", "make_logsigmoid", "x=2x8", "torch/onnx/ort")
    cause = diagnosis["node_cause"]
    assert cause["cause"] == "float32_rounding" and cause["op_type"] == "Sigmoid"
    assert cause["consumer"]["op_type"] == "Log" and cause["fix_tested"]
    runtime = next(c for c in diagnosis["links"]["checks"] if c["link"] == "runtime")
    assert runtime["ok"] and runtime["third_opinion"]["follows_spec"] in ("both", "ort")
    assert diagnosis["links"]["enters_at"] == "converter"
    assert diagnosis["first_divergent_tap"] == "act"


def test_a_version_converted_softmax_is_the_converter_not_onnx_runtime(root, tmp_path):
    from tests.converterbugs import softmax_tokens_onnx

    softmax_tokens_onnx(str(tmp_path / "softmax18.onnx"))
    assert (
        _invoke("init", "smax", "--workspace", root, "--onnx", tmp_path / "softmax18.onnx", "--opset", "11").exit_code
        == 0
    )
    assert _invoke("golden", "build", "--workspace", root, "--model", "smax").exit_code == 0
    result = _invoke("check", "--workspace", root, "--model", "smax", "--path", "onnx/ort", "--json", "-")
    diagnosis = json.loads(result.output[result.output.index("{") :])["results"][0]["diagnosis"]
    runtime = next(c for c in diagnosis["links"]["checks"] if c["link"] == "runtime")
    # onnx.reference normalises over axis 1 alone below opset 13; the spec (and ONNX Runtime) over axes 1 and 2
    assert runtime["third_opinion"]["follows_spec"] == "ort" and runtime["ok"]
    assert diagnosis["links"]["enters_at"] == "converter"
    assert "onnx.version_converter" in diagnosis["links"]["explanation"]
    cause = diagnosis["node_cause"]
    assert cause["cause"] == "opset_axis" and cause["op_type"] == "Softmax" and cause["fix_tested"]


@pytest.mark.slow  # a second proof of a converter's departure named by the tested cause of a layer init typed; the
# fast set keeps test_leaf_causes.py::test_a_fully_masked_attention_row_that_attends_uniformly_is_named_at_its_leaf
def test_a_dropped_pool_attribute_is_the_converter_and_the_tested_cause(root):
    diagnosis, _ = _diagnosed(root, "pool", "make_pool_divisor", "x=2x3x6x6", "torch/onnx/ort")
    assert diagnosis["first_divergent_tap"] == "pool"
    assert diagnosis["links"]["enters_at"] == "converter"
    assert diagnosis["node_cause"] is None and diagnosis["optimiser"] is None
    # init typed the pool (with its divisor): the dropped attribute is the tested cause
    assert diagnosis["cause"]["variant"] == "divisor_dropped" and diagnosis["cause"]["after"]["tol_units"] <= 1


def test_third_opinion_on_a_handmade_softmax_below_opset_13():
    from onnx import TensorProto, helper

    from parity.diagnose.graph import onnx_ops
    from parity.model.spec import Tolerance

    node = helper.make_node("Softmax", ["x"], ["y"], axis=1, name="sm")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    flat = np.exp(x.reshape(2, 12)) / np.exp(x.reshape(2, 12)).sum(1, keepdims=True)
    one_axis = np.exp(x) / np.exp(x).sum(1, keepdims=True)
    values = {"ort": {"x": x, "y": flat.reshape(x.shape)}, "onnxref": {"x": x, "y": one_axis}}
    opinion = onnx_ops.third_opinion(model, node, values, Tolerance(1e-5, 1e-5))
    assert opinion["follows_spec"] == "ort" and opinion["evaluator"] == onnx_ops.NUMPY
    # at opset 13 the same values make the other runtime the one that follows
    model.opset_import[0].version = 13
    assert onnx_ops.third_opinion(model, node, values, Tolerance(1e-5, 1e-5))["follows_spec"] == "onnxref"


def test_bisection_keeps_every_tap_that_does_not_disturb_and_counts_its_runs():
    from parity.diagnose.graph import instrument
    from parity.model.spec import Tolerance

    plain = {"y": np.array([1.0, np.inf])}

    def run(names):  # marking "t3" or "t6" changes the output, as a fusion stopped by an output would
        disturbed = {"t3", "t6"} & set(names)
        return {**{n: np.zeros(1) for n in names}, "y": np.array([1.5, 2.0]) if disturbed else plain["y"].copy()}

    taps = {f"tap{i}": f"t{i}" for i in range(8)}
    seen = instrument.observe(run, plain, taps, lambda name: Tolerance(1e-6, 1e-6))
    assert [d["tap"] for d in seen["disturbing"]] == ["tap3", "tap6"]
    assert seen["observable"] == [f"tap{i}" for i in (0, 1, 2, 4, 5, 7)]
    assert seen["runs"] < 2 * len(taps) and set(seen["values"]) >= {"t0", "t7"}


def test_a_failure_on_the_eval_split_only_is_diagnosed_on_the_eval_samples_that_fail(workspace_copy):
    from tests.conftest import mlp_variant

    # the export clamps the first hidden layer at 4: no sample of the fixed set reaches it, four eval samples do
    root = workspace_copy(
        mlp_variant(
            {
                "    from torch import nn\n": "    import torch\n    from torch import nn\n",
                "return self.logits(self.relu2(self.dense2(self.relu1(self.dense1(x)))))": "h = self.relu1(self.dense1(x))\n"
                "            if torch.onnx.is_in_onnx_export():\n"
                "                h = torch.clamp(h, max=4.0)\n"
                "            return self.logits(self.relu2(self.dense2(h)))",
            }
        )
    )
    result = _invoke("check", "--workspace", root, "--path", "torch/onnx/ort", "--json", "-")
    checked = json.loads(result.output[result.output.index("{") :])["results"][0]
    assert checked["verdict"] == "fail" and all(s["ok"] for s in checked["outputs"].values())
    diagnosis = checked["diagnosis"]
    assert diagnosis["split"]["name"] == "eval" and 1 <= len(set(diagnosis["split"]["rows"])) <= 10
    assert diagnosis["first_divergent_tap"] == "relu1"  # the clamp follows the ReLU inside the exported graph
    assert diagnosis["links"]["enters_at"] == "converter"
    assert "fails on the eval split only" in diagnosis["notes"][0]


def test_a_gradient_only_failure_gets_a_backward_chain_naming_the_stopped_gradient(workspace_copy):
    from tests.conftest import mlp_variant

    root = workspace_copy(
        mlp_variant(
            {
                "self.relu2(self.dense2(self.relu1(self.dense1(x))))": "self.relu2(self.dense2(self.relu1(self.dense1(x)))).detach()"
            }
        )
    )
    result = _invoke("check", "--workspace", root, "--path", "torch", "--json", "-")
    checked = json.loads(result.output[result.output.index("{") :])["results"][0]
    assert checked["verdict"] == "fail" and all(s["ok"] for s in checked["outputs"].values())
    gradients = checked["diagnosis"]["gradients"]
    assert checked["diagnosis"]["first_divergent_tap"] is None
    assert gradients["first_departing_param"] == "dense2/bias" and "stopped gradient" in gradients["note"]
    assert set(gradients["stopped"]) == {"dense2/bias", "dense2/kernel", "dense1/bias", "dense1/kernel", "input:x"}
