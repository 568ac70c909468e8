"""The precision and device axes on a CPU machine: bf16 / fp16 paths verified against the float64 golden and
timed, one that fails the metric rule on purpose, flags recorded, and GPU paths skipping with their reasons."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from parity.bench.plan import BenchOptions
from parity.cli import cli
from parity.model.spec import Tolerance, Tolerances
from parity.model.workspace import Workspace
from parity.pipeline import orchestrate, outcome
from parity.platform import devices, precision
from parity.run import paths
from tests.conftest import REPO

NO_GPU = isinstance(devices.nvidia_gpus(), str)


def run_check(root, model, patterns, **options):
    opts = orchestrate.Options(threads=1, patterns=tuple(patterns), **options)
    report = orchestrate.check(Workspace(root), [model], opts)
    return report, {r["path"]: r for r in report["results"]}


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


# --- tolerances and flags ---------------------------------------------------------------------------


def test_default_tolerances_come_from_the_dtype_and_gradients_are_looser():
    assert precision.default_tolerance("fp16") == (16 * 2**-10,) * 2
    assert precision.default_tolerance("bf16") == (16 * 2**-7,) * 2
    assert precision.default_tolerance("tf32") == precision.default_tolerance("fp16")  # 10 fraction bits each
    assert precision.default_tolerance("bf16", gradients=True)[0] == 10 * precision.default_tolerance("bf16")[0]


def test_a_spec_declares_per_precision_tolerances_and_defaults_are_never_tighter_than_fp32():
    spec = Workspace(REPO).load_spec("mlp")
    spec.tolerances = {
        "fp32": Tolerances(Tolerance(0.5, 1e-5), {"logits": Tolerance(1e-5, 0.9)}),
        "fp16": Tolerances(Tolerance(0.03, 0.03)),
    }
    assert spec.output_tolerances("fp16").default == Tolerance(0.03, 0.03)  # declared wins
    bf16 = spec.output_tolerances("bf16")
    assert bf16.default == Tolerance(0.5, 0.125) and bf16.for_name("logits") == Tolerance(0.125, 0.9)
    assert spec.gradient_tolerances("bf16").default.rtol == 1.25


def test_torch_flags_are_set_explicitly_and_recorded():
    torch = pytest.importorskip("torch")
    recorded = precision.torch_flags(torch, "tf32", "cpu")
    assert recorded["torch.backends.cuda.matmul.allow_tf32"] is True and recorded["torch.backends.cudnn.allow_tf32"]
    assert recorded["torch.backends.mkldnn.matmul.fp32_precision"] == "ieee"  # the CPU never uses a reduced fp32
    recorded = precision.torch_flags(torch, "fp32", "cpu")  # fp32: TF32 off, as set, not as defaulted
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert recorded["torch.float32_matmul_precision"] == "highest"
    assert recorded["torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction"] is False
    torch.export.export(torch.nn.Conv2d(1, 1, 1), (torch.zeros(1, 1, 2, 2),))  # torch.export still reads the switches


def test_worker_environment_pins_tf32_off_except_at_tf32():
    assert precision.worker_environment("cuda:1", "fp32")["NVIDIA_TF32_OVERRIDE"] == "0"
    assert precision.worker_environment("cuda:1", "fp32")["CUDA_VISIBLE_DEVICES"] == "1"
    assert precision.worker_environment("cuda:0", "tf32")["NVIDIA_TF32_OVERRIDE"] is None  # an inherited 0 is unset
    assert precision.worker_environment("cpu", "bf16")["JAX_PLATFORMS"] == "cpu"


# --- end to end on the CPU --------------------------------------------------------------------------


@pytest.mark.slow  # a second proof of a bf16 check under bf16's tolerances; the fast set keeps
# test_a_bf16_path_that_loses_the_ranking_fails_the_metric_rule (its outputs within them), and a timed check
# test_check.py::test_gate_times_passing_paths_only
def test_bf16_native_paths_pass_with_their_tolerances_and_are_timed(workspace_copy):
    root = workspace_copy()
    report, results = run_check(
        root,
        "mlp",
        ["torch", "jax"],
        precision="bf16",
        timing=BenchOptions(budget_s=0.05, min_runs=5, batch_sizes=(64,), first_result=False),
    )
    assert outcome.exit_code(report) == 0
    for path_id, dtype_flag in (
        ("torch", "torch.backends.cuda.matmul.allow_tf32"),
        ("jax", "jax_default_matmul_precision"),
    ):
        result = results[path_id]
        assert result["verdict"] == "pass" and result["precision"] == "bf16", result["reason"]
        assert result["numerics"]["dtype"] == "bfloat16" and dtype_flag in result["numerics"]
        assert result["tolerances"]["outputs"]["default"] == {"atol": 0.125, "rtol": 0.125}
        worst = result["outputs"]["logits"]
        assert 1e-3 < worst["max_abs"] and worst["tol_units"] < 1  # bf16 rounding is there, within tolerance
        assert result["metrics"]["ok"] and result["gradients"]
        assert result["timing"]["batches"]["64"]["verdict"] == "pass"  # verified again at the batch, then timed


def test_fp16_onnx_model_is_converted_and_runs_on_onnx_runtime_cpu(workspace_copy):
    root = workspace_copy()
    report, results = run_check(root, "mlp", ["torch/onnx/*"], precision="fp16", diagnose=None)
    assert outcome.exit_code(report) == 0
    for path_id in ("torch/onnx/ort", "torch/onnx/onnxref"):
        result = results[path_id]
        assert result["verdict"] == "pass", result["reason"]
        assert result["numerics"]["float16_model"] is True
        assert 1e-4 < result["outputs"]["logits"]["max_abs"]  # really float16, not the float32 model
    assert paths.by_id("torch/onnx/ort", "cpu", "fp16").exports[-1] is paths.ONNX_FP16


def test_a_bf16_path_that_loses_the_ranking_fails_the_metric_rule(tmp_path):
    """Logits on a large offset: bf16 outputs stay within tolerance, but the ranking collapses, and the
    metric rule (accuracy >= 99 % of the float64 value, argmax agreement) fails the path."""
    import torch

    from tests.usermodels import make_offset_logits

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    with torch.no_grad():
        labels = make_offset_logits().double()(torch.from_numpy(x).double()).argmax(-1).numpy()
    np.savez(tmp_path / "data.npz", x=x, labels=labels)
    models = REPO / "tests" / "usermodels.py"
    for args in (
        [
            "init",
            "offset",
            "--torch",
            f"{models}:make_offset_logits",
            "--inputs",
            str(tmp_path / "data.npz"),
            "--input",
            "x=64x8",
        ],
        ["golden", "build", "--model", "offset"],
    ):
        result = invoke(*args, "--workspace", str(tmp_path))
        assert result.exit_code == 0, result.output
    _, fp32 = run_check(tmp_path, "offset", ["torch"], diagnose=None)
    assert fp32["torch"]["verdict"] == "pass"
    report, bf16 = run_check(tmp_path, "offset", ["torch"], precision="bf16")
    result = bf16["torch"]
    assert result["diagnosis"] and "error" not in result["diagnosis"]  # diagnosed at bf16, under bf16 tolerances
    assert result["verdict"] == "fail" and outcome.exit_code(report) == 1
    assert result["outputs"]["output"]["ok"]  # within the bf16 output tolerance ...
    assert not result["metrics"]["ok"] and result["metrics"]["accuracy"]["value"] < 0.9  # ... but not the metric
    assert result["reason"].startswith("metric accuracy") and "argmax agreement" in result["reason"]


# --- what cannot run here -----------------------------------------------------------------------------


def test_tf32_on_the_cpu_and_bf16_on_onnx_runtime_skip_with_reasons():
    assert "tensor-core mode" in paths.unavailable_reason(paths.by_id("torch", "cpu", "tf32"))
    assert "bfloat16 ONNX converter" in paths.unavailable_reason(paths.by_id("torch/onnx/ort", "cpu", "bf16"))
    assert paths.unavailable_reason(paths.by_id("torch", "cpu", "bf16")) is None


@pytest.mark.skipif(not NO_GPU, reason="this machine has an NVIDIA GPU")
def test_device_cuda_without_a_gpu_skips_every_path_with_its_reason(workspace_copy):
    root = workspace_copy()
    result = invoke("check", "--workspace", str(root), "--model", "mlp", "--device", "cuda", "--json", "-")
    assert result.exit_code == 2, result.output  # nothing failed, but nothing was checked: said in one line
    assert result.stderr.strip().splitlines()[-1].startswith("error: nothing was checked: every selected path")
    assert "no NVIDIA GPU here" in result.stderr and "Traceback" not in result.output
    report = json.loads(result.stdout)
    reasons = {r["path"]: r["reason"] for r in report["results"]}
    assert {r["verdict"] for r in report["results"]} == {"skip"} and {r["device"] for r in report["results"]} == {
        "cuda:0"
    }
    assert all(reason.startswith("no NVIDIA GPU here") for reason in reasons.values())
    assert "torch/onnx/trt" in reasons and "torch/onnx/ort-trt" in reasons and "torch/onnx/onnxref" not in reasons
    if "+cpu" in (report["env"]["packages"].get("torch") or ""):
        assert "CPU-only build" in reasons["torch"]
    assert "onnxruntime is the CPU build" in reasons["torch/onnx/ort"]


def test_paths_shows_the_whole_matrix_with_reasons_and_the_tensorrt_note():
    result = invoke("paths", "--model", "mlp")
    assert result.exit_code == 0
    for text in ("torch/onnx/trt", "cuda:0", "tf32", "bf16", "TF32 is a tensor-core mode", "unverified"):
        assert text in result.output


@pytest.mark.parametrize(
    "args,message",
    [
        (["--precision", "fp8"], "Invalid value for '--precision'"),
        (["--device", "tpu"], "unknown device 'tpu'; use cpu, cuda or cuda:N"),
        (["--device", "cuda:x"], "unknown device 'cuda:x'"),
    ],
)
def test_bad_device_or_precision_is_one_line_and_exit_2(args, message):
    result = CliRunner().invoke(cli, ["check", "--model", "mlp", *args])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def _key(run, spec, manifest, path, depth):
    """The cache key of a chain's artifact at ``depth`` from what is known before it is made."""
    from parity.run.cache import content_key

    return content_key(run._key_parts(spec, manifest, path, depth, None)[0])


