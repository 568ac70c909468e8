"""The walk down a model's tree, level by level, in the worker that holds both sides (``parity.diagnose.tree.descent``):
the rows of each level, the first divergent child whose own input agrees, where the walk stops and why, and the cause
tested at the leaf. The rules are ``parity.diagnose.descend``'s. NumPy only.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np

from parity.check import closeness as compare
from parity.diagnose.causes import drift
from parity.diagnose.graph import mapping_check
from parity.run.worker import report

MAX_DEPTH = 16
# a tree reader's whole tree of values and inputs above this many bytes: each level is read by a run of its own
TAP_BYTES = 512 * 2**20
UNSEEN = ("fused", "unmapped", "unobservable")


def walk(tree, framework: str) -> dict:
    """The descent over ``tree`` (a ``parity.diagnose.tree.descent.Tree`` with its path side built): level by level from
    the root, as the module docstring says. Runs in the worker that holds both sides."""
    tolerances = tree.spec.output_tolerances(tree.precision)
    scope, trail = "", []
    levels: list[dict[str, Any]] = []
    leaf: dict[str, Any] | None = None
    evidence: tuple[dict, dict] | None = None  # the reference's and the path's values at the leaf's level
    result: dict[str, Any] = {
        "descended": True,
        "levels": levels,
        "first_divergent_path": [],
        "leaf": None,
        "verdict": None,
        "note": None,
    }
    for _ in range(MAX_DEPTH):
        reference = tree.reference(scope)
        if not reference["reproduces"]:
            result.update(
                verdict="untrusted",
                note=f"{framework} in the golden's dtype no longer reproduces the "
                f"golden outputs: its tree is not compared",
            )
            break
        children = [c for c in reference["children"] if c["has_value"]]
        if not children:
            if not scope:
                result.update(descended=False, reason="the model has no modules or named scopes to descend into")
            break
        names = [c["path"] for c in children]
        report(f"level {len(levels) + 1}: the path's values at {len(names)} module(s)")
        observed = tree.path(
            scope,
            names,
            {c["path"]: c["calls"] for c in children},
            {n: reference["values"][n] for n in names},
            {n: reference["inputs"][n] for n in names if n in reference["inputs"]},
        )
        rows = _rows(children, reference, observed, tolerances)
        withdrawn = mapping_check.withdraw_contradicted(rows, observed["located"], observed.get("output_units"))
        first = drift.first_divergent(rows)
        levels.append(
            {"scope": scope, "rows": rows, "first_divergent": first, "instrumentation": observed.get("instrumentation")}
        )
        if withdrawn:
            result.setdefault("withdrawn", []).extend(
                {"path": r["tap"], "reason": r["reason"]} for r in rows if r["tap"] in withdrawn
            )
        if first is None:
            result.update(verdict="own_operations" if scope else "not_found", note=_none_departs(scope, rows))
            break
        row = next(r for r in rows if r["tap"] == first)
        before = _previous_observed(rows, first) or f"the input of {scope or 'the model'}"
        if row["input"] is not None and not row["input"]["ok"]:
            result.update(
                verdict="own_operations" if scope else "not_found",
                note=f"{first} reads an input that already departs from the reference "
                f"({compare.times(row['input'].get('tol_units', math.inf))}): the drift is in what "
                f"{scope or 'the model'} computes between {before} and {first}, not in {first}",
            )
            break
        span = _unseen_before(rows, first)
        if span and row["input"] is None:
            result.update(
                verdict="span",
                note=f"between {before} and {first}: {' … '.join(span)} not observed, and "
                f"{first}'s own input could not be read: the divergence is in that span",
            )
            break
        trail.append(first)
        # the level's values are reduced to its rows' statistics: only the departing child's raw values are kept
        scope, leaf, evidence = first, row, (_only(reference, first), _only(observed, first))
        if row["leaf"]:
            break
    result.update(first_divergent_path=trail, leaf=leaf)
    result["raw_tensors"] = {
        "compared": sum(2 * len(level["rows"]) for level in levels),
        "held": sum(len(side.get(key) or {}) for side in evidence or () for key in ("values", "inputs")),
    }
    if trail and result["verdict"] is None:
        result["verdict"] = "leaf"
    typed_scope = result["verdict"] == "own_operations" and leaf is not None and leaf["kind"] is not None
    if leaf is not None and evidence is not None and (result["verdict"] == "leaf" or typed_scope):
        # a scope the catalogue computes whole (a gated MLP) is tested as one layer where none of its children departs
        report(f"the causes of {leaf['tap']}")
        result["cause_test"] = _test_cause(leaf, *evidence, _model_weights(tree), tolerances)
    return result


def _model_weights(tree):
    """The weights a cause test reads its leaf's from: the golden data's copy, else (a user's torch or Keras model)
    those its reference holds, so that the whole model is not built again for one layer's weights."""
    from parity.golden import weights as golden_weights

    weights = tree.verified.arrays["weights.npz"]
    if not isinstance(weights, golden_weights.ModelWeights):
        return weights
    runner = tree.reference_runner
    if getattr(runner, "module", None) is not None:
        return golden_weights.ModuleWeights(runner.module)
    if tree.framework == "tf" and getattr(runner, "model", None) is not None:
        return golden_weights.KerasWeights(runner.model)
    return weights


def _only(found: dict, name: str) -> dict:
    """``found`` (a side's level) with the raw values, inputs and masks of ``name`` alone, and no outputs."""
    kept = {key: {name: found[key][name]} for key in ("values", "inputs", "masks") if name in (found.get(key) or {})}
    return {**found, "values": {}, "inputs": {}, "masks": {}, "outputs": {}, **kept}


def _test_cause(row: dict, reference: dict, observed: dict, weights: dict, tolerances) -> dict:
    """The leaf recomputed from its input as this path computed it (else the reference's) with each variant of its
    kind (``parity.diagnose.causes.cause``)."""
    from parity.diagnose.causes.cause import not_its_kind, test_layer
    from parity.model.spec import Layer

    name = row["tap"]
    if row["kind"] is None:
        return {
            "tap": name,
            "kind": None,
            "cause": None,
            "explanation": f"{name} ({row['class'].rsplit('.', 1)[-1]}) is not a layer the catalogue computes "
            f"from one input, so no cause is tested there",
        }
    if name in observed["inputs"]:
        fed, provenance = observed["inputs"][name], f"the input of {name} as this path computed it"
    else:
        fed, provenance = reference["inputs"][name], f"the input of {name} from the reference"
    further = list(((reference.get("masks") or {}).get(name) or {}).values())  # a masked attention's mask
    layer, prefix = Layer(row["kind"], dict(row["attrs"] or {})), row.get("params") or name
    if name in reference["inputs"] and name in reference["values"]:
        unlike = not_its_kind(
            layer,
            [reference["inputs"][name], *further],
            weights,
            reference["values"][name],
            tolerances.for_name(name),
            prefix,
            f"{name} ({row['class'].rsplit('.', 1)[-1]})",
        )
        if unlike:
            return {"tap": name, **unlike}
    result = test_layer(
        layer,
        [fed, *further],
        weights,
        np.asarray(observed["values"][name], np.float64),
        tolerances.for_name(name),
        prefix=prefix,
    )
    return {"tap": name, "inputs": [provenance], **result}


def _rows(children: list[dict], reference: dict, observed: dict, tolerances) -> list[dict]:
    """Tap rows (``drift.tap_rows``) for one level, with each child's class, calls, ONNX nodes, and its input
    compared with the reference's."""
    names = [c["path"] for c in children]
    located = observed["located"]
    rows = drift.tap_rows(
        SimpleNamespace(taps=names, layers={}), reference["values"], observed["values"], located, tolerances.for_name
    )
    for row, child in zip(rows, children):
        name = child["path"]
        where = located.get(name, {})
        row.update(
            {
                "class": child["class"],
                "calls": child["calls"],
                "leaf": child["leaf"],
                "kind": child["kind"],
                "attrs": child["attrs"],
                "params": child.get("params"),
                "nodes": where.get("nodes"),
                "input_tensor": where.get("input_tensor"),
                **({"input_order": where["input_order"]} if where.get("input_order") else {}),
                "input": None,
                "value": None,
                "observed_input": None,
            }
        )
        if name in observed["inputs"] and name in reference["inputs"]:
            row["input"] = compare.error_stats(
                np.asarray(observed["inputs"][name]), reference["inputs"][name], tolerances.for_name(name)
            )
        if child["calls"] > 1:
            row["reason"] = " ".join(
                filter(
                    None,
                    [
                        row.get("reason"),
                        (f"called {child['calls']} times (shared weights): compared at its first call"),
                    ],
                )
            )
    return rows


def _none_departs(scope: str, rows: list[dict]) -> str:
    unseen = [r["tap"] for r in rows if r["found"] in UNSEEN]
    if not scope:
        return "no module of the model departs from the reference on its own"
    if unseen:
        return (
            f"none of the observed children of {scope} departs; {', '.join(unseen)} could not be observed: the "
            f"drift is in {scope}'s own operations or in those"
        )
    return (
        f"none of the {len(rows)} children of {scope} departs from the reference: the drift is in {scope}'s own "
        f"operations (functional ops between its modules, after {rows[-1]['tap']} at the latest)"
    )


def _previous_observed(rows: list[dict], first: str) -> str | None:
    before = [r for r in rows[: [r["tap"] for r in rows].index(first)] if r["stats"] is not None]
    return before[-1]["tap"] if before else None


def _unseen_before(rows: list[dict], first: str) -> list[str]:
    """The children between the last observed one before ``first`` and ``first`` that could not be observed."""
    index = [r["tap"] for r in rows].index(first)
    unseen: list[str] = []
    for row in reversed(rows[:index]):
        if row["stats"] is not None:
            break
        unseen.insert(0, row["tap"])
    return unseen
