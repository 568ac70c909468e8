"""The benchmark's time budget, the orchestrator's callbacks and progress steps (no timing assertions)."""

from __future__ import annotations

import pytest

from parity.bench.plan import MIN_SERIES_S, BenchOptions, Budget, _measured_s
from parity.pipeline.orchestrate import accepts_steps


def test_without_a_total_every_series_gets_the_per_series_budget():
    budget = Budget(1.0, None, 4)
    for _ in range(4):
        assert budget.allot() == 1.0
        budget.spend(0.3)
    assert budget.to_json() == {"per_series_s": 1.0, "total_s": None, "spent_s": pytest.approx(1.2)}


def test_a_total_is_spread_over_the_series_left_and_capped_per_series():
    budget = Budget(1.0, 2.0, 4)
    assert budget.allot() == 0.5  # 2 s over 4 series, under the 1 s cap
    budget.spend(0.1)  # stopped early (its CI was tight): the rest goes to the others
    assert budget.allot() == pytest.approx(1.9 / 3)
    budget.spend(1.9 / 3)
    budget.spend(1.9 / 3)
    assert budget.allot() == pytest.approx(1.9 / 3)


def test_a_generous_total_never_raises_a_series_above_its_own_budget():
    budget = Budget(0.25, 100.0, 3)
    assert budget.allot() == 0.25


def test_a_spent_total_still_gives_each_series_a_floor():
    budget = Budget(1.0, 1.0, 3)
    budget.spend(5.0)  # min_runs wins over the budget: a series may overrun
    assert budget.allot() == MIN_SERIES_S


def test_measured_seconds_count_warm_up_and_timed_runs():
    assert _measured_s({"warmup_ms": [100.0, 100.0], "samples_ms": [50.0] * 4}) == pytest.approx(0.4)
    assert _measured_s({"verdict": "error", "reason": "x"}) == 0.0


def test_options_refuse_a_total_that_is_not_positive():
    with pytest.raises(ValueError):
        BenchOptions(total_budget_s=0)
    assert BenchOptions(total_budget_s=30).total_budget_s == 30


def test_progress_steps_only_for_callables_that_take_them():
    def one(message):
        pass

    def both(message, step=None, steps=None):
        pass

    def keywords(message, **kw):
        pass

    assert not accepts_steps(one)
    assert not accepts_steps(lambda message: None)
    assert accepts_steps(both) and accepts_steps(keywords)
    accepts_steps(print)  # a builtin: whatever inspect can say of it, no error


def test_run_progress_passes_steps_only_where_accepted(tmp_path, monkeypatch):
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))
    from parity.pipeline import orchestrate

    class Ws:
        root = tmp_path

    (tmp_path / "golden").mkdir()
    heard = []
    run = orchestrate.Run(Ws(), orchestrate.Options(threads=1), progress=lambda message: heard.append(message))
    run.progress("a", 1, 2)
    stepped = []
    run2 = orchestrate.Run(Ws(), orchestrate.Options(threads=1),
                           progress=lambda message, step=None, steps=None: stepped.append((message, step, steps)))
    run2.progress("b", 1, 2)
    run2.progress("c")
    assert heard == ["a"]
    assert stepped == [("b", 1, 2), ("c", None, None)]


def test_on_checked_hears_the_verdicts_before_timing(tmp_path, monkeypatch):
    """With no model to load, the run still calls on_checked once, with the final report's shape."""
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))
    from parity.pipeline import orchestrate
    from parity.platform.errors import SpecError

    class Ws:
        root = tmp_path

        def load_spec(self, name):
            raise SpecError(f"no model {name}")

    (tmp_path / "golden").mkdir()
    seen = []
    report = orchestrate.check(Ws(), ["nope"], orchestrate.Options(threads=1, timing=BenchOptions()),
                               on_checked=lambda r: seen.append({k: r[k] for k in ("schema", "results", "model_errors")}))
    assert len(seen) == 1 and seen[0]["model_errors"][0]["model"] == "nope"
    assert set(report) >= {"schema", "env", "results", "model_errors", "stage_seconds"}
    assert set(report["stage_seconds"]) <= {"verify", "export", "check", "diagnose", "bench"}
    assert "verify" in report["stage_seconds"]