def test_an_engine_is_keyed_on_gpu_and_tensorrt_version_and_float32_exports_are_shared(workspace_copy, monkeypatch):
    """An engine cache entry built for another GPU or TensorRT version has another key: rebuilt, never reused.
    The float32 export under a reduced-precision path is the fp32 path's own (one export, many precisions)."""
    root = workspace_copy()
    ws = Workspace(root)
    spec = ws.load_spec("mlp")
    from parity.golden import store as golden

    manifest = golden.verify(ws.golden_dir("mlp"), spec)
    run = orchestrate.Run(ws, orchestrate.Options(threads=1))
    engine = paths.by_id("torch/onnx/trt", "cuda:0", "fp16")
    identity = {"tensorrt": "10.13.0", "gpu": "NVIDIA H100", "compute_capability": "9.0"}
    monkeypatch.setattr(devices, "engine_identity", lambda device: dict(identity))
    key = _key(run, spec, manifest, engine, 1)
    for field, other in (("gpu", "NVIDIA A100"), ("compute_capability", "8.0"), ("tensorrt", "11.4.0")):
        monkeypatch.setattr(devices, "engine_identity", lambda device, f=field, o=other: {**identity, f: o})
        assert _key(run, spec, manifest, engine, 1) != key
    assert _key(run, spec, manifest, paths.by_id("torch/onnx/trt", "cuda:0", "fp32"), 1) != key
    fp32, fp16 = paths.by_id("torch/onnx/ort", "cpu", "fp32"), paths.by_id("torch/onnx/ort", "cpu", "fp16")
    assert _key(run, spec, manifest, fp32, 0) == _key(run, spec, manifest, fp16, 0)
    assert _key(run, spec, manifest, fp16, 1) != _key(run, spec, manifest, paths.by_id("torch/onnx/ort"), 0)


