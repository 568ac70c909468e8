"""LiteRT's paths: tf/litert (the TFLite converter, run by ai_edge_litert's interpreter with XNNPACK) passes the zoo
with its batch axis dynamic; its taps are mapped to the .tflite graph's tensors by layer name, checked by shape, and a
changed weight in the .tflite model is diagnosed to its layer; torch/litert is a skip with the installer's reason."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from parity.diagnose import chain
from parity.exporters.common import ExportJob
from parity.golden import store as golden
from parity.model.workspace import Workspace
from parity.pipeline import orchestrate
from parity.run import install_names, paths
from parity.runtimes.base import ShapeMismatch
from tests.conftest import worker_pool, zoo_copy

pytest.importorskip("ai_edge_litert")


def checked(root: Path, models, patterns) -> dict:
    report = orchestrate.check(Workspace(root), list(models), orchestrate.Options(threads=1, patterns=tuple(patterns)))
    return {(r["model"], r["path"]): r for r in report["results"]}


def exported(root: Path, model: str, perturbation: dict | None = None) -> tuple[Path, dict]:
    """The model's .tflite export (in this process) from its golden weights plus ``perturbation``."""
    from parity.exporters import tf_litert

    ws = Workspace(zoo_copy(root / "ws", model))
    spec = ws.load_spec(model)
    weights = dict(golden.load(ws.golden_dir(model), spec).arrays["weights.npz"])
    for name, delta in (perturbation or {}).items():
        weights[name] = weights[name] + delta
    out = root / "artifact"
    out.mkdir()
    meta = tf_litert.export(ExportJob(spec=spec, weights=weights, batch_size=spec.batch_size, opset=17, out_dir=out))
    return out, meta


@pytest.fixture(scope="module")
def mlp_tflite(tmp_path_factory):
    """mlp's .tflite, its metadata, its spec and the golden arrays."""
    root = tmp_path_factory.mktemp("litert")
    out, meta = exported(root, "mlp")
    ws = Workspace(root / "ws")
    spec = ws.load_spec("mlp")
    return out, meta, spec, golden.load(ws.golden_dir("mlp"), spec).arrays


def runner_for(mlp_tflite, meta=None):
    from parity.runtimes.litert import LiteRtRunner

    out, exported_meta, spec, _ = mlp_tflite
    return LiteRtRunner(spec, out, meta or exported_meta, spec.batch_size, threads=1)


def test_export_meta_names_the_tflite_tensors_and_keeps_the_batch_dynamic(mlp_tflite):
    out, meta, _, _ = mlp_tflite
    assert (out / "model.tflite").is_file() and meta["format"] == "tflite" and meta["file"] == "model.tflite"
    assert meta["input_names"] == ["x"] and meta["tflite_outputs"] == {"logits": meta["output_names"][0]}
    assert meta["axes"] == {"dynamic": {"x": {"0": "batch"}}, "static": {}, "reason": None}
    assert meta["converter"]["select_tf_ops"] is False and meta["converter"]["optimizations"] == []
    assert meta["taps"]["logits"]["output"] == "logits" and meta["taps"]["dense2"]["shape"] == [None, 32]


