"""parity.bench.stats and the stopping rule of parity.bench.measure.measure (fake clock: nothing here is timed)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from parity.bench import stats
from parity.bench.measure import measure

# ---------------------------------------------------------------------------------------------- median_ci


@pytest.mark.parametrize("n, lo, hi", [(10, 2, 9), (30, 10, 21), (100, 40, 61)])
def test_median_ci_known_order_statistics(n, lo, hi):
    """Tabulated 95 % ranks (1-based) of the median's distribution-free CI."""
    sample = np.random.default_rng(n).permutation(np.arange(1, n + 1, dtype=float))
    assert stats.median_ci(sample) == (float(lo), float(hi))


@pytest.mark.parametrize("n", [6, 7, 20, 31, 64, 257, 1000, 20_001, 300_000])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_median_ci_follows_binomial_rule(n, confidence):
    lo, hi = stats.median_ci_ranks(n, confidence)
    if n < 9 and confidence == 0.99:
        pytest.skip("too few samples for 99 %")
    alpha = (1 - confidence) / 2
    assert hi == n - 1 - lo  # symmetric: l-th smallest and l-th largest
    assert sps.binom.cdf(lo, n, 0.5) <= alpha < sps.binom.cdf(lo + 1, n, 0.5)  # P(B <= l-1) <= alpha, tightest
    coverage = 1 - 2 * sps.binom.cdf(lo, n, 0.5)
    assert coverage >= confidence


def test_median_ci_small_and_bad_input():
    assert stats.median_ci([3.0, 1.0, 2.0, 5.0, 4.0]) == (1.0, 5.0)  # n < 6: the whole range
    assert stats.median_ci([2.5]) == (2.5, 2.5)
    with pytest.raises(ValueError):
        stats.median_ci([])
    with pytest.raises(ValueError):
        stats.median_ci([1.0, float("nan")])
    with pytest.raises(ValueError):
        stats.median_ci([1.0, 2.0], confidence=1.0)


# ---------------------------------------------------------------------------------------------- summarize


def test_summarize_known_array():
    ms = np.random.default_rng(0).permutation(np.arange(1.0, 11.0))
    s = stats.summarize(ms, batch_size=10)
    assert set(s) == {
        "median_ms",
        "mean_ms",
        "std_ms",
        "cv",
        "spread",
        "p90_ms",
        "p99_ms",
        "tail",
        "min_ms",
        "ci95_ms",
        "runs",
        "throughput",
    }
    assert s["median_ms"] == 5.5
    assert s["mean_ms"] == 5.5
    assert s["std_ms"] == pytest.approx(math.sqrt(82.5 / 9))
    assert s["cv"] == pytest.approx(math.sqrt(82.5 / 9) / 5.5)
    # ten runs claim no tail: a 95 % bound on p90 needs 29, on p99 299
    assert s["p90_ms"] is None and s["p99_ms"] is None
    assert s["tail"]["p90"] == {"value_ms": None, "upper_ms": None, "runs": 10, "needs_runs": 29}
    assert s["spread"] == pytest.approx((np.percentile(ms, 75) - np.percentile(ms, 25)) / 5.5)
    assert s["min_ms"] == 1.0
    assert s["ci95_ms"] == [2.0, 9.0]
    assert s["runs"] == 10
    assert s["throughput"] == pytest.approx(10 / 5.5e-3)


def test_summarize_single_sample_and_cv_constant():
    s = stats.summarize([4.0], batch_size=1)
    assert s["std_ms"] == 0.0 and s["cv"] == 0.0 and s["ci95_ms"] == [4.0, 4.0]
    assert stats.CV_WARNING == 0.025


# ---------------------------------------------------------------------------------------------- comparisons


def _lognormal(seed, median, n=200, sigma=0.1):
    return np.random.default_rng(seed).lognormal(math.log(median), sigma, n)


def test_ratio_of_medians_known_ratio():
    a, b = _lognormal(1, 2.0), _lognormal(2, 1.0)
    r = stats.ratio_of_medians(a, b)
    assert r["ratio"] == pytest.approx(np.median(a) / np.median(b))
    lo, hi = r["ci95"]
    assert lo < 2.0 < hi and lo > 1.0
    assert r == stats.ratio_of_medians(a, b)  # deterministic for a seed
    c = stats.compare_series(a, b)
    assert c["significant"] and c["verdict"] == "slower" and c["p"] < 1e-10
    assert stats.compare_series(b, a)["verdict"] == "faster"


def test_ratio_of_medians_identical_distributions():
    a, b = _lognormal(3, 1.0), _lognormal(4, 1.0)
    lo, hi = stats.ratio_of_medians(a, b)["ci95"]
    assert lo < 1.0 < hi
    c = stats.compare_series(a, b)
    assert not c["significant"] and c["verdict"] == "no significant difference"
    assert set(c) == {"ratio", "ci95", "p", "significant", "verdict"}


