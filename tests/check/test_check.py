"""End-to-end checks with real torch, TensorFlow, JAX, exporters and ONNX Runtime (mlp only)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from parity.bench.plan import BenchOptions
from parity.model.workspace import Workspace
from parity.pipeline import orchestrate, outcome
from tests.conftest import mlp_variant


def run_check(root, patterns, timing=None, **options):
    ws = Workspace(root)
    opts = orchestrate.Options(threads=1, patterns=tuple(patterns), timing=timing, **options)
    report = orchestrate.check(ws, ["mlp"], opts)
    return report, {r["path"]: r for r in report["results"]}


def test_gate_times_passing_paths_only(workspace_copy):
    """A weight perturbed on purpose in one path fails that path, which is then not timed; the others are
    timed at every batch size with raw samples, a verified training step, first result and baseline ratios."""
    root = workspace_copy()
    delta = np.zeros((64, 64), np.float32)
    delta[3, 5] = 0.05
    report, results = run_check(
        root,
        ["torch", "torch/onnx/ort", "jax"],
        timing=BenchOptions(budget_s=0.05, min_runs=30, batch_sizes=(64,)),
        weight_perturbation={("mlp", "jax"): {"dense1/kernel": delta}},
    )
    assert results["jax"]["verdict"] == "fail"
    assert results["jax"]["timing"] is None
    assert "output logits" in results["jax"]["reason"]
    assert not results["jax"]["outputs"]["logits"]["ok"]
    for path in ("torch", "torch/onnx/ort"):
        assert results[path]["verdict"] == "pass", results[path]["reason"]
        timing = results[path]["timing"]
        entry = timing["batches"]["64"]
        assert entry["verdict"] == "pass" and entry["verified"]["ok"]
        assert entry["runs"] >= 30 and len(entry["samples_ms"]) == entry["runs"] and entry["median_ms"] > 0
        assert entry["ci95_ms"][0] <= entry["median_ms"] <= entry["ci95_ms"][1]
        assert timing["first_result"]["load_s"] >= 0 and timing["first_result"]["path_peak_mb"] >= 0
    assert results["torch"]["timing"]["train_step"]["verdict"] == "pass"
    assert results["torch/onnx/ort"]["timing"]["train_step"] is None  # ONNX Runtime cannot differentiate
    assert_compared(results["torch/onnx/ort"]["timing"]["batches"]["64"], results["torch"]["timing"]["batches"]["64"])
    assert outcome.exit_code(report) == 1


def assert_compared(entry: dict, base: dict) -> None:
    """A series' ratio to its baseline: given with a CI around it where both series settled, withheld naming the
    unsettled one where not (a busy machine, such as a parallel test run, can leave a short series unsettled)."""
    versus = entry["vs_baseline"]
    unsettled = [who for who, e in (("this series", entry), ("the baseline's", base)) if not e["stability"]["ok"]]
    assert versus["baseline"] == "torch"
    if unsettled:
        assert versus["withheld"] and "ratio" not in versus
        assert all(
            f"{who}: {e['stability']['reason']}" in versus["reason"]
            for who, e in (("this series", entry), ("the baseline's", base))
            if who in unsettled
        )
    else:
        assert versus["ci95"][0] <= versus["ratio"] <= versus["ci95"][1] and "withheld" not in versus


def test_a_ratio_is_given_between_settled_series_and_withheld_where_one_is_unsettled():
    """The rule on fixed series: two settled series get a ratio with its CI; a baseline whose warm-up did not
    converge withholds the ratio and says why."""
    from types import SimpleNamespace

    from parity.bench import stats
    from parity.bench.plan import _compare_to_baselines

    rng = np.random.default_rng(0)

    def series(median_ms, settled=True):
        samples = list(median_ms * (1 + 0.01 * rng.standard_normal(200)))
        entry = {
            "verdict": "pass",
            "samples_ms": samples,
            "median_ms": float(np.median(samples)),
            "ci95_ms": [0.99 * median_ms, 1.01 * median_ms],
            "warmup_converged": settled,
            "warmup_runs": 50,
        }
        entry["stability"] = stats.stability(entry, 0.02)
        return entry

    def pending(base_settled):
        spec = SimpleNamespace(name="mlp")
        return [
            (
                spec,
                None,
                SimpleNamespace(id=path, baseline="torch", quantized=False),
                {"timing": {"batches": {"8": entry}}},
            )
            for path, entry in (("torch", series(2.0, base_settled)), ("torch/onnx/ort", series(1.0)))
        ]

    settled = pending(True)
    _compare_to_baselines(settled, BenchOptions())
    ort, torch = (p[3]["timing"]["batches"]["8"] for p in reversed(settled))
    assert torch["vs_baseline"] == {"baseline": "torch", "self": True}
    assert 0.45 < ort["vs_baseline"]["ratio"] < 0.55 and ort["vs_baseline"]["verdict"] == "faster"
    assert_compared(ort, torch)

    unsettled = pending(False)
    _compare_to_baselines(unsettled, BenchOptions())
    ort, torch = (p[3]["timing"]["batches"]["8"] for p in reversed(unsettled))
    assert ort["vs_baseline"]["reason"] == "withheld: the baseline's: warm-up did not converge in 50 runs"
    assert_compared(ort, torch)


def test_a_batch_size_that_computes_something_else_is_never_timed(workspace_copy):
    """The torch definition is right at the checked batch (64) and the verification shapes (1, 3) and wrong at
    batch 2: batch 2 gets no number."""
    root = workspace_copy(
        mlp_variant(
            {
                "return self.logits(self.relu2(self.dense2(self.relu1(self.dense1(x)))))": "out = self.logits(self.relu2(self.dense2(self.relu1(self.dense1(x)))))\n"
                "            return out + 1.0 if x.shape[0] == 2 else out"
            }
        )
    )
    _, results = run_check(root, ["torch"], timing=BenchOptions(budget_s=0.05, batch_sizes=(2, 64), first_result=False))
    batches = results["torch"]["timing"]["batches"]
    assert results["torch"]["verdict"] == "pass"
    assert batches["2"]["verdict"] == "fail" and "median_ms" not in batches["2"]
    assert "output at batch 2" in batches["2"]["reason"]
    assert batches["64"]["verdict"] == "pass" and batches["64"]["median_ms"] > 0


def test_a_definition_wrong_at_a_verification_shape_fails_its_check(workspace_copy):
    """Wrong at batch 1 only: the check at the verification shapes catches it before anything is timed."""
    root = workspace_copy(
        mlp_variant(
            {
                "return self.logits(self.relu2(self.dense2(self.relu1(self.dense1(x)))))": "out = self.logits(self.relu2(self.dense2(self.relu1(self.dense1(x)))))\n"
                "            return out + 1.0 if x.shape[0] == 1 else out"
            }
        )
    )
    _, results = run_check(root, ["torch"], timing=BenchOptions(budget_s=0.05, batch_sizes=(64,), first_result=False))
    assert results["torch"]["verdict"] == "fail" and results["torch"]["timing"] is None
    assert results["torch"]["reason"].startswith("at batch=1: output logits")


def test_every_builtin_mlp_path_checks_with_statistics(workspace_copy):
    root = workspace_copy()
    report, results = run_check(root, ["torch", "torch/onnx/ort", "torch/onnx/onnxref", "tf", "jax/onnx/ort"])
    assert set(results) == {"torch", "torch/onnx/ort", "torch/onnx/onnxref", "tf", "jax/onnx/ort"}
    for result in results.values():
        assert result["verdict"] == "pass", (result["path"], result["reason"])
        stats = result["outputs"]["logits"]
        assert 0 < stats["max_abs"] < 1e-4 and stats["cosine"] > 0.999999 and stats["tol_units"] <= 1
        assert result["metrics"]["argmax_agreement"] == 1.0
        assert result["metrics"]["accuracy"]["value"] == result["metrics"]["accuracy"]["golden"]
        assert result["timing"] is None  # check never times
    assert results["torch"]["gradients"]["dense1/kernel"]["ok"]
    assert results["torch/onnx/ort"]["gradients"] is None
    assert report["env"]["threads"] == 1
    # a second run uses the export cache
    _, again = run_check(root, ["torch/onnx/ort"])
    assert again["torch/onnx/ort"]["export"]["cached"] is True


def test_worker_crash_becomes_error_and_others_go_on(workspace_copy):
    source = mlp_variant({"    import jax\n\n    tap = tap": "    import os\n\n    os._exit(3)\n    tap = tap"})
    root = workspace_copy(source)
    report, results = run_check(root, ["jax", "torch"], use_cache=False)
    assert results["jax"]["verdict"] == "error"
    assert "died" in results["jax"]["reason"] and "exit code 3" in results["jax"]["reason"]
    assert results["torch"]["verdict"] == "pass"
    log = Path(re.search(r"see (\S+\.log)", results["jax"]["reason"])[1])
    assert log.is_file()  # kept for the failed run, also with --no-cache


@pytest.mark.slow  # a second proof of a task past its limit killed and made an error; the fast set keeps it in
# test_worker_timeouts.py::test_a_checks_default_limit_is_scaled_with_its_models_weights (a given limit:
# test_worker_timeouts.py::test_a_given_timeout_bounds_a_busy_task_whatever_the_model; the others go on:
# test_worker_crash_becomes_error_and_others_go_on)
def test_hang_is_killed_after_timeout(workspace_copy):
    source = mlp_variant({"    import jax\n\n    tap = tap": "    import time\n\n    time.sleep(600)\n    tap = tap"})
    root = workspace_copy(source)
    report, results = run_check(root, ["jax", "torch"], timeout_s=10)
    assert results["jax"]["verdict"] == "error" and "timed out" in results["jax"]["reason"]
    assert results["torch"]["verdict"] == "pass"


EXPECTED_LINE = (
    '    expected_errors={"jax/tf/onnx/*": "jax2tf serialises through XlaCallModule, which tf2onnx cannot convert"},\n'
)


def test_expected_errors_and_unexpected_pass(workspace_copy):
    source = mlp_variant(
        {
            EXPECTED_LINE: (
                "    expected_errors={'jax/tf/onnx/*': 'XlaCallModule', 'torch/onnx/ort': 'declared broken'},\n"
            )
        }
    )
    root = workspace_copy(source)
    report, results = run_check(root, ["jax/tf/onnx/ort", "torch/onnx/ort"])
    xerror = results["jax/tf/onnx/ort"]
    assert xerror["verdict"] == "error" and xerror["expected"] is True
    assert "XlaCallModule" in xerror["reason"]
    assert results["torch/onnx/ort"]["verdict"] == "pass" and results["torch/onnx/ort"]["unexpected_pass"]
    assert outcome.exit_code(report) == 1
    _, only_expected = run_check(root, ["jax/tf/onnx/ort"])
    assert outcome.exit_code({"results": list(only_expected.values()), "model_errors": []}) == 0


def test_undeclared_export_error_is_unexpected_with_converter_reason(workspace_copy):
    root = workspace_copy(mlp_variant({EXPECTED_LINE: ""}))
    report, results = run_check(root, ["jax/tf/onnx/ort"])
    result = results["jax/tf/onnx/ort"]
    assert result["verdict"] == "error" and not result["expected"]
    assert "XlaCallModule" in result["reason"]
    assert outcome.exit_code(report) == 1


def test_unsupported_tf_op_names_the_op(workspace_copy):
    """Keras 3 gelu lowers to Erfc, which tf2onnx 1.17 leaves unconverted: an error naming Erfc."""
    source = mlp_variant(
        {'h = layers.ReLU(name="relu1", dtype=dtype)(': 'h = layers.Activation("gelu", name="relu1", dtype=dtype)('}
    )
    root = workspace_copy(source)
    _, results = run_check(root, ["tf/onnx/ort"])
    assert results["tf/onnx/ort"]["verdict"] == "error"
    assert "Erfc" in results["tf/onnx/ort"]["reason"] and "tf2onnx" in results["tf/onnx/ort"]["reason"]


def test_nan_output_fails_naming_the_output(workspace_copy):
    source = mlp_variant({'    return dense("logits", h)': '    return dense("logits", h) * jax.numpy.nan'})
    root = workspace_copy(source)
    _, results = run_check(root, ["jax"])
    assert results["jax"]["verdict"] == "fail"
    assert "logits" in results["jax"]["reason"] and "NaN" in results["jax"]["reason"]
    assert results["jax"]["timing"] is None


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_missing_framework_is_skip(workspace_copy, monkeypatch, framework):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == framework else real(name, *a))
    root = workspace_copy()
    _, results = run_check(root, [framework])
    assert results[framework]["verdict"] == "skip"
    assert framework in results[framework]["reason"] and "not installed" in results[framework]["reason"]
