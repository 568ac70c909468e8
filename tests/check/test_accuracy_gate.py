"""The accuracy gate of quantized paths: Tango's paired interval, the three decisions, SQNR."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize_scalar

from parity.check import accuracy_gate as gate_
from parity.model.spec import Gate

Z95 = NormalDist().inv_cdf(0.95)


def _logits(classes: np.ndarray, width: int = 10) -> np.ndarray:
    return np.eye(width)[classes]


def _split(n: int, golden_wrong: int, lost: int, gained: int, seed: int = 0):
    """Labels, golden logits and path logits over ``n`` samples with the given paired counts."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    golden, path = labels.copy(), labels.copy()
    golden[:golden_wrong] = (labels[:golden_wrong] + 1) % 10  # the golden misses these
    path[:golden_wrong] = golden[:golden_wrong]
    path[golden_wrong : golden_wrong + gained] = labels[golden_wrong : golden_wrong + gained]  # the path gets them
    start = golden_wrong + gained
    golden[golden_wrong:start] = (labels[golden_wrong:start] + 2) % 10
    path[start : start + lost] = (labels[start : start + lost] + 3) % 10  # the path misses these, the golden does not
    return labels, _logits(golden), _logits(path)


def test_no_discordant_sample_passes_when_the_split_can_tell():
    labels, golden, path = _split(449, golden_wrong=13, lost=0, gained=0)
    judged = gate_.judge(path, golden, labels, Gate())
    assert judged["decision"] == "pass" and judged["reason"] is None
    # rule of three at one-sided 95 %: the upper bound is z^2 / (n + z^2)
    assert judged["interval"][1] == pytest.approx(Z95**2 / (449 + Z95**2), rel=1e-6)
    assert judged["agreement"] == 1.0 and judged["lost"] == judged["gained"] == 0


def test_too_small_a_split_is_inconclusive_and_says_how_many_more():
    labels, golden, path = _split(100, golden_wrong=3, lost=0, gained=0)  # 3/100 > the 0.97 % allowed: no power
    judged = gate_.judge(path, golden, labels, Gate())
    assert judged["decision"] == "inconclusive"
    assert judged["more_samples"] is not None and judged["more_samples"] > 100
    assert "more labelled samples would decide" in judged["reason"]
    # and that many more samples at the same rates do decide
    scale = (100 + judged["more_samples"]) / 100
    low, high = gate_.paired_interval(0, 0, 100 * scale, Z95)
    assert high <= judged["allowed"] + 1e-12


def test_a_clear_drop_fails_and_gains_offset_losses():
    labels, golden, path = _split(449, golden_wrong=13, lost=30, gained=0)
    judged = gate_.judge(path, golden, labels, Gate())
    assert judged["decision"] == "fail" and judged["interval"][0] > judged["allowed"]
    assert judged["reason"].startswith("accuracy gate: accuracy")
    # the same losses offset by as many gains: a drop of zero, passing on a large enough split
    labels, golden, path = _split(4000, golden_wrong=100, lost=3, gained=3)
    offset = gate_.judge(path, golden, labels, Gate())
    assert offset["drop"] == 0.0 and offset["decision"] == "pass"


def test_without_labels_the_gate_is_agreement():
    _, golden, path = _split(449, golden_wrong=0, lost=0, gained=0)
    judged = gate_.judge(path, golden, None, Gate())
    assert judged["metric"] == "agreement" and judged["golden"] == 1.0 and "no labels" in judged["note"]


def test_an_observed_drop_at_the_allowed_one_cannot_be_decided():
    # golden 100 %, drop exactly 1 %: keep 0.99 allows exactly that
    assert gate_.more_samples(4, 0, 400, 0.01, Z95) is None


def _restricted_mle(lost, gained, n, delta):
    """P(path-only right) maximising the multinomial likelihood with P(golden-only right) - it = delta, numerically."""
    other = n - lost - gained

    def negative_log_likelihood(p):
        return -(lost * math.log(p + delta) + gained * math.log(p) + other * math.log(1 - 2 * p - delta))

    low, high = max(0.0, -delta) + 1e-12, (1 - delta) / 2 - 1e-12
    return minimize_scalar(negative_log_likelihood, bounds=(low, high), method="bounded", options={"xatol": 1e-12}).x


@given(st.integers(1, 30), st.integers(1, 30), st.integers(100, 2000), st.floats(-0.05, 0.05))
@settings(max_examples=40, deadline=None)
def test_the_closed_form_restricted_mle_is_the_likelihoods_maximum(lost, gained, n, delta):
    """The score statistic's variance uses a closed-form restricted MLE; it must be the numerical maximum."""
    other = n - lost - gained
    b = lost * (1 - delta) + gained * (1 - 3 * delta) - 2 * other * delta
    c = gained * delta * (1 - delta)
    closed = (b + math.sqrt(b * b + 8 * n * c)) / (4 * n)
    if closed + delta <= 0 or 1 - 2 * closed - delta <= 0:
        return
    assert closed == pytest.approx(_restricted_mle(lost, gained, n, delta), abs=1e-6)


def test_the_interval_covers_the_true_drop_as_often_as_it_claims():
    """Each bound is one-sided at 95 %: over simulated paired splits the true drop lies beyond each bound in about
    5 % of them. A score interval on counts this small is near nominal on average, not in every case (Tango 1998,
    Newcombe 1998): at most 9 % in any case simulated, at most 6.5 % averaged over them."""
    rng = np.random.default_rng(7)
    misses = []
    for n, p_lost, p_gained in [
        (400, 0.02, 0.005),
        (449, 0.01, 0.0),
        (449, 0.005, 0.005),
        (1000, 0.02, 0.01),
        (400, 0.05, 0.01),
    ]:
        below = above = 0
        trials = 800
        for _ in range(trials):
            cells = rng.multinomial(n, [p_lost, p_gained, 1 - p_lost - p_gained])
            low, high = gate_.paired_interval(int(cells[0]), int(cells[1]), n, Z95)
            below += (p_lost - p_gained) < low
            above += (p_lost - p_gained) > high
        misses += [below / trials, above / trials]
    assert max(misses) <= 0.09 and np.mean(misses) <= 0.065, misses


def test_sqnr_and_by_sqnr_keep_shape_and_nan_failures():
    reference = np.array([[3.0, 4.0]])
    assert gate_.sqnr_db(reference, reference) == math.inf
    assert gate_.sqnr_db(reference, reference * 1.1) == pytest.approx(20.0)
    compared = {"logits": {"ok": False, "tol_units": 50.0}, "other": {"ok": False, "nonfinite": 1, "reason": "NaN"}}
    judged = gate_.by_sqnr(
        compared, {"logits": reference * 1.1, "other": reference}, {"logits": reference, "other": reference}
    )
    assert judged["logits"]["ok"] and judged["logits"]["sqnr_db"] == pytest.approx(20.0)
    assert not judged["other"]["ok"]


def test_gate_declaration_is_checked():
    with pytest.raises(ValueError, match="metric"):
        Gate(metric="f1")
    with pytest.raises(ValueError, match="keep"):
        Gate(keep=1.5)
