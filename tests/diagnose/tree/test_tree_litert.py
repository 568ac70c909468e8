"""The descent into a Keras model's own layer tree on ``tf/litert``: the ``.tflite`` tensors mapped to layer paths by
the names the TFLite converter keeps (``parity.diagnose.tree.litert_tree``), through ``parity init`` (the library call
``assert_parity`` makes), golden build and the diagnosis. The model (``tests/keras_litert.py``) is a functional
model whose ``blocks`` is a ``Sequential`` of custom residual layers; one leaf departs on ``tf/litert`` only."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from parity.diagnose import chain
from parity.diagnose.graph import mapping_check
from parity.diagnose.tree.descent import Tree
from parity.golden import store as golden
from parity.model.workspace import Workspace
from parity.pipeline import orchestrate
from parity.run import paths
from tests.conftest import keras_workspace

FACTORIES = Path(__file__).resolve().parents[2] / "keras_litert.py"
FAULTY, CLEAN, DEFAULT = "faulty_blocks", "blocks", "default_names"
LEAF = "blocks/res_block_1/act"  # keras_litert.FAULTY (that file is imported by path, not as a module here)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, pool) -> Workspace:
    """Both factories through init (as ``assert_parity`` calls them) and golden build."""
    factories = {FAULTY: "make_faulty_blocks", CLEAN: "make_blocks", DEFAULT: "make_default_names"}
    models = {name: (f"{FACTORIES}:{factory}", (2, 12)) for name, factory in factories.items()}
    return keras_workspace(tmp_path_factory.mktemp("keras_litert_tree"), pool, models)


def _run(ws: Workspace, model: str):
    spec = ws.load_spec(model)
    return spec, golden.verify(ws.golden_dir(model), spec), orchestrate.Run(ws, orchestrate.Options(threads=1))


def diagnose(ws: Workspace, model: str, path_id: str, pool) -> dict:
    spec, manifest, run = _run(ws, model)
    return chain.diagnose(run, pool, spec, manifest, paths.by_id(path_id))


def _artifact(ws: Workspace, model: str, pool) -> dict:
    spec, manifest, run = _run(ws, model)
    path = paths.by_id("tf/litert")
    artifact = run._export(pool, spec, manifest, path, len(path.exports) - 1)
    assert "error" not in artifact, artifact
    return artifact


def test_a_departing_leaf_in_a_sequential_of_custom_layers_is_named_with_its_cause(workspace, pool):
    d = diagnose(workspace, FAULTY, "tf/litert", pool)
    tree = d["tree"]
    assert tree["descended"] and tree["verdict"] == "leaf", tree
    assert d["first_divergent_path"] == ["blocks", "blocks/res_block_1", LEAF], tree
    top = {row["tap"]: row for row in tree["levels"][0]["rows"]}
    assert top["proj"]["stats"]["ok"] and top["proj"]["found"] == "name"
    blocks = {row["tap"]: row for row in tree["levels"][1]["rows"]}
    assert blocks["blocks/res_block_0"]["stats"]["ok"] and not blocks["blocks/res_block_1"]["stats"]["ok"]
    inner = {row["tap"]: row for row in tree["levels"][2]["rows"]}
    assert inner["blocks/res_block_1/norm"]["stats"]["ok"]
    leaf = inner[LEAF]
    assert leaf["found"] == "name" and "res_block_1_1/act_1/" in leaf["tensor"], leaf
    assert leaf["kind"] == "activation" and leaf["input"]["ok"]  # its own input agrees: it is blamed
    assert "TANH" in [op for _, op in leaf["nodes"]], leaf["nodes"]  # the ops the tanh form became, not GELU
    assert d["cause_test"]["tap"] == LEAF
    assert d["cause"] is not None and d["cause"]["tap"] == LEAF, d["cause_test"]
    assert "gelu_tanh" in str(d["cause"]), d["cause"]


def test_the_passing_litert_path_shows_no_divergence_at_any_level(workspace, pool):
    d = diagnose(workspace, CLEAN, "tf/litert", pool)
    tree = d["tree"]
    assert tree["descended"], tree
    assert [level["first_divergent"] for level in tree["levels"]] == [None] * len(tree["levels"])
    assert d["first_divergent_path"] == [] and not tree.get("withdrawn"), tree
    found = {row["tap"]: row["found"] for row in tree["levels"][0]["rows"]}
    assert found == {"proj": "name", "mix": "name", "blocks": "name", "pre": "fused", "relu": "name", "head": "name"}


def _tree(ws: Workspace, model: str, pool) -> Tree:
    """``model``'s tree in this process, its path side the ``.tflite`` file of ``tf/litert``."""
    artifact = _artifact(ws, model, pool)
    built = Tree(str(ws.root), model, str(ws.golden_dir(model)), "tf", "fp32", 1)
    built.on_path("tf/litert", artifact_dir=artifact["dir"], artifact_meta=artifact["meta"])
    return built


