"""tf/xla: the Keras model with forward, gradients, training step and taps compiled by XLA (jit_compile=True) passes
the zoo against the float64 golden; its record says XLA was on and how often each function was traced."""

from __future__ import annotations

import numpy as np
import pytest

from parity.bench.plan import BenchOptions
from parity.check import training
from parity.golden import store as golden
from parity.model.workspace import Workspace
from parity.pipeline import orchestrate
from tests.conftest import zoo_copy


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    ws = Workspace(zoo_copy(tmp_path_factory.mktemp("xla"), "mlp"))
    spec = ws.load_spec("mlp")
    return spec, golden.load(ws.golden_dir("mlp"), spec).arrays


def test_forward_gradients_taps_and_step_are_xla_compiled_and_match_golden(mlp):
    """Every function is compiled by XLA (its HLO is there to read), the forward, gradients and taps match the golden,
    and one SGD step from the golden weights lands on w - lr * golden gradient."""
    from parity.sources.tf_xla import KerasXlaSource

    spec, arrays = mlp
    inputs, reference = arrays["inputs.npz"], arrays["reference.npz"]
    x, labels = {"x": inputs["x"]}, inputs["labels"]
    runner = KerasXlaSource(spec, arrays["weights.npz"], spec.batch_size)
    np.testing.assert_allclose(runner.run(x)["logits"], reference["logits"], atol=1e-5, rtol=1e-5)
    assert "HloModule" in runner._forward.experimental_get_compiler_ir(runner._to_tf(x))(stage="hlo")
    grads = runner.gradients(x, labels)
    for name, golden_grad in arrays["gradients.npz"].items():
        np.testing.assert_allclose(grads[name], golden_grad, atol=1e-6, rtol=1e-4, err_msg=name)
    taps = runner.taps(x)
    for tap in spec.taps:
        np.testing.assert_allclose(taps[tap], reference[f"tap/{tap}"], atol=1e-5, rtol=1e-5, err_msg=tap)
    step = training.check_step(
        runner, x, labels, 0.1, arrays["weights.npz"], arrays["gradients.npz"], spec.gradient_tolerances("fp32")
    )
    assert step["ok"], step["worst"]
    assert "HloModule" in runner._step.experimental_get_compiler_ir(
        runner._to_tf(x), runner.tf.constant(labels), runner.tf.constant(0.1, dtype="float32")
    )(stage="hlo")
    runner.run({"x": inputs["x"][:3]})
    record = runner.runtime_record()
    assert record["xla"] is True and record["jit_compile"] == "must-compile"
    functions = record["functions"]
    assert functions["forward"]["shapes"] == [{"x": [64, 64]}, {"x": [3, 64]}] and functions["forward"]["traces"] == 2
    assert functions["gradients"]["traces"] == 1 and functions["train_step"]["traces"] == 1
    assert functions["taps"]["compiles"] == 1


# slow: tf/xla's second proof of the forward, gradients and step (a whole check of the zoo mlp); the fast set keeps
# test_forward_gradients_taps_and_step_are_xla_compiled_and_match_golden
@pytest.mark.slow
def test_tf_xla_passes_on_mlp_with_its_gradients_and_its_training_step(tmp_path):
    report = orchestrate.check(
        Workspace(zoo_copy(tmp_path, "mlp")),
        ["mlp"],
        orchestrate.Options(
            threads=1, patterns=("tf/xla",), timing=BenchOptions(budget_s=0.05, min_runs=10, batch_sizes=(64,))
        ),
    )
    result = {r["path"]: r for r in report["results"]}["tf/xla"]
    assert result["verdict"] == "pass", result["reason"]
    assert result["gradients"] and all(stats["ok"] for stats in result["gradients"].values())
    assert result["timing"]["train_step"]["verdict"] == "pass"
    assert result["runtime"]["xla"] is True and result["runtime"]["functions"]["forward"]["traces"] >= 1
    assert result["numerics"]["xla"] is True


@pytest.mark.slow
def test_tf_xla_passes_on_cnn_and_transformer(tmp_path):
    report = orchestrate.check(
        Workspace(zoo_copy(tmp_path, "cnn", "transformer")),
        ["cnn", "transformer"],
        orchestrate.Options(threads=1, patterns=("tf/xla",)),
    )
    for result in report["results"]:
        assert result["verdict"] == "pass", (result["model"], result["reason"])
        assert all(stats["ok"] for stats in result["gradients"].values())
