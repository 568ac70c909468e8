"""ONNX files in their own dtypes, as scripts/onnx_corpus.py takes ONNX's backend cases: a float16 graph judged at
float16's tolerance (and each output of a mixed graph at its own dtype's), a scalar input fed to onnx.reference
as the scalar it is, and the corpus's own reading and verdict of ONNX Runtime on the kinds parity once refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from parity.check import closeness
from parity.model.spec import Tolerance, Tolerances
from tests.interop.test_onnx_corpus import corpus_of

CASES = ("test_attention_4d_fp16", "test_dft", "test_stft", "test_identity_sequence")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return corpus_of(tmp_path_factory, "dtypes", CASES)


def test_a_float16_graph_is_judged_at_float16_tolerance_and_says_so(corpus):
    """ONNX Runtime's float16 attention is one float16 ulp (4.9e-4 at 0.5) from the expected outputs: within
    float16's tolerance, which the result names with its reason (it once failed at the float32 one)."""
    script, cases, workspace = corpus
    says, reason, entry = script.parity_result(cases["test_attention_4d_fp16"], workspace)
    assert says == "pass", reason
    rule = entry["outputs"]["Y"]["tolerance"]
    assert rule["dtype"] == "float16" and rule["atol"] == pytest.approx(2.0**-6) and "fp16" in rule["why"]
    assert 0 < entry["outputs"]["Y"]["max_abs"] < 1e-3
    json.dumps(entry, allow_nan=False)  # the result stays plain JSON


def _spec_tolerances(declared: dict):
    """``ModelSpec.output_tolerances`` of a spec that declares ``declared`` (precision -> Tolerances)."""
    from parity.model.spec import _at_precision

    return lambda precision: _at_precision(declared, precision, gradients=False)


def test_bench_verifies_a_float16_output_at_the_tolerance_the_check_passed_it_at(corpus):
    """A timed series is verified before it is timed, at the same tolerance as the check: a float16 output passed
    at float16's tolerance is not failed by the bench at the float32 one."""
    from click.testing import CliRunner

    from parity.cli import cli

    script, cases, workspace = corpus
    says, reason, _ = script.parity_result(cases["test_attention_4d_fp16"], workspace)
    assert says == "pass", reason
    out = workspace / "bench.json"
    result = CliRunner().invoke(
        cli,
        [
            "bench",
            "--workspace",
            str(workspace),
            "--model",
            "test_attention_4d_fp16",
            "--path",
            "onnx/ort",
            "--budget",
            "0.05",
            "--no-store",
            "--json",
            str(out),
        ],
    )
    (entry,) = json.loads(out.read_text())["results"]
    series = entry["timing"]["batches"]
    assert series and all(s["verdict"] == "pass" for s in series.values()), (result.output, series)


def test_each_output_of_a_mixed_graph_is_judged_by_its_own_dtype():
    tolerances_at = _spec_tolerances({"fp32": Tolerances(Tolerance(1e-5, 1e-5))})
    golden = {"half": np.full(4, 0.5), "full": np.full(4, 0.5)}
    actual = {"half": golden["half"] + 4.9e-4, "full": golden["full"] + 4.9e-4}
    judged = closeness.OutputTolerances(tolerances_at, "fp32", {"half": "float16", "full": "float32"})
    stats = closeness.compare_outputs(actual, golden, judged)
    assert stats["half"]["ok"] and stats["half"]["tolerance"]["dtype"] == "float16"
    assert not stats["full"]["ok"] and "tolerance" not in stats["full"]
    bf16 = closeness.compare_outputs(
        {"y": golden["half"] + 3e-3},
        {"y": golden["half"]},
        closeness.OutputTolerances(tolerances_at, "fp32", {"y": "bfloat16"}),
    )
    assert bf16["y"]["ok"] and bf16["y"]["tolerance"]["rtol"] == pytest.approx(16 * 2.0**-7)
    # a float16 path at --precision fp16 keeps its precision's own tolerances, and says nothing more
    _, rule = closeness.dtype_tolerance(tolerances_at, "y", "float16", "fp16")
    assert rule is None


def test_a_float16_output_takes_the_fp16_tolerance_the_spec_declares():
    """A spec that declares its fp16 tolerances has a float16 output judged at those, as ``--precision fp16`` judges
    it, not at the dtype's default."""
    tolerances_at = _spec_tolerances(
        {"fp32": Tolerances(Tolerance(1e-5, 1e-5)), "fp16": Tolerances(Tolerance(1e-4, 1e-4))}
    )
    judged = closeness.OutputTolerances(tolerances_at, "fp32", {"y": "float16"})
    stats = closeness.compare_outputs({"y": np.full(4, 0.5 + 4.9e-4)}, {"y": np.full(4, 0.5)}, judged)
    assert not stats["y"]["ok"] and stats["y"]["tolerance"]["atol"] == pytest.approx(1e-4)


@pytest.mark.parametrize("name", ["test_dft", "test_stft"])
def test_onnx_reference_runs_a_graph_with_an_omitted_optional_input_and_a_scalar_one(corpus, name):
    """DFT and STFT leave an optional input empty and take a scalar one: onnx.reference is fed that scalar 0-d, as
    its documentation asks (a (1,) array made it fail with 'Issues with types [ndarray, NoneType, ...]')."""
    script, cases, workspace = corpus
    says, reason = script.parity_verdict(cases[name], workspace, path="onnx/onnxref")
    assert says == "pass", reason


def test_the_corpus_reads_a_sequence_case_as_onnx_runtime_takes_it(corpus):
    """ONNX Runtime's own verdict reads each data file by the type its graph slot declares (a sequence here, once
    'not a serialized onnx.TensorProto') and compares sequences element by element."""
    script, cases, _ = corpus
    assert script.ort_verdict(cases["test_identity_sequence"]) == ("pass", None)
    assert script.same([np.ones(2, np.float16)], [np.ones(2, np.float16) + np.float16(1e-2)]) is False
    assert script.same([np.ones(2)], [np.ones(2)]) and not script.same([np.ones(2)], [np.ones(2), np.ones(2)])
    assert script.same(np.array(["a", "b"], dtype=object), np.array(["a", "b"]))