@pytest.fixture(scope="module")
def tree(workspace, pool) -> Tree:
    """The clean model's tree."""
    return _tree(workspace, CLEAN, pool)


@pytest.fixture(scope="module")
def default_tree(workspace, pool) -> Tree:
    """The tree of the model with Keras's default layer names."""
    return _tree(workspace, DEFAULT, pool)


def _level(tree: Tree, scope: str, change=None) -> tuple[dict, dict]:
    reference = tree.reference(scope)
    assert reference["reproduces"]
    names = [c["path"] for c in reference["children"]]
    expected = {n: reference["values"][n] for n in names}
    if change:
        expected.update(change(expected))
    observed = tree.path(
        scope, names, {c["path"]: c["calls"] for c in reference["children"]}, expected, reference["inputs"]
    )
    return reference, observed


def test_each_layer_of_a_custom_block_is_read_at_its_own_tensor(tree):
    reference, observed = _level(tree, "blocks/res_block_2")
    names = ["blocks/res_block_2/fc", "blocks/res_block_2/norm", "blocks/res_block_2/act", "blocks/res_block_2/out"]
    assert [c["path"] for c in reference["children"]] == names
    located = observed["located"]
    for name in names:
        assert located[name]["found"] == "name", located[name]
        assert f"res_block_2_1/{name.rsplit('/', 1)[1]}_1/" in located[name]["tensor"], located[name]
        np.testing.assert_allclose(observed["values"][name], reference["values"][name], rtol=1e-4, atol=1e-5)
    # each layer's input is the previous layer's output tensor
    for before, after in itertools.pairwise(names):
        assert located[after]["input_tensor"] == located[before]["tensor"]
        np.testing.assert_allclose(observed["inputs"][after], reference["inputs"][after], rtol=1e-4, atol=1e-5)
    assert observed["instrumentation"] is None


def test_the_model_output_is_read_at_the_op_its_weights_name(tree):
    reference, observed = _level(tree, "")
    head = observed["located"]["head"]
    assert head["found"] == "name" and head["tensor"] == tree.path_side.outputs[0], head
    assert head["feeds_outputs"] and observed["located"]["blocks"]["feeds_outputs"]
    np.testing.assert_allclose(observed["values"]["head"], reference["values"]["head"], rtol=1e-4, atol=1e-5)


def test_a_read_that_no_axis_order_makes_agree_is_not_compared(tree):
    """A tensor whose shape is another order of the layer's axes is taken only in an order its value proves:
    against a reference value that no order of the tensor matches, the layer is unmapped (not named)."""
    name = "blocks/res_block_0/norm"
    _, observed = _level(tree, "blocks/res_block_0", lambda e: {name: (e[name] * 3.0).T.copy()})
    assert observed["located"][name]["found"] == "unmapped", observed["located"][name]
    assert "no order of its axes agrees" in observed["located"][name]["reason"]
    assert name not in observed["values"]
    # the same tensor against its value in the transposed order: proven by value, read in that order
    _, observed = _level(tree, "blocks/res_block_0", lambda e: {name: e[name].T.copy()})
    assert observed["located"][name]["order"] == [1, 0], observed["located"][name]
    assert name in observed["values"]


