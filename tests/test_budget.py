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


def test_a_spare_worker_is_adopted_by_the_first_call_and_closed_when_unused(tmp_path):
    from parity.run import worker

    with worker.WorkerPool(1, tmp_path, timeout_s=120) as pool:
        pool.prestart()
        spare = pool.spare
        assert pool.current_group() is None
        assert pool.call("onnx", "parity.check.metrics:accuracy", logits=[[0.0, 1.0]], labels=[1]) == 1.0
        assert pool.current is spare and pool.spare is None and pool.current_group() == "onnx"
        assert spare.log_path.name == "worker-onnx.log"
    assert not spare.alive
    with worker.WorkerPool(1, tmp_path, timeout_s=120) as pool:
        pool.prestart()
        unused = pool.spare
    assert not unused.alive  # closed with the pool, never given a group


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
