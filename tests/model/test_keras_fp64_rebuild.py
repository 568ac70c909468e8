"""A user's Keras model with nested layers rebuilt in float64 under its weights' full paths; a model that cannot be
rebuilt so says it on each result and under the verdict table."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from parity.cli import cli
from tests.conftest import REPO

MODELS = REPO / "tests" / "keras_nested.py"


def test_nested_layers_rebuild_in_float64_under_their_full_paths():
    import keras

    from parity.model.keras_dtype import rebuilt_in_dtype
    from tests.keras_nested import make_nested

    model = make_nested()
    rebuilt = rebuilt_in_dtype(keras, model, "float64")
    assert [v.path for v in rebuilt.weights] == [v.path for v in model.weights]
    assert "bottleneck/conv_a/kernel" in {v.path for v in rebuilt.weights}
    assert {str(v.dtype) for v in rebuilt.weights if v.path != "scale/scale"} == {"float64"}
    assert str(rebuilt.get_layer("block").inner.compute_dtype) == "float64"  # a custom layer's own sublayer
    x = np.random.default_rng(0).standard_normal((2, 8, 8, 3))
    y64 = np.asarray(rebuilt(x))
    assert y64.dtype == np.float64
    np.testing.assert_allclose(y64, np.asarray(model(x.astype(np.float32))), atol=1e-5)


def test_a_sublayer_fixed_in_float32_is_refused_by_name():
    import keras

    from parity.model.keras_dtype import rebuilt_in_dtype
    from parity.platform.errors import ParityError
    from tests.keras_nested import make_float32_block

    with pytest.raises(ParityError, match=r"layer 'inner' \(Dense\) computes in float32"):
        rebuilt_in_dtype(keras, make_float32_block(), "float64")


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.slow  # two golden builds and a check in TensorFlow workers: about 15 s
def test_golden_of_a_nested_model_is_float64_and_a_fallback_is_said_per_path(tmp_path):
    for name, factory, shape in (("nested", "make_nested", "x=2x8x8x3"), ("f32", "make_float32_block", "x=2x6")):
        result = _invoke("init", name, "--workspace", tmp_path, "--keras", f"{MODELS}:{factory}", "--input", shape)
        assert result.exit_code == 0, result.output
        result = _invoke("golden", "build", "--workspace", tmp_path, "--model", name)
        assert result.exit_code == 0, result.output
    nested = json.loads((tmp_path / "golden" / "nested" / "manifest.json").read_text())
    assert nested["reference"]["dtype"] == "float64" and nested["reference"]["reason"] is None
    assert nested["reference"]["tolerance_factor"] == 1
    # a float64 reference measures the float32 floor, and init's tolerances are 32 times it, never widened
    assert nested["reference"]["float32_floor"]
    assert nested["tolerances"]["fp32"]["default"]["rtol"] == pytest.approx(32 * 2.0**-23)
    fallback = json.loads((tmp_path / "golden" / "f32" / "manifest.json").read_text())
    assert fallback["reference"]["dtype"] == "float32" and fallback["reference"]["tolerance_factor"] == 10
    # no floor against a float32 reference: the declared numbers, widened ten times
    assert fallback["tolerances"]["fp32"]["default"] == {"atol": pytest.approx(1e-3), "rtol": pytest.approx(1e-3)}

    result = _invoke("check", "--workspace", tmp_path, "--path", "tf", "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    results = {r["model"]: r for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    assert results["nested"]["verdict"] == "pass" and results["nested"]["reference_fallback"] is None
    said = results["f32"]["reference_fallback"]
    assert said["dtype"] == "float32" and said["tolerance_factor"] == 10
    assert "layer 'inner' (Dense) computes in float32" in said["reason"]
    (line,) = [line for line in result.output.splitlines() if "golden reference" in line]
    assert line.startswith("warning: f32: checked against a float32 golden reference, not float64")
    assert line.endswith("tolerances widened x10")
