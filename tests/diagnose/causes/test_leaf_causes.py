"""Tested causes at the leaf of the descent: users' nested torch models (tests/leafcauses.py), each diverging at one
leaf layer on torch/onnx/ort, through init -> golden build -> check; the diagnosis ends its first divergent path at
that leaf and names the variant that reproduces what the path computed there (a softplus threshold lost, a
log-softmax computed as the log of a float32 softmax, a fully masked attention row that attends uniformly, a resize
coordinate mode). A float64 product removed by torch.onnx's own optimiser is located at its (untyped) leaf, and
ONNX Runtime's optimiser is not blamed for it."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from parity.cli import cli
from parity.diagnose.causes.layers import NotApplicable, get
from parity.model.layer_types import torch_layer
from tests.conftest import REPO, failing_export

LEAVES = REPO / "tests" / "leafcauses.py"


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _checked(root, name, factory, *inputs, data=None):
    """init, golden build, check torch (passing) and torch/onnx/ort (failing): the latter's diagnosis."""
    given = ["--inputs", data] if data else []
    return failing_export(
        root, name, ["--torch", f"{LEAVES}:{factory}", *given, *[a for decl in inputs for a in ("--input", decl)]]
    )[0]


def _cause(diagnosis):
    return (diagnosis["cause"] or {}).get("variant") or (diagnosis.get("cause_test") or {}).get("explanation")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("leaves")


@pytest.mark.slow  # a second proof of a tested cause named at the leaf of a user's nested torch model; the fast set
# keeps test_a_fully_masked_attention_row_that_attends_uniformly_is_named_at_its_leaf (softplus' variants:
# test_the_new_kinds_match_torch_and_their_variants_differ)
def test_a_softplus_exported_without_its_threshold_is_named_at_its_leaf(root):
    diagnosis = _checked(root, "softplus", "make_softplus_decoder", "x=2x16")
    assert diagnosis["first_divergent_path"] == ["decoder", "decoder.1", "decoder.1.act"]
    assert _cause(diagnosis) == "softplus_no_threshold"
    assert diagnosis["cause_test"]["attrs"] == {"form": "softplus", "beta": 2.0, "threshold": 1.0}


@pytest.mark.slow
def test_a_log_softmax_computed_as_the_log_of_a_float32_softmax_is_named_at_its_leaf(root):
    diagnosis = _checked(root, "logsoftmax", "make_log_softmax_classifier", "x=2x16")
    assert diagnosis["first_divergent_path"] == ["head", "head.3"]
    assert _cause(diagnosis) == "log_of_softmax"
    assert diagnosis["cause_test"]["kind"] == "softmax"
    assert diagnosis["cause_test"]["attrs"] == {"axis": 1, "log": True}


def test_a_fully_masked_attention_row_that_attends_uniformly_is_named_at_its_leaf(root, tmp_path):
    rng = np.random.default_rng(0)
    mask = np.ones((2, 5), np.int64)
    mask[0, 3:] = 0  # a padded sequence
    mask[1] = 0  # an empty one: torch gives NaN for its rows
    data = tmp_path / "tokens.npz"
    np.savez(data, x=rng.standard_normal((2, 5, 8)).astype(np.float32), attention_mask=mask)
    diagnosis = _checked(root, "masked", "make_masked_encoder", data=data)
    assert diagnosis["first_divergent_path"] == ["encoder", "encoder.attn"]
    assert _cause(diagnosis) == "masked_row_uniform"
    assert diagnosis["cause_test"]["attrs"]["masked_rows"] == "nan"
    assert diagnosis["cause_test"]["attrs"]["key_padding"] is True


@pytest.mark.slow
def test_a_resize_exported_with_align_corners_is_named_in_its_decoder_block(root):
    diagnosis = _checked(root, "upsample", "make_upsample_decoder", "x=2x3x8x8")
    assert diagnosis["first_divergent_path"] == ["decoder", "decoder.0", "decoder.0.up"]
    assert _cause(diagnosis) == "coordinates_align_corners"


@pytest.mark.slow
def test_a_float64_product_dropped_by_the_exporters_optimiser_is_located_and_not_blamed_on_the_runtime(root):
    """torch.onnx's optimiser (not ONNX Runtime's) removes the Mul: the descent ends at the module holding it, which
    the catalogue does not type, so no cause is named there; ONNX Runtime fails at every optimisation level."""
    import torch

    from tests.leafcauses import make_pre_emphasis

    diagnosis = _checked(root, "emphasis", "make_pre_emphasis", "x=2x32")
    assert diagnosis["first_divergent_path"] == ["frontend", "frontend.1"]
    assert diagnosis["cause"] is None and diagnosis["cause_test"]["kind"] is None
    assert not diagnosis.get("optimiser")
    net, x = make_pre_emphasis(), torch.randn(2, 32)
    for optimize, kept in ((True, False), (False, True)):
        graph = torch.onnx.export(net, (x,), dynamo=True, optimize=optimize).model_proto.graph
        assert any(n.op_type == "Mul" and "coefficient" in "".join(n.input) for n in graph.node) is kept


def test_the_new_kinds_match_torch_and_their_variants_differ():
    import torch
    from torch import nn

    x = torch.randn(3, 4, 5, dtype=torch.float64) * 40  # wide: a float32 softmax underflows somewhere
    for module in (
        nn.Softplus(),
        nn.Softplus(beta=2, threshold=1),
        nn.Softplus(0.5, 3),
        nn.Softmax(dim=1),
        nn.LogSoftmax(dim=-1),
        nn.LogSoftmax(dim=0),
    ):
        kind, attrs = torch_layer(module)
        declared = get(kind).forward([x.numpy()], {}, attrs)
        assert np.allclose(declared, module(x).numpy(), rtol=0, atol=1e-12), module
        for variant in get(kind).variants(attrs):
            try:
                value = variant.compute([x.numpy()], {}, attrs, None)
            except NotApplicable:
                continue
            assert not np.allclose(value, declared, rtol=1e-6, atol=1e-6), (module, variant.name)
    assert torch_layer(nn.Softmax()) is None  # torch's implicit dim depends on the rank: not typed


def test_a_softmax_in_the_meaning_of_opsets_before_13_is_named_on_onnx_runtime():
    """ONNX Runtime running an opset-11 ``Softmax(axis=1)`` on a 3-D input normalises over axes 1 and 2 flattened
    (the input coerced to 2-D): what a torch ``nn.Softmax(dim=1)`` exported in the old meaning computes."""
    import onnxruntime as ort
    import torch
    from onnx import TensorProto, helper

    from parity.diagnose.causes.cause import test_layer
    from parity.model.spec import Layer, Tolerance

    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], axis=1)],
        "old",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    observed = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[
        0
    ]
    kind, attrs = torch_layer(torch.nn.Softmax(dim=1))
    result = test_layer(Layer(kind, attrs), [x.astype(np.float64)], {}, observed, Tolerance(1e-6, 1e-6))
    assert _cause({"cause": result["cause"], "cause_test": result}) == "axis_coerced_2d"