def test_runner_resizes_the_dynamic_batch_and_records_the_delegate(mlp_tflite):
    _, _, _, arrays = mlp_tflite
    runner = runner_for(mlp_tflite)
    x = arrays["inputs.npz"]["x"]
    full = runner.run(x)["logits"]
    np.testing.assert_allclose(full, arrays["reference.npz"]["logits"], atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(runner.run(x[:3])["logits"], full[:3])  # resized down and back up
    np.testing.assert_array_equal(runner.run(x)["logits"], full)
    record = runner.runtime_record()
    assert record["runtime"] == "litert" and record["threads"] == 1 and record["dynamic_inputs"] == ["x"]
    assert record["delegate"]["name"] == "XNNPACK" and record["delegate"]["applied"] is True
    with pytest.raises(ShapeMismatch, match="has shape"):
        runner.run(np.zeros((2, 63), np.float32))


def test_taps_are_read_at_the_last_op_of_each_layer_and_fused_layers_say_so(mlp_tflite):
    """Dense + ReLU become one FULLY_CONNECTED with a fused activation: the dense taps are fused into the ReLU taps,
    the ReLU taps read there, the logits at the model's output; every value read is the golden one."""
    _, meta, _, arrays = mlp_tflite
    runner = runner_for(mlp_tflite)
    taps = runner.taps(arrays["inputs.npz"]["x"])
    located = runner.tap_locations
    assert {t: w["found"] for t, w in located.items()} == {
        "dense1": "fused",
        "relu1": "name",
        "dense2": "fused",
        "relu2": "name",
        "logits": "name",
    }
    assert located["dense2"]["fused_into"] == "relu2" and located["dense2"]["tensor"] == located["relu2"]["tensor"]
    assert "relu2" in located["relu2"]["tensor"] and located["logits"]["tensor"] == meta["output_names"][0]
    assert set(taps) == {"relu1", "relu2", "logits"}
    for tap, value in taps.items():
        np.testing.assert_allclose(value, arrays["reference.npz"][f"tap/{tap}"], atol=1e-5, rtol=1e-5)


def test_a_tensor_of_another_shape_is_unmapped_not_read(mlp_tflite):
    """A wrong mapping is worse than none: where the layer's recorded output shape differs from the tensor's, the tap
    is unmapped and the reason gives both shapes."""
    _, meta, _, arrays = mlp_tflite
    wrong = {**meta, "taps": {**meta["taps"], "relu1": {**meta["taps"]["relu1"], "shape": [None, 63]}}}
    runner = runner_for(mlp_tflite, wrong)
    taps = runner.taps(arrays["inputs.npz"]["x"])
    assert "relu1" not in taps and runner.tap_locations["relu1"]["found"] == "unmapped"
    assert "(?, 64)" in runner.tap_locations["relu1"]["reason"] and "(?, 63)" in runner.tap_locations["relu1"]["reason"]
    no_map = {key: value for key, value in meta.items() if key != "taps"} | {"taps_reason": "no layer names here"}
    runner = runner_for(mlp_tflite, no_map)
    assert runner.taps(arrays["inputs.npz"]["x"]) == {}
    assert {w["reason"] for w in runner.tap_locations.values()} == {"no layer names here"}


def test_tf_litert_passes_on_mlp_and_torch_litert_is_a_skip_with_the_installers_reason(tmp_path):
    results = checked(zoo_copy(tmp_path, "mlp"), ["mlp"], ["tf/litert", "torch/litert"])
    result = results[("mlp", "tf/litert")]
    assert result["verdict"] == "pass", result["reason"]
    assert result["gradients"] is None and result["deterministic"]
    assert [entry["ok"] for entry in result["shapes"]] == [True] * len(result["shapes"]) and result["shapes"]
    assert result["runtime"]["delegate"]["applied"] is True and result["export"]["axes"]["dynamic"]
    skipped = results[("mlp", "torch/litert")]
    assert skipped["verdict"] == "skip"
    assert (
        install_names.WONT_INSTALL["litert_torch"] in skipped["reason"]
        and "litert_torch not installed" in skipped["reason"]
    )


def test_litert_torch_signature_names_are_read_and_run(mlp_tflite, tmp_path):
    """litert-torch names a signature's inputs args_<k> and outputs output_<k>: its exporter's metadata maps them to the
    spec's names, and the LiteRT runner runs the file by the tensors behind them (a file written here with the TFLite
    converter under the same names, as litert-torch itself cannot be installed beside this stack)."""
    import tensorflow as tf

    from parity.exporters.torch_litert import TAPS_REASON, litert_meta
    from parity.runtimes.litert import LiteRtRunner

    _, _, spec, arrays = mlp_tflite
    kernel = tf.constant(np.arange(640, dtype=np.float32).reshape(64, 10) / 640)

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32)])
    def serve(args_0):
        return {"output_0": tf.matmul(args_0, kernel)}

    data = tf.lite.TFLiteConverter.from_concrete_functions([serve.get_concrete_function()], tf.Module()).convert()
    (tmp_path / "model.tflite").write_bytes(data)
    meta = litert_meta(spec, data, None)
    assert meta["signature"] == {
        "name": "serving_default",
        "inputs": {"x": "args_0"},
        "outputs": {"logits": "output_0"},
    }
    assert meta["axes"]["dynamic"] == {"x": {"0": "batch"}} and meta["taps_reason"] == TAPS_REASON
    runner = LiteRtRunner(spec, tmp_path, meta, spec.batch_size, threads=1)
    x = arrays["inputs.npz"]["x"][:5]
    np.testing.assert_allclose(runner.run(x)["logits"], x @ kernel.numpy(), rtol=1e-5)
    assert runner.taps(x) == {} and runner.tap_locations["relu1"]["reason"] == TAPS_REASON


