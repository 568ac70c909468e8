"""The descent into a hand-written Keras encoder (``keras_encoder.make_encoder``: custom blocks in a list, attention,
norms, a feed-forward of Dense layers in a dict) on ``tf/xla``, its taps computed inside the XLA-compiled function;
the same encoder's nested layer paths in tf2onnx's node names; a layer called twice, said so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from parity.check.closeness import error_stats
from parity.diagnose import chain
from parity.diagnose.graph import onnx_taps as ot
from parity.diagnose.tree import keras_tree
from parity.diagnose.tree.descent import Tree
from parity.golden import store as golden
from parity.model import feeds
from parity.model.workspace import Workspace
from parity.pipeline import orchestrate
from parity.report.diagnosis import render
from parity.run import paths
from tests.conftest import keras_workspace

TESTS = Path(__file__).resolve().parents[2]
LEAF = "encoder/block_1/ffn/down"
# the path's own drift, on its weights only: a real XLA departure on CPU stays far inside float32's tolerances
DRIFT = {("encoder", "tf/xla"): {f"{LEAF}/kernel": np.random.default_rng(1).normal(0.0, 2e-3, (32, 16))}}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, pool) -> Workspace:
    factories = TESTS / "keras_encoder.py"
    models = {"encoder": (f"{factories}:make_encoder", (2, 6, 8)), "shared": (f"{factories}:make_shared", (2, 8))}
    return keras_workspace(tmp_path_factory.mktemp("keras_xla"), pool, models)


def _diagnose(ws: Workspace, model: str, path_id: str, pool, drift: dict | None = None) -> dict:
    spec = ws.load_spec(model)
    run = orchestrate.Run(ws, orchestrate.Options(threads=1, weight_perturbation=drift or {}))
    return chain.diagnose(run, pool, spec, golden.verify(ws.golden_dir(model), spec), paths.by_id(path_id))


def _runners(ws: Workspace):
    """The encoder on ``tf/xla`` and on ``tf`` (the same golden weights), and its golden inputs."""
    spec = ws.load_spec("encoder")
    arrays = golden.load(ws.golden_dir("encoder"), spec).arrays
    made = [
        paths.load_target(paths.by_id(p).runtime_target)(spec, arrays["weights.npz"], spec.batch_size)
        for p in ("tf/xla", "tf")
    ]
    return (*made, feeds.from_arrays(spec, arrays["inputs.npz"]))


def test_keras_scope_maps_the_encoders_nested_paths():
    level = ("encoder/block_1/attn/query", "encoder/block_1/attn/key", "encoder/block_1/attn/attention_output")
    name = "encoder_model_1/encoder_1/block_1_1/attn_1/key_1/MatMul"
    assert ot.keras_scope(name, level) == "encoder/block_1/attn/key"
    assert ot.keras_scope(name, ("encoder/block_0/attn/key",)) is None  # the other block's key
    assert ot.keras_scope("encoder_model_1/encoder_1/block_1_1/ffn_1/down_1/MatMul", ("encoder/block_1/ffn/down",))


def test_xla_departure_is_found_at_the_leaf(workspace, pool):
    d = _diagnose(workspace, "encoder", "tf/xla", pool, DRIFT)
    tree = d["tree"]
    assert d["first_divergent_path"] == ["encoder", "encoder/block_1", "encoder/block_1/ffn", LEAF], tree
    assert tree["verdict"] == "leaf"
    for level in tree["levels"]:
        assert {r["found"] for r in level["rows"]} == {"native"} and level["instrumentation"] is None
    inner = {r["tap"]: r for r in tree["levels"][-1]["rows"]}
    assert inner["encoder/block_1/ffn/up"]["stats"]["ok"] and inner[LEAF]["input"]["ok"]  # its input agrees
    assert inner[LEAF]["kind"] == "dense"
    assert d["cause_test"]["tap"] == LEAF and d["cause_test"]["kind"] == "dense"  # tested, typed


@pytest.mark.parametrize("path_id", ["tf/xla", "tf/onnx/ort"])
def test_passing_paths_name_no_divergence(path_id, workspace, pool):
    d = _diagnose(workspace, "encoder", path_id, pool)
    tree = d["tree"]
    assert tree["descended"], tree
    assert [level["first_divergent"] for level in tree["levels"]] == [None] * len(tree["levels"])
    assert d["first_divergent_path"] == [] and d["first_divergent_tap"] is None
    assert {r["found"] for r in tree["levels"][0]["rows"]} == ({"native"} if path_id == "tf/xla" else {"name"})


def test_taps_are_read_inside_the_xla_compilation(workspace):
    """XLA's float32 values differ in their last bits from TensorFlow's kernels: each tap is XLA's, not a
    recomputation beside the compiled function."""
    import tensorflow as tf

    xla, plain_tf, x = _runners(workspace)
    top = keras_tree.level_of(xla, x, "")
    compiled = xla.run(x)["output"]  # the path's own compiled forward
    assert np.array_equal(top["outputs"]["output"], compiled)
    assert np.array_equal(top["values"]["head"], compiled)  # the last layer's tap is the compiled output itself
    proj = xla.model.get_layer("proj")
    fed = xla._to_tf(xla.check_feed(x))["x"]
    alone = tf.function(proj.__call__, jit_compile=True)(fed).numpy()
    assert np.array_equal(top["values"]["proj"], alone)  # the first layer, compiled alone, is bit for bit the tap
    tol = xla.spec.output_tolerances("fp32").for_name("output")
    for scope in ("", "encoder/block_1", "encoder/block_1/attn", "encoder/block_1/ffn"):
        on_xla, on_tf = keras_tree.level_of(xla, x, scope), keras_tree.level_of(plain_tf, x, scope)
        assert on_xla["values"].keys() == on_tf["values"].keys() and on_xla["values"]
        for name, value in on_xla["values"].items():
            assert not np.array_equal(value, on_tf["values"][name]), name  # not TensorFlow's kernels
            assert error_stats(value, on_tf["values"][name].astype(np.float64), tol)["ok"], name


@pytest.mark.slow
def test_taps_that_change_the_compiled_outputs_are_unobservable(workspace):
    """A path whose own compiled outputs the instrumented compilation does not reproduce: no tap is trusted."""
    import tensorflow as tf

    xla, _, x = _runners(workspace)
    forward = xla._forward
    xla._forward = tf.function(lambda inputs: tuple(t + 1e-2 for t in forward(inputs)), jit_compile=True)
    found = keras_tree.level_of(xla, x, "encoder")
    assert found["values"] == {} and found["instrumentation"]["disturbing"]
    assert {n: w["found"] for n, w in found["located"].items()} == dict.fromkeys(
        ("encoder/block_0", "encoder/block_1"), "unobservable"
    )
    assert "changes the model's outputs" in found["located"]["encoder/block_1"]["reason"]


@pytest.mark.slow
def test_reference_levels_run_the_model_eagerly(workspace):
    """The reference side (the golden's dtype) runs each level eagerly, as the golden build reads its taps: no
    ``tf.function`` of the model is traced again at every level of a descent; a native path's side is still traced."""
    import keras
    import tensorflow as tf

    tree = Tree(str(workspace.root), "encoder", str(workspace.golden_dir("encoder")), "tf", "fp32", 1)
    _, plain_tf, x = _runners(workspace)
    seen: dict[str, list[bool]] = {"reference": [], "tf": []}
    for side, model in (("reference", tree.reference_runner.model), ("tf", plain_tf.model)):
        block = keras_tree.resolve(keras, model, "encoder/block_0")
        original = block.call
        block.__dict__["call"] = lambda *a, _o=original, _s=seen[side], **k: (
            _s.append(tf.executing_eagerly()),
            _o(*a, **k),
        )[1]
    try:
        found = tree.reference("encoder")
        on_tf = keras_tree.level_of(plain_tf, x, "encoder")
    finally:
        for model in (tree.reference_runner.model, plain_tf.model):
            del keras_tree.resolve(keras, model, "encoder/block_0").__dict__["call"]
    assert found["reproduces"] and [c["path"] for c in found["children"]] == ["encoder/block_0", "encoder/block_1"]
    assert seen == {"reference": [True], "tf": [False]}
    tol = plain_tf.spec.output_tolerances("fp32").for_name("output")
    for name, value in on_tf["values"].items():
        assert error_stats(value.astype(np.float64), found["values"][name], tol)["ok"], name


@pytest.mark.slow
def test_tf2onnx_levels_map_nested_layers_by_name(workspace, pool):
    """tf2onnx's rewriting of the attention leaves its key projection to unscoped nodes: the attention is read where
    the next layer reads it, and every layer of the block agrees with the reference on a passing export."""
    spec = workspace.load_spec("encoder")
    run = orchestrate.Run(workspace, orchestrate.Options(threads=1))
    path = paths.by_id("tf/onnx/ort")
    artifact = run._export(
        pool, spec, golden.verify(workspace.golden_dir("encoder"), spec), path, len(path.exports) - 1
    )
    tree = Tree(str(workspace.root), "encoder", str(workspace.golden_dir("encoder")), "tf", "fp32", 1)
    tree.on_path(path.id, "cpu", artifact["dir"], artifact["meta"])
    tol = spec.output_tolerances("fp32").for_name("output")
    for scope in ("encoder", "encoder/block_1", "encoder/block_1/attn", "encoder/block_1/ffn"):
        reference = tree.reference(scope)
        names = [c["path"] for c in reference["children"] if c["has_value"]]
        inputs = {n: reference["inputs"][n] for n in names if n in reference["inputs"]}
        seen = tree.path(scope, names, dict.fromkeys(names, 1), {n: reference["values"][n] for n in names}, inputs)
        for name in names:
            assert seen["located"][name]["found"] == "name", (name, seen["located"][name])
            assert error_stats(seen["values"][name], reference["values"][name], tol)["ok"], name
        if scope == "encoder/block_1":
            assert "attn_1/attention_output_1/" in seen["located"]["encoder/block_1/attn"]["tensor"]


def test_a_shared_layer_is_compared_at_its_first_call_and_said_so(workspace, pool):
    drift = {("shared", "tf"): {"shared/kernel": np.random.default_rng(2).normal(0.0, 2e-3, (8, 8))}}
    d = _diagnose(workspace, "shared", "tf", pool, drift)
    assert d["first_divergent_path"] == ["shared"], d["tree"]
    row = next(r for r in d["tree"]["levels"][0]["rows"] if r["tap"] == "shared")
    assert row["calls"] == 2 and "called 2 times (shared weights): compared at its first call" in row["reason"]
    assert "called 2x, compared at its first call" in render(d)
