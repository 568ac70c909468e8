"""int8 paths to LiteRT and OpenVINO: the TFLite converter's full-integer model (tf/litert-int8) and NNCF's quantized
IR (*/openvino-int8) are really int8, run unchanged on the float paths' runtimes, keep the zoo's accuracy, keep the
layers the spec names in float; NNCF's accuracy control reports what it reverted, beside parity's own repair."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from parity.check import metrics
from parity.exporters.common import ExportJob
from parity.golden import calibration
from parity.golden import store as golden
from parity.model import feeds
from parity.model.spec import Quantization
from parity.model.workspace import Workspace
from parity.platform.errors import ExportError
from parity.run import paths, tasks
from tests.conftest import zoo_copy

ZOO = ("mlp", "cnn")
ACCURACY_LOSS = 0.01  # the int8 model's accuracy on the eval split at most this far below the golden's


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> Path:
    return zoo_copy(tmp_path_factory.mktemp("int8"), *ZOO)


def loaded(root: Path, model: str, keep_float: dict | None = None):
    """``(spec with keep_float, verified golden, calibration feeds)``."""
    spec = Workspace(root).load_spec(model)
    if keep_float is not None:
        spec = dataclasses.replace(spec, quantization=Quantization(keep_float=keep_float))
    verified = golden.load(Workspace(root).golden_dir(model), spec)
    return spec, verified, calibration.calibration_feeds(spec, verified)[0]


def export_int8(exporter, root: Path, model: str, out: Path, path_id: str, keep_float=None, parent=None) -> dict:
    spec, verified, samples = loaded(root, model, keep_float)
    out.mkdir(parents=True, exist_ok=True)
    job = ExportJob(
        spec=spec,
        weights=verified.arrays["weights.npz"],
        batch_size=spec.batch_size,
        opset=18,
        out_dir=out,
        parent_dir=parent and parent[0],
        parent_meta=parent and parent[1],
        calibration=samples,
        path_id=path_id,
    )
    return exporter(job)


def eval_accuracy(root: Path, model: str, path_id: str, out: Path, meta: dict, keep_float=None):
    """``(runner, the path's accuracy, the golden's, argmax agreement with the golden)`` on the eval split."""
    spec, verified, _ = loaded(root, model, keep_float)
    runner = tasks.build_runner(spec, paths.by_id(path_id), {}, spec.batch_size, 1, str(out), meta)
    evals = verified.arrays["eval.npz"]
    logits = feeds.run_batched(runner, feeds.from_arrays(spec, evals), spec.batch_size)["logits"]
    reference = verified.arrays["reference.npz"]["eval/logits"]
    return (
        runner,
        metrics.accuracy(logits, evals["y"]),
        metrics.accuracy(reference, evals["y"]),
        metrics.argmax_agreement(logits, reference),
    )


# ---- tf/litert-int8 ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def litert_int8(zoo, tmp_path_factory):
    pytest.importorskip("ai_edge_litert")
    from parity.exporters import tf_litert_int8

    made = {}
    for model in ZOO:
        out = tmp_path_factory.mktemp(f"litert-{model}")
        made[model] = out, export_int8(tf_litert_int8.export, zoo, model, out, "tf/litert-int8")
    return made


@pytest.mark.parametrize("model", ZOO)
def test_litert_int8_computes_every_op_in_int8_and_keeps_the_accuracy(zoo, litert_int8, model):
    """Every op between the input's QUANTIZE and the output's DEQUANTIZE writes int8 (shape arithmetic int32), the
    weights are int8 per channel, the inputs and outputs float32 with the batch dynamic; LiteRtRunner runs it as it
    runs the float model, within a point of the golden accuracy."""
    from ai_edge_litert import interpreter as litert

    from parity.exporters.tf_litert_int8 import EDGE_OPS, op_outputs

    out, meta = litert_int8[model]
    data = (out / "model.tflite").read_bytes()
    ops = op_outputs(data)
    kinds = [op for _, op, _ in ops]
    assert kinds[0] == "QUANTIZE" and kinds[-1] == "DEQUANTIZE"
    assert {dtype for _, op, dtype in ops if op not in EDGE_OPS} <= {"int8", "int32"}
    interpreter = litert.Interpreter(model_content=data)
    details = interpreter.get_tensor_details()
    assert sum(d["dtype"] == np.int8 for d in details) >= 4
    assert interpreter.get_input_details()[0]["dtype"] == np.float32
    assert interpreter.get_output_details()[0]["dtype"] == np.float32
    record = meta["quantization"]
    assert record["calibration_samples"] == 256 and record["calibration"] == "MinMax"
    assert record["per_channel"] and record["kept_float"] == [] and record["float_layers"] == []
    assert record["quantized_layers"] >= 3 and record["supported_ops"] == ["TFLITE_BUILTINS_INT8"]
    assert meta["axes"]["dynamic"] == {"x": {"0": "batch"}}
    _, accuracy, golden_accuracy, agreement = eval_accuracy(zoo, model, "tf/litert-int8", out, meta)
    assert accuracy >= golden_accuracy - ACCURACY_LOSS and agreement >= 0.97, (accuracy, golden_accuracy, agreement)


def test_litert_int8_taps_are_read_dequantized(zoo, litert_int8):
    """An int8 tensor is read as the real values it stands for (its scale and zero point), near the golden tap, and
    says so; an integer tensor without a scale is no layer value and says why instead of being read."""
    from parity.runtimes.litert import dequantized

    out, meta = litert_int8["cnn"]
    spec, verified, _ = loaded(zoo, "cnn")
    runner = tasks.build_runner(spec, paths.by_id("tf/litert-int8"), {}, spec.batch_size, 1, str(out), meta)
    taps = runner.taps(verified.arrays["inputs.npz"]["x"])
    assert {"relu1", "pool1", "flatten", "logits"} <= set(taps)
    assert "dequantized" in runner.tap_locations["relu1"]["reason"]
    for tap in ("relu1", "pool1", "logits"):
        reference = verified.arrays["reference.npz"][f"tap/{tap}"]
        assert np.max(np.abs(taps[tap] - reference)) < 0.05 * np.max(np.abs(reference)), tap
    value, why = dequantized(
        {"name": "shape", "quantization_parameters": {"scales": np.zeros(0)}}, np.array([1, 2], np.int32)
    )
    assert value is None and "without a quantization scale" in why


def test_litert_int8_keeps_the_named_layers_in_float(zoo, tmp_path):
    """kept_float by Keras layer name: its op computes in float32 with float32 weights through TensorFlow's selective
    quantization (QuantizationDebugger), every other op stays int8, float builtins are allowed and recorded; a name
    that is no op or layer is an export error naming the ops."""
    from parity.exporters import tf_litert_int8

    keep = {"tf/litert-int8": ("conv2",)}
    meta = export_int8(tf_litert_int8.export, zoo, "cnn", tmp_path / "kept", "tf/litert-int8", keep)
    record = meta["quantization"]
    assert record["kept_float"] == ["conv2"] and len(record["denylisted_nodes"]) == 1
    assert "conv2_1/convolution" in record["denylisted_nodes"][0]
    assert record["supported_ops"] == ["TFLITE_BUILTINS_INT8", "TFLITE_BUILTINS"]
    assert meta["converter"]["selective"].startswith("QuantizationDebugger")
    ops = tf_litert_int8.op_outputs((tmp_path / "kept" / "model.tflite").read_bytes())
    by_tensor = {tensor: (op, dtype) for tensor, op, dtype in ops}
    assert by_tensor[record["denylisted_nodes"][0]] == ("CONV_2D", "float32")
    assert [op for op, dtype in by_tensor.values() if op == "CONV_2D" and dtype == "int8"] == ["CONV_2D"]
    assert record["float_layers"] == record["denylisted_nodes"]
    _, accuracy, golden_accuracy, _ = eval_accuracy(zoo, "cnn", "tf/litert-int8", tmp_path / "kept", meta)
    assert accuracy >= golden_accuracy - ACCURACY_LOSS
    with pytest.raises(ExportError, match=r"keeps in float 'conv9'.*its ops: .*CONV_2D"):
        export_int8(
            tf_litert_int8.export, zoo, "cnn", tmp_path / "wrong", "tf/litert-int8", {"tf/litert-int8": ("conv9",)}
        )


# ---- */openvino-int8 -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def openvino_float(zoo, tmp_path_factory):
    """The float parents NNCF quantizes: mlp and cnn as OpenVINO IRs from torch, mlp as an ONNX file."""
    pytest.importorskip("nncf")
    made = {}
    for model, step in (("mlp", paths.TORCH_OPENVINO), ("cnn", paths.TORCH_OPENVINO), ("mlp-onnx", paths.TORCH_ONNX)):
        name = model.split("-")[0]
        out = tmp_path_factory.mktemp(f"float-{model}")
        made[model] = (
            out,
            tasks.export_step(str(zoo), name, step.target, str(zoo / "golden" / name), 18, str(out), None, None),
        )
    return made


def int8_ops(xml: Path) -> tuple[int, int]:
    """``(FakeQuantize ops, int8 / uint8 constants)`` of an IR."""
    import openvino as ov

    model = ov.Core().read_model(str(xml))
    kinds = [(op.get_type_name(), op.get_output_element_type(0).get_type_name()) for op in model.get_ordered_ops()]
    return (
        sum(kind == "FakeQuantize" for kind, _ in kinds),
        sum(kind == "Constant" and dtype in ("i8", "u8") for kind, dtype in kinds),
    )


@pytest.mark.parametrize(
    "parent, path_id",
    [("mlp", "torch/openvino-int8"), ("cnn", "torch/openvino-int8"), ("mlp-onnx", "torch/onnx/openvino-int8")],
)
def test_openvino_int8_is_quantized_by_nncf_and_runs_int8_on_the_plugin(zoo, openvino_float, tmp_path, parent, path_id):
    """NNCF's IR holds FakeQuantize ops and int8 weights (float32 scales, nothing compressed to f16); the OPENVINO
    runtime runs it unchanged by the parent's tensor names and its CPU plugin computes those layers in int8; the
    accuracy stays within a point of the golden's; the meta is the parent's plus what NNCF did."""
    from parity.exporters import openvino_int8

    model = parent.split("-")[0]
    parent_dir, parent_meta = openvino_float[parent]
    meta = export_int8(openvino_int8.export, zoo, model, tmp_path, path_id, parent=(parent_dir, parent_meta))
    fake_quantize, int8_weights = int8_ops(tmp_path / "model.xml")
    assert fake_quantize >= 3 and int8_weights >= 3
    assert 'element_type="f16"' not in (tmp_path / "model.xml").read_text()
    assert meta["format"] == "openvino" and meta["parent_format"] == parent_meta["format"]
    assert (meta["input_names"], meta["output_names"], meta["axes"]) == (
        parent_meta["input_names"],
        parent_meta["output_names"],
        parent_meta["axes"],
    )
    record = meta["quantization"]
    assert record["tool"] == "nncf.quantize" and record["preset"] == "PERFORMANCE" and record["kept_float"] == []
    assert record["calibration_samples"] == 256 and record["subset_size"] == 256
    assert record["quantized_layers"] == 3 and record["per_channel"] and record["fake_quantize"] == fake_quantize
    runner, accuracy, golden_accuracy, agreement = eval_accuracy(zoo, model, path_id, tmp_path, meta)
    assert accuracy >= golden_accuracy - ACCURACY_LOSS and agreement >= 0.97, (accuracy, golden_accuracy, agreement)
    ran = runner.runtime_record()["int8_layers"]
    assert sum(ran.get(kind, 0) for kind in ("FullyConnected", "Convolution")) == 3, ran
    assert "int8 IR quantized by NNCF" in runner.no_taps_reason


def test_openvino_int8_keeps_the_named_layers_in_float(zoo, openvino_float, tmp_path):
    """kept_float names NNCF nodes (OpenVINO op names): that MatMul reads float32 weights and no FakeQuantize'd
    input, the others stay int8; a name that is no node is NNCF's error in one line."""
    from parity.exporters import openvino_int8

    parent = openvino_float["mlp"]
    first = export_int8(openvino_int8.export, zoo, "mlp", tmp_path / "all", "torch/openvino-int8", parent=parent)
    kept = first["quantization"]["layers"][1]
    keep = {"*/openvino-int8": (kept,)}
    meta = export_int8(openvino_int8.export, zoo, "mlp", tmp_path / "kept", "torch/openvino-int8", keep, parent)
    record = meta["quantization"]
    assert record["kept_float"] == [kept] and kept not in record["layers"] and record["quantized_layers"] == 2
    assert int8_ops(tmp_path / "kept" / "model.xml")[1] == 2
    with pytest.raises(ExportError, match=r"nncf.quantize failed: .*no-such-node"):
        export_int8(
            openvino_int8.export,
            zoo,
            "mlp",
            tmp_path / "wrong",
            "torch/openvino-int8",
            {"*/openvino-int8": ("no-such-node",)},
            parent,
        )


