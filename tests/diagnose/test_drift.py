"""Per-tap drift, the first divergent tap, gradients by layer and output patterns (NumPy only)."""

from __future__ import annotations

import numpy as np

from parity.diagnose import patterns
from parity.diagnose.causes import drift
from parity.model.spec import InputSpec, Layer, ModelSpec, ParamSpec, Tolerance, Tolerances

TOL = Tolerance(atol=1e-5, rtol=1e-5)


def spec(taps=("a", "b", "c", "d")):
    params = {f"{t}/kernel": ParamSpec((2, 2), "dense_kernel") for t in taps}
    return ModelSpec(
        name="toy",
        description="",
        input=InputSpec("x", (2,)),
        outputs=("y",),
        num_classes=2,
        params=params,
        taps=taps,
        layers={t: Layer("dense") for t in taps},
        tolerances={"fp32": Tolerances(TOL)},
        grad_tolerances={"fp32": Tolerances(TOL)},
        jax_apply=lambda p, x, tap=None: x,
    )


def rows_for(errors: list[float]):
    s = spec()
    reference = {t: np.ones(100) for t in s.taps}
    observed = {t: reference[t] + e for t, e in zip(s.taps, errors)}
    return drift.tap_rows(s, reference, observed, {t: {"found": "native"} for t in s.taps}, lambda name: TOL)


def test_first_divergent_is_over_tolerance_and_grew():
    rows = rows_for([1e-7, 5e-3, 6e-3, 2e-2])
    assert drift.first_divergent(rows) == "b"
    assert [r["first_divergent"] for r in rows] == [False, True, False, False]
    assert rows[1]["growth"] > 1 and rows[1]["stats"]["n_bad"] == 100


def test_inherited_error_is_not_blamed_on_a_layer_that_shrinks_it():
    # a is already over tolerance; b carries less of it, c amplifies again
    rows = rows_for([1e-3, 5e-4, 5e-4, 1e-3])
    assert drift.first_divergent(rows) == "a"


def test_no_divergence_within_tolerance():
    assert drift.first_divergent(rows_for([1e-7, 1e-7, 2e-7, 1e-7])) is None


def test_unmapped_taps_are_kept_with_their_reason_and_skipped():
    s = spec()
    reference = {t: np.ones(4) for t in s.taps}
    observed = {"a": reference["a"], "c": reference["c"] + 1.0}
    located = {
        "a": {"found": "name"},
        "b": {"found": "fused", "fused_into": "c"},
        "c": {"found": "name"},
        "d": {"found": "unmapped", "reason": "no node carries d"},
    }
    rows = drift.tap_rows(s, reference, observed, located, lambda name: TOL)
    assert [r["found"] for r in rows] == ["name", "fused", "name", "unmapped"]
    assert rows[1]["stats"] is None and rows[1]["fused_into"] == "c"
    assert rows[3]["reason"] == "no node carries d"
    assert drift.first_divergent(rows) == "c"


def test_gradients_blame_the_first_departing_parameter_in_backward_order_only_when_forward_agrees():
    s = spec()
    ok, bad = {"ok": True, "tol_units": 0.1, "max_abs": 1e-7}, {"ok": False, "tol_units": 9.0, "max_abs": 1e-3}
    grads = {"a/kernel": bad, "b/kernel": bad, "c/kernel": ok, "d/kernel": ok, "input:x": bad}
    g = drift.gradient_layers(s, grads, forward_divergent=None)
    assert g["first_departing_param"] == "b/kernel"
    assert [layer["layer"] for layer in g["layers"]] == ["input", "a", "b", "c", "d"]
    inherited = drift.gradient_layers(s, grads, forward_divergent="b")
    assert inherited["first_departing_param"] is None and "inherited" in inherited["note"]


def test_output_patterns_each_detected_and_none_on_noise():
    rng = np.random.default_rng(0)
    golden = rng.normal(size=(64, 10))
    held = {p["name"]: p["holds"] for p in patterns.output_patterns(golden[:, [1, 0, *range(2, 10)]], golden, TOL)}
    assert held["permutation"] and not held["scale"]
    assert {p["name"] for p in patterns.output_patterns(golden * 1.5, golden, TOL) if p["holds"]} == {"scale"}
    assert {p["name"] for p in patterns.output_patterns(golden + 0.25, golden, TOL) if p["holds"]} == {"offset"}
    image = rng.normal(size=(2, 3, 8, 8))
    shifted = np.roll(image, 1, axis=3)
    assert {p["name"] for p in patterns.output_patterns(shifted, image, TOL) if p["holds"]} == {"shift"}
    assert not any(p["holds"] for p in patterns.output_patterns(golden + rng.normal(size=golden.shape), golden, TOL))
