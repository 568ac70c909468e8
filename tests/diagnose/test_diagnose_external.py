"""The diagnosis of an ONNX graph whose weights lie in a data file beside it (an export past protobuf's 2 GiB) keeps
them there: the graph is read and edited without them, and each runtime reads the data from its folder. Proven on
small models with ``$PARITY_ONNX_EXTERNAL_BYTES`` lowered to 0, so every tensor over 1 KiB goes to the data file."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from onnx import TensorProto

from parity.cli import cli
from parity.diagnose.graph import onnx_graph
from parity.diagnose.tree import graph_tree
from parity.exporters.common import save_onnx
from tests.conftest import REPO, failing_export
from tests.nestedmodels import make_residual_stack

NESTED = REPO / "tests" / "nestedmodels.py"


def _external_initializers(model) -> int:
    return sum(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The residual stack (its block 5's norm computes another epsilon in the export) exported by torch.onnx and
    written with every weight in ``model.onnx.data``, its folder and a feed."""
    folder = tmp_path_factory.mktemp("stack")
    model = make_residual_stack()
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(0))
    program = torch.onnx.export(model, (x,), dynamo=True, verbose=False)
    save_onnx(program.model_proto, folder, threshold=0)
    return folder / "model.onnx", {program.model_proto.graph.input[0].name: x.numpy()}


def test_a_graph_with_external_data_is_read_edited_and_run_on_every_runtime_without_a_copy_of_its_weights(exported):
    path, feed = exported
    data = path.parent / "model.onnx.data"
    assert data.exists()
    model, folder = onnx_graph.load(path)
    assert folder == path.parent.resolve() and _external_initializers(model) > 0
    names = onnx_graph.intermediate_names(model)
    extended = onnx_graph.with_outputs(onnx_graph.pinned(model, feed), names)
    # the instrumented graph is the graph alone: its weights stay in the data file
    assert _external_initializers(extended) == _external_initializers(model)
    whole = onnx.load(str(path))  # the reference: the same file read with its weights
    assert _external_initializers(whole) == 0
    inline = onnx_graph.with_outputs(onnx_graph.pinned(whole, feed), names)
    assert inline.ByteSize() - extended.ByteSize() >= 0.9 * data.stat().st_size  # not one weight's bytes held
    for runtime in ("ort", "ort-noopt", "onnxref", "openvino"):
        got = onnx_graph.run_tensors(runtime, model, feed, names, folder=folder)
        want = onnx_graph.run_tensors(runtime, whole, feed, names)
        assert got.keys() == want.keys() and got, runtime
        for name in got:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{runtime} {name}")
    with pytest.raises(ValueError, match="keeps its weights in a data file"):
        onnx_graph.run_tensors("ort", model, feed, names[:1])
    weights = onnx_graph.Weights(model, folder)  # one weight read alone, as its node's third opinion reads it
    first = model.graph.initializer[0].name
    np.testing.assert_array_equal(weights[first], onnx.numpy_helper.to_array(whole.graph.initializer[0]))
    assert list(weights.read) == [first]


def test_a_descent_reads_every_scope_of_the_graph_in_its_first_run_within_its_budget(exported):
    path, feed = exported
    model, _ = onnx_graph.load(path)
    model = onnx_graph.pinned(model, feed)
    graph = onnx_graph._Graph(model)
    ahead = graph_tree.scope_tensors(model, graph, "torch.onnx")
    norm = [
        i for i, node in enumerate(graph.nodes) if "blocks.5.norm" in graph_tree.onnx_tree.node_scopes(node, "metadata")
    ]
    boundary = graph_tree.onnx_taps._boundary_outputs(graph, norm)
    assert norm and set(boundary) <= set(ahead)  # the deepest leaf's value is read with the first level
    sizes = {t: int(np.prod(graph.shapes[t])) * 4 for t in ahead}  # float32 values of known shapes
    budget = sum(sizes[t] for t in ahead[:3])
    first = graph_tree.scope_tensors(model, graph, "torch.onnx", budget=budget)
    assert first == ahead[:3] and len(ahead) > 3  # the shallowest scopes' tensors, as many as the budget holds
    # no records of scopes (modules found by value, level after level): every tensor of the graph, in its order
    assert graph_tree.scope_tensors(model, graph, "jax2onnx") == [t for t in graph.names if graph.shapes[t] is not None]


def test_a_torch_model_exported_with_external_data_is_diagnosed_to_its_faulty_leaf_and_reproduced(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("PARITY_ONNX_EXTERNAL_BYTES", "0")
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "ws"
    root.mkdir()
    diagnosis, _ = failing_export(root, "stack", ["--torch", f"{NESTED}:make_residual_stack", "--input", "x=2x16"])
    assert list((tmp_path / "cache" / "exports").glob("*/model.onnx.data"))  # the export kept its weights apart
    # the same leaf and cause as the export with its weights inline (tests/diagnose/tree/test_tree_torch.py)
    assert diagnosis["first_divergent_path"] == ["blocks", "blocks.5", "blocks.5.norm"]
    assert diagnosis["cause"]["tap"] == "blocks.5.norm" and diagnosis["cause"]["variant"] == "eps_fitted"
    out = tmp_path / "repro"
    args = ["repro", "--workspace", root, "--model", "stack", "--path", "torch/onnx/ort", "--out", out]
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    reduced = onnx.load(str(out / "model.onnx"))
    assert len(reduced.graph.node) <= 12 and _external_initializers(reduced) == 0
    assert not (out / "model.onnx.data").exists()  # a reproducer is one self-contained file
