"""The descent into a torch model's own tree: nested models as users bring them (tests/nestedmodels.py), each with one
leaf layer that computes something else in the export only, through init -> golden build -> check -> repro; the
leaf is named as the first divergent path, its cause tested, and the reproducer cut at its boundary. Passing paths
show no divergence at any level."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from parity.cli import cli
from parity.diagnose.descend import display
from parity.diagnose.tree import torch_tree
from tests.conftest import REPO, failing_export

NESTED = REPO / "tests" / "nestedmodels.py"


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _checked(root, name, factory, *inputs):
    """init, golden build, check torch (passing) and torch/onnx/ort (failing): the latter's diagnosis."""
    return failing_export(root, name, ["--torch", f"{NESTED}:{factory}", *[a for d in inputs for a in ("--input", d)]])[
        0
    ]


def _repro_nodes(root, name, out) -> int:
    result = _invoke("repro", "--workspace", root, "--model", name, "--path", "torch/onnx/ort", "--out", out)
    assert result.exit_code == 0, result.output
    import onnx

    return len(onnx.load(str(out / "model.onnx")).graph.node)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("nested")


@pytest.fixture(scope="module")
def stack(root):
    """The residual stack through init, golden build and check (in each test worker that needs it): its diagnosis."""
    return _checked(root, "stack", "make_residual_stack", "x=2x16")


def test_children_are_the_modules_a_scope_calls_through_holders_never_called_and_shared_ones_are_counted():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(4, 8)
            self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])  # never called itself
            self.unused = nn.Linear(8, 8)  # never called at all
            self.shared = nn.Tanh()

        def forward(self, x):
            x = self.shared(self.embed(x))
            for layer in self.layers:
                x = layer(x)
            return self.shared(x), x.sum()

    net = Net().eval()
    x = torch.randn(2, 4)
    found = torch_tree.level(net, lambda: net(x), "")
    paths = [c["path"] for c in found["children"]]
    assert paths == ["embed", "shared", "layers.0", "layers.1", "layers.2"]  # call order; unused left out
    by_path = {c["path"]: c for c in found["children"]}
    assert by_path["shared"]["calls"] == 2 and by_path["layers.1"]["calls"] == 1
    assert by_path["layers.0"]["kind"] == "dense" and by_path["layers.0"]["leaf"]
    with torch.no_grad():
        first = torch.tanh(net.embed(x))  # the shared module is compared at its first call
    np.testing.assert_allclose(found["values"]["shared"], first.numpy(), rtol=1e-6)
    np.testing.assert_allclose(found["inputs"]["layers.0"], first.numpy(), rtol=1e-6)
    assert display(["layers.1", "layers.1.norm"]) == "layers.1 › norm"
    assert display(["features", "features.1", "features.1.3"]) == "features › features.1 › features.1.3"


def test_a_residual_stack_is_descended_to_the_faulty_norm_of_block_5(root, stack, tmp_path):
    diagnosis = stack
    assert diagnosis["first_divergent_path"] == ["blocks", "blocks.5", "blocks.5.norm"]
    assert diagnosis["cause"]["tap"] == "blocks.5.norm" and diagnosis["cause"]["variant"] == "eps_fitted"
    assert "epsilon 0.1" in diagnosis["cause"]["description"]
    leaf = diagnosis["tree"]["leaf"]
    assert [op for _, op in leaf["nodes"]] == ["LayerNormalization"] and leaf["input_tensor"]
    # the taps collection and the descent, in one worker, read the graph from one instrumented run: the plain run's
    # outputs are the check's own
    assert diagnosis["tree"]["raw_tensors"]["graph_runs"] == 1
    for level in diagnosis["tree"]["levels"]:  # every child before the divergent one agrees, and so does its input
        index = [r["tap"] for r in level["rows"]].index(level["first_divergent"])
        assert all(r["stats"]["ok"] for r in level["rows"][:index] if r["stats"])
        assert level["rows"][index]["input"]["ok"]
    assert _repro_nodes(root, "stack", tmp_path / "repro") <= 12


