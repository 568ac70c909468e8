"""A tested cause for one layer's drift: recompute it in NumPy, declared form and known variants.

``test_layer`` recomputes a layer from the activations that fed it (as observed on the path
under diagnosis) and compares every form against the activation observed at its output. A
cause is named only when the declared form does *not* reproduce the observed activation
(``tol_units > 1``) and a variant *does* (``tol_units <= 1``), distinguishably from the declared
form; of several, the lowest ``tol_units`` wins.

Beyond the documented result, each tested variant carries ``distinct`` (False when it is
within tolerance of the declared form on these inputs: it cannot be told apart, so it is never
named) and, when it could not be computed or compared, ``error`` (its ``tol_units`` is then
inf); a cause carries ``also``, the other variants that reproduce.
"""

from __future__ import annotations

import math

import numpy as np

from parity.check.closeness import error_stats
from parity.diagnose.layers import NotApplicable, Variant, get

# a user's torch module keeps its own weight names (``proj.weight``): the canonical name and layout per kind
TORCH_NAMES = {"dense": {"weight": ("kernel", np.transpose), "bias": ("bias", None)},
               "conv": {"weight": ("kernel", None), "bias": ("bias", None)},
               "batch_norm": {"weight": ("gamma", None), "bias": ("beta", None), "running_mean": ("moving_mean", None),
                              "running_var": ("moving_variance", None)},
               "layer_norm": {"weight": ("gamma", None), "bias": ("beta", None)},
               "recurrent": {"weight_ih_l0": ("w_ih", None), "weight_hh_l0": ("w_hh", None),
                             "bias_ih_l0": ("b_ih", None), "bias_hh_l0": ("b_hh", None)}}
GENERIC = ("float16_rounding", "bfloat16_rounding", "dropout_active_inside", "layer_skipped")


def layer_weights(all_weights: dict, prefix: str, kind: str | None = None) -> dict:
    """The weights named ``prefix/...``, keyed by what follows ``prefix/``, as float64; for a user's torch module,
    its ``prefix.weight``-style names mapped to the kind's canonical names and layouts (``TORCH_NAMES``)."""
    head = f"{prefix}/"
    own = {name[len(head):]: np.asarray(value, np.float64) for name, value in all_weights.items()
           if name.startswith(head)}
    if own or kind not in TORCH_NAMES:
        return own
    for suffix, (name, layout) in TORCH_NAMES[kind].items():
        value = all_weights.get(f"{prefix}.{suffix}")
        if value is not None:
            value = np.asarray(value, np.float64)
            own[name] = layout(value) if layout is not None else value
    return own


def _rounded(forward, dtype_name: str):
    def compute(inputs, weights, attrs, observed):
        if dtype_name == "bfloat16":
            import ml_dtypes

            dtype = ml_dtypes.bfloat16
        else:
            dtype = np.float16

        def r(a):
            return np.asarray(a, np.float64).astype(dtype).astype(np.float64)

        with np.errstate(over="ignore"):  # beyond float16's range is inf, as in float16
            return r(forward([r(x) for x in inputs], {k: r(v) for k, v in weights.items()}, attrs))

    return compute


def _dropout_inside(forward):
    from parity.diagnose.layers.dropout import observed_mask

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
    found = [Variant("float16_rounding", "computed in float16 (inputs, weights and output rounded)",
                     _rounded(forward, "float16")),
             Variant("bfloat16_rounding", "computed in bfloat16 (inputs, weights and output rounded)",
                     _rounded(forward, "bfloat16")),
             Variant("layer_skipped", "the layer skipped: its output is its input", _skipped)]
    if kind != "dropout":
        found.insert(2, Variant("dropout_active_inside", "a dropout active at inference inside the layer (elements "
                                "zeroed, the rest scaled by 1/(1-rate))", _dropout_inside(forward)))
    return found


def _error(recomputed, observed, tol) -> tuple[dict, str | None]:
    """``{"max_abs", "tol_units"}`` of ``recomputed`` against ``observed`` (inf with a reason if incomparable)."""
    stats = error_stats(recomputed, observed, tol)
    if "tol_units" not in stats:
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


def test_layer(layer, inputs, weights, observed, tol, prefix: str | None = None) -> dict:
    """Recompute ``layer`` (a ``parity.model.spec.Layer``) from ``inputs``; test its variants against ``observed``.

    ``weights`` is the full canonical weight dict; the layer's own are those under ``prefix``
    (default ``layer.params``; with neither, ``weights`` are taken as the layer's own).
    """
    module = get(layer.kind)
    attrs = dict(layer.attrs)
    prefix = prefix if prefix is not None else layer.params
    own = layer_weights(weights, prefix, layer.kind) if prefix is not None else {k: np.asarray(v, np.float64)
                                                                       for k, v in weights.items()}
    inputs = [np.asarray(x, np.float64) for x in inputs]
    observed = np.asarray(observed, np.float64)
    result = {"kind": layer.kind, "attrs": attrs}

    declared, problem = _run(module.forward, inputs, own, attrs)
    result["declared"], reason = ({"max_abs": math.inf, "tol_units": math.inf}, problem) if problem else \
        _error(declared, observed, tol)
    if problem:
        result["declared"]["error"] = problem

    tested = []
    for variant in [*module.variants(attrs), *generic_variants(layer.kind, module.forward)]:
        entry = {"name": variant.name, "description": variant.description}
        value, problem = _run(variant.compute, inputs, own, attrs, observed)
        if problem is None:
            stats, problem = _error(value, observed, tol)
        else:
            stats = {"max_abs": math.inf, "tol_units": math.inf}
        entry.update(stats)
        entry["reproduces"] = bool(stats["tol_units"] <= 1.0)
        # a variant within tolerance of the declared form cannot be told apart from it at this tolerance
        entry["distinct"] = bool(problem is not None or declared is None or value.shape != declared.shape
                                 or error_stats(value, declared, tol)["tol_units"] > 1.0)
        if problem:
            entry["error"] = problem
        if variant.name in GENERIC:
            entry["generic"] = True
        tested.append(entry)
    result["variants"] = tested
    result["cause"] = None

    nonfinite = int(observed.size - np.count_nonzero(np.isfinite(observed)))
    before = result["declared"]
    if nonfinite:
        result["explanation"] = (f"the observed activation has {nonfinite} of {observed.size} non-finite elements "
                                 f"(NaN/Inf): no recomputation explains them, so no cause is named")
        return result
    if before["tol_units"] <= 1.0:
        result["explanation"] = (f"the {layer.kind} layer computes what the spec declares ({before['tol_units']:.3g} "
                                 f"tolerance units from its observed output): the drift is inherited from its "
                                 f"inputs or arises elsewhere")
        return result
    causes = [v for v in tested if v["reproduces"] and v["distinct"]]
    if causes:
        best = min(causes, key=lambda v: v["tol_units"])
        after = {"max_abs": best["max_abs"], "tol_units": best["tol_units"]}
        result["cause"] = {"variant": best["name"], "description": best["description"],
                           "before": {"max_abs": before["max_abs"], "tol_units": before["tol_units"]}, "after": after,
                           "also": [v["name"] for v in causes if v is not best]}
        result["explanation"] = (f"{best['description']}: this reproduces the observed {layer.kind} output "
                                 f"({after['tol_units']:.3g} tolerance units; the declared form is off by "
                                 f"{before['tol_units']:.3g})")
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


test_layer.__test__ = False  # not a pytest test, wherever it is imported
