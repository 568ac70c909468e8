"""Error statistics follow numpy.allclose semantics and catch non-finite values."""

from __future__ import annotations

import numpy as np
import pytest

from parity.check import closeness as compare
from parity.model.spec import Tolerance


@pytest.mark.parametrize("seed", range(5))
def test_ok_matches_numpy_allclose(seed):
    rng = np.random.default_rng(seed)
    golden = rng.standard_normal(100)
    actual = golden + rng.standard_normal(100) * 10.0 ** rng.uniform(-7, -3)
    tol = Tolerance(atol=1e-5, rtol=1e-4)
    stats = compare.error_stats(actual.astype(np.float32), golden, tol)
    assert stats["ok"] == np.allclose(actual.astype(np.float32).astype(np.float64), golden, atol=1e-5, rtol=1e-4)


def test_statistics_by_hand():
    golden = np.array([1.0, -2.0, 4.0])
    actual = np.array([1.0, -2.5, 4.0])
    stats = compare.error_stats(actual, golden, Tolerance(atol=0.1, rtol=0.1))
    assert stats["max_abs"] == pytest.approx(0.5)
    assert stats["max_rel"] == pytest.approx(0.25)
    assert stats["mean_abs"] == pytest.approx(0.5 / 3)
    assert stats["tol_units"] == pytest.approx(0.5 / (0.1 + 0.2))
    assert stats["cosine"] == pytest.approx(np.dot(golden, actual) / np.linalg.norm(golden) / np.linalg.norm(actual))
    assert stats["ok"] is False


def test_nan_and_inf_are_counted_and_fail():
    stats = compare.error_stats(np.array([np.nan, 1.0, np.inf]), np.ones(3), Tolerance(1.0, 1.0))
    assert stats["ok"] is False and stats["nonfinite"] == 2 and "NaN or Inf" in stats["reason"]


def test_shape_mismatch_fails():
    stats = compare.error_stats(np.zeros((2, 3)), np.zeros((3, 2)), Tolerance(1.0, 1.0))
    assert stats["ok"] is False and "shape" in stats["reason"]


def test_bitwise_equal():
    a = {"y": np.array([1.0, 2.0], np.float32)}
    assert compare.bitwise_equal(a, {"y": a["y"].copy()}) == (True, 0.0)
    same, diff = compare.bitwise_equal(a, {"y": np.array([1.0, 2.5], np.float32)})
    assert not same and diff == pytest.approx(0.5)


def test_zero_atol_follows_allclose_on_exact_zeros():
    """atol 0 and a golden of exactly 0: an exact element is within tolerance, any other is not."""
    tol = Tolerance(atol=0.0, rtol=1e-5)
    golden = np.array([0.0, 1.0])
    exact = compare.error_stats(golden.copy(), golden, tol)
    assert exact["ok"] and exact["tol_units"] == 0.0 and exact["n_bad"] == 0
    off = compare.error_stats(np.array([1e-9, 1.0]), golden, tol)
    assert not off["ok"] and off["tol_units"] == float("inf") and off["n_bad"] == 1
