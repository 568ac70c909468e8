"""Statistics of timing samples: distribution-free median CIs, summaries, and comparisons of two series.

NumPy only, and SciPy for Welch's test (imported there: a worker that times never loads it). Times are
positive durations, usually in milliseconds.
"""

from __future__ import annotations

import functools
import math
import statistics

import numpy as np

CV_WARNING = 0.025
"""Coefficient of variation above which a timing is noisy (trtexec warns at 2.5 %)."""


def _as_samples(samples, name: str = "samples", positive: bool = False) -> np.ndarray:
    arr = np.asarray(samples, dtype=np.float64).ravel()
    if arr.size == 0:
        raise ValueError(f"{name}: no samples")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: samples must be finite")
    if positive and not np.all(arr > 0):
        raise ValueError(f"{name}: samples must be > 0 (log-times)")
    return arr


def _exp(x: float) -> float:
    """``e**x``, inf where that exceeds the largest float (a log-time ratio of absurdly different series)."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _median_sorted(x: np.ndarray) -> float:
    """The median of sorted samples, without overflow where the two middle ones are near the largest float."""
    k = x.size // 2
    return float(x[k]) if x.size % 2 else float(0.5 * x[k - 1] + 0.5 * x[k])


def median(samples_ms) -> float:
    """The median of finite samples (the mean of the two middle ones for an even count), without overflow."""
    return _median_sorted(np.sort(_as_samples(samples_ms, "samples_ms")))


def _scaled(ms: np.ndarray) -> tuple[np.ndarray, int]:
    """``ms / 2**e`` and ``e``: samples brought near 1 by an exact power of two, so sums cannot overflow."""
    exponent = int(np.frexp(np.max(np.abs(ms)))[1])
    return np.ldexp(ms, -exponent), exponent


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


def binomial_half_cdf(j: int, n: int) -> float:
    """``P(B <= j)`` for ``B ~ Binomial(n, 1/2)``, to about 1e-8 relative or better (log-gamma's cancellation at
    large ``n``): the term
    at ``j`` from log-gamma, then the terms below it summed down (each ``i / (n - i + 1)`` times the one above)
    until they no longer change the sum (``O(sqrt(n))`` terms near the median's CI ranks)."""
    if j < 0:
        return 0.0
    if j >= n:
        return 1.0
    if j > n / 2:
        return 1.0 - binomial_half_cdf(n - j - 1, n)
    log_top = math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) - n * math.log(2.0)
    total, term = 0.0, 1.0
    for i in range(j, -1, -1):
        total += term
        term *= i / (n - i + 1)
        if term <= total * 1e-17:
            break
    return math.exp(log_top) * total


@functools.lru_cache(maxsize=4096)
def median_ci_ranks(n: int, confidence: float = 0.95) -> tuple[int, int]:
    """0-based ranks ``(lo, hi)`` into the sorted sample of the median's distribution-free CI.

    With ``B ~ Binomial(n, 1/2)`` (how many samples fall below the true median), the interval
    ``[x_(l), x_(n+1-l)]`` (1-based order statistics) covers the median with probability
    ``1 - 2 P(B <= l-1)``. ``l`` is the largest rank with ``P(B <= l-1) <= (1-confidence)/2``, so the
    coverage is at least ``confidence``. When even ``l = 1`` is too narrow (``n < 6`` at 95 %), the
    whole range ``[min, max]`` is returned, whose coverage ``1 - 2^(1-n)`` is then below ``confidence``.
    """
    if n < 1:
        raise ValueError("median_ci needs at least one sample")
    _check_confidence(confidence)
    alpha = (1.0 - confidence) / 2.0
    # j = largest count with P(B <= j) <= alpha (-1 when there is none); the normal approximation gives a start,
    # the exact cdf settles it
    j = min(max(math.floor(n / 2 + statistics.NormalDist().inv_cdf(alpha) * math.sqrt(n) / 2), -1), n - 1)
    while j >= 0 and binomial_half_cdf(j, n) > alpha:
        j -= 1
    while j + 1 < n and binomial_half_cdf(j + 1, n) <= alpha:
        j += 1
    lo_rank = max(j + 1, 1)  # 1-based l
    hi_rank = n + 1 - lo_rank  # 1-based n + 1 - l
    return lo_rank - 1, hi_rank - 1