def test_ratio_of_medians_rejects_nonpositive():
    with pytest.raises(ValueError):
        stats.ratio_of_medians([1.0, 0.0], [1.0, 2.0])


def test_bootstrap_medians_odd_match_exact_distribution():
    """Odd n: P(median* <= x_(j)) = P(Binomial(n, j/n) >= (n+1)/2), exactly."""
    n, draws = 7, 200_000
    x = np.arange(n, dtype=float)
    med = stats._bootstrap_medians(x, draws, np.random.default_rng(0))
    empirical = np.array([(med <= j).mean() for j in range(n)])
    exact = np.array([sps.binom.sf((n + 1) // 2 - 1, n, (j + 1) / n) for j in range(n)])
    np.testing.assert_allclose(empirical, exact, atol=0.005)


def test_bootstrap_medians_even_match_naive_resampling():
    n, draws = 8, 200_000
    x = np.sort(np.random.default_rng(1).lognormal(0, 1, n))
    rng = np.random.default_rng(2)
    fast = stats._bootstrap_medians(x, draws, rng)
    naive = np.median(x[rng.integers(0, n, size=(draws, n))], axis=1)
    for q in (0.025, 0.1, 0.25, 0.5, 0.75, 0.9, 0.975):
        v = np.quantile(naive, q)
        assert abs((fast <= v).mean() - (naive <= v).mean()) < 0.006


def test_welch_log_matches_formula_and_scipy():
    a, b = _lognormal(5, 1.1, n=40, sigma=0.2), _lognormal(6, 1.0, n=25, sigma=0.05)
    w = stats.welch_log(a, b)
    la, lb = np.log(a), np.log(b)
    va, vb = la.var(ddof=1) / la.size, lb.var(ddof=1) / lb.size
    t = (la.mean() - lb.mean()) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (la.size - 1) + vb**2 / (lb.size - 1))
    assert w["t"] == pytest.approx(t)
    assert w["df"] == pytest.approx(df)
    assert w["p"] == pytest.approx(2 * sps.t.sf(abs(t), df))
    assert w["p"] == pytest.approx(sps.ttest_ind(la, lb, equal_var=False).pvalue)


# ---------------------------------------------------------------------------------------------- measure


class FakeClock:
    """``clock()`` returns fake seconds; ``fn()`` advances them by the next duration (in ms)."""

    def __init__(self, durations_ms):
        self.t = 0.0
        self.calls = 0
        self.durations_ms = durations_ms

    def __call__(self):
        return self.t

    def fn(self):
        self.t += self.durations_ms(self.calls) / 1e3
        self.calls += 1


def noisy(seed=0, low=1.0, high=3.0):
    rng = np.random.default_rng(seed)
    return lambda i: float(rng.uniform(low, high))


def run(clock, **kwargs):
    return measure(clock.fn, clock=clock, **kwargs)


def test_warmup_stops_when_two_windows_agree():
    steps = [5.0] * 5 + [3.0] * 5 + [1.0] * 5
    clock = FakeClock(lambda i: steps[i] if i < len(steps) else 1.0)
    m = run(clock, warmup_window=5, warmup_tolerance=0.05, budget_s=10.0)
    assert m["warmup_converged"] is True
    assert m["warmup_runs"] == 20  # windows 5, 3, 1, 1 ms: the 3rd and 4th agree
    assert m["warmup_ms"] == pytest.approx(steps + [1.0] * 5)
    assert m["stopped"] == "ci" and len(m["samples_ms"]) == 30  # constant 1 ms: CI is a point at min_runs
    assert clock.calls == m["warmup_runs"] + len(m["samples_ms"])


def test_warmup_within_tolerance_and_caps():
    clock = FakeClock(lambda i: 1.0 if (i // 5) % 2 == 0 else 1.04)
    assert run(clock, warmup_tolerance=0.05)["warmup_runs"] == 10
    clock = FakeClock(lambda i: 1.0 if (i // 5) % 2 == 0 else 2.0)  # never agree: run cap
    m = run(clock, max_warmup_runs=52, max_warmup_s=1e9)
    assert m["warmup_converged"] is False and m["warmup_runs"] == 50
    clock = FakeClock(lambda i: 1.0 if (i // 5) % 2 == 0 else 2.0)  # never agree: seconds cap
    m = run(clock, max_warmup_runs=10_000, max_warmup_s=0.049)
    assert m["warmup_converged"] is False and m["warmup_runs"] == 35  # windows of 5, 10, 5, ... ms: 45 ms, then 50
    m = run(FakeClock(lambda i: 1.0), max_warmup_runs=0)
    assert m["warmup_runs"] == 0 and m["warmup_converged"] is False


def test_never_fewer_than_min_runs():
    m = run(FakeClock(noisy()), min_runs=30, budget_s=1e-9, target_rel_ci=1e-6)
    assert m["stopped"] == "budget" and len(m["samples_ms"]) == 30
    m = run(FakeClock(noisy()), min_runs=75, budget_s=1e-9, target_rel_ci=1e-6)
    assert len(m["samples_ms"]) == 75


def test_stops_when_ci_is_tight():
    m = run(FakeClock(noisy(1)), budget_s=1e6, target_rel_ci=0.02)
    assert m["stopped"] == "ci"
    ms = m["samples_ms"]
    assert len(ms) > 30
    lo, hi = stats.median_ci(ms)
    med = float(np.median(ms))
    assert med * 0.98 <= lo and hi <= med * 1.02
    # checked every few runs (30, then steps of max(5, 5 %)): it stopped at the first check that was tight

    def tight(k):
        lo, hi = stats.median_ci(ms[:k])
        med = float(np.median(ms[:k]))
        return med * 0.98 <= lo and hi <= med * 1.02

    checks = [30]
    while checks[-1] < len(ms):
        checks.append(checks[-1] + max(5, int(checks[-1] * 0.05)))
    assert checks[-1] == len(ms)
    assert not any(tight(k) for k in checks[:-1])


def test_ci_needs_enough_runs_for_its_coverage():
    m = run(FakeClock(noisy(2, 1.0, 1.001)), min_runs=1, budget_s=1e6, target_rel_ci=0.02)
    assert m["stopped"] == "ci" and len(m["samples_ms"]) >= 6


def test_stops_on_budget():
    m = run(FakeClock(noisy(3)), budget_s=1.0, target_rel_ci=0.0)
    assert m["stopped"] == "budget"
    total = sum(m["samples_ms"])
    assert 1000.0 <= total < 1000.0 + 30.0  # does not run far past the budget
    assert len(m["samples_ms"]) > 30


def test_stops_on_max_runs():
    m = run(FakeClock(noisy(4)), budget_s=1e6, target_rel_ci=0.0, max_runs=123)
    assert m["stopped"] == "max_runs" and len(m["samples_ms"]) == 123


@pytest.mark.parametrize(
    "kwargs",
    [
        {"budget_s": 0},
        {"budget_s": -1.0},
        {"budget_s": float("nan")},
        {"min_runs": 0},
        {"min_runs": 10, "max_runs": 5},
        {"warmup_window": 0},
    ],
)
def test_bad_arguments_raise(kwargs):
    clock = FakeClock(lambda i: 1.0)
    with pytest.raises(ValueError):
        run(clock, **kwargs)
    assert clock.calls == 0


def test_binomial_half_cdf_matches_scipy_to_double_precision():
    for n in (*range(1, 200), 999, 1000, 4096, 20_001, 250_000):
        for j in sorted({0, 1, n // 3, n // 2 - 1, n // 2, n // 2 + 1, n - 2, n - 1, n}):
            if 0 <= j <= n:
                exact = sps.binom.cdf(j, n, 0.5)
                assert math.isclose(stats.binomial_half_cdf(j, n), exact, rel_tol=1e-9, abs_tol=1e-300), (j, n)
    assert stats.binomial_half_cdf(-1, 5) == 0.0 and stats.binomial_half_cdf(5, 5) == 1.0


def test_a_worker_that_times_never_imports_scipy():
    import subprocess
    import sys

    code = "import sys, parity.bench.tasks; print('scipy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_tail_percentiles_are_claimed_from_enough_runs_with_an_upper_bound_that_holds():
    assert stats.runs_needed(0.9) == 29 and stats.runs_needed(0.99) == 299
    rng = np.random.default_rng(1)
    # coverage of the 95 % upper bound of p90 on exponential samples (true p90 = ln 10)
    covered = sum(stats.percentile_bound(rng.exponential(size=60), 0.9)["upper_ms"] >= math.log(10) for _ in range(400))
    assert covered / 400 >= 0.93
    big = stats.summarize(rng.exponential(size=400), batch_size=1)
    assert big["p99_ms"] is not None and big["tail"]["p99"]["upper_ms"] >= big["p99_ms"]


def test_ratios_read_from_a_thousand_times_faster_to_a_thousand_times_slower():
    assert [stats.ratio_text(r) for r in (0.001, 0.0123, 0.5, 1.0, 1.234, 999.0, 1000.0)] == [
        "1/1000x",
        "0.0123x",
        "0.5x",
        "1x",
        "1.23x",
        "999x",
        "1000x",
    ]