def test_timed_runs_export_every_timed_batch_size_up_front():
    from parity.pipeline import orchestrate

    class Spec:
        batch_size = 64
        timed_batch_sizes = (1, 64)

    run = orchestrate.Run.__new__(orchestrate.Run)
    run.options = orchestrate.Options(threads=1, timing=BenchOptions())
    assert run._batches(Spec) == [None, 1]
    run.options = orchestrate.Options(threads=1, timing=BenchOptions(batch_sizes=(8, 8, 64)))
    assert run._batches(Spec) == [None, 8]
    run.options = orchestrate.Options(threads=1)
    assert run._batches(Spec) == [None]


class _Pool:
    """A worker pool that records each call: (group, task, fresh) and answers from ``answers`` (task -> value)."""

    def __init__(self, current=None, answers=None):
        self.current, self.answers, self.calls = current, answers or {}, []

    def current_group(self):
        return self.current

    def call(self, group, task, fresh=False, **kwargs):
        self.calls.append((group, task.split(":")[1], fresh))
        self.current = group
        answer = self.answers.get(task.split(":")[1], {})
        return answer(**kwargs) if callable(answer) else answer


def _bench_fixture(pool, groups=("onnx", "tf"), first_result=True):
    """A run with one passing path per group (no exports), timed at one batch size without a training step."""
    from types import SimpleNamespace

    from parity.bench import plan

    class Spec:
        name, timed_batch_sizes, batch_size, axes = "m", (1,), 1, {}

    def path(group):
        return SimpleNamespace(id=f"p-{group}", exports=(), runtime=SimpleNamespace(group=group), precision="fp32",
                               device="cpu", differentiable=False, baseline=f"p-{group}")

    run = SimpleNamespace(workspace=SimpleNamespace(root="/ws", golden_dir=lambda name: f"/ws/golden/{name}"),
                          options=SimpleNamespace(threads=1), progress=lambda *a, **k: None)
    pending = [(Spec, {}, path(group), {"verdict": "pass"}) for group in groups]
    plan.bench(run, pool, pending, BenchOptions(budget_s=0.01, first_result=first_result))
    return {item[2].runtime.group: item[3] for item in pending}


def test_every_path_is_timed_in_a_fresh_worker_of_its_own_after_its_first_result():
    """No path is timed in a worker that ran anything else: each path's first result starts a fresh worker, its
    series follow in it; without first results each path's first series starts one; the running group first."""
    pool = _Pool(current="tf", answers={"first_result": {"load_s": 1.0}, "time_batch": {"verdict": "pass"}})
    results = _bench_fixture(pool, groups=("onnx", "tf"))
    assert pool.calls == [("tf", "first_result", True), ("tf", "time_batch", False),
                          ("onnx", "first_result", True), ("onnx", "time_batch", False)]
    assert results["tf"]["timing"]["first_result"] == {"load_s": 1.0}
    failed = _Pool(answers={"first_result": {"verdict": "error", "reason": "died"}, "time_batch": {"verdict": "pass"}})
    _bench_fixture(failed, groups=("onnx",))
    assert failed.calls == [("onnx", "first_result", True), ("onnx", "time_batch", True)]
    without = _Pool(answers={"time_batch": {"verdict": "pass"}})
    _bench_fixture(without, groups=("onnx", "tf"), first_result=False)
    assert without.calls == [("onnx", "time_batch", True), ("tf", "time_batch", True)]


def test_a_paths_series_start_at_its_own_batch_size_then_its_training_step_and_keep_their_order():
    """The spec's batch size runs first, on the runner the first result built, the training step next on that same
    runner, then the other batch sizes; the JSON keeps the declared order."""
    from types import SimpleNamespace

    from parity.bench import plan

    class Spec:
        name, timed_batch_sizes, batch_size, axes = "m", (1, 64), 64, {}

    calls = []

    class Pool(_Pool):
        def call(self, group, task, fresh=False, **kwargs):
            calls.append((task.split(":")[1], kwargs.get("batch_size"), fresh))
            return {"load_s": 1.0} if task.endswith("first_result") else {"verdict": "pass"}

    path = SimpleNamespace(id="torch", exports=(), runtime=SimpleNamespace(group="torch"), precision="fp32",
                           device="cpu", differentiable=True, baseline="torch")
    run = SimpleNamespace(workspace=SimpleNamespace(root="/ws", golden_dir=lambda name: f"/ws/golden/{name}"),
                          options=SimpleNamespace(threads=1), progress=lambda *a, **k: None)
    result = {"verdict": "pass", "gradients": {"w": {"ok": True}}}
    plan.bench(run, Pool(), [(Spec, {}, path, result)], BenchOptions(budget_s=0.01))
    assert calls == [("first_result", None, True), ("time_batch", 64, False), ("time_train_step", None, False),
                     ("time_batch", 1, False)]
    assert list(result["timing"]["batches"]) == ["1", "64"] and result["timing"]["train_step"]["verdict"] == "pass"


