"""Steps in a history of timings: where a path became slower or faster, found so that pure noise rarely looks like
one.

Each run contributes its median (on a log scale, so a step is a ratio) and the 95 % CI of that median. asv's step
detection (a penalised piecewise-constant fit weighting points by their CIs) is the anchor; this differs in how a
step is accepted:

* **outliers**: values are pulled in to 4 robust standard deviations of the median first (a run twice as slow is
  not a level of its own: asv reports steps at such runs, see the script);
* **weights**: a run's weight is ``1 / (se_i^2 + tau^2)``: ``se_i`` from its own CI, ``tau^2`` the variation between
  runs beyond what their CIs show (machines drift between runs more than within one), estimated robustly from
  successive differences, so a run with a tight CI on a noisy machine is not over-trusted;
* **the test**: binary segmentation on the likelihood-ratio statistic of one step at each split (the weighted mean
  difference studentised by the residual variance of the two-level fit; a segment found inside another is tested at
  half its parent's level); the largest one is accepted only when a permutation test of that maximum, over the same points
  shuffled, gives ``p < alpha``. The permutation distribution is the maximum's own null, so on exchangeable noise
  a false step is found with probability about ``alpha`` whatever the noise's distribution and the history's length
  (``scripts/step_detection.py`` measures both rates);
* **a step must matter**: the change must exceed ``min_change`` (relative) as well as be significant;
* **a drift is not a step**: where the step does not improve on a straight line through the segment by an F
  statistic of ``TREND_F``, there is no run at which the change happened, and none is named.

NumPy only.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

ALPHA = 0.01
MIN_SIZE = 2  # runs on each side of a step at least (one run after a change is an outlier until another agrees)
PERMUTATIONS = 999
MIN_CHANGE = 0.01
CLIP = 4.0  # robust standard deviations beyond which a run's value is pulled in
TREND_F = 7.0  # how much better than a straight line a step must fit (F statistic of the step given the line)


@dataclass(frozen=True)
class Step:
    index: int  # the first run after the step
    before: float  # the typical value between the step before it (or the start) and it: weighted mean, original scale
    after: float  # the same between it and the next step (or the end)
    p: float

    @property
    def ratio(self) -> float:
        return self.after / self.before


def se_from_ci(median: float, lo: float, hi: float) -> float:
    """The standard error of ``log(median)`` a 95 % CI implies (its log-width / 3.92); 0 where the CI is absent."""
    if not (lo and hi and lo > 0 and hi > 0 and median > 0):
        return 0.0
    return (math.log(hi) - math.log(lo)) / (2 * 1.959964)


def _clipped(y: np.ndarray, k: float = CLIP) -> np.ndarray:
    """``y`` with outliers pulled in to ``k`` robust standard deviations (1.4826 MAD) of the median: one run twice as
    slow is not a level of its own. A function of the set of values, so the permutation test stays exact."""
    med = float(np.median(y))
    scale = 1.4826 * float(np.median(np.abs(y - med)))
    return np.clip(y, med - k * scale, med + k * scale) if scale > 0 else y


def _between_run_variance(y: np.ndarray, se: np.ndarray) -> float:
    """tau^2: variance between runs beyond their own CIs, from the median absolute successive difference (a step
    moves one difference only, so it barely moves the estimate)."""
    if y.size < 3:
        return 0.0
    d = np.diff(y)
    sigma = 1.4826 * float(np.median(np.abs(d - np.median(d)))) / math.sqrt(2)
    return max(sigma**2 - float(np.mean(se**2)), 0.0)


def _max_statistic(y: np.ndarray, w: np.ndarray, min_size: int) -> tuple[np.ndarray, np.ndarray]:
    """For each row of ``y``/``w`` (shape (m, n)), the largest likelihood-ratio statistic of one step over splits
    ``k`` in ``[min_size, n - min_size]`` (the weighted mean difference studentised by the residual variance of the
    two-level fit: a step does not inflate its own yardstick), and where it is."""
    cw, cy, cyy = np.cumsum(w, axis=1), np.cumsum(w * y, axis=1), np.cumsum(w * y * y, axis=1)
    total_w, total_y, total_yy = cw[:, -1:], cy[:, -1:], cyy[:, -1:]
    k = np.arange(min_size, y.shape[1] - min_size + 1)
    left_w, left_y = cw[:, k - 1], cy[:, k - 1]
    right_w, right_y = total_w - left_w, total_y - left_y
    rss0 = total_yy - total_y**2 / total_w
    rss = np.maximum(total_yy - left_y**2 / left_w - right_y**2 / right_w, 1e-300 * np.maximum(rss0, 1e-300))
    stat = (rss0 - rss) / (rss / (y.shape[1] - 2))
    best = np.argmax(stat, axis=1)
    return stat[np.arange(stat.shape[0]), best], k[best]


def _wls_rss(columns: list[np.ndarray], y: np.ndarray, w: np.ndarray) -> float:
    sw = np.sqrt(w)
    design = np.stack(columns, axis=1) * sw[:, None]
    coef, *_ = np.linalg.lstsq(design, y * sw, rcond=None)
    return float(np.sum(w * (y - np.stack(columns, axis=1) @ coef) ** 2))


def _trend_explains(y: np.ndarray, w: np.ndarray, k: int, f_min: float = TREND_F) -> bool:
    """Whether a straight line through the segment explains it: the step at ``k`` added to the line does not
    improve the fit by an F statistic of ``f_min``. A slow drift (a machine warming, a cache filling over runs) has
    no run where it happened, so it is not called a step."""
    x = np.arange(y.size, dtype=np.float64)
    ones, after = np.ones_like(x), (x >= k).astype(np.float64)
    line, both = _wls_rss([ones, x], y, w), _wls_rss([ones, x, after], y, w)
    return y.size <= 4 or (line - both) / max(both / (y.size - 4), 1e-300) < f_min


def detect(
    values,
    ses=None,
    alpha: float = ALPHA,
    min_change: float = MIN_CHANGE,
    min_size: int = MIN_SIZE,
    permutations: int = PERMUTATIONS,
    seed: int = 0,
) -> list[Step]:
    """Steps in ``values`` (positive, in run order; e.g. medians in ms) given each one's standard error of its log
    (``ses``; zeros when unknown), oldest first."""
    y = np.log(np.asarray(values, dtype=np.float64))
    se = np.zeros_like(y) if ses is None else np.asarray(ses, dtype=np.float64)
    if y.size < 2 * min_size:
        return []
    y = _clipped(y)
    tau2 = _between_run_variance(y, se)
    var = se**2 + tau2
    if not np.any(var > 0):  # identical values, no CIs: nothing varies, so any change is a step
        var = np.full_like(y, 1e-12)
    w = 1.0 / np.maximum(var, 1e-300)
    rng = np.random.default_rng(seed)
    found: list[tuple[int, float]] = []

    def segment(a: int, b: int, level: float) -> None:
        if b - a < 2 * min_size:
            return
        ys, ws = y[a:b], w[a:b]
        observed, split = _max_statistic(ys[None, :], ws[None, :], min_size)
        order = np.argsort(rng.random((permutations, b - a)), axis=1)
        null, _ = _max_statistic(ys[order], ws[order], min_size)
        p = (1 + int(np.count_nonzero(null >= observed[0] - 1e-12))) / (permutations + 1)
        k = int(split[0])
        change = np.sum(ws[k:] * ys[k:]) / np.sum(ws[k:]) - np.sum(ws[:k] * ys[:k]) / np.sum(ws[:k])
        if p >= level or abs(math.expm1(change)) < min_change or _trend_explains(ys, ws, k):
            return
        found.append((a + k, p))
        segment(a, a + k, level / 2)  # each level of the recursion tests twice the segments: half the level each
        segment(a + k, b, level / 2)

    segment(0, y.size, alpha)
    found.sort()
    bounds = [0, *(i for i, _ in found), y.size]
    level = [float(np.exp(np.sum(w[a:b] * y[a:b]) / np.sum(w[a:b]))) for a, b in itertools.pairwise(bounds)]
    return [Step(i, level[j], level[j + 1], p) for j, (i, p) in enumerate(found)]