def test_a_read_its_own_outputs_contradict_is_withdrawn(tree):
    """On the passing path, a layer read far off while the outputs computed from it agree was misread: the walk
    withdraws it (``mapping_check.withdraw_contradicted``) instead of naming it."""
    from parity.diagnose.tree.walk import _rows

    name = "blocks/res_block_1/out"
    reference, observed = _level(tree, "blocks/res_block_1")
    observed["values"][name] = observed["values"][name] * 50.0 + 1.0  # what a misread tensor would hold
    rows = _rows(reference["children"], reference, observed, tree.spec.output_tolerances("fp32"))
    assert not next(r for r in rows if r["tap"] == name)["stats"]["ok"]
    withdrawn = mapping_check.withdraw_contradicted(rows, observed["located"], observed["output_units"])
    assert withdrawn == [name]
    assert next(r for r in rows if r["tap"] == name)["found"] == "withdrawn"


def test_a_fused_layer_is_said_fused_and_a_shared_one_is_read_at_its_first_call(tree):
    reference, observed = _level(tree, "")
    located = observed["located"]
    pre, relu, mix = located["pre"], located["relu"], located["mix"]
    assert pre["found"] == "fused" and pre["fused_into"] == "the FULLY_CONNECTED op of relu", pre
    assert "pre" not in observed["values"]
    assert relu["found"] == "name" and relu["tensor"] == pre["tensor"] and relu["input_tensor"] is None, relu
    np.testing.assert_allclose(observed["values"]["relu"], reference["values"]["relu"], rtol=1e-4, atol=1e-5)
    # mix's two calls are two name scopes: its first call's output, read from proj's
    assert mix["found"] == "name" and mix["input_tensor"] == located["proj"]["tensor"], mix
    assert [c["calls"] for c in reference["children"] if c["path"] == "mix"] == [2]
    np.testing.assert_allclose(observed["values"]["mix"], reference["values"]["mix"], rtol=1e-4, atol=1e-5)
    assert not np.allclose(reference["values"]["mix"], reference["inputs"]["blocks"])  # not the second call's


def _scopes(tensor: str) -> list[str]:
    return tensor.split(";")[0].split("/")[:-1]