def test_checks_run_the_running_group_first():
    from types import SimpleNamespace

    from parity.pipeline.orchestrate import _check_order

    def item(group):
        return None, None, SimpleNamespace(runtime=SimpleNamespace(group=group)), None

    pending = [item(g) for g in ("tf", "torch", "jax", "onnx", "tf", "jax")]
    groups = [i[2].runtime.group for i in _check_order(_Pool(current="onnx"), pending)]
    assert groups == ["onnx", "jax", "jax", "tf", "tf", "torch"]
    groups = [i[2].runtime.group for i in _check_order(_Pool(current="tf"), pending)]
    assert groups == ["tf", "tf", "jax", "jax", "onnx", "torch"]


def test_the_training_step_reuses_the_runner_of_its_batch_series_and_never_the_golden_weights(monkeypatch):
    """The series at the spec's batch size leaves its runner (forward runs only) to the training step that follows;
    any other series in between, or another path, gets a runner built anew; every runner gets its own weights."""
    from types import SimpleNamespace

    import numpy as np

    from parity.bench import tasks
    from parity.check import training

    golden_weights = {"w": np.ones(3, np.float32)}
    spec = SimpleNamespace(batch_size=2, outputs=["y"], output_tolerances=lambda p: SimpleNamespace(for_name=lambda n: None),
                           gradient_tolerances=lambda p: None, model_inputs=(SimpleNamespace(name="x", batched=True),))
    verified = SimpleNamespace(arrays={"weights.npz": golden_weights, "gradients.npz": {},
                                       "eval.npz": {"x": np.zeros((4, 1), np.float32)},
                                       "reference.npz": {"eval/logits": np.zeros((4, 1), np.float32)},
                                       "inputs.npz": {"x": np.zeros((2, 1), np.float32), "labels": np.zeros(2, int)}})
    built = []

    class Runner:
        differentiable = True

        def __init__(self, weights):
            assert weights["w"] is not golden_weights["w"] and np.array_equal(weights["w"], golden_weights["w"])
            self.weights = weights
            built.append(self)

        def run(self, x):
            return {"y": np.zeros((len(x["x"]), 1), np.float32)}

        def train_step(self, x, labels, lr):
            pass

    monkeypatch.setattr(tasks, "_setup", lambda *a, **k: (spec, SimpleNamespace(device_kind="cpu"), verified))
    monkeypatch.setattr(tasks, "build_runner", lambda spec, path, weights, *a: Runner(weights))
    monkeypatch.setattr(tasks.compare, "error_stats", lambda *a: {"ok": True})
    monkeypatch.setattr(training, "check_step", lambda runner, *a: {"ok": True, "runner": runner})
    timing = {"budget_s": 0.001, "min_runs": 1, "target_rel_ci": 0.5}
    common = {"workspace": "/ws", "model": "m", "path_id": "p", "golden_dir": "/g", "precision": "fp32", "threads": 1}
    tasks.time_batch(batch_size=2, timing=timing, **common)
    step = tasks.time_train_step(lr=0.1, timing=timing, **common)
    assert len(built) == 1 and step["verified"]["runner"] is built[0]
    tasks.time_batch(batch_size=2, timing=timing, **common)
    tasks.time_batch(batch_size=1, timing=timing, **common)
    step = tasks.time_train_step(lr=0.1, timing=timing, **common)
    assert len(built) == 4 and step["verified"]["runner"] is built[3]
    tasks.time_batch(batch_size=2, timing=timing, **common)
    step = tasks.time_train_step(lr=0.1, timing=timing, **{**common, "path_id": "q"})
    assert len(built) == 6 and step["verified"]["runner"] is built[5]
    tasks.time_train_step(lr=0.1, timing=timing, **common)  # used once only: a step changes its weights
    assert len(built) == 7
