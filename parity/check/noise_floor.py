"""The float32 noise floor of a model, and the passing paths that are far noisier than it (NumPy free).

The floor of an output is the error of the model's own float32 source path (``torch``, ``tf``, ``jax``; an ONNX
file's reference evaluator, ``onnx/onnxref``) against the float64 golden: what float32 arithmetic costs this model
on these inputs. A converted path that passes the declared tolerance but whose error is more than ``FACTOR`` times
that floor computes something float32 arithmetic does not explain (a float16 island, a lost epsilon that happens to
stay inside a loose tolerance): it is said under the table and in the JSON (``noise_floor``), and diagnosed at a
tolerance derived from the floor (``bound``) as a failure is at the declared one.
"""

from __future__ import annotations

import math

from parity.model.spec import Tolerance, Tolerances
from parity.model.user import float32_floor, relative_floor
from parity.platform.precision import DTYPE_MIN_NORMAL

FACTOR = 32.0  # a passing fp32 path more than this many times the floor is flagged


def _numeric(stats: dict | None) -> bool:
    """Entries compared elementwise at the path's own tolerance (not by a gate, not at a reduced dtype's)."""
    return stats is not None and "max_abs" in stats and "reason" not in stats and not stats.get("judged_by")


def relative(stats: dict) -> float:
    """The floor of one output relative to its scale (its largest golden magnitude), from the source's stats."""
    return relative_floor(stats["max_abs"], stats.get("scale", 0.0))


def floor_of(stats: dict) -> float:
    """The floor of one output from the source's stats: its max_abs, at least one float32 unit of the output's
    largest golden value (``scale``)."""
    return float32_floor(stats["max_abs"], stats.get("scale", 0.0))


def judge(result: dict, source: dict, source_id: str, factor: float = FACTOR) -> dict | None:
    """``result``'s error against the floor of ``source`` (the source path's result on the same golden inputs):
    ``{"source", "factor", "ratio", "output", "max_abs", "floor", "outputs": {name: ratio}, "noisier"}``, or None
    where nothing can be compared (no numeric output in both)."""
    ours, theirs = result.get("outputs") or {}, source.get("outputs") or {}
    floors = {
        name: floor_of(theirs[name])
        for name, stats in ours.items()
        if _numeric(stats) and _numeric(theirs.get(name)) and "tolerance" not in stats
    }
    if not floors:
        return None
    ratios = {name: ours[name]["max_abs"] / floor for name, floor in floors.items()}
    worst = max(ratios, key=lambda n: ratios[n])
    return {
        "source": source_id,
        "factor": factor,
        "ratio": ratios[worst],
        "output": worst,
        "max_abs": ours[worst]["max_abs"],
        "floor": floors[worst],
        "outputs": ratios,
        "floors": floors,
        "relative": {name: relative(theirs[name]) for name in floors},
        "noisier": bool(result.get("verdict") == "pass" and ratios[worst] > factor),
    }


def judged(result: dict, path) -> bool:
    """Whether ``result`` (of ``path``, a ``PathDef``) is compared with its source's floor: an fp32 float path that
    is not its own definition and ran to a verdict on its outputs."""
    return (
        path.precision == "fp32"
        and not path.quantized
        and path.id != path.definition
        and result.get("verdict") in ("pass", "fail")
        and bool(result.get("outputs"))
    )


def bound(spec, precision: str, floor: dict) -> Tolerances:
    """The tolerances a flagged path is diagnosed at, relative to each tensor's own scale (``Tolerance.scaled``): an
    output allowed ``factor`` times its float32 floor (``floor["relative"]``), every tap (the default) ``factor``
    times the largest of those relative floors, since a float32 computation costs each tensor about the same
    fraction of its size wherever it sits in the model. A tolerance the spec declares exact stays exact."""
    declared = spec.output_tolerances(precision)
    factor = floor["factor"]

    def at(tol: Tolerance, fraction: float) -> Tolerance:
        return (
            tol
            if tol.atol + tol.rtol + tol.scaled == 0
            else Tolerance(DTYPE_MIN_NORMAL["float32"], 0.0, factor * fraction)
        )

    default = at(declared.default, max(floor["relative"].values()))
    overrides = dict(declared.overrides)
    for name, value in floor["relative"].items():
        overrides[name] = at(declared.for_name(name), value)
    return Tolerances(default, overrides)


def tolerances_from_json(data: dict) -> Tolerances:
    """``Tolerances.to_json`` read back."""
    return Tolerances(
        Tolerance(**data["default"]), {name: Tolerance(**value) for name, value in data.get("overrides", {}).items()}
    )


def at_bound(spec, precision: str, tolerances: dict | None):
    """``spec`` judging ``precision`` at ``tolerances`` (``Tolerances.to_json``) where given (a diagnosis at the
    floor's bound), else as it is."""
    if tolerances is not None:
        spec.tolerances = {**spec.tolerances, precision: tolerances_from_json(tolerances)}
        spec.diagnosed_at = tolerances  # what the diagnosis passes on to its worker tasks
    return spec


def line(result: dict) -> str | None:
    """The line said under the table for a flagged path, or None."""
    floor = result.get("noise_floor")
    if not floor or not floor.get("noisier"):
        return None
    ratio = "inf" if math.isinf(floor["ratio"]) else f"{floor['ratio']:.3g}"
    return (
        f"noisier than float32: {result['model']} {result['path']} {ratio}x the float32 floor (output "
        f"{floor['output']}: max_abs {floor['max_abs']:.3g}, {floor['source']} {floor['floor']:.3g}; flagged over "
        f"{floor['factor']:g}x) - parity diagnose --model {result['model']} --path {result['path']}"
    )
