"""The descent into a Keras model's own layer tree: a functional sub-model used as a layer, a custom layer holding
Dense / LayerNormalization sub-layers and a ``keras.Sequential`` block, through ``parity init`` (the library call
``assert_parity`` makes), golden build and the diagnosis; tf2onnx node names matched to nested layer paths."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from parity.diagnose import chain
from parity.diagnose.descend import descend
from parity.diagnose.graph import onnx_taps as ot
from parity.golden import store as golden
from parity.model.workspace import Workspace
from parity.pipeline import orchestrate
from parity.run import paths
from tests.conftest import keras_workspace

MODEL = "nested"


def make_nested():
    """x (2x12) -> proj -> encoder (functional: dense, norm, out) -> block (custom: x + norm(fc(x))) -> mlp
    (Sequential: fc1, ln, fc2) -> head -> output (2x3); every LayerNormalization's gamma and beta random."""
    import keras
    from keras import layers

    @keras.saving.register_keras_serializable(package="test_tree_keras")
    class Block(keras.layers.Layer):
        def __init__(self, width: int = 16, **kwargs):
            super().__init__(**kwargs)
            self.width = width
            # in the layer's own dtype: parity rebuilds the model in float64 for its reference
            self.fc = layers.Dense(width, activation="tanh", dtype=self.dtype_policy, name="fc")
            self.norm = layers.LayerNormalization(
                epsilon=1e-3, gamma_initializer=gamma, beta_initializer=beta, dtype=self.dtype_policy, name="norm"
            )

        def build(self, shape):
            self.fc.build(shape)
            self.norm.build(tuple(shape[:-1]) + (self.width,))

        def call(self, x):
            return x + self.norm(self.fc(x))

        def get_config(self):
            return {**super().get_config(), "width": self.width}

    keras.utils.set_random_seed(0)
    gamma, beta = keras.initializers.RandomUniform(0.5, 1.5), keras.initializers.RandomNormal(stddev=0.2)
    inner = keras.Input((16,), name="encoder_in")
    h = layers.Dense(16, activation="tanh", name="dense")(inner)
    h = layers.LayerNormalization(gamma_initializer=gamma, beta_initializer=beta, name="norm")(h)
    encoder = keras.Model(inner, layers.Dense(16, name="out")(h), name="encoder")
    mlp = keras.Sequential(
        [
            layers.Dense(24, activation="relu", name="fc1"),
            layers.LayerNormalization(gamma_initializer=gamma, beta_initializer=beta, name="ln"),
            layers.Dense(16, name="fc2"),
        ],
        name="mlp",
    )
    x = keras.Input((12,), name="x")
    h = mlp(Block(name="block")(encoder(layers.Dense(16, name="proj")(x))))
    return keras.Model(x, layers.Dense(3, name="head")(h), name="nested")


def test_keras_scope_matches_nested_layer_paths():
    level = ("encoder/dense", "encoder/norm", "encoder/out")
    assert ot.keras_scope("nested_1/encoder_1/norm_1/Mean", level) == "encoder/norm"
    assert ot.keras_scope("model_1/encoder_1/dense_1/MatMul", level) == "encoder/dense"
    assert ot.keras_scope("nested_1/norm_1/Mean", level) is None  # a top-level norm is not the encoder's
    assert ot.keras_scope("nested_1/encoder_1/add", level) is None  # the encoder's own op, no layer of it
    assert ot.keras_scope("model_1/sub_1/dense_2_1/MatMul", ("sub/dense", "sub/dense_2")) == "sub/dense_2"
    assert ot.keras_scope("model_1/sub_1/dense_2_1/MatMul", ("sub/dense",)) is None  # dense_2's scope, not dense's
    assert ot.keras_scope("a_1/block_1/norm_1/moments/mean", ("block", "block/norm")) == "block"  # earliest wins


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, pool) -> Workspace:
    """``make_nested`` through init (as ``assert_parity`` calls it) and golden build."""
    root = tmp_path_factory.mktemp("keras_tree")
    ws = keras_workspace(root, pool, {MODEL: (f"{Path(__file__).resolve()}:make_nested", (2, 12))})
    assert ws.load_spec(MODEL).taps == ("proj", "encoder", "block", "mlp", "head")
    return ws


def _run(ws: Workspace):
    spec = ws.load_spec(MODEL)
    return spec, golden.verify(ws.golden_dir(MODEL), spec), orchestrate.Run(ws, orchestrate.Options(threads=1))


def diagnose(ws: Workspace, path_id: str, pool, artifact=None) -> dict:
    spec, manifest, run = _run(ws)
    return chain.diagnose(run, pool, spec, manifest, paths.by_id(path_id), artifact=artifact)


