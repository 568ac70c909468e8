"""The TensorRT paths: importable on a CPU-only machine, a clear skip without TensorRT, and (on a GPU) an engine
build that matches NumPy and records whether two independent builds agree."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from parity.model.spec import InputSpec, ModelSpec
from parity.platform.errors import Unavailable

BATCH, FEATURES, CLASSES = 4, 3, 2
MODULES = ("parity.runtimes.trt", "parity.runtimes.ort_trt", "parity.exporters.trt_engine")


def tiny_onnx(folder):
    """y = relu(x @ w + b), static batch; returns (meta as the ONNX exporters write it, w, b)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = rng.standard_normal((FEATURES, CLASSES)).astype(np.float32)
    b = rng.standard_normal(CLASSES).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["z"]), helper.make_node("Relu", ["z"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [BATCH, CLASSES])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save_model(model, str(folder / "model.onnx"))
    meta = {
        "format": "onnx",
        "file": "model.onnx",
        "input_names": ["x"],
        "output_names": ["y"],
        "input_layout": "flat",
        "canonical_layout": "flat",
    }
    return meta, w, b


def tiny_spec():
    return ModelSpec(name="tiny", description="", input=InputSpec("x", (FEATURES,)), outputs=("y",), batch_size=BATCH)


def test_importing_the_tensorrt_modules_imports_no_gpu_library():
    probe = (
        f"import importlib, json, sys\nfor m in {MODULES!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorrt', 'cuda', 'onnxruntime'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_ort_trt_without_the_tensorrt_provider_is_unavailable(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    if "TensorrtExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the TensorRT provider")
    from parity.runtimes.ort_trt import OrtTrtRunner

    meta, _, _ = tiny_onnx(tmp_path)
    with pytest.raises(Unavailable, match="no TensorrtExecutionProvider .*pip install parity\\[gpu\\]"):
        OrtTrtRunner(tiny_spec(), tmp_path, meta, BATCH, 1, "cuda:0", "fp32")


@pytest.mark.gpu
def test_engine_build_matches_numpy_and_records_determinism(tmp_path):
    pytest.importorskip("tensorrt")
    from parity.exporters.common import ExportJob
    from parity.exporters.trt_engine import export
    from parity.runtimes.trt import TrtRunner

    parent, out = tmp_path / "onnx", tmp_path / "trt"
    parent.mkdir()
    out.mkdir()
    parent_meta, w, b = tiny_onnx(parent)
    x = np.random.default_rng(1).standard_normal((BATCH, FEATURES)).astype(np.float32)
    job = ExportJob(tiny_spec(), {}, BATCH, 17, out, parent, parent_meta, device="cuda:0", precision="fp32", inputs=x)
    meta = export(job)

    assert (out / meta["file"]).exists()
    assert meta["builder"]["cleared"][0] == "TF32" and meta["builder"]["flags"] == []
    assert meta["build_determinism"]["builds"] == 2
    assert isinstance(meta["build_determinism"]["deterministic"], bool)
    assert len(meta["build_s"]) == 2
    runner = TrtRunner(tiny_spec(), out, meta, BATCH, 1, "cuda:0", "fp32")
    try:
        got = runner.run(x)["y"]
        np.testing.assert_allclose(got, np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)
        assert runner.device_memory_peak_mb() > 0
        runner.device_compute(x)()
    finally:
        runner.close()
