"""ONNX Runtime's int8 paths: the static (QDQ) and dynamic exporters, and the diagnosis that names the layer an int8
model loses its accuracy in and the fewest nodes to keep in float.

The models are the zoo's trained digits MLP, exported by torch.onnx as parity exports it, and the same MLP made
sensitive on purpose: its first hidden layer's busiest channel scaled by 1024 and the next layer's weights on that
channel divided by 1024 (exact in binary floating point, and ReLU commutes with a positive scale, so the float model
and its golden data are unchanged), which no per-tensor int8 range of that activation can hold beside the others.

Both are judged by a gate that keeps 95 % (``KEEP``): on its 449 eval samples the default 99 % passes only while not
one sample changes, a decision one rounding on another CPU's int8 kernel flips, which a test must not sit on. The
int8 model that "passes" loses at most a few samples, the outlier model most of them: both far from this gate's edge.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from parity.exporters import onnx_int8
from parity.exporters.common import ExportJob
from parity.golden import calibration
from parity.golden import store as golden
from parity.model.workspace import Workspace
from parity.platform.errors import ExportError
from tests.conftest import reseal, zoo_copy

OUTLIER = 1024.0  # a power of two: scaling and dividing back is exact, so the golden stays the model's
KEEP = 0.95  # the tests' gate (see the module docstring)
STATIC, DYNAMIC = "torch/onnx/ort-int8", "torch/onnx/ort-int8dyn"


def _plant_outlier(golden_dir: Path) -> int:
    """The outlier channel of the module docstring in ``golden_dir``'s weights (resealed); returns the channel."""
    from parity.model.digits import digits_split

    with np.load(golden_dir / "weights.npz") as stored:
        weights = {name: stored[name].copy() for name in stored.files}
    x = digits_split((64,)).train_x
    hidden = np.maximum(x @ weights["dense1/kernel"] + weights["dense1/bias"], 0.0)
    channel = int(hidden.mean(0).argmax())
    weights["dense1/kernel"][:, channel] *= OUTLIER
    weights["dense1/bias"][channel] *= OUTLIER
    weights["dense2/kernel"][channel, :] /= OUTLIER
    reseal(golden_dir, "weights.npz", weights)
    return channel


def keep_gate(spec_file: Path, keep: float) -> None:
    """Give the spec in ``spec_file`` a gate that keeps ``keep`` of the golden's accuracy."""
    source = spec_file.read_text()
    assert "ModelSpec(" in source and "from parity.model.spec import " in source
    spec_file.write_text(
        source.replace("ModelSpec(", f"ModelSpec(\n    gate=Gate(keep={keep}),", 1).replace(
            "from parity.model.spec import ", "from parity.model.spec import Gate, ", 1
        )
    )


def _workspace(root: Path, outlier: bool):
    """A zoo copy with the mlp (its weights given the outlier channel when ``outlier``), its spec, the golden and
    the float ONNX parent the int8 paths are quantized from (torch.onnx, as parity exports it)."""
    from parity.exporters import torch_onnx
    from parity.run.tasks import _input_batch

    zoo_copy(root, "mlp")
    keep_gate(root / "models" / "mlp.py", KEEP)
    if outlier:
        _plant_outlier(root / "golden" / "mlp")
    ws = Workspace(root)
    spec = ws.load_spec("mlp")
    verified = golden.load(ws.golden_dir("mlp"), spec)
    parent = root / "parent"
    parent.mkdir()
    job = ExportJob(
        spec=spec,
        weights=verified.arrays["weights.npz"],
        batch_size=spec.batch_size,
        opset=spec.opset,
        out_dir=parent,
        inputs=_input_batch(verified, spec, spec.batch_size),
    )
    return ws, spec, verified, parent, torch_onnx.export(job)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return _workspace(tmp_path_factory.mktemp("int8-plain"), outlier=False)


@pytest.fixture(scope="module")
def sensitive(tmp_path_factory):
    return _workspace(tmp_path_factory.mktemp("int8-outlier"), outlier=True)


def _export(setup, exporter, out_dir: Path, path_id: str, keep_float=None, method: str = "MinMax") -> dict:
    _, spec, verified, parent, meta = setup
    spec = replace(spec, quantization=replace(spec.quantization, calibration=method, keep_float=keep_float or {}))
    samples, _ = calibration.calibration_feeds(spec, verified)
    out_dir.mkdir()
    job = ExportJob(
        spec=spec,
        weights={},
        batch_size=spec.batch_size,
        opset=spec.opset,
        out_dir=out_dir,
        parent_dir=parent,
        parent_meta=meta,
        calibration=samples,
        path_id=path_id,
    )
    return exporter(job)


def _check(setup, path_id: str, out_dir: Path, meta: dict) -> dict:
    """parity's own check of the int8 path on the artifact in ``out_dir``: its accuracy gate."""
    from parity.run.tasks import check_path

    ws = setup[0]
    result = check_path(str(ws.root), "mlp", path_id, str(ws.golden_dir("mlp")), "fp32", 1, str(out_dir), meta)
    return result["gate"]


