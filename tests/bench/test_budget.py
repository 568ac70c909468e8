"""The benchmark's time budget, the orchestrator's callbacks and progress steps (no timing assertions)."""

from __future__ import annotations

import pytest

from parity.bench.plan import MIN_SERIES_S, BenchOptions, Budget
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
    run = orchestrate.Run(Ws(), orchestrate.Options(threads=1), progress=heard.append)
    run.progress("a", 1, 2)
    stepped = []
    run2 = orchestrate.Run(
        Ws(),
        orchestrate.Options(threads=1),
        progress=lambda message, step=None, steps=None: stepped.append((message, step, steps)),
    )
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
    report = orchestrate.check(
        Ws(),
        ["nope"],
        orchestrate.Options(threads=1, timing=BenchOptions()),
        on_checked=lambda r: seen.append({k: r[k] for k in ("schema", "results", "model_errors")}),
    )
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


class _Worker:
    """A worker of ``WorkerPool.extra``: records (its id, task, series) and answers like the real tasks."""

    def __init__(self, log, ident, samples_ms=1.0):
        self.log, self.ident, self.samples_ms, self.closed = log, ident, samples_ms, False

    def call(self, task, kwargs, timeout_s):
        task = task.split(":")[1]
        self.log.append((self.ident, task, kwargs.get("series")))
        if task == "first_result":
            return {"load_s": 1.0}
        if task == "open_series":
            return {"verdict": "pass", "verified": {"ok": True}}
        if task == "time_block":
            n = kwargs["timing"]["min_runs"]
            first = kwargs["final"]
            return {
                "samples_ms": [self.samples_ms] * n,
                "warmup_ms": [1.0] * (5 if first else 0),
                "warmup_runs": 5 if first else 0,
                "warmup_converged": True,
                "stopped": "max_runs",
                "audit": None,
            }
        return {}

    def close(self):
        self.closed = True


class _Extras(_Pool):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.log, self.workers, self.timeout_s, self.failed = [], [], 10.0, False

    def extra(self, group):
        self.workers.append(_Worker(self.log, f"{group}{len(self.workers)}"))
        return self.workers[-1]

    def limits(self):
        return self.timeout_s


