"""A tested cause for one layer's drift: recompute it in NumPy, declared form and known variants.

``test_layer`` recomputes a layer from the activations that fed it (as observed on the path
under diagnosis) and compares every form against the activation observed at its output. A
cause is named only when the declared form does *not* reproduce the observed activation
(``tol_units > 1``) and a variant *does* (``tol_units <= 1``), distinguishably from the declared
form; of several, the lowest ``tol_units`` wins. Besides its kind's variants, every layer is tried with a few
that depend on what it does rather than on its declared kind (``generic_variants``: run in float16 or bfloat16,
a dropout left active inside it, skipped), named under the same rule and marked ``"generic": true``. Observed NaN
or infinite elements are explained only by a form that gives the same NaN or infinity at the same places (a fully
masked attention row giving NaN, a float16 overflow).

The layer's weights and activations may be its framework's own (a user's torch or Keras model):
``parity.diagnose.causes.layers.native`` maps them to the kind's canonical form, so the comparison is always made in
the tap's own layout.

Beyond the documented result, each tested variant carries ``distinct`` (False when it is
within tolerance of the declared form on these inputs: it cannot be told apart, so it is never
named) and, when it could not be computed or compared, ``error`` (its ``tol_units`` is then
inf); a cause carries ``also``, the other variants that reproduce.
"""

from __future__ import annotations

import math

import numpy as np

from parity.check.closeness import error_stats
from parity.diagnose.causes.layers import Fitted, NotApplicable, Variant
from parity.diagnose.causes.layers.native import bind, canonical_weights

GENERIC = ("float16_rounding", "bfloat16_rounding", "dropout_active_inside", "layer_skipped")


def layer_weights(all_weights: dict, prefix: str, kind: str | None = None, attrs: dict | None = None) -> dict:
    """The weights of the layer at ``prefix`` under its kind's canonical names and layouts, as float64: those named
    ``prefix/...``, a user's torch module's ``prefix.weight``-style names, or a Keras layer's own layouts where
    ``attrs`` declare ``weight_layout`` (``parity.diagnose.causes.layers.native``)."""
    return canonical_weights(all_weights, prefix, kind, attrs)


def recompute(layer, inputs, weights, prefix: str | None = None) -> np.ndarray:
    """The declared form of ``layer`` on ``inputs``, in the tap's own layout (``weights`` and ``prefix`` as for
    ``test_layer``): what the spec says the layer computes."""
    attrs = dict(layer.attrs)
    prefix = prefix if prefix is not None else layer.params
    own = (
        layer_weights(weights, prefix, layer.kind, attrs)
        if prefix is not None
        else {k: np.asarray(v, np.float64) for k, v in weights.items()}
    )
    return bind(layer.kind, attrs).forward([np.asarray(x, np.float64) for x in inputs], own)


def _rounded(forward, dtype_name: str):
    """The declared form with inputs, weights and output rounded through ``dtype_name``. A reduced-precision kernel
    rounds its result correctly only up to one unit in the last place (accumulation order, double rounding): where
    the observed element is exactly the rounded value's neighbour in that type, it is taken as reproduced."""

    def compute(inputs, weights, attrs, observed):
        if dtype_name == "bfloat16":
            import ml_dtypes

            dtype = ml_dtypes.bfloat16
        else:
            dtype = np.float16

        def r(a):
            return np.asarray(a, np.float64).astype(dtype).astype(np.float64)

        with np.errstate(over="ignore"):  # beyond float16's range is inf, as in float16
            value = np.asarray(forward([r(x) for x in inputs], {k: r(v) for k, v in weights.items()}, attrs))
            value = value.astype(dtype)
            if observed is None or np.shape(observed) != value.shape:
                return value.astype(np.float64)
            observed = np.asarray(observed, np.float64)
            near = observed.astype(dtype)
        bits = value.view(np.uint16)  # the neighbours in the reduced type: one unit in the last place either way
        up, down = (bits + np.uint16(1)).view(dtype), (bits - np.uint16(1)).view(dtype)
        snap = ((near == up) | (near == down)) & (near.astype(np.float64) == observed)
        return np.where(snap, observed, value.astype(np.float64))

    return compute


