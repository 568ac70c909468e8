"""Reading taps without changing what is read: which tap tensors can be marked as graph outputs while the graph
still computes the outputs it computes without them.

Marking a tensor as a graph output can change a runtime's result: ONNX Runtime's fusions do not fire across a
tensor that must be kept (a ``Mul`` that would be folded into a ``MatMul`` stays a ``Mul``). A diagnosis that
reads every tap at once may then look at a graph that no longer fails. ``observe`` bisects the tap tensors
(all of them, then halves, down to single tensors) and keeps the largest set whose marking leaves every output
as the plain run computed it; the others are reported as disturbing, and their taps as unobservable.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from parity.check.closeness import error_stats

# an instrumented output within this share of the tolerance of the plain run's still shows the same failure
SAME = 0.1


def same_outputs(plain: dict, values: dict, tolerance_for) -> bool:
    """Every output of ``plain`` is in ``values`` as the plain run computed it (non-finite elements alike)."""
    for name, expected in plain.items():
        if values[name] is expected:  # the plain run's own array (a level read from tensors held): nothing to compare
            continue
        if np.shape(values[name]) == np.shape(expected) and np.array_equal(values[name], expected):
            continue  # bitwise the same (NaN aside, which the comparison below takes as alike): nothing to measure
        actual = np.asarray(values[name], np.float64)
        expected = np.asarray(expected, np.float64)
        if actual.shape != expected.shape:
            return False
        bad_a, bad_e = ~np.isfinite(actual), ~np.isfinite(expected)
        if not np.array_equal(bad_a, bad_e) or not np.array_equal(actual[bad_a], expected[bad_e], equal_nan=True):
            return False
        if (~bad_a).any():
            stats = error_stats(actual[~bad_a], expected[~bad_e], tolerance_for(name))
            if not stats.get("tol_units", np.inf) <= SAME:
                return False
    return True


def observe(run: Callable[[list[str]], dict], plain: dict, tap_tensors: dict[str, str], tolerance_for) -> dict:
    """``run(names) -> {name: value}`` runs the graph with ``names`` as outputs; ``plain`` is its outputs run alone.

    ``{"observable": [taps], "disturbing": [{"tap", "tensor"}], "runs": n, "values": the last reproducing run's
    tensors}``. Taps sharing a tensor go together."""
    outputs = list(plain)
    tensors = list(dict.fromkeys(tap_tensors.values()))
    runs = 0
    last: dict = {}

    def reproduces(subset: list[str]) -> bool:
        nonlocal runs, last
        runs += 1
        values = run([*outputs, *subset])
        if same_outputs(plain, values, tolerance_for):
            last = values
            return True
        return False

    def split(subset: list[str]) -> tuple[list[str], list[str]]:
        if not subset or reproduces(subset):
            return subset, []
        if len(subset) == 1:
            return [], subset
        middle = len(subset) // 2
        keep_a, drop_a = split(subset[:middle])
        keep_b, drop_b = split(subset[middle:])
        return keep_a + keep_b, drop_a + drop_b

    keep, drop = split(tensors)
    if keep and not reproduces(keep):  # tensors harmless alone may disturb together: add them one at a time
        together: list[str] = []
        for tensor in keep:
            if reproduces([*together, tensor]):
                together.append(tensor)
            else:
                drop.append(tensor)
        keep = together
        if keep:
            reproduces(keep)
    if not keep:
        reproduces([])
    kept = set(keep)
    return {
        "observable": [t for t, tensor in tap_tensors.items() if tensor in kept],
        "disturbing": [{"tap": t, "tensor": tensor} for t, tensor in tap_tensors.items() if tensor not in kept],
        "runs": runs,
        "values": last,
    }
