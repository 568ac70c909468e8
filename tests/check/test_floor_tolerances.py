"""Tolerances derived from the float32 noise floor: `parity init` declares outputs at 32 times the floor that
`parity golden build` measures (the model in float32 against its float64 reference), instead of one fixed number."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from parity.cli import cli
from parity.model.spec import Tolerance, Tolerances
from parity.model.user import resolve_floor
from tests.conftest import REPO, reseal
from tests.interop.test_onnx_corpus import corpus_of

EPS = 2.0**-23
MODELS = REPO / "tests" / "usermodels.py"
# onnx's forward DFT node cases: float32 rounding of sums, up to 945, off by 2-3e-4 at elements near zero
DFT = (
    "test_dft",
    "test_dft_axis",
    "test_dft_rfft",
    "test_dft_opset19",
    "test_dft_axis_opset19",
    "test_dft_rfft_opset19",
)


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _floored(**overrides) -> SimpleNamespace:
    return SimpleNamespace(
        outputs=("y", "z", "w"),
        tolerances={
            "fp32": Tolerances(Tolerance(1e-4, 1e-4), overrides, floor=32),
            "fp16": Tolerances(Tolerance(1e-2, 1e-2)),
        },
    )


def test_each_measured_output_is_allowed_the_factor_times_its_floor_and_a_declared_override_wins():
    spec = _floored(z=Tolerance(1e-2, 0.0))
    resolve_floor(spec, {"y": {"max_abs": 1e-6, "scale": 4.0}, "z": {"max_abs": 1e-6, "scale": 4.0}})
    fp32 = spec.tolerances["fp32"]
    assert fp32.floor == 0 and "floor" not in fp32.to_json()
    assert fp32.for_name("y") == Tolerance(32e-6, 32 * EPS)
    assert fp32.for_name("z") == Tolerance(1e-2, 0.0)  # the user's own number
    assert fp32.for_name("w") == Tolerance(1e-4, 1e-4)  # no floor measured: the numbers declared beside floor=
    # every tap of a diagnosis: the same fraction of its own largest magnitude
    assert fp32.default.scaled == pytest.approx(32 * 1e-6 / 4.0) and fp32.default.rtol == 32 * EPS
    assert spec.tolerances["fp16"] == Tolerances(Tolerance(1e-2, 1e-2))  # a tolerance given as numbers stays


def test_an_exact_float32_output_is_still_allowed_its_rounding():
    spec = _floored()
    resolve_floor(spec, {"y": {"max_abs": 0.0, "scale": 8.0}})
    assert spec.tolerances["fp32"].for_name("y").atol == pytest.approx(32 * 8.0 * EPS)


def test_without_a_floor_the_declared_numbers_are_the_tolerance():
    spec = _floored()
    resolve_floor(spec, None)  # a float32 reference: nothing to measure the floor against
    assert spec.tolerances["fp32"] == Tolerances(Tolerance(1e-4, 1e-4))


def test_a_float32_error_more_than_rounding_explains_derives_no_tolerance():
    """A float32 model off its float64 reference by far more than rounding (a cancellation fault of the definition)
    must fail the native path: its error is no floor, the declared numbers stay."""
    spec = _floored()
    floors = {"y": {"max_abs": 0.57, "scale": 0.3}, "z": {"max_abs": 1e-6, "scale": 4.0}}
    resolve_floor(spec, floors)
    fp32 = spec.tolerances["fp32"]
    assert fp32.for_name("y") == Tolerance(1e-4, 1e-4)
    assert fp32.for_name("z") == Tolerance(32e-6, 32 * EPS)
    spec = _floored()
    resolve_floor(spec, {"y": floors["y"]})  # no plausible floor at all: the model as declared
    assert spec.tolerances["fp32"] == Tolerances(Tolerance(1e-4, 1e-4))


def test_the_forward_dft_cases_pass_on_onnx_runtime_at_the_floor_derived_tolerance(tmp_path_factory):
    script, cases, workspace = corpus_of(tmp_path_factory, "dft", DFT)
    assert sorted(cases) == sorted(DFT)
    for name in DFT:
        says, reason, entry = script.parity_result(cases[name], workspace)
        assert says == "pass", (name, reason)
        # float32 rounding at the outputs' scale (up to 945), not 1e-4 at every element
        assert entry["tolerances"]["outputs"]["overrides"]["y"]["atol"] > 1e-3, name
        assert not (entry.get("noise_floor") or {}).get("noisier"), name


def test_init_declares_the_floor_and_the_golden_build_measures_it(tmp_path):
    made = invoke("init", "net", "--workspace", tmp_path, "--torch", f"{MODELS}:make_net", "--input", "x=2x3x8x8")
    assert made.exit_code == 0, made.output
    text = (tmp_path / "models" / "net.py").read_text()
    assert "Tolerances(Tolerance(atol=0.0001, rtol=0.0001), floor=32)" in text and "32x its float32 noise floor" in text
    assert invoke("golden", "build", "--workspace", tmp_path, "--model", "net").exit_code == 0
    manifest = json.loads((tmp_path / "golden" / "net" / "manifest.json").read_text())
    floor = manifest["reference"]["float32_floor"]["output"]
    assert 0 < floor["max_abs"] < 1e-5 < floor["scale"]
    out = tmp_path / "check.json"
    checked = invoke("check", "--workspace", tmp_path, "--model", "net", "--path", "torch/onnx/ort", "--json", out)
    assert checked.exit_code == 0, checked.output
    (result,) = json.loads(out.read_text())["results"]
    allowed = result["tolerances"]["outputs"]["overrides"]["output"]
    assert allowed["atol"] == pytest.approx(32 * max(floor["max_abs"], EPS * floor["scale"]))
    assert allowed["atol"] < 1e-4 and result["verdict"] == "pass"

    # golden data that does not record the floor the spec derives its tolerances from: rebuild, never a guess
    reseal(tmp_path / "golden" / "net", edit=lambda m: m["reference"].pop("float32_floor"))
    refused = invoke("check", "--workspace", tmp_path, "--model", "net", "--path", "torch/onnx/ort")
    assert refused.exit_code != 0 and " pass " not in refused.output
    assert "float32 noise floor" in refused.output and "parity golden build --model net" in refused.output


@pytest.mark.slow
@pytest.mark.parametrize(("factory", "verdict"), [("make_gpt2_float16_island", "fail"), ("make_gpt2_float32", "pass")])
def test_the_tolerance_init_derives_fails_a_float16_island_and_passes_float32(tmp_path, factory, verdict):
    """The GPT-2 whose export computes ``h.1.mlp.c_proj`` in float16 passes 1e-4 (0.98x); at the floor's 32x it
    fails, and the same model in float32 passes."""
    gpt2 = ("--input", "input_ids=2x16:int64:50", "--input", "attention_mask=2x16:int64:mask")
    made = invoke(
        "init", "gpt", "--workspace", tmp_path, "--torch", f"{REPO / 'tests' / 'floormodels.py'}:{factory}", *gpt2
    )
    assert made.exit_code == 0, made.output
    assert invoke("golden", "build", "--workspace", tmp_path, "--model", "gpt").exit_code == 0
    out = tmp_path / "check.json"
    invoke(
        "check", "--workspace", tmp_path, "--model", "gpt", "--path", "torch", "--path", "torch/onnx/ort", "--json", out
    )
    results = {r["path"]: r for r in json.loads(out.read_text())["results"]}
    assert results["torch"]["verdict"] == "pass"
    assert results["torch/onnx/ort"]["verdict"] == verdict, results["torch/onnx/ort"].get("reason")


def test_floor_on_a_built_in_model_is_refused_not_ignored():
    """Only a golden build of a model brought with `parity init` measures the floor: declared on a zoo model, whose
    golden build measures none, it would be silently ignored."""
    import dataclasses

    from parity.model.workspace import Workspace

    spec = Workspace(REPO).load_spec("mlp")
    floored = {"fp32": Tolerances(Tolerance(1e-4, 1e-4), floor=32)}
    with pytest.raises(ValueError, match="floor= needs a model brought with parity init"):
        dataclasses.replace(spec, tolerances=floored).validate()