def _ops(path: Path) -> dict[str, str]:
    return {node.name: node.op_type for node in onnx.load(str(path)).graph.node}


def test_static_export_writes_a_qdq_model_calibrated_as_the_spec_says_and_keeps_the_named_nodes_float(plain, tmp_path):
    meta = _export(plain, onnx_int8.export_static, tmp_path / "static", STATIC, method="Entropy")
    parent_meta = plain[4]
    assert {k: meta[k] for k in parent_meta} == {**parent_meta, "file": "model.onnx"}
    record = meta["quantization"]
    assert record["format"] == "QDQ" and record["calibration"] == "Entropy" and record["per_channel"]
    assert record["calibration_samples"] == 256 and record["pre_process"]["applied"]
    assert record["quantized_layers"] == 3 and record["kept_float"] == []
    ops = _ops(tmp_path / "static" / "model.onnx")
    assert "QuantizeLinear" in ops.values() and "DequantizeLinear" in ops.values()
    assert _check(plain, STATIC, tmp_path / "static", meta)["decision"] == "pass"
    # a kept node reads its own weight as the float initializer, not through a DequantizeLinear
    kept = _export(
        plain,
        onnx_int8.export_static,
        tmp_path / "kept",
        STATIC,
        keep_float={"torch/onnx/ort-int8*": ("node_linear_1",)},
    )
    assert kept["quantization"]["kept_float"] == ["node_linear_1"] and kept["quantization"]["quantized_layers"] == 2
    model = onnx.load(str(tmp_path / "kept" / "model.onnx"))
    producers = {out: node.op_type for node in model.graph.node for out in node.output}
    gemm = next(node for node in model.graph.node if node.name == "node_linear_1")
    assert producers.get(gemm.input[1]) is None and gemm.input[1] in {t.name for t in model.graph.initializer}


def test_dynamic_export_quantizes_weights_and_keeps_a_named_gemm_float(plain, tmp_path):
    meta = _export(plain, onnx_int8.export_dynamic, tmp_path / "dynamic", DYNAMIC)
    record = meta["quantization"]
    assert record["calibration"] is None and record["calibration_samples"] == 0 and record["quantized_layers"] == 3
    assert list(_ops(tmp_path / "dynamic" / "model.onnx").values()).count("MatMulInteger") == 3
    assert _check(plain, DYNAMIC, tmp_path / "dynamic", meta)["decision"] == "pass"
    # quantize_dynamic renames a Gemm before it reads nodes_to_exclude: the layer must still stay float
    kept = _export(
        plain, onnx_int8.export_dynamic, tmp_path / "kept", DYNAMIC, keep_float={DYNAMIC: ("node_linear_1",)}
    )
    ops = _ops(tmp_path / "kept" / "model.onnx")
    assert list(ops.values()).count("MatMulInteger") == 2 and ops["node_linear_1_MatMul"] == "MatMul"
    assert kept["quantization"]["quantized_layers"] == 2


def test_a_kept_node_the_graph_does_not_have_is_an_export_error(plain, tmp_path):
    with pytest.raises(ExportError, match="keep_float names 1 node.*node_typo"):
        _export(plain, onnx_int8.export_static, tmp_path / "typo", STATIC, keep_float={STATIC: ("node_typo",)})


def _diagnose(setup, path_id: str) -> dict:
    from parity.diagnose.precision.int8_layers import diagnose_int8

    ws, _, _, parent, meta = setup
    found = diagnose_int8(str(ws.root), "mlp", path_id, str(ws.golden_dir("mlp")), str(parent), meta, 1)
    return json.loads(json.dumps(found))  # what crosses the worker boundary


def test_an_outlier_channel_is_named_as_the_layer_that_costs_the_accuracy_and_repaired(sensitive, tmp_path):
    from parity.diagnose.precision.int8_layers import render_int8

    found = _diagnose(sensitive, STATIC)
    assert found["gate"]["decision"] == "fail" and found["gate"]["value"] < 0.5 < found["gate"]["golden"]
    for label in ("first", "worst"):
        layer = found[label]
        assert (layer["node"], layer["module"], layer["op_type"]) == ("node_linear", "dense1", "Gemm"), label
        assert found[f"{label}_by"] == "regain" and layer["regain"] > 0.5
    # the tensor's SQNR is high (the outlier is the signal); its other channels round to zero
    first = found["first"]
    assert (
        first["sqnr_db"] > 30 and first["channel_sqnr_db"] < 3 and first["excluded"] == ["node_linear", "node_linear_1"]
    )
    assert found["ranking"][0] == "node_linear" and found["tested"] == 3
    repair = found["repair"]
    assert repair["passes"] and repair["minimal"] and repair["after"]["decision"] == "pass"
    assert repair["nodes_to_exclude"] == ["node_linear", "node_linear_1"] and repair["runs"] <= 40
    assert all(judged["decision"] != "pass" for judged in repair["needed"].values())
    assert repair["toolchain"]["spec"] == (
        'quantization=Quantization(keep_float={"torch/onnx/ort-int8": ("node_linear", "node_linear_1")})'
    )
    lines = "\n".join(render_int8(found))
    assert "dense1 (node node_linear, Gemm)" in lines and "nodes_to_exclude=['node_linear', 'node_linear_1']" in lines
    # the exporter with the repair's list writes a model parity's check passes; with either node int8 it fails
    keep = {STATIC: tuple(repair["nodes_to_exclude"])}
    meta = _export(sensitive, onnx_int8.export_static, tmp_path / "repaired", STATIC, keep_float=keep)
    assert _check(sensitive, STATIC, tmp_path / "repaired", meta)["decision"] == "pass"
    meta = _export(sensitive, onnx_int8.export_static, tmp_path / "half", STATIC, keep_float={STATIC: ("node_linear",)})
    assert _check(sensitive, STATIC, tmp_path / "half", meta)["decision"] == "fail"


