"""GPU paths (``gpu`` marker: deselected by default, ``-m gpu`` runs them; each skips with the reason the
path is unavailable, so they pass cleanly on a machine without a GPU or without a CUDA build)."""

from __future__ import annotations

import pytest

from parity.bench.plan import BenchOptions
from parity.model.workspace import Workspace
from parity.pipeline import orchestrate
from parity.run import paths

pytestmark = pytest.mark.gpu
TIMING = BenchOptions(budget_s=0.2, min_runs=10, batch_sizes=(64,), first_result=False)


def checked(root, path_id: str, precision: str, timing=TIMING) -> dict:
    reason = paths.unavailable_reason(paths.by_id(path_id, "cuda:0", precision))
    if reason:
        pytest.skip(reason)
    opts = orchestrate.Options(threads=1, patterns=(path_id,), device="cuda:0", precision=precision, timing=timing)
    report = orchestrate.check(Workspace(root), ["mlp"], opts)
    result = {r["path"]: r for r in report["results"]}[path_id]
    if result["verdict"] == "skip":  # the runner itself found the device or precision missing
        pytest.skip(result["reason"])
    assert result["verdict"] == "pass", result["reason"]
    assert result["device"] == "cuda:0" and result["precision"] == precision
    return result


def gpu_figures(result: dict) -> dict:
    batch = result["timing"]["batches"]["64"]
    assert batch["verdict"] == "pass"
    return batch["gpu"]


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16", "bf16"])
def test_torch_on_cuda(workspace_copy, precision):
    result = checked(workspace_copy(), "torch", precision)
    flags = result["numerics"]
    assert (
        flags["torch.backends.cuda.matmul.allow_tf32"]
        == flags["torch.backends.cudnn.allow_tf32"]
        == (precision == "tf32")
    )
    figures = gpu_figures(result)
    assert figures["compute"]["median_ms"] > 0 and figures["peak_device_memory_mb"] > 0
    assert figures["state"].get("available") is not False or "reason" in figures["state"]
    energy = figures["energy"]
    assert energy["joules_per_inference"] is None or energy["joules_per_inference"] > 0


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16", "bf16"])
def test_jax_on_cuda(workspace_copy, precision):
    result = checked(workspace_copy(), "jax", precision)
    assert result["numerics"]["jax_default_matmul_precision"] == ("tensorfloat32" if precision == "tf32" else "highest")
    assert gpu_figures(result)["compute"]["median_ms"] > 0


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
def test_onnx_runtime_cuda_provider(workspace_copy, precision):
    result = checked(workspace_copy(), "torch/onnx/ort", precision)
    assert result["numerics"]["provider"] == "CUDAExecutionProvider"
    assert result["numerics"]["provider_options"]["use_tf32"] == (1 if precision == "tf32" else 0)
    assert gpu_figures(result)["compute"]["median_ms"] > 0


@pytest.mark.parametrize("path_id", ["torch/onnx/trt", "torch/onnx/ort-trt"])
def test_tensorrt(workspace_copy, path_id):
    result = checked(workspace_copy(), path_id, "fp32")
    assert gpu_figures(result)["compute"]["median_ms"] > 0
