"""Gradient parity: a gradient bug injected in one framework fails exactly that path."""

from __future__ import annotations

from parity.model.workspace import Workspace
from parity.pipeline import orchestrate
from tests.conftest import mlp_variant


def test_stop_gradient_in_tf_fails_tf_only_naming_parameters(workspace_copy):
    source = mlp_variant(
        {
            'logits = layers.Dense(CLASSES, name="logits", dtype=dtype)(h)': 'logits = layers.Dense(CLASSES, name="logits", dtype=dtype)(keras.ops.stop_gradient(h))'
        }
    )
    root = workspace_copy(source)
    report = orchestrate.check(
        Workspace(root), ["mlp"], orchestrate.Options(threads=1, patterns=("torch", "tf", "jax"))
    )
    results = {r["path"]: r for r in report["results"]}
    assert results["torch"]["verdict"] == "pass" and results["jax"]["verdict"] == "pass"
    tf_result = results["tf"]
    assert tf_result["verdict"] == "fail"
    assert tf_result["outputs"]["logits"]["ok"]  # outputs still agree
    assert "gradients differ" in tf_result["reason"] and "dense2/kernel" in tf_result["reason"]
    grads = tf_result["gradients"]
    assert not grads["dense1/kernel"]["ok"] and not grads["dense2/bias"]["ok"] and not grads["input:x"]["ok"]
    assert grads["logits/kernel"]["ok"] and grads["logits/bias"]["ok"]
    for path in ("torch", "jax"):
        assert all(s["ok"] for s in results[path]["gradients"].values())
        assert results[path]["time_to_first_gradient_s"] > 0