def median_ci(samples, confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free CI of the median from binomial order statistics (see :func:`median_ci_ranks`).

    For ``n = 30`` at 95 % this is the 10th and 21st smallest sample (coverage 95.7 %).
    """
    arr = _as_samples(samples)
    lo, hi = median_ci_ranks(arr.size, float(confidence))
    part = np.partition(arr, (lo, hi))
    return float(part[lo]), float(part[hi])


def summarize(samples_ms, batch_size: int) -> dict:
    """Median, mean, spread, tail percentiles, the median's 95 % CI and throughput of timing samples (ms).

    ``std_ms`` is the sample standard deviation (ddof=1; 0 for one sample); ``cv = std / mean``; ``spread`` the
    interquartile range over the median (robust: a few outliers give a cv of hundreds of percent, not a wide
    spread; compare with :data:`CV_WARNING`); ``p90_ms``/``p99_ms`` interpolate linearly, and are None below the
    runs a claim about that percentile needs (``tail``: :func:`percentile_bound`); ``throughput`` is samples per
    second at the median, ``batch_size / median`` (None when the median is 0).
    """
    ms = _as_samples(samples_ms, "samples_ms")
    median = _median_sorted(np.sort(ms))
    scaled, exponent = _scaled(ms)
    mean = float(np.ldexp(np.mean(scaled), exponent))
    std = float(np.ldexp(np.std(scaled, ddof=1), exponent)) if ms.size > 1 else 0.0
    lo, hi = median_ci(ms, 0.95)
    q1, q3 = np.percentile(ms, [25, 75])
    tail = {f"p{round(100 * q)}": percentile_bound(ms, q) for q in TAILS}
    return {
        "median_ms": median,
        "mean_ms": mean,
        "std_ms": std,
        "cv": std / mean if mean > 0 else float("nan"),
        "spread": float((q3 - q1) / median) if median > 0 else float("nan"),
        "p90_ms": tail["p90"]["value_ms"],
        "p99_ms": tail["p99"]["value_ms"],
        "tail": tail,
        "min_ms": float(np.min(ms)),
        "ci95_ms": [lo, hi],
        "runs": int(ms.size),
        "throughput": batch_size / (median / 1e3) if median > 0 else None,
    }


TAILS = (0.9, 0.99)


def runs_needed(q: float, confidence: float = 0.95) -> int:
    """The fewest runs for which an order statistic bounds the ``q``-quantile from above with ``confidence``:
    ``1 - q**n >= confidence`` (29 for p90, 299 for p99 at 95 %; MLPerf's early-stopping criterion)."""
    return math.ceil(math.log(1.0 - confidence) / math.log(q))


def _binomial_cdf(k: int, n: int, q: float) -> float:
    """``P(B <= k)`` for ``B ~ Binomial(n, q)``: exact by recurrence where ``n q (1-q)`` is small, else the normal
    approximation with continuity correction (error far below the ranks' granularity there)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    var = n * q * (1.0 - q)
    if var > 400:
        return statistics.NormalDist(n * q, math.sqrt(var)).cdf(k + 0.5)
    log_pmf = n * math.log1p(-q)  # k = 0
    total = 0.0
    for i in range(k + 1):
        total += math.exp(log_pmf)
        log_pmf += math.log((n - i) / (i + 1)) + math.log(q) - math.log1p(-q)
    return min(total, 1.0)


def percentile_bound(samples, q: float, confidence: float = 0.95) -> dict:
    """The ``q``-quantile of timing samples and what may be claimed about it: ``value_ms`` (interpolated) only from
    ``needs_runs`` runs on, with ``upper_ms``, the smallest order statistic that is at least the true quantile with
    ``confidence`` (MLPerf's early stopping: ``x_(k)`` with ``P(Binomial(n, q) <= k - 1) >= confidence``);
    below that, both None and the runs it needs said."""
    ms = np.sort(_as_samples(samples))
    n, needed = ms.size, runs_needed(q, confidence)
    if n < needed:
        return {"value_ms": None, "upper_ms": None, "runs": int(n), "needs_runs": needed}
    k = min(max(math.floor(n * q), 1), n)
    while k > 1 and _binomial_cdf(k - 2, n, q) >= confidence:
        k -= 1
    while k < n and _binomial_cdf(k - 1, n, q) < confidence:
        k += 1
    return {
        "value_ms": float(np.percentile(ms, 100 * q)),
        "upper_ms": float(ms[k - 1]),
        "runs": int(n),
        "needs_runs": needed,
    }


def stability(entry: dict, target_rel_ci: float) -> dict:
    """Whether a timed series settled well enough to be compared: its warm-up converged and its median's 95 % CI is
    within ``max(5 x target, 10 %)`` of the median. ``{"ok", "reason"?}``."""
    if entry.get("warmup_converged") is False:
        return {"ok": False, "reason": f"warm-up did not converge in {entry.get('warmup_runs')} runs"}
    median, (lo, hi) = entry["median_ms"], entry["ci95_ms"]
    half = max(median - lo, hi - median) / median if median > 0 else math.inf
    limit = max(5 * target_rel_ci, 0.10)
    if half > limit:
        return {
            "ok": False,
            "reason": f"its median's 95 % CI is +-{100 * half:.0f} %, wider than +-{100 * limit:.0f} %",
        }
    return {"ok": True}


def ratio_text(ratio: float) -> str:
    """A ratio readable from 1000x faster to 1000x slower: ``1.23x``, ``0.456x``, ``1234x``, ``1/1234x``."""
    if not math.isfinite(ratio) or ratio <= 0:
        return str(ratio)
    if ratio >= 100:
        return f"{ratio:.0f}x"
    if ratio >= 0.01:
        return f"{ratio:.3g}x"
    return f"1/{1 / ratio:.0f}x"


def _bootstrap_medians(sorted_x: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Medians of ``resamples`` bootstrap resamples of ``sorted_x``, drawn exactly in O(resamples).

    A resample is ``x_(ceil(n U_i))`` for ``n`` iid uniforms ``U_i``; the map is monotone, so the
    resample's k-th order statistic is ``x_(ceil(n U_(k)))`` with ``U_(k) ~ Beta(k, n-k+1)``. For even
    ``n`` the next order statistic is ``U_(k+1) = U_(k) + (1 - U_(k)) Beta(1, n-k)`` (the smallest of
    the ``n-k`` uniforms above ``U_(k)``). This has the same distribution as sorting each resample.
    """
    n = sorted_x.size
    k = (n + 1) // 2
    u = rng.beta(k, n - k + 1, size=resamples)
    med = sorted_x[np.minimum((u * n).astype(np.int64), n - 1)]
    if n % 2 == 0:
        u2 = u + (1.0 - u) * rng.beta(1, n - k, size=resamples)
        med = 0.5 * med + 0.5 * sorted_x[np.minimum((u2 * n).astype(np.int64), n - 1)]
    return med


def log_ratio_of_medians(a_ms, b_ms, confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> dict:
    """``log(median(a) / median(b))`` with a percentile-bootstrap CI, both natural logs.

    Method: independent nonparametric bootstrap of each series; each replicate is
    ``log median(a*) - log median(b*)`` (the log-time ratio); the CI is the (1-c)/2 and (1+c)/2
    percentiles of the replicates. Resampled medians are drawn exactly from the order-statistic
    representation (see ``_bootstrap_medians``), so the cost does not grow with the number of samples
    beyond one sort. Everything stays in log space, so any positive finite samples (1e-300 against
    1e300 ms) give finite results. Deterministic for a given ``seed``.
    """
    a = np.sort(_as_samples(a_ms, "a_ms", positive=True))
    b = np.sort(_as_samples(b_ms, "b_ms", positive=True))
    _check_confidence(confidence)
    if resamples < 1:
        raise ValueError("resamples must be >= 1")
    rng = np.random.default_rng(seed)
    log_ratio = np.log(_bootstrap_medians(a, resamples, rng)) - np.log(_bootstrap_medians(b, resamples, rng))
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(log_ratio, [tail, 1.0 - tail])
    point = math.log(_median_sorted(a)) - math.log(_median_sorted(b))
    return {"log_ratio": point, "log_ci95": [float(lo), float(hi)]}


def ratio_of_medians(a_ms, b_ms, confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> dict:
    """``median(a) / median(b)`` with a percentile-bootstrap CI: :func:`log_ratio_of_medians`, exponentiated.

    (Percentile intervals are invariant under the monotone log, so this equals the percentile CI of
    the ratio itself.) A ratio beyond the float range is inf or 0; the log version stays exact.
    """
    r = log_ratio_of_medians(a_ms, b_ms, confidence, resamples, seed)
    return {"ratio": _exp(r["log_ratio"]), "ci95": [_exp(x) for x in r["log_ci95"]]}


def welch_log(a_ms, b_ms) -> dict:
    """Welch's unequal-variance t-test on log-times (``scipy.stats.ttest_ind(equal_var=False)``).

    Returns ``{"t", "df", "p"}`` (two-sided p). ``t > 0`` means ``a`` is slower on the log scale.
    Series with zero variance on both sides give NaN.
    """
    a = np.log(_as_samples(a_ms, "a_ms", positive=True))
    b = np.log(_as_samples(b_ms, "b_ms", positive=True))
    if a.size < 2 or b.size < 2:
        raise ValueError("welch_log needs at least two samples in each series")
    import warnings

    from scipy import stats as _sps  # here only: the orchestrator compares, workers never do

    with warnings.catch_warnings():  # nearly identical log-times: SciPy's precision warning is no news to a reader
        warnings.simplefilter("ignore", RuntimeWarning)
        res = _sps.ttest_ind(a, b, equal_var=False)
    return {"t": float(res.statistic), "df": float(res.df), "p": float(res.pvalue)}


def compare_series_log(a_ms, b_ms) -> dict:
    """:func:`compare_series` in log space: ``log_ratio`` and ``log_ci95`` (natural logs) instead of
    ``ratio`` and ``ci95``, finite for any positive finite samples."""
    r = log_ratio_of_medians(a_ms, b_ms)
    p = welch_log(a_ms, b_ms)["p"]
    lo, hi = r["log_ci95"]
    significant = bool((lo > 0.0 or hi < 0.0) and p < 0.05)
    if not significant:
        verdict = "no significant difference"
    else:
        verdict = "faster" if r["log_ratio"] < 0.0 else "slower"
    return {**r, "p": p, "significant": significant, "verdict": verdict}


def compare_series(a_ms, b_ms) -> dict:
    """Is ``a`` faster or slower than ``b``? ``ratio = median(a) / median(b)`` (< 1: ``a`` is faster).

    ``significant`` needs both the 95 % bootstrap CI of the ratio to exclude 1 and Welch's test on
    log-times to give ``p < 0.05``; otherwise the verdict is ``"no significant difference"``.
    """
    c = compare_series_log(a_ms, b_ms)
    return {
        "ratio": _exp(c["log_ratio"]),
        "ci95": [_exp(x) for x in c["log_ci95"]],
        "p": c["p"],
        "significant": c["significant"],
        "verdict": c["verdict"],
    }
