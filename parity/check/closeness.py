"""Error statistics and closeness verdicts (NumPy only; knows nothing about frameworks)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from parity.model.spec import Tolerance

_TINY = 1e-30


def error_stats(actual: np.ndarray, golden: np.ndarray, tol: Tolerance) -> dict:
    """Statistics of ``actual`` against ``golden`` (float64 arithmetic).

    ``tol_units`` is the worst element's error in units of its allowance
    ``atol + rtol * |golden|``; ``ok`` is ``tol_units <= 1`` with every element finite
    (numpy.allclose semantics). Non-finite elements make ``ok`` false and are counted, except where the
    golden element is itself infinite (a masked logit): there the element must be that infinity, exactly.
    """
    actual = np.asarray(actual)
    if np.asarray(golden).dtype.kind in "USO" or actual.dtype.kind in "USO":
        return text_stats(actual, np.asarray(golden))
    golden = np.asarray(golden, dtype=np.float64)
    if actual.shape != golden.shape:
        return {"ok": False, "reason": f"shape {tuple(actual.shape)} != golden {tuple(golden.shape)}"}
    a = actual.astype(np.float64)
    infinite = ~np.isfinite(golden)  # a -inf mask's values, NaN given data: each must come out the same, exactly
    if infinite.any():
        stats = error_stats(np.where(infinite, 0.0, a), np.where(infinite, 0.0, golden), tol)
        same = (a[infinite] == golden[infinite]) | (np.isnan(a[infinite]) & np.isnan(golden[infinite]))
        differ = int(np.count_nonzero(~same))
        stats["infinite_golden"] = int(np.count_nonzero(infinite))
        if differ:
            stats.update(
                ok=False,
                reason=f"{differ} of {stats['infinite_golden']} non-finite golden elements differ "
                f"(each must be the same infinity, or NaN, at the same position)",
            )
        return stats
    nonfinite = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
    if nonfinite:
        return {
            "ok": False,
            "nonfinite": nonfinite,
            "size": int(a.size),
            "reason": f"{nonfinite} of {a.size} elements are NaN or Inf",
        }
    diff = np.abs(a - golden)
    magnitude = np.abs(golden)
    scale = float(magnitude.max(initial=0.0))
    allowance = _allowance(tol, magnitude, scale)
    g_flat, a_flat = golden.ravel(), a.ravel()
    norms = np.linalg.norm(g_flat) * np.linalg.norm(a_flat)
    cosine = float(np.dot(g_flat, a_flat) / norms) if norms > 0 else float(np.array_equal(g_flat, a_flat))
    with np.errstate(divide="ignore", invalid="ignore"):  # atol 0 and golden 0: an exact element is within
        ratio = np.where(diff == 0, 0.0, diff / allowance)
    tol_units = float(np.max(ratio)) if diff.size else 0.0
    if not np.isfinite(tol_units):  # a non-finite reference: never comparable, never ok
        tol_units = float("inf")
    return {
        "max_abs": float(diff.max()) if diff.size else 0.0,
        "max_rel": float(np.max(diff / np.maximum(magnitude, _TINY))) if diff.size else 0.0,
        "mean_abs": float(diff.mean()) if diff.size else 0.0,
        "cosine": cosine,
        "tol_units": tol_units,
        "n_bad": int(np.count_nonzero(~(ratio <= 1.0))),
        "size": int(diff.size),
        "scale": scale,  # the largest golden magnitude
        "ok": bool(tol_units <= 1.0),
    }


def text_stats(actual: np.ndarray, golden: np.ndarray) -> dict:
    """A string output against its golden: equal element by element (no tolerance applies to text)."""
    if actual.shape != golden.shape:
        return {"ok": False, "reason": f"shape {tuple(actual.shape)} != golden {tuple(golden.shape)}"}
    if actual.dtype.kind not in "USO" or golden.dtype.kind not in "USO":
        return {"ok": False, "reason": f"{actual.dtype} values where the golden holds {golden.dtype} ones"}
    differ = int(np.count_nonzero(actual.astype(str) != golden.astype(str)))
    stats: dict[str, Any] = {
        "max_abs": 0.0,
        "max_rel": 0.0,
        "mean_abs": 0.0,
        "cosine": 1.0,
        "tol_units": 0.0 if not differ else float("inf"),
        "n_bad": differ,
        "size": int(golden.size),
        "ok": not differ,
    }
    if differ:
        first = tuple(int(i) for i in np.argwhere(actual.astype(str) != golden.astype(str))[0])
        stats["reason"] = (
            f"{differ} of {golden.size} strings differ (at {first}: {str(actual[first])!r}, golden "
            f"{str(golden[first])!r})"
        )
    return stats


def compare_named(actual: dict, golden: dict, tolerance_for) -> dict:
    """``error_stats`` for every golden name; a name missing from ``actual`` is not ok."""
    result = {}
    for name, golden_value in golden.items():
        if name not in actual:
            result[name] = {"ok": False, "reason": "missing"}
        else:
            result[name] = error_stats(actual[name], golden_value, tolerance_for(name))
    return result


# outputs a model holds in a reduced float dtype: judged at the tolerance of the precision that computes in it
REDUCED_PRECISION = {"float16": "fp16", "bfloat16": "bf16"}


def dtype_tolerance(
    tolerances_at, name: str, dtype: str | None, precision: str = "fp32"
) -> tuple[Tolerance, dict | None]:
    """The tolerance output ``name``, held in ``dtype``, is judged at on a path of ``precision``, and why (None: the
    spec's as it is). ``tolerances_at(precision)`` gives the spec's ``Tolerances`` (``ModelSpec.output_tolerances``).

    An output the model computes in float16 or bfloat16 cannot be closer to a float64 golden than that dtype's
    rounding: it is judged at the tolerance ``--precision fp16`` / ``bf16`` judges it at (the spec's own for that
    precision where it declares one, else the dtype's default), never tighter than the path's. A float8 or float4
    output (a cast, a quantizer) is allowed one unit in the last place of its dtype. Integer, bool and wider float
    outputs keep the path's tolerance.
    """
    declared = tolerances_at(precision).for_name(name)
    if dtype in REDUCED_PRECISION:
        rule = REDUCED_PRECISION[dtype]
        if rule == precision:  # the precision's own tolerances already are this dtype's
            return declared, None
        reduced = tolerances_at(rule).for_name(name)
        atol, rtol = reduced.atol, reduced.rtol
        why = f"output is {dtype}: the {rule} tolerance, as --precision {rule} judges it"
    elif dtype and dtype.startswith(("float8", "float4")):
        import ml_dtypes

        info = ml_dtypes.finfo(dtype)
        atol, rtol = float(info.smallest_subnormal), float(info.eps)
        why = f"output is {dtype}: one unit in the last place of {dtype}"
    else:
        return declared, None
    applied = replace(declared, atol=max(declared.atol, atol), rtol=max(declared.rtol, rtol))
    if applied == declared:
        return declared, None
    return applied, {"atol": applied.atol, "rtol": applied.rtol, "dtype": dtype, "why": why}


@dataclass(frozen=True)
class OutputTolerances:
    """The tolerance each output of a path is judged at: the spec's at the path's ``precision``, except an output
    the path computes in a reduced dtype (``dtypes``: ``{output name: dtype}`` as the runner returned them), judged
    at that dtype's (``dtype_tolerance``). ``tolerances_at`` is ``ModelSpec.output_tolerances``."""

    tolerances_at: Callable[[str], object]
    precision: str = "fp32"
    dtypes: dict = field(default_factory=dict)

    def rule(self, name: str) -> tuple[Tolerance, dict | None]:
        return dtype_tolerance(self.tolerances_at, name, self.dtypes.get(name), self.precision)

    def for_name(self, name: str) -> Tolerance:
        return self.rule(name)[0]


def compare_outputs(actual: dict, golden: dict, tolerances: OutputTolerances) -> dict:
    """``compare_named`` for a path's outputs, each judged by its own dtype (``OutputTolerances``); an entry judged
    at a dtype's tolerance carries it under ``tolerance``."""
    result = compare_named(actual, golden, tolerances.for_name)
    for name in golden:
        rule = tolerances.rule(name)[1]
        if rule is not None and name in result:
            result[name]["tolerance"] = rule
    return result


def _allowance(tol: Tolerance, magnitude, scale: float):
    """Each element's allowance: ``atol + rtol·|golden|``, plus ``scaled`` of the tensor's largest magnitude."""
    return tol.atol + tol.rtol * magnitude + (tol.scaled * scale if tol.scaled else 0.0)


def quick_units(actual, golden, tol) -> float:
    """The worst element's error in units of its allowance, the one figure ``error_stats`` decides ``ok`` by, at a
    fraction of its cost (the output audits of a timed series); inf where anything is not finite or shapes differ."""
    a = np.asarray(actual, dtype=np.float64)
    if a.shape != np.shape(golden):
        return float("inf")
    with np.errstate(divide="ignore", invalid="ignore"):
        magnitude = np.abs(golden)
        allowance = _allowance(tol, magnitude, float(magnitude.max(initial=0.0)))
        units = float(np.max(np.abs(a - golden) / allowance, initial=0.0))
    return units if np.isfinite(units) else float("inf")


def first_failure(stats: dict) -> tuple[str, dict] | None:
    """The worst failing entry (NaN first, then the largest tol_units), or None if all ok."""
    failing = [(name, s) for name, s in stats.items() if not s["ok"]]
    if not failing:
        return None
    return max(failing, key=lambda item: (("tol_units" not in item[1]), item[1].get("tol_units", 0.0)))


def times(tol_units: float) -> str:
    """An error in tolerance units as words: ``3.4x the tolerance``, or what an infinite multiple means."""
    if math.isnan(tol_units) or math.isinf(tol_units):
        return "non-finite or beyond any multiple of the tolerance"
    return f"{tol_units:.3g}x the tolerance"


def describe(kind: str, name: str, stats: dict) -> str:
    """One line for a failing output or gradient: how far off it is and how many elements are out."""
    if "reason" in stats:
        return f"{kind} {name}: {stats['reason']}"
    if not math.isfinite(stats["tol_units"]):  # an allowance of 0: atol 0 where the golden element is 0
        return (
            f"{kind} {name}: max_abs {stats['max_abs']:.3g}, and elements whose golden value is 0 differ where "
            f"the tolerance allows nothing (atol 0), {stats['n_bad']} of {stats['size']} elements out"
        )
    rule = stats.get("tolerance")
    which = f" ({rule['dtype']}: atol {rule['atol']:.3g}, rtol {rule['rtol']:.3g})" if rule else ""
    return (
        f"{kind} {name}: max_abs {stats['max_abs']:.3g} is {stats['tol_units']:.3g}x the tolerance{which}, "
        f"{stats['n_bad']} of {stats['size']} elements out"
    )


def bitwise_equal(first: dict, second: dict) -> tuple[bool, float]:
    """Whether two runs' outputs are bitwise identical, and their largest difference."""
    worst = 0.0
    identical = True
    for name, value in first.items():
        other = second[name]
        if value.shape != other.shape or value.tobytes() != other.tobytes():
            identical = False
            if value.shape == other.shape and value.dtype.kind not in "USO":
                with np.errstate(invalid="ignore"):
                    worst = max(worst, float(np.nanmax(np.abs(value.astype(np.float64) - other.astype(np.float64)))))
            else:
                worst = float("inf")
    return identical, worst
