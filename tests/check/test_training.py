"""Training-step parity: one SGD step per differentiable path matches golden ``w - lr * g``; wrong steps fail."""

from __future__ import annotations

import numpy as np
import pytest

from parity.check.training import check_step
from parity.model.workspace import Workspace
from parity.platform.errors import NotDifferentiable
from parity.runtimes.base import Runner
from tests.conftest import REPO, worker_pool

LR = 0.1
# the sabotage each model gets: a rate twice too large, or one parameter left out of the optimizer
SABOTAGE = {"mlp": ("double_lr", None), "cnn": ("skip:conv2/kernel", "conv2/kernel")}


def golden(model: str, file: str) -> dict:
    with np.load(REPO / "golden" / model / file, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="module")
def pool(export_cache):
    with worker_pool() as workers:
        yield workers


def verify(pool, group: str, model: str, framework: str, **kwargs) -> dict:
    return pool.call(
        group, "parity.run.tasks:verify_step", workspace=str(REPO), model=model, framework=framework, lr=LR, **kwargs
    )


def assert_caught(result: dict, model: str) -> None:
    sabotage, param = SABOTAGE[model]
    failing = [name for name, stats in result["params"].items() if not stats["ok"]]
    assert not result["ok"], sabotage
    if param is None:  # every parameter moved twice as far
        assert failing == list(result["params"])
    else:
        assert failing == [param] and result["worst"] == param


# slow: jax/tf, a second proof of one SGD step checked and a wrong one caught on a TensorFlow runner (the fast set
# keeps tf, torch and jax); jax/tf before tf: one tf worker
@pytest.mark.parametrize("framework", ["torch", "jax", pytest.param("jax/tf", marks=pytest.mark.slow), "tf"])
def test_one_sgd_step_matches_golden_and_a_wrong_step_fails(pool, framework, tmp_path):
    group = "tf" if framework.startswith(("tf", "jax/tf")) else framework
    if framework == "jax/tf":  # the jax2tf SavedModel (variables in canonical layout): mlp only, to stay quick
        meta = pool.call(
            "jax+tf",
            "parity.run.tasks:export_step",
            workspace=str(REPO),
            model="mlp",
            target="parity.exporters.jax_tf:export",
            golden_dir=str(REPO / "golden" / "mlp"),
            opset=18,
            out_dir=str(tmp_path),
            parent_dir=None,
            parent_meta=None,
        )
        artifact = {"artifact_dir": str(tmp_path), "artifact_meta": meta}
        good = verify(pool, group, "mlp", framework, **artifact)
        assert good["ok"], good
        bad = verify(pool, group, "mlp", framework, sabotage="skip:logits/bias", **artifact)
        assert not bad["ok"] and bad["worst"] == "logits/bias"
        assert [n for n, s in bad["params"].items() if not s["ok"]] == ["logits/bias"]
        return
    for model in ("mlp", "cnn"):
        good = verify(pool, group, model, framework)
        assert good["ok"], good
        assert set(good["params"]) == set(Workspace(REPO).load_spec(model).trainable_params)
        assert all(s["tol_units"] <= 1 and s["start_ok"] for s in good["params"].values())
        assert_caught(verify(pool, group, model, framework, sabotage=SABOTAGE[model][0]), model)


class ExactRunner(Runner):
    """NumPy stand-in: steps with the golden gradients themselves (what a correct framework must match)."""

    differentiable = True

    def __init__(self, spec, weights, grads):
        super().__init__(spec, spec.batch_size)
        self.weights = {n: weights[n].copy() for n in spec.trainable_params}
        self.grads = grads

    def train_step_impl(self, x, labels, lr):
        for name in self.optimized_params():
            self.weights[name] = self.weights[name] - np.float32(lr) * self.grads[name].astype(np.float32)

    def trainable_weights_impl(self):
        return {n: w.copy() for n, w in self.weights.items()}


def test_check_step_on_numpy_runner_catches_a_stale_start_and_a_missing_parameter():
    spec = Workspace(REPO).load_spec("mlp")
    weights, grads, inputs = golden("mlp", "weights.npz"), golden("mlp", "gradients.npz"), golden("mlp", "inputs.npz")
    tolerances = spec.grad_tolerances["fp32"]

    def check(runner):
        return check_step(runner, inputs["x"], inputs["labels"], LR, weights, grads, tolerances)

    result = check(ExactRunner(spec, weights, grads))
    assert result["ok"] and "input:x" not in result["params"] and result["lr"] == LR

    stale = ExactRunner(spec, weights, grads)
    stale.weights["dense1/bias"] = stale.weights["dense1/bias"] + 1e-3  # not freshly built from golden
    result = check(stale)
    assert not result["ok"] and result["worst"] == "dense1/bias" and not result["params"]["dense1/bias"]["start_ok"]

    missing = ExactRunner(spec, weights, grads)
    del missing.weights["logits/kernel"]
    missing.optimized_params = lambda: [n for n in spec.trainable_params if n != "logits/kernel"]
    result = check(missing)
    assert not result["ok"] and result["worst"] == "logits/kernel"


def test_a_runner_that_cannot_differentiate_takes_no_step():
    spec = Workspace(REPO).load_spec("mlp")
    runner = Runner(spec, spec.batch_size)
    with pytest.raises(NotDifferentiable):
        runner.train_step(np.zeros(spec.input_shape("x"), np.float32), np.zeros(spec.batch_size, np.int64), LR)
    with pytest.raises(NotDifferentiable):
        runner.trainable_weights()
    with pytest.raises(NotDifferentiable, match="Runner cannot differentiate"):
        runner.gradients(np.zeros(spec.input_shape("x"), np.float32), np.zeros(spec.batch_size, np.int64))