def _bench_fixture(pool, groups=("onnx", "tf"), **options):
    """A run with one passing path per group (no exports), timed at one batch size without a training step."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from parity.bench import plan

    class Spec:
        name, timed_batch_sizes, batch_size, axes = "m", (1,), 1, {}

    def path(group):
        return SimpleNamespace(
            id=f"p-{group}",
            exports=(),
            runtime=SimpleNamespace(group=group),
            precision="fp32",
            device="cpu",
            differentiable=False,
            baseline=f"p-{group}",
            quantized=False,
        )

    run = SimpleNamespace(
        workspace=SimpleNamespace(root="/ws", golden_dir=lambda name: f"/ws/golden/{name}"),
        options=SimpleNamespace(threads=1),
        progress=lambda *a, **k: None,
        sized=lambda pool, spec: nullcontext(),
    )
    pending = [(Spec, {}, path(group), {"verdict": "pass"}) for group in groups]
    plan.bench(run, pool, pending, BenchOptions(budget_s=10.0, **options))
    return {item[2].runtime.group: item[3] for item in pending}


def test_every_path_is_timed_in_fresh_workers_of_its_own_its_first_result_first():
    """No path is timed in a worker that ran anything else: each path gets fresh workers (--processes of them), the
    first of which measures its first result before anything else; every worker is closed afterwards."""
    pool = _Extras()
    results = _bench_fixture(pool, groups=("onnx", "tf"), processes=2)
    assert [w.ident for w in pool.workers] == ["onnx0", "onnx1", "tf2", "tf3"] and all(w.closed for w in pool.workers)
    by_worker = {
        w.ident: [(task, series) for ident, task, series in pool.log if ident == w.ident] for w in pool.workers
    }
    assert by_worker["onnx0"][0] == ("first_result", None) and by_worker["tf2"][0] == ("first_result", None)
    assert all(task != "first_result" for task, _ in by_worker["onnx1"] + by_worker["tf3"])
    assert {series for ident in ("onnx0", "onnx1") for _, series in by_worker[ident] if series} == {"m|p-onnx|batch|1"}
    entry = results["tf"]["timing"]["batches"]["1"]
    assert entry["verdict"] == "pass" and entry["processes"]["n"] == 2 and entry["runs"] >= 30
    assert results["tf"]["timing"]["first_result"] == {"load_s": 1.0}


def test_series_of_different_paths_alternate_in_random_rounds():
    """Blocks of each path alternate instead of all runs of one path then the next, in an order that changes."""
    pool = _Extras()
    _bench_fixture(pool, groups=("onnx", "tf", "torch", "jax"), min_runs=60)
    blocks = [series.split("|")[1] for _, task, series in pool.log if task == "time_block"]
    assert len(blocks) >= 8
    rounds = [blocks[k : k + 4] for k in range(0, len(blocks), 4)]
    assert all(sorted(r) == ["p-jax", "p-onnx", "p-tf", "p-torch"] for r in rounds)  # each round: each path once
    assert len({tuple(r) for r in rounds}) > 1  # in random order


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


def test_series_get_runners_of_their_own_and_never_the_golden_weights(monkeypatch):
    """The first series at the spec's batch size takes the runner the first result built (forward runs only); every
    other series, a training step included, gets one built anew; every runner gets its own copy of the weights."""
    from types import SimpleNamespace

    import numpy as np

    from parity.bench import tasks
    from parity.check import training
    from parity.model.spec import Tolerance

    golden_weights = {"w": np.ones(3, np.float32)}
    tolerance = Tolerance(atol=1e-6, rtol=1e-6)
    spec = SimpleNamespace(
        batch_size=2,
        outputs=["y"],
        output_tolerances=lambda p: SimpleNamespace(for_name=lambda n: tolerance),
        gradient_tolerances=lambda p: None,
        model_inputs=(SimpleNamespace(name="x", batched=True),),
    )
    verified = SimpleNamespace(
        arrays={
            "weights.npz": golden_weights,
            "gradients.npz": {},
            "eval.npz": {"x": np.zeros((4, 1), np.float32)},
            "reference.npz": {"eval/logits": np.zeros((4, 1), np.float32)},
            "inputs.npz": {"x": np.zeros((2, 1), np.float32), "labels": np.zeros(2, int)},
        },
        manifest={},
    )  # golden data from before batch axes were recorded: axis 0
    built = []

    class Runner:
        differentiable = True
        output_dtypes: dict = {}  # noqa: RUF012 - the stand-in runner's, read only

        def __init__(self, weights):
            assert weights["w"] is not golden_weights["w"] and np.array_equal(weights["w"], golden_weights["w"])
            built.append(self)

        def run(self, x):
            return {"y": np.zeros((len(x["x"]), 1), np.float32)}

    monkeypatch.setattr(
        tasks, "_setup", lambda *a, **k: (spec, SimpleNamespace(device_kind="cpu", quantized=False), verified)
    )
    monkeypatch.setattr(tasks, "_IDLE_MB", 100.0)  # this worker's idle size, as its first result measured it
    monkeypatch.setattr(tasks, "build_runner", lambda spec, path, weights, *a: Runner(weights))
    monkeypatch.setattr(tasks.compare, "error_stats", lambda *a: {"ok": True, "tol_units": 0.0})
    monkeypatch.setattr(training, "check_step", lambda runner, *a: {"ok": True, "runner": runner})
    common = {"workspace": "/ws", "model": "m", "path_id": "p", "golden_dir": "/g", "precision": "fp32", "threads": 1}
    spare = Runner(dict(golden_weights, w=golden_weights["w"].copy()))
    monkeypatch.setattr(tasks, "_SPARE_RUNNER", (tasks._runner_key("m", "p", "fp32", "cpu", 1, 2, None), spare))
    assert tasks.open_series("a", "batch", batch_size=2, **common)["verdict"] == "pass"
    assert tasks._OPEN["a"]["runner"] is spare and len(built) == 1
    step = tasks.open_series("b", "train_step", lr=0.1, **common)
    assert step["verified"]["runner"] is built[1] and len(built) == 2
    tasks.open_series("c", "batch", batch_size=1, **common)
    assert len(built) == 3 and tasks._OPEN["c"]["runner"] is built[2]
    for name in ("a", "b", "c"):
        tasks.close_series(name, {})
    assert not tasks._OPEN
