"""A diagnosis checks itself: an instrumented run that no longer reproduces the failing outputs is said so, and
its chain of links is never reported as ok."""

from __future__ import annotations

from parity.diagnose import chain
from parity.golden import store
from parity.model.workspace import Workspace
from parity.report import diagnosis
from parity.run import paths
from tests.conftest import REPO


def _observed(spec, arrays) -> dict:
    """What an instrumented run of a path that computes exactly the golden collects (outputs, taps)."""
    reference = arrays["reference.npz"]
    return {
        "outputs": {n: reference[n] for n in spec.outputs},
        "taps": {t: reference[f"tap/{t}"] for t in spec.taps},
        "located": {t: {"found": "metadata"} for t in spec.taps},
        "gradients": None,
        "runtime_compare": None,
    }


def test_a_failure_that_vanishes_under_instrumentation_is_never_every_link_ok():
    spec = Workspace(REPO).load_spec("mlp")
    arrays = store.load(Workspace(REPO).golden_dir("mlp"), spec).arrays
    observed = _observed(spec, arrays)
    path = paths.by_id("torch/onnx/ort")
    # the check found logits out of tolerance; the instrumented run computes them exactly
    vanished = chain.analyse(spec, path, arrays, observed, observed, failing=["logits"])
    assert vanished["reproduces"] is False and vanished["links"]["unreliable"]
    text = diagnosis.render(vanished)
    assert "the failure disappears under instrumentation: output logits" in text
    assert "chain: not judged" in text and "ok |" not in text
    # a path diagnosed without a failing output (diagnose --all) is judged as before
    judged = chain.analyse(spec, path, arrays, observed, observed, failing=[])
    assert judged["reproduces"] is True and "unreliable" not in judged["links"]


def test_an_error_where_the_tolerance_allows_nothing_is_said_in_words_not_as_infinity():
    import numpy as np

    from parity.check.closeness import describe, error_stats
    from parity.model.spec import Tolerance

    stats = error_stats(np.array([0.0, 1e-3]), np.array([0.0, 0.0]), Tolerance(0.0, 1e-5))
    text = describe("output", "y", stats)
    assert "inf" not in text and "the tolerance allows nothing (atol 0), 1 of 2 elements out" in text


def _cnn():
    spec = Workspace(REPO).load_spec("cnn")
    return spec, store.load(Workspace(REPO).golden_dir("cnn"), spec).arrays


def test_a_tap_read_in_the_wrong_layout_on_a_passing_path_is_put_right_not_reported_as_drift():
    import numpy as np

    spec, arrays = _cnn()
    observed = _observed(spec, arrays)
    tap = next(
        t
        for t in spec.taps
        if observed["taps"][t].ndim == 4 and observed["taps"][t].shape[2] == observed["taps"][t].shape[3]
    )
    observed["taps"][tap] = np.swapaxes(observed["taps"][tap], 2, 3)  # H and W read swapped
    d = chain.analyse(spec, paths.by_id("torch/onnx/ort"), arrays, observed, _observed(spec, arrays))
    assert d["first_divergent_tap"] is None
    row = next(r for r in d["taps"] if r["tap"] == tap)
    assert row["stats"]["ok"] and "another axis order" in row["reason"]


def test_a_scrambled_tap_on_a_passing_path_is_unobservable_and_on_a_failing_path_stays_a_divergence():
    import numpy as np

    spec, arrays = _cnn()
    observed = _observed(spec, arrays)
    tap = spec.taps[1]
    scrambled = np.random.default_rng(0).permutation(observed["taps"][tap].ravel()).reshape(observed["taps"][tap].shape)
    observed["taps"][tap] = scrambled
    d = chain.analyse(spec, paths.by_id("torch/onnx/ort"), arrays, observed, _observed(spec, arrays))
    row = next(r for r in d["taps"] if r["tap"] == tap)
    assert d["first_divergent_tap"] is None and row["found"] == "unobservable" and row["stats"] is None
    # the same values in another order where the outputs fail: the order may be the fault (a flatten order)
    failing = _observed(spec, arrays)
    failing["taps"][tap] = scrambled
    failing["outputs"] = {n: v + 1.0 for n, v in failing["outputs"].items()}
    assert (
        chain.analyse(spec, paths.by_id("torch/onnx/ort"), arrays, failing, _observed(spec, arrays))[
            "first_divergent_tap"
        ]
        == tap
    )


def test_per_column_output_patterns_are_not_claimed_on_one_sample():
    import numpy as np

    from parity.diagnose import patterns
    from parity.model.spec import Tolerance

    golden = np.array([[0.1, 0.7, 0.2]])
    observed = golden + np.array([[0.3, -0.2, 0.05]])  # any offset per column fits one row
    found = {p["name"]: p for p in patterns.output_patterns(observed, golden, Tolerance(1e-6, 1e-6))}
    assert not found["offset"]["holds"] and not found["permutation"]["holds"]
    rows = np.random.default_rng(0).standard_normal((4, 3))
    shifted = {p["name"]: p for p in patterns.output_patterns(rows + [0.3, -0.2, 0.05], rows, Tolerance(1e-6, 1e-6))}
    assert shifted["offset"]["holds"] and "per column" in shifted["offset"]["detail"]