def test_gpu_figures_time_compute_alone_and_say_what_cannot_be_measured():
    """The GPU timing step on a runner with a device-resident form (the Runner contract's own hook, here a
    plain function): compute alone is timed; where NVML has no GPU, energy and clocks say so, never a number."""
    import time

    from parity.bench import tasks as timing
    from parity.report import timing_table
    from parity.runtimes.base import Runner

    class Resident(Runner):
        def device_compute(self, x):
            return lambda: time.sleep(0.0005)

        def device_memory_peak_mb(self):
            return 12.0

    runner = Resident(Workspace(REPO).load_spec("mlp"), 4, device="cuda:0")
    figures = timing.gpu_figures(
        runner, np.zeros((4, 64), np.float32), {"budget_s": 0.05, "min_runs": 5, "target_rel_ci": 0.02}, 4
    )
    assert figures["compute"]["median_ms"] >= 0.5 and figures["peak_device_memory_mb"] == 12.0
    if NO_GPU:
        assert figures["state"]["available"] is False
        assert figures["energy"]["joules_per_inference"] is None
        assert figures["energy"]["reason"].startswith("not measurable here")
    result = {
        "model": "mlp",
        "path": "torch",
        "verdict": "pass",
        "timing": {
            "batches": {
                "4": {
                    "verdict": "pass",
                    "median_ms": 1.0,
                    "ci95_ms": [0.9, 1.1],
                    "cv": 0.01,
                    "runs": 5,
                    "throughput": 4000.0,
                    "gpu": figures,
                }
            }
        },
    }
    text = timing_table.render({"results": [result]})
    assert "GPU compute alone" in text and "12" in text
    if NO_GPU:
        assert "not measurable here" in text