# ---- NNCF's accuracy control ---------------------------------------------------------------------------------------


def test_accuracy_control_reverts_layers_until_its_max_drop_and_says_which(zoo, openvino_float):
    """With a max drop the plain int8 model exceeds, NNCF reverts ops to float until the float model's accuracy is
    kept: the ops read from its model are the ones its own report names, and its model is no worse than the plain
    one; with the gate's keep (1 %), the zoo's mlp needs nothing reverted."""
    import openvino as ov

    from parity.diagnose.precision import int8_nncf

    parent_dir, parent_meta = openvino_float["mlp"]
    spec, verified, samples = loaded(zoo, "mlp")
    evals = feeds.from_arrays(spec, verified.arrays["eval.npz"])
    labels = verified.arrays["eval.npz"]["y"]
    model = ov.Core().read_model(str(parent_dir / parent_meta["file"]))
    _, strict = int8_nncf.accuracy_control(model, spec, parent_meta, samples, evals, labels, keep=0.9999)
    assert strict["quantized_value"] < strict["float_value"]  # the plain int8 model loses a sample: revert needed
    assert strict["kept_float"] and strict["quantized_layers"]["after"] < strict["quantized_layers"]["before"] == 3
    assert strict["reported"] is not None and sorted(strict["reported"]["reverted"]) == sorted(strict["kept_float"])
    assert strict["value"] >= strict["quantized_value"] and strict["iterations"] >= 1 and strict["seconds"] > 0
    assert strict["met"] == (strict["drop"] <= strict["max_drop"])
    _, relaxed = int8_nncf.accuracy_control(model, spec, parent_meta, samples, evals, labels, keep=0.99)
    assert relaxed["met"] and relaxed["kept_float"] == [] and relaxed["iterations"] == 0
    assert any(line.startswith("Metric of initial model") for line in relaxed["log"])