def test_dynamic_quantization_names_the_layer_that_quantizes_the_outlier_activation(sensitive):
    found = _diagnose(sensitive, DYNAMIC)
    assert found["gate"]["decision"] == "fail"
    # quantize_dynamic quantizes an activation where it is read: inside the next layer
    assert found["first"]["node"] == found["worst"]["node"] == "node_linear_1" and found["worst"]["module"] == "dense2"
    repair = found["repair"]
    assert repair["passes"] and repair["minimal"] and repair["nodes_to_exclude"] == ["node_linear_1"]
    assert "'node_linear_1_MatMul'" in repair["toolchain"]["onnxruntime"]


def test_a_path_that_passes_needs_no_repair_and_another_quantizer_is_not_diagnosed_here(plain):
    found = _diagnose(plain, STATIC)
    assert found["gate"]["decision"] == "pass" and found["repair"]["reason"] == "the path passes its gate as quantized"
    assert {layer["node"] for layer in found["layers"]} == {"node_linear", "node_linear_1", "node_linear_2"}
    assert "not quantized by ONNX Runtime" in _diagnose(plain, "torch/onnx/openvino-int8")["reason"]


def _jax_style_gemm(path, beta: float = 0.0) -> None:
    """Two layers as jax2onnx writes them: Gemm(x, W, scalar C) with beta 0, then the real bias by an Add."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1, w2 = rng.normal(size=(16, 32)).astype(np.float32), rng.normal(size=(32, 4)).astype(np.float32)
    b1 = rng.normal(size=(1, 32)).astype(np.float32)
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(b1, "b1"),
        numpy_helper.from_array(np.array(0.0, np.float32), "dot_bias"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "dot_bias"], ["h"], name="g1", beta=beta),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="add"),
        helper.make_node("Relu", ["hb"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "w2", "dot_bias"], ["y"], name="g2", beta=beta),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 4])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), str(path))


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_jax2onnx_gemm_with_beta_zero_is_quantized_to_the_same_sum(tmp_path, dynamic):
    """ONNX Runtime's quantizer (1.31) folds a Gemm's C without its beta=0 (the jax zoo's int8 model scored 1.6 %),
    and its dynamic quantizer leaves a Gemm float: parity drops the unused C and, for dynamic, writes the MatMul."""
    import onnxruntime

    from parity.exporters import onnx_int8

    _jax_style_gemm(tmp_path / "f.onnx")
    x = np.random.default_rng(1).normal(size=(8, 16)).astype(np.float32)
    record = onnx_int8.quantize(
        tmp_path / "f.onnx",
        tmp_path / "q.onnx",
        None if dynamic else [{"x": x}],
        None if dynamic else "MinMax",
        dynamic=dynamic,
    )
    assert record["quantized_layers"] >= 2
    assert any("C unused (beta=0) dropped" in c for c in record["pre_process"]["gemm_bias_rewritten"])
    expected = onnxruntime.InferenceSession(str(tmp_path / "f.onnx")).run(None, {"x": x})[0]
    found = onnxruntime.InferenceSession(str(tmp_path / "q.onnx")).run(None, {"x": x})[0]
    assert np.abs(found - expected).max() < 0.05 * np.abs(expected).max()


def test_a_graph_the_quantizer_leaves_float_is_an_export_error(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from parity.exporters import onnx_int8
    from parity.platform.errors import ExportError

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), str(tmp_path / "f.onnx")
    )
    with pytest.raises(ExportError, match="quantized no layer"):
        onnx_int8.quantize(tmp_path / "f.onnx", tmp_path / "q.onnx", None, None, dynamic=True)


def test_a_candidate_with_every_layer_kept_float_is_no_int8_model_and_not_a_repair(tmp_path):
    from parity.diagnose.precision.int8_repair import Candidates

    _jax_style_gemm(tmp_path / "f.onnx")
    candidates = Candidates(
        tmp_path / "f.onnx",
        {"file": "f.onnx"},
        None,
        None,
        True,
        [],
        tmp_path / "runs",
        evaluate=lambda folder, meta: pytest.fail("nothing to run"),
        judge=lambda logits: {},
    )
    judged = candidates.gate(["g1", "g2"])
    assert judged["decision"] == "fail" and judged["value"] is None and "quantized no layer" in judged["reason"]
