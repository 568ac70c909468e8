"""Per-tap drift against a reference, the first divergent tap, and gradients mapped to layers (NumPy only).

The first divergent tap is the first one whose error is over tolerance *and* grew there: error
inherited from an earlier layer, even when it crosses the tolerance line further on, is not
blamed on an innocent layer unless that layer amplified it.
"""

from __future__ import annotations

import math

import numpy as np

from parity.check import closeness as compare
from parity.model.spec import MODEL_INPUT as INPUT


def tap_rows(
    spec, reference: dict[str, np.ndarray], observed: dict[str, np.ndarray], located: dict[str, dict], tolerance_for
) -> list[dict]:
    """One row per tap in network order: how it was found and its error statistics against ``reference``.

    ``located[tap]`` is ``{"found", "tensor", "fused_into", "reason"}``; a tap without a value in
    ``observed`` (fused or unmapped) has ``stats`` None and keeps its reason.
    """
    rows = []
    for tap in spec.taps:
        where = located.get(tap, {"found": "unmapped", "reason": "not reported by this path"})
        layer = spec.layers.get(tap)
        row = {
            "tap": tap,
            "kind": layer.kind if layer else None,
            "found": where.get("found"),
            "tensor": where.get("tensor"),
            "fused_into": where.get("fused_into"),
            "reason": where.get("reason"),
            **({"order": where["order"]} if where.get("order") else {}),
            "stats": None,
            "growth": None,
            "first_divergent": False,
        }
        if tap in observed and tap in reference:
            row["stats"] = compare.error_stats(observed[tap], reference[tap], tolerance_for(tap))
        rows.append(row)
    return set_growth(rows)


def set_growth(rows: list[dict]) -> list[dict]:
    """``rows`` with each compared row's ``growth``: its tolerance units over the previous compared row's (None
    for the first and for rows without statistics)."""
    previous = None
    for row in rows:
        row["growth"] = None
        if row["stats"] is not None:
            units = row["stats"].get("tol_units", math.inf)
            if previous is not None:
                row["growth"] = units / previous if previous > 0 else (math.inf if units > 0 else 1.0)
            previous = units
    return rows


def first_divergent(rows: list[dict]) -> str | None:
    """Mark and return the first tap over tolerance whose error grew there (or the first compared tap over it)."""
    for row in rows:
        stats = row["stats"]
        if stats is None or stats.get("ok", False):
            continue
        growth = row["growth"]
        if growth is None or growth > 1.0 or "tol_units" not in stats:
            row["first_divergent"] = True
            return row["tap"]
    return None


def worst_units(rows: list[dict]) -> float:
    units = [r["stats"].get("tol_units", math.inf) for r in rows if r["stats"] is not None]
    return max(units, default=0.0)


def layer_of(param: str) -> str:
    """``block0_attn/query/kernel`` -> ``block0_attn``; the input gradient belongs to ``input``."""
    return INPUT if param.startswith("input:") else param.split("/", 1)[0]


def gradient_layers(
    spec, grad_stats: dict | None, forward_divergent: str | None, zero: set | None = None
) -> dict | None:
    """Gradient statistics grouped by layer in network order, and the parameter to blame, if any.

    When the forward taps diverge, every gradient inherits that fault (downstream parameters see
    different activations, upstream ones a different backward signal), so no parameter is named.
    When the forward pass agrees, the first parameter in backward order whose gradient departs is; ``zero`` names the
    gradients that are exactly zero where the golden's are not: a stopped gradient, said so.
    """
    if grad_stats is None:
        return None
    groups: dict[str, list] = {}
    for name, stats in grad_stats.items():
        groups.setdefault(layer_of(name), []).append(
            {
                "name": name,
                "ok": bool(stats.get("ok")),
                "tol_units": stats.get("tol_units", math.inf),
                "max_abs": stats.get("max_abs", math.inf),
            }
        )
    order = [INPUT, *spec.taps]
    layers = [
        {
            "layer": layer,
            "ok": all(p["ok"] for p in params),
            "worst_tol_units": max(p["tol_units"] for p in params),
            "params": params,
        }
        for layer, params in sorted(groups.items(), key=lambda item: _position(order, item[0]))
    ]
    failing = [name for name in grad_stats if not grad_stats[name].get("ok")]
    if not failing:
        return {"layers": layers, "first_departing_param": None, "note": "every gradient is within tolerance"}
    if forward_divergent is not None:
        return {
            "layers": layers,
            "first_departing_param": None,
            "note": f"{len(failing)} gradient(s) differ, inherited from the forward divergence at "
            f"{forward_divergent}: no parameter is blamed for it",
        }
    backward = [name for name in reversed(list(spec.params)) if name in grad_stats] + [
        name for name in spec.input_grad_names.values() if name in grad_stats
    ]
    first = next(name for name in backward if name in failing)
    note = (
        f"the forward taps agree; in backward order the first gradient that departs is {first} "
        f"({grad_stats[first].get('tol_units', math.inf):.3g}x the tolerance)"
    )
    stopped = [name for name in backward if name in (zero or ())]
    if first in stopped:
        note += (
            (
                f": it is exactly zero where the golden's is not, as are {len(stopped) - 1} more upstream; a "
                f"stopped gradient (a detach, no_grad, or a non-differentiable op) between the loss and "
                f"{layer_of(first)}"
            )
            if len(stopped) > 1
            else (
                ": it is exactly zero where the golden's is not: a stopped gradient (a detach, no_grad, or a "
                "non-differentiable op) between the loss and it"
            )
        )
    return {"layers": layers, "first_departing_param": first, "stopped": stopped, "note": note}


def _position(order: list[str], layer: str) -> int:
    return order.index(layer) if layer in order else len(order)