@pytest.mark.slow
def test_tf_litert_passes_on_cnn_and_transformer(tmp_path):
    results = checked(zoo_copy(tmp_path, "cnn", "transformer"), ["cnn", "transformer"], ["tf/litert"])
    for model in ("cnn", "transformer"):
        result = results[(model, "tf/litert")]
        assert result["verdict"] == "pass", (model, result["reason"])
        assert all(entry["ok"] for entry in result["shapes"])


@pytest.fixture(scope="module")
def pool():
    with worker_pool() as workers:
        yield workers


def diagnosed(root: Path, model: str, artifact_dir: Path, meta: dict, pool) -> dict:
    ws = Workspace(root / "ws")
    spec = ws.load_spec(model)
    manifest = golden.verify(ws.golden_dir(model), spec)
    run = orchestrate.Run(ws, orchestrate.Options(threads=1))
    return chain.diagnose(
        run, pool, spec, manifest, paths.by_id("tf/litert"), artifact={"dir": str(artifact_dir), "meta": meta}
    )


@pytest.mark.slow  # a second proof of a tf/litert departure diagnosed to its layer, fused taps said so; the fast set
# keeps test_tree_litert.py::test_a_departing_leaf_in_a_sequential_of_custom_layers_is_named_with_its_cause
def test_a_changed_weight_in_the_tflite_model_is_diagnosed_to_its_layer(tmp_path, pool):
    """dense2's kernel changed in the .tflite file: the taps before it agree, dense2 is fused into relu2's op, and relu2
    (the tensor that holds dense2's output after its activation) is the first divergent tap."""
    delta = np.zeros((64, 32), np.float32)
    delta[3, 5] = 0.5
    artifact, meta = exported(tmp_path, "mlp", {"dense2/kernel": delta})
    d = diagnosed(tmp_path, "mlp", artifact, meta, pool)
    rows = {r["tap"]: r for r in d["taps"]}
    assert d["first_divergent_tap"] == "relu2", [(r["tap"], r["found"], r["stats"]) for r in d["taps"]]
    assert rows["relu1"]["found"] == "name" and rows["relu1"]["stats"]["ok"]
    assert rows["dense2"]["found"] == "fused" and rows["dense2"]["fused_into"] == "relu2"
    assert rows["relu2"]["tensor"].startswith("mlp") and "relu2" in rows["relu2"]["tensor"]


@pytest.mark.slow
def test_a_changed_weight_in_a_transformer_tflite_is_diagnosed_to_its_layer(tmp_path, pool):
    delta = np.zeros((32, 64), np.float32)
    delta[1, 2] = 0.5
    artifact, meta = exported(tmp_path, "transformer", {"block1_mlp_in/kernel": delta})
    d = diagnosed(tmp_path, "transformer", artifact, meta, pool)
    rows = {r["tap"]: r for r in d["taps"]}
    assert d["first_divergent_tap"] == "block1_mlp_in"
    assert rows["block1_mlp_in"]["found"] == "name" and "block1_mlp_in" in rows["block1_mlp_in"]["tensor"]
    assert all(rows[t]["stats"]["ok"] for t in ("pos", "block0_attn", "block1_norm2"))
