"""A task's bounds: killed once it makes no progress, or past a wall-clock limit that grows with the model."""

from __future__ import annotations

import time

import pytest

from parity.platform.errors import TaskFailed, UsageError
from parity.run import watch
from parity.run.pool import WorkerPool

ACCURACY = {"logits": [[0.0, 1.0]], "labels": [1]}


def spin(seconds: float) -> int:
    """A worker task that computes (CPU busy) for ``seconds``."""
    deadline, count = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        count += sum(range(1000))
    return count


def test_a_task_that_makes_no_progress_is_killed_after_the_stall_bound(tmp_path, monkeypatch):
    monkeypatch.setenv(watch.STALL_VARIABLE, "2")
    with WorkerPool(1, tmp_path, timeout_s=60) as pool:
        pool.call("onnx", "parity.check.metrics:accuracy", **ACCURACY)  # the worker is up: what follows is the task
        started = time.monotonic()
        with pytest.raises(TaskFailed, match="no progress for 2 s") as hung:
            pool.call("onnx", "tests.conftest:sleep", seconds=60)
        assert time.monotonic() - started < 20  # not the 60 s wall-clock limit
        assert hung.value.kind == "timeout" and pool.current is None
        assert f"raise with {watch.STALL_VARIABLE}=SECONDS" in str(hung.value)
        assert pool.call("onnx", "parity.check.metrics:accuracy", **ACCURACY) == 1.0  # a fresh worker goes on


@pytest.mark.slow  # a second proof of a default limit that grows with the model and of computing not taken for a
# stall; the fast set keeps test_a_checks_default_limit_is_scaled_with_its_models_weights
def test_a_task_that_computes_past_the_default_limit_of_a_small_model_completes_for_a_large_one(tmp_path, monkeypatch):
    monkeypatch.setenv(watch.STALL_VARIABLE, "1.5")  # computing for longer than this is progress, not a hang
    monkeypatch.setattr(watch, "BASE_WALL_S", 2.0)
    monkeypatch.setattr(watch, "WALL_S_PER_GB", 30.0)
    with WorkerPool(1, tmp_path, timeout_s=None) as pool:
        pool.call("onnx", "parity.check.metrics:accuracy", **ACCURACY)
        with pytest.raises(TaskFailed, match=r"timed out after 2 s, the default limit \(") as busy:
            pool.call("onnx", "tests.run.test_worker_timeouts:spin", seconds=30)
        assert "raise with --timeout" in str(busy.value)
        with pool.for_model(1_000_000_000):  # 1 GB of weights: 32 s
            assert pool.limits().wall_s == 32
            assert pool.call("onnx", "tests.run.test_worker_timeouts:spin", seconds=5) > 0
        assert pool.limits().wall_s == 2


def test_a_given_timeout_bounds_a_busy_task_whatever_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv(watch.STALL_VARIABLE, "1")
    with WorkerPool(1, tmp_path, timeout_s=3) as pool, pool.for_model(10**12):
        pool.call("onnx", "parity.check.metrics:accuracy", **ACCURACY)
        with pytest.raises(TaskFailed, match=r"timed out after 3 s, the limit given \(worker onnx killed"):
            pool.call("onnx", "tests.run.test_worker_timeouts:spin", seconds=60)


def test_the_default_limit_grows_with_the_weights_of_the_model():
    manifest = {
        "files": {
            "weights.npz": {
                "arrays": {
                    "embed": {"shape": [49152, 576], "dtype": "float32"},
                    "layers": {"shape": [12, 9_000_000], "dtype": "float32"},
                    "scale": {"shape": [], "dtype": "float64"},
                }
            }
        }
    }
    size = watch.weights_bytes(manifest)
    assert size == (49152 * 576 + 12 * 9_000_000) * 4 + 8
    small, llama = watch.limits(None, 0), watch.limits(None, size)
    assert small.wall_s == watch.BASE_WALL_S and small.basis == "the default limit"
    assert llama.wall_s > 3 * 300  # an export that took 93 s on a busy machine is far inside it
    assert llama.basis == "the default limit for the model's 545 MB of weights"
    assert watch.limits(300, size) == watch.Limits(300.0, watch.DEFAULT_STALL_S, "the limit given")
    assert watch.weights_bytes({"files": {}}) == 0


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", "inf"])
def test_a_bad_stall_bound_is_one_clear_error(tmp_path, monkeypatch, value):
    monkeypatch.setenv(watch.STALL_VARIABLE, value)
    with pytest.raises(UsageError, match=f"{watch.STALL_VARIABLE}='{value}': give the seconds"):
        WorkerPool(1, tmp_path, timeout_s=None)


def test_a_checks_default_limit_is_scaled_with_its_models_weights(workspace_copy, monkeypatch):
    import json

    from parity.model.workspace import Workspace
    from parity.pipeline import orchestrate
    from tests.conftest import mlp_variant

    busy = "    import time\n\n    while True:\n        time.monotonic()\n    tap = tap"
    root = workspace_copy(mlp_variant({"    import jax\n\n    tap = tap": busy}))
    monkeypatch.setenv(watch.STALL_VARIABLE, "3")  # it computes: never a stall
    monkeypatch.setattr(watch, "BASE_WALL_S", 1.0)
    monkeypatch.setattr(watch, "WALL_S_PER_GB", 2e5)  # the mlp's 26 kB of weights: 5 s more
    manifest = json.loads((root / "golden" / "mlp" / "manifest.json").read_text())
    size = watch.weights_bytes(manifest)
    expected = watch.limits(None, size)
    assert expected.wall_s > watch.BASE_WALL_S + 2
    options = orchestrate.Options(threads=1, patterns=("jax",))
    report = orchestrate.check(Workspace(root), ["mlp"], options)
    (result,) = report["results"]
    assert result["verdict"] == "error"
    assert (
        f"timed out after {expected.wall_s:g} s, the default limit for the model's {size / 1e3:.0f} kB of weights"
        in (result["reason"])
    )