def _dropout_inside(forward):
    from parity.diagnose.causes.layers.dropout import observed_mask

    def compute(inputs, weights, attrs, observed):
        y = np.asarray(forward(inputs, weights, attrs), np.float64)
        observed = np.asarray(observed, np.float64)
        live = y != 0
        zeroed = live & (observed == 0)
        kept = live & ~zeroed & (np.abs(y) > 1e-12)
        if not zeroed.any() or not kept.any():
            raise NotApplicable("no dropout pattern in the observed activation")
        scale = float(np.median(observed[kept] / y[kept]))  # 1/(1-rate): the survivors' rescale
        rate = 1.0 - 1.0 / scale if scale > 1.0 else zeroed.sum() / live.sum()
        if observed_mask(y, observed, rate) is None:
            raise NotApplicable("no dropout pattern in the observed activation")
        return np.where(zeroed, 0.0, y * scale)

    return compute


def _skipped(inputs, weights, attrs, observed):
    if len(inputs) != 1 or np.shape(inputs[0]) != np.shape(observed):
        raise NotApplicable("the layer changes the shape: it cannot have been skipped")
    return inputs[0]


def generic_variants(kind: str, forward) -> list:
    """Variants of what any layer may do wrong, whatever its declared kind: computed in float16 or bfloat16, a
    dropout left active inside it (a dropout in a layer typed otherwise), or skipped (the identity)."""
    found = [
        Variant(
            "float16_rounding", "computed in float16 (inputs, weights and output rounded)", _rounded(forward, "float16")
        ),
        Variant(
            "bfloat16_rounding",
            "computed in bfloat16 (inputs, weights and output rounded)",
            _rounded(forward, "bfloat16"),
        ),
        Variant("layer_skipped", "the layer skipped: its output is its input", _skipped),
    ]
    if kind != "dropout":
        found.insert(
            2,
            Variant(
                "dropout_active_inside",
                "a dropout active at inference inside the layer (elements zeroed, the rest scaled by 1/(1-rate))",
                _dropout_inside(forward),
            ),
        )
    return found


def _error(recomputed, observed, tol) -> tuple[dict, str | None]:
    """``{"max_abs", "tol_units"}`` of ``recomputed`` against ``observed`` (inf with a reason if incomparable: another
    shape, or non-finite elements that are not the observed ones, the same NaN or infinity at the same place)."""
    stats = error_stats(recomputed, observed, tol)
    if "tol_units" not in stats or "reason" in stats:
        reason = stats.get("reason", "not comparable").replace("golden", "observed")
        return {"max_abs": math.inf, "tol_units": math.inf}, reason
    return {"max_abs": stats["max_abs"], "tol_units": stats["tol_units"]}, None


def _run(compute, *args):
    """``(array, None)`` or ``(None, one-line error)``: a variant that raises is reported, never fatal."""
    try:
        return np.asarray(compute(*args), np.float64), None
    except Exception as error:  # noqa: BLE001 - any failure of a recomputation is data for the report
        text = " ".join(str(error).split())
        return None, f"{type(error).__name__}: {text}" if text else type(error).__name__


def _fitted_into(compute, entry: dict):
    """``compute`` whose ``Fitted`` result gives ``entry`` its description (with the fitted value) and its array."""

    def run(*args):
        value = compute(*args)
        if isinstance(value, Fitted):
            entry["description"] = value.description
            return value.value
        return value

    return run


def not_its_kind(layer, inputs, weights, expected, tol, prefix: str | None, what: str) -> dict | None:
    """A cause test's result where ``layer``'s declared form, recomputed from the reference's ``inputs``, does not
    reproduce the reference's own output ``expected``: a layer typed by its class that computes something else (a
    subclass's own ``call``), where no variant of its kind can explain a path; None where it reproduces."""
    value, problem = _run(recompute, layer, inputs, weights, prefix)
    units = math.inf if problem else _error(value, np.asarray(expected, np.float64), tol)[0]["tol_units"]
    if units <= 1.0:
        return None
    return {
        "kind": layer.kind,
        "attrs": dict(layer.attrs),
        "cause": None,
        "explanation": f"{what} is typed {layer.kind}, but that form does not reproduce the reference's own output "
        f"from its input ({units:.3g} tolerance units): the layer computes something else, so no cause is tested "
        f"there",
    }


