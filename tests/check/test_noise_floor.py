"""The float32 noise floor: a passing path far noisier than the model's own float32 source is said (under the table
and in the JSON) and diagnosed at the floor's bound; real float32 paths are not."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from parity.check import closeness, noise_floor
from parity.cli import cli
from parity.model.spec import Tolerance, Tolerances
from parity.report import terminal
from parity.run import paths
from tests.conftest import REPO

FLOOR_MODELS = REPO / "tests" / "floormodels.py"
GPT2_INPUTS = ("--input", "input_ids=2x16:int64:50", "--input", "attention_mask=2x16:int64:mask")


def _stats(max_abs: float, scale: float = 1.0, ok: bool = True) -> dict:
    return {"max_abs": max_abs, "tol_units": max_abs / 1e-4, "scale": scale, "ok": ok}


def _result(path: str, max_abs: float, verdict: str = "pass") -> dict:
    return {"model": "m", "path": path, "verdict": verdict, "outputs": {"y": _stats(max_abs, ok=verdict == "pass")}}


def test_a_passing_path_far_above_its_sources_floor_is_flagged_and_one_near_it_is_not():
    source = _result("torch", 5.7e-7)
    island = noise_floor.judge(_result("torch/onnx/ort", 1.46e-4), source, "torch")
    assert island["noisier"] and island["ratio"] == pytest.approx(1.46e-4 / 5.7e-7)
    assert island["output"] == "y" and island["source"] == "torch"
    assert not noise_floor.judge(_result("torch/onnx/ort", 3e-6), source, "torch")["noisier"]
    # a failing path is a failure already, not a flag
    assert not noise_floor.judge(_result("torch/onnx/ort", 1.46e-4, "fail"), source, "torch")["noisier"]


def test_an_exact_source_has_one_float32_unit_of_its_scale_as_its_floor():
    exact = {"outputs": {"y": _stats(0.0, scale=8.0)}}
    judged = noise_floor.judge(_result("torch/onnx/ort", 1e-6), exact, "torch")
    assert judged["floor"] == pytest.approx(8.0 * 2.0**-23) and not judged["noisier"]


def test_outputs_judged_at_a_reduced_dtype_or_by_a_gate_are_not_compared_with_the_floor():
    source = _result("torch", 5.7e-7)
    half = _result("onnx/ort", 1e-3)
    half["outputs"]["y"]["tolerance"] = {"atol": 1e-2, "rtol": 1e-2, "dtype": "float16", "why": "-"}
    assert noise_floor.judge(half, source, "onnx/onnxref") is None


def test_only_fp32_float_paths_other_than_the_definition_are_judged():
    checked = {"verdict": "pass", "outputs": {"y": _stats(1e-6)}}
    assert noise_floor.judged(checked, paths.by_id("torch/onnx/ort"))
    assert not noise_floor.judged(checked, paths.by_id("torch"))
    assert not noise_floor.judged(checked, paths.by_id("torch/onnx/ort", "cpu", "fp16"))


def test_the_floors_bound_is_relative_to_each_tensors_scale():
    declared = Tolerances(Tolerance(1e-4, 1e-4))
    spec = SimpleNamespace(output_tolerances=lambda precision: declared)
    floor = noise_floor.judge(_result("torch/onnx/ort", 1.46e-4), {"outputs": {"y": _stats(5.7e-7, 4.0)}}, "torch")
    bound = noise_floor.bound(spec, "fp32", floor)
    assert bound.for_name("y").scaled == pytest.approx(32 * 5.7e-7 / 4.0)
    # a tap of another scale is allowed the same fraction of its own largest magnitude
    golden = np.linspace(-0.01, 0.01, 50)
    inside = closeness.error_stats(golden + 32 * 5.7e-7 / 4.0 * 0.01 * 0.9, golden, bound.default)
    outside = closeness.error_stats(golden + 32 * 5.7e-7 / 4.0 * 0.01 * 1.1, golden, bound.default)
    assert inside["ok"] and not outside["ok"]
    assert noise_floor.tolerances_from_json(bound.to_json()) == bound


def test_the_flag_is_a_line_under_the_table_naming_the_ratio_and_the_diagnose_command():
    flagged = _result("torch/onnx/ort", 1.46e-4)
    flagged["noise_floor"] = noise_floor.judge(flagged, _result("torch", 5.7e-7), "torch")
    plain = _result("torch/onnx/ort", 3e-6)
    plain["model"] = "other"
    plain["noise_floor"] = noise_floor.judge(plain, _result("torch", 5.7e-7), "torch")
    text = terminal.render({"results": [flagged, plain], "model_errors": []}, timed=False)
    said = " ".join(text[text.index("noisier than float32") :].split())
    assert said.startswith("noisier than float32: m torch/onnx/ort 256x the float32 floor")
    assert "parity diagnose --model m --path torch/onnx/ort" in said
    assert text.count("noisier than float32") == 1


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _gpt2(root, name: str, factory: str) -> None:
    made = _invoke("init", name, "--workspace", root, "--torch", f"{FLOOR_MODELS}:{factory}", *GPT2_INPUTS)
    assert made.exit_code == 0, made.output
    spec = root / "models" / f"{name}.py"
    text = spec.read_text()  # the user's declared tolerance, loose enough for the island to pass
    start = text.index('    tolerances={"fp32"')
    end = text.index("\n", start)
    spec.write_text(text[:start] + '    tolerances={"fp32": Tolerances(Tolerance(atol=3e-4, rtol=3e-4))},' + text[end:])
    built = _invoke("golden", "build", "--workspace", root, "--model", name)
    assert built.exit_code == 0, built.output


@pytest.mark.slow
def test_a_float16_island_that_passes_the_declared_tolerance_is_flagged_and_diagnosed_to_its_module(tmp_path):
    _gpt2(tmp_path, "gpt", "make_gpt2_float16_island")
    out = tmp_path / "check.json"
    checked = _invoke("check", "--workspace", tmp_path, "--model", "gpt", "--path", "torch", "--path", "torch/onnx/ort",
                      "--json", out)  # fmt: skip
    assert checked.exit_code == 0, checked.output
    results = {r["path"]: r for r in json.loads(out.read_text())["results"]}
    assert results["torch/onnx/ort"]["verdict"] == "pass"
    floor = results["torch/onnx/ort"]["noise_floor"]
    assert floor["noisier"] and floor["ratio"] > 4 * floor["factor"] and floor["source"] == "torch"
    assert "noise_floor" not in results["torch"]
    assert "noisier than float32: gpt torch/onnx/ort" in " ".join(checked.output.split())
    out = tmp_path / "diagnose.json"
    diagnosed = _invoke(
        "diagnose", "--workspace", tmp_path, "--model", "gpt", "--path", "torch/onnx/ort", "--json", out
    )
    diagnosis = json.loads(out.read_text())["results"][0]["diagnosis"]
    assert diagnosis["first_divergent_path"][-1] == "h.1.mlp.c_proj", diagnosed.output
    assert diagnosis["tolerance"]["scaled"] > 0


@pytest.mark.slow
def test_the_same_model_in_float32_is_not_flagged(tmp_path):
    _gpt2(tmp_path, "gpt", "make_gpt2_float32")
    out = tmp_path / "check.json"
    checked = _invoke("check", "--workspace", tmp_path, "--model", "gpt", "--path", "torch/onnx/*", "--json", out)
    assert checked.exit_code == 0, checked.output
    judged = [r for r in json.loads(out.read_text())["results"] if r.get("noise_floor")]
    assert judged and not any(r["noise_floor"]["noisier"] for r in judged), [r["noise_floor"] for r in judged]
    assert "noisier than float32" not in checked.output