def test_side_by_side_on_the_float_onnx_names_onnx_nodes_and_renders(zoo, openvino_float):
    """The worker task the int8 diagnosis calls: on the float ONNX file of torch/onnx/ort-int8 it runs NNCF for the
    matching openvino-int8 path, judges NNCF's model by parity's gate and renders one block of lines."""
    from parity.diagnose.precision import int8_nncf

    parent_dir, parent_meta = openvino_float["mlp-onnx"]
    result = int8_nncf.nncf_side_by_side(
        str(zoo), "mlp", "torch/onnx/ort-int8", str(zoo / "golden" / "mlp"), str(parent_dir), parent_meta, 1
    )
    assert result["path"] == "torch/onnx/openvino-int8" and result["compared_with"] == "torch/onnx/ort-int8"
    assert result["max_drop"] == pytest.approx(0.01) and result["drop_type"] == "RELATIVE"
    assert result["gate"]["decision"] in ("pass", "fail", "inconclusive") and result["gate"]["value"] == result["value"]
    assert len(result["onnx_nodes"]) == len(result["kept_float"])
    lines = int8_nncf.render_nncf(result)
    assert lines[0].startswith("  NNCF accuracy control (nncf.quantize_with_accuracy_control")
    assert any("parity's gate on NNCF's model" in line for line in lines)
    assert int8_nncf.onnx_nodes(["node_linear_1/WithoutBiases", "node_relu"], parent_dir / parent_meta["file"]) == {
        "node_linear_1/WithoutBiases": "node_linear_1",
        "node_relu": "node_relu",
    }
    assert int8_nncf.render_nncf({"error": "no openvino here"}) == ["  NNCF accuracy control: no openvino here"]