@pytest.mark.slow
def test_default_names_are_read_at_their_own_scopes(default_tree):
    """Layer ``dense``'s ops are scoped ``dense_1``, layer ``dense_1``'s ``dense_1_2``: each is read at its own, by
    the suffix count the model's scope carries (not by the fewest suffixes, which gave ``dense``'s ops to
    ``dense_1``), in a nested Sequential too."""
    reference, observed = _level(default_tree, "")
    located = observed["located"]
    assert located["dense"]["found"] == "name" and "dense_1" in _scopes(located["dense"]["tensor"]), located
    assert located["dense_1"]["found"] == "name" and "dense_1_2" in _scopes(located["dense_1"]["tensor"]), located
    assert located["dense_1"]["input_tensor"] == located["dense"]["tensor"], located["dense_1"]
    for name in ("dense", "dense_1", "sequential"):
        np.testing.assert_allclose(observed["values"][name], reference["values"][name], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(observed["inputs"]["dense_1"], reference["inputs"]["dense_1"], rtol=1e-4, atol=1e-5)
    reference, observed = _level(default_tree, "sequential")
    located = observed["located"]
    assert "res_block_1" in _scopes(located["sequential/res_block"]["tensor"]), located
    assert "res_block_1_2" in _scopes(located["sequential/res_block_1"]["tensor"]), located
    assert located["sequential/res_block_1"]["input_tensor"] == located["sequential/res_block"]["tensor"]
    for name in ("sequential/res_block", "sequential/res_block_1"):
        np.testing.assert_allclose(observed["values"][name], reference["values"][name], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_softmax_head_is_read_at_the_graph_output(default_tree):
    """``Dense(activation="softmax")`` becomes a FULLY_CONNECTED and a SOFTMAX that writes the graph output
    (``Identity``, no scope): the head is read there, not at its logits."""
    reference, observed = _level(default_tree, "")
    head = observed["located"]["dense_2"]
    assert head["found"] == "name" and head["tensor"] == default_tree.path_side.outputs[0], head
    assert "SOFTMAX" in [op for _, op in head["nodes"]], head["nodes"]
    np.testing.assert_allclose(observed["values"]["dense_2"], reference["values"]["dense_2"], rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_the_tree_of_a_tflite_file_without_a_layer_map_is_not_read(workspace, pool):
    """A ``.tflite`` file whose exporter recorded no layer map (litert-torch's, on ``torch/litert``) is not read
    layer by layer: the descent says why instead of showing rows."""
    from parity.diagnose.tree.descent import descent
    from parity.exporters.torch_litert import TAPS_REASON

    artifact = _artifact(workspace, CLEAN, pool)
    meta = {k: v for k, v in artifact["meta"].items() if k not in ("taps", "keras_model_name")}
    meta["taps_reason"] = TAPS_REASON
    ws = str(workspace.root)
    found = descent(ws, CLEAN, str(workspace.golden_dir(CLEAN)), "fp32", 1, "tf", "torch/litert", artifact["dir"], meta)
    assert found == {"descended": False, "reason": f"the tree of torch/litert is not read: {TAPS_REASON}"}


def test_an_interpreter_that_lists_no_ops_is_said_so(workspace, pool, monkeypatch):
    from ai_edge_litert import interpreter as litert

    from parity.diagnose.tree.litert_tree import LiteRTLevels, NotRead
    from parity.model import feeds

    artifact = _artifact(workspace, CLEAN, pool)
    spec = workspace.load_spec(CLEAN)
    x = feeds.from_arrays(spec, golden.load(workspace.golden_dir(CLEAN), spec).arrays["inputs.npz"])
    monkeypatch.delattr(litert.Interpreter, "_get_ops_details")  # a LiteRT whose interpreter does not list its ops
    with pytest.raises(NotRead, match="lists no ops"):
        LiteRTLevels(spec, paths.by_id("tf/litert"), artifact["dir"], artifact["meta"], x, 1)


@pytest.fixture(scope="module")
def onnx_tree(workspace, pool) -> Tree:
    """The default-names model's tree on ``tf/onnx/ort``: tf2onnx's node names, read by the same scope rule."""
    spec, manifest, run = _run(workspace, DEFAULT)
    path = paths.by_id("tf/onnx/ort")
    artifact = run._export(pool, spec, manifest, path, len(path.exports) - 1)
    assert "error" not in artifact, artifact
    built = Tree(str(workspace.root), DEFAULT, str(workspace.golden_dir(DEFAULT)), "tf", "fp32", 1)
    built.on_path(path.id, artifact_dir=artifact["dir"], artifact_meta=artifact["meta"])
    return built


@pytest.mark.slow
def test_tf2onnx_node_names_of_default_names_are_read_at_their_own_scopes(onnx_tree):
    """tf2onnx keeps the same scopes in its node names (``functional_1/dense_1/MatMul`` is layer ``dense``'s):
    ``onnx_taps.keras_scope`` gives each layer its own nodes, one layer asked for at a time too."""
    from parity.diagnose.graph import onnx_taps

    assert onnx_taps.keras_scope("functional_1/dense_1/MatMul", ("dense", "dense_1")) == "dense"
    assert onnx_taps.keras_scope("functional_1/dense_1_2/MatMul", ("dense", "dense_1")) == "dense_1"
    assert onnx_taps.keras_scope("functional_1/dense_1_2/MatMul", ("dense",)) is None
    assert onnx_taps.keras_scope("functional_1/dense_1/MatMul", ("dense_1",)) is None
    reference, observed = _level(onnx_tree, "")
    located = observed["located"]
    for name, scope in (("dense", "dense_1"), ("dense_1", "dense_1_2")):
        assert located[name]["found"] == "name", located[name]
        assert {node.split("/")[1] for node, _ in located[name]["nodes"]} == {scope}, located[name]["nodes"]
        np.testing.assert_allclose(observed["values"][name], reference["values"][name], rtol=1e-4, atol=1e-5)
