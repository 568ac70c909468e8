"""Cheap global explanations of an output that drifted, tested on the outputs alone (NumPy only).

Each test transforms the golden output in one way and says whether the observed output is then
within tolerance: a permutation of the classes (a label map that differs), a constant scale
(a missing or extra normalisation factor), a constant offset (a bias added twice or lost), a
shifted grid (padding or cropping off by one on a spatial output).
"""

from __future__ import annotations

import numpy as np

from parity.check import closeness as compare

MIN_ROWS = 3  # per-column patterns (a class map, an offset per column) are tested on at least this many samples


def _holds(candidate: np.ndarray, observed: np.ndarray, tol) -> tuple[bool, float]:
    stats = compare.error_stats(observed, candidate, tol)
    return bool(stats.get("ok")), float(stats.get("tol_units", np.inf))


def permutation(observed: np.ndarray, golden: np.ndarray, tol) -> dict:
    """Classes in another order: every observed column matches one golden column."""
    if observed.ndim != 2 or observed.shape != golden.shape:
        return {"name": "permutation", "holds": False, "detail": "not applicable (needs a 2-D output)"}
    if observed.shape[0] < MIN_ROWS:
        return {
            "name": "permutation",
            "holds": False,
            "detail": f"not tested on {observed.shape[0]} sample(s): a column map fits almost any",
        }
    # for each observed column, the golden column closest to it (one column at a time: memory stays O(N x C))
    mapping = np.array([np.abs(golden - observed[:, [j]]).max(axis=0).argmin() for j in range(observed.shape[1])])
    if len(set(mapping.tolist())) != len(mapping) or np.array_equal(mapping, np.arange(len(mapping))):
        return {"name": "permutation", "holds": False, "detail": "no non-trivial class permutation fits"}
    holds, units = _holds(golden[:, mapping], observed, tol)
    moved = [f"{j}<-{int(i)}" for j, i in enumerate(mapping) if i != j]
    detail = f"output class j is golden class i for {', '.join(moved)} ({units:.3g}x tolerance after permuting)"
    return {"name": "permutation", "holds": holds, "detail": detail if holds else "no class permutation fits"}


def scale(observed: np.ndarray, golden: np.ndarray, tol) -> dict:
    """observed = a * golden for one constant a != 1 (least squares)."""
    g, o = golden.ravel(), observed.ravel()
    denominator = float(np.dot(g, g))
    if denominator == 0.0:
        return {"name": "scale", "holds": False, "detail": "golden is all zeros"}
    a = float(np.dot(g, o)) / denominator
    holds, units = _holds(a * golden, observed, tol)
    holds = holds and not np.isclose(a, 1.0, rtol=1e-6, atol=0)
    return {
        "name": "scale",
        "holds": holds,
        "detail": f"observed = {a:.6g} x golden ({units:.3g}x tolerance after scaling)"
        if holds
        else f"best constant scale {a:.6g} leaves {units:.3g}x the tolerance",
    }


def offset(observed: np.ndarray, golden: np.ndarray, tol) -> dict:
    """observed = golden + b, for one constant b or one constant per output column."""
    diff = observed - golden
    candidates = [("overall", diff.mean())]
    if diff.reshape(-1, diff.shape[-1]).shape[0] >= MIN_ROWS:  # with fewer rows any per-column offset fits
        candidates.append(("per column", diff.reshape(-1, diff.shape[-1]).mean(axis=0)))
    for per, b in candidates:
        if np.allclose(b, 0.0, atol=tol.atol, rtol=0):
            continue
        holds, units = _holds(golden + b, observed, tol)
        if holds:
            shown = (
                f"{float(b):.4g}"
                if np.ndim(b) == 0
                else np.array2string(np.asarray(b), precision=3, max_line_width=120)
            )
            return {
                "name": "offset",
                "holds": True,
                "detail": f"observed = golden + {shown} ({per}; {units:.3g}x tolerance after the shift)",
            }
    return {"name": "offset", "holds": False, "detail": "no constant offset fits"}


def shifted_grid(observed: np.ndarray, golden: np.ndarray, tol) -> dict:
    """A spatial output moved by one position along a spatial axis (compared on the overlap)."""
    if observed.ndim < 3 or observed.shape != golden.shape:
        return {"name": "shift", "holds": False, "detail": "not applicable (needs a spatial output)"}
    for axis in range(2, observed.ndim):
        for step in (1, -1):
            size = observed.shape[axis]
            if size < 3:
                continue
            keep = slice(1, None) if step == 1 else slice(None, -1)
            source = slice(None, -1) if step == 1 else slice(1, None)
            o = np.take(observed, range(size)[keep], axis=axis)
            g = np.take(golden, range(size)[source], axis=axis)
            holds, units = _holds(g, o, tol)
            if holds:
                return {
                    "name": "shift",
                    "holds": True,
                    "detail": f"shifted by {step} along axis {axis} ({units:.3g}x tolerance on the overlap)",
                }
    return {"name": "shift", "holds": False, "detail": "no one-position grid shift fits"}


def output_patterns(observed: np.ndarray, golden: np.ndarray, tol) -> list[dict]:
    """Every pattern test on one output (float64 arithmetic)."""
    observed = np.asarray(observed, dtype=np.float64)
    golden = np.asarray(golden, dtype=np.float64)
    if observed.shape != golden.shape or not np.all(np.isfinite(observed)):
        return [{"name": "all", "holds": False, "detail": "not tested: shapes differ or values are not finite"}]
    return [test(observed, golden, tol) for test in (permutation, scale, offset, shifted_grid)]