def _edited_export(ws: Workspace, pool, tmp_path: Path, scope: str, epsilon: float) -> dict:
    """The tf2onnx export with the epsilon of the LayerNormalization whose nodes are under ``scope`` (tf2onnx names,
    ``encoder_1/norm_1``) set to ``epsilon``, as a converter bug would."""
    import onnx
    from onnx import numpy_helper

    spec, manifest, run = _run(ws)
    path = paths.by_id("tf/onnx/ort")
    artifact = run._export(pool, spec, manifest, path, len(path.exports) - 1)
    assert "error" not in artifact, artifact
    folder = tmp_path / "edited"
    shutil.copytree(artifact["dir"], folder)
    file = folder / artifact["meta"]["file"]
    model = onnx.load(str(file))
    constants = {t.name: t for t in model.graph.initializer}
    adds = [
        n
        for n in model.graph.node
        if n.op_type == "Add"
        and f"/{scope}/" in n.name
        and any(i in constants and numpy_helper.to_array(constants[i]).size == 1 for i in n.input)
    ]
    assert len(adds) == 1, [n.name for n in model.graph.node if f"/{scope}/" in n.name]
    index = next(k for k, i in enumerate(adds[0].input) if i in constants)
    value = np.full_like(numpy_helper.to_array(constants[adds[0].input[index]]), epsilon)
    model.graph.initializer.append(numpy_helper.from_array(value, f"{scope}/edited_epsilon"))  # tf2onnx shares it
    adds[0].input[index] = f"{scope}/edited_epsilon"
    onnx.save_model(model, str(file))
    return {"dir": str(folder), "meta": artifact["meta"]}


# slow: encoder/norm, a second proof of a tf2onnx export fault found at its nested leaf; the fast set keeps block/norm
@pytest.mark.parametrize(
    "leaf, scope",
    [("block/norm", "block_1/norm_1"), pytest.param("encoder/norm", "encoder_1/norm_1", marks=pytest.mark.slow)],
)
def test_export_fault_in_a_nested_leaf_is_found_at_the_leaf(leaf, scope, workspace, pool, tmp_path):
    artifact = _edited_export(workspace, pool, tmp_path, scope, 0.3)
    d = diagnose(workspace, "tf/onnx/ort", pool, artifact)
    parent = leaf.split("/")[0]
    assert d["first_divergent_path"] == [parent, leaf], d["tree"]
    tree = d["tree"]
    assert tree["verdict"] == "leaf"
    top = {row["tap"]: row for row in tree["levels"][0]["rows"]}
    assert top["proj"]["stats"]["ok"] and top[parent]["found"] == "name"
    inner = {row["tap"]: row for row in tree["levels"][1]["rows"]}
    assert inner[leaf]["kind"] == "layer_norm" and inner[leaf]["input"]["ok"]  # its input agrees: it is blamed
    assert any(leaf.split("/")[1] + "_1" in node for node, _ in inner[leaf]["nodes"])
    assert d["cause_test"]["tap"] == leaf
    if leaf == "block/norm":  # its weights are named after its path (a functional sub-model's are not)
        assert d["cause"] is not None and d["cause"]["tap"] == leaf, d["cause_test"]
    runtime = next(c for c in d["links"]["checks"] if c["link"] == "runtime")
    assert runtime["ok"] and "of the module where the drift begins" in runtime["compared"], runtime
    assert "runtime_link" not in tree
    # the descent links the runtimes on the leaf from its own run's values, as the link's own task does from a run
    spec, manifest, run = _run(workspace)
    path, arrays = paths.by_id("tf/onnx/ort"), golden.load(workspace.golden_dir(MODEL), spec).arrays
    observed = chain._collect(run, pool, spec, path, artifact, "fp32", gradients=False)
    descended = descend(run, pool, spec, path, artifact, observed["outputs"])
    linked = descended.pop("runtime_link")
    own_task = chain._runtime_link(run, pool, spec, path, artifact, arrays, observed, descended)
    assert linked["scope"] == own_task["scope"] and linked["first_divergent"] == own_task["first_divergent"]
    assert [n["node"] for n in linked["nodes"]] == [n["node"] for n in own_task["nodes"]]
    np.testing.assert_allclose([n["max_abs"] for n in linked["nodes"]], [n["max_abs"] for n in own_task["nodes"]])


@pytest.mark.parametrize("path_id", ["tf", "tf/onnx/ort"])
def test_clean_paths_show_no_divergence_at_any_level(path_id, workspace, pool):
    d = diagnose(workspace, path_id, pool)
    tree = d["tree"]
    assert tree["descended"], tree
    assert [level["first_divergent"] for level in tree["levels"]] == [None] * len(tree["levels"])
    assert d["first_divergent_path"] == []
    found = {row["found"] for row in tree["levels"][0]["rows"]}
    assert found == ({"native"} if path_id == "tf" else {"name"}), tree["levels"][0]["rows"]