def test_a_skipped_module_is_not_observed_and_the_next_one_is_not_blamed_for_what_it_reads(root, stack, tmp_path):
    spec = root / "models" / "stack.py"
    original = spec.read_text()
    spec.write_text(original.replace("    taps=", "    tree_skip=('blocks.5',),\n    taps=", 1))
    try:
        out = tmp_path / "d.json"
        _invoke("diagnose", "--workspace", root, "--model", "stack", "--path", "torch/onnx/ort", "--json", out)
        diagnosis = json.loads(out.read_text())["results"][0]["diagnosis"]
    finally:
        spec.write_text(original)
    assert "blocks.5" not in [r["tap"] for r in diagnosis["tree"]["levels"][1]["rows"]]
    assert diagnosis["first_divergent_path"] == ["blocks"] and diagnosis["tree"]["verdict"] == "own_operations"
    assert "blocks.6 reads an input that already departs" in diagnosis["tree"]["note"]
    assert diagnosis["cause"] is None


def test_the_runtime_link_is_judged_on_the_leaf_nodes(stack):
    runtime = next(c for c in stack["links"]["checks"] if c["link"] == "runtime")
    assert runtime["ok"] and "1 node(s) of the module where the drift begins" in runtime["compared"]
    assert stack["links"]["enters_at"] == "converter"


@pytest.mark.slow
def test_a_sum_pool_in_the_second_stage_is_named_with_its_dropped_divisor(root, tmp_path):
    diagnosis = _checked(root, "stages", "make_cnn_stages", "x=2x3x16x16")
    assert diagnosis["first_divergent_path"] == ["features", "features.1", "features.1.3"]
    assert diagnosis["cause"]["variant"] == "divisor_dropped"
    assert _repro_nodes(root, "stages", tmp_path / "repro") <= 12


def test_a_passing_path_shows_no_divergence_at_any_level(root, stack, tmp_path):
    out = tmp_path / "d.json"
    result = _invoke("diagnose", "--workspace", root, "--model", "stack", "--path", "torch", "--json", out)
    diagnosis = json.loads(out.read_text())["results"][0]["diagnosis"]
    assert diagnosis["first_divergent_path"] == [] and diagnosis["cause"] is None
    assert all(level["first_divergent"] is None for level in diagnosis["tree"]["levels"])
    assert "first divergent path: none" in result.output


@pytest.mark.slow
@pytest.mark.parametrize(
    "factory, inputs, trail, variant",
    [
        (
            "make_faulty_distilbert",
            ("input_ids=2x16:int64", "attention_mask=2x16:int64"),
            "transformer › layer.1 › output_layer_norm",
            "eps=",
        ),
        ("make_faulty_vit", ("pixel_values=2x3x16x16",), "layers.2 › layernorm_before", "no_bias"),
        (
            "make_faulty_bert",
            ("input_ids=2x16:int64", "attention_mask=2x16:int64"),
            "encoder › layer.1 › intermediate › intermediate_act_fn",
            "gelu_tanh",
        ),
        ("make_faulty_gpt2", ("input_ids=2x16:int64", "attention_mask=2x16:int64"), "h.1 › mlp › act", "gelu_erf"),
    ],
)
def test_transformers_are_descended_to_their_faulty_leaf(root, tmp_path, factory, inputs, trail, variant):
    name = factory.removeprefix("make_faulty_")
    diagnosis = _checked(root, name, factory, *inputs)
    assert display(diagnosis["first_divergent_path"]) == trail
    assert diagnosis["cause"]["variant"].startswith(variant), diagnosis["cause_test"]
    # a tap of the spec after the divergence is not named: it computes what it is given
    assert diagnosis["first_divergent_tap"] in (None, diagnosis["first_divergent_path"][0])
    assert _repro_nodes(root, name, tmp_path / "repro") <= 12