def test_layer(layer, inputs, weights, observed, tol, prefix: str | None = None) -> dict:
    """Recompute ``layer`` (a ``parity.model.spec.Layer``) from ``inputs``; test its variants against ``observed``.

    ``weights`` is the full canonical weight dict; the layer's own are those under ``prefix``
    (default ``layer.params``; with neither, ``weights`` are taken as the layer's own).
    """
    attrs = dict(layer.attrs)
    module = bind(layer.kind, attrs)
    prefix = prefix if prefix is not None else layer.params
    own = (
        layer_weights(weights, prefix, layer.kind, attrs)
        if prefix is not None
        else {k: np.asarray(v, np.float64) for k, v in weights.items()}
    )
    inputs = [np.asarray(x, np.float64) for x in inputs]
    observed = np.asarray(observed, np.float64)
    result = {"kind": layer.kind, "attrs": attrs}

    declared, problem = _run(module.forward, inputs, own)
    result["declared"], reason = (
        ({"max_abs": math.inf, "tol_units": math.inf}, problem) if problem else _error(declared, observed, tol)
    )
    if problem:
        result["declared"]["error"] = problem

    tested = []
    for variant in [*module.variants, *generic_variants(layer.kind, module.forward)]:
        entry = {"name": variant.name, "description": variant.description}
        value, problem = _run(_fitted_into(variant.compute, entry), inputs, own, attrs, observed)
        if problem is None:
            stats, problem = _error(value, observed, tol)
        else:
            stats = {"max_abs": math.inf, "tol_units": math.inf}
        entry.update(stats)
        entry["reproduces"] = bool(stats["tol_units"] <= 1.0)
        # a variant within tolerance of the declared form cannot be told apart from it at this tolerance
        entry["distinct"] = bool(
            problem is not None or declared is None or _error(value, declared, tol)[0]["tol_units"] > 1.0
        )
        if problem:
            entry["error"] = problem
        if variant.name in GENERIC:
            entry["generic"] = True
        tested.append(entry)
    result["variants"] = tested
    result["cause"] = None

    nonfinite = int(observed.size - np.count_nonzero(np.isfinite(observed)))
    before = result["declared"]
    if before["tol_units"] <= 1.0:
        result["explanation"] = (
            f"the {layer.kind} layer computes what the spec declares ({before['tol_units']:.3g} "
            f"tolerance units from its observed output): the drift is inherited from its "
            f"inputs or arises elsewhere"
        )
        return result
    # a variant reproduces non-finite observed elements only with the same NaN or infinity at the same places
    causes = [v for v in tested if v["reproduces"] and v["distinct"]]
    if causes:
        best = min(causes, key=lambda v: v["tol_units"])
        after = {"max_abs": best["max_abs"], "tol_units": best["tol_units"]}
        result["cause"] = {
            "variant": best["name"],
            "description": best["description"],
            "before": {"max_abs": before["max_abs"], "tol_units": before["tol_units"]},
            "after": after,
            "also": [v["name"] for v in causes if v is not best],
        }
        result["explanation"] = (
            f"{best['description']}: this reproduces the observed {layer.kind} output "
            f"({after['tol_units']:.3g} tolerance units; the declared form is off by "
            f"{before['tol_units']:.3g})"
        )
        return result
    if nonfinite:
        result["explanation"] = (
            f"the observed activation has {nonfinite} of {observed.size} non-finite elements "
            f"(NaN/Inf): no recomputation explains them, so no cause is named"
        )
        return result
    off = "cannot be recomputed" if math.isinf(before["tol_units"]) else f"is off by {before['tol_units']:.3g}"
    finite = [v for v in tested if math.isfinite(v["tol_units"])]
    if finite:
        closest = min(finite, key=lambda v: v["tol_units"])
        near = f"closest variant {closest['name']}: {closest['tol_units']:.3g} tolerance units"
    else:
        near = "no variant applies" if tested else "no variants are known for this kind"
    result["explanation"] = f"no known {layer.kind} variant explains the drift (the declared form {off}; {near})"
    if reason:
        result["explanation"] += f"; declared: {reason}"
    return result


test_layer.__test__ = False  # type: ignore[attr-defined]  # not a pytest test, wherever it is imported (pytest reads it)
