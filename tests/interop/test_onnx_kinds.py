"""ONNX files whose tensors are not numbers, or that take no input, as scripts/onnx_corpus.py takes ONNX's own
backend cases: string inputs and outputs (compared for equality), a graph without inputs (``Constant``: its
outputs checked whole). parity takes them and its verdict agrees with ONNX Runtime's own."""

from __future__ import annotations

import numpy as np
import pytest

from tests.interop.test_onnx_corpus import corpus_of, taken_and_agreeing, with_expected

CASES = ("test_constant", "test_string_concat", "test_regex_full_match_basic", "test_equal_string")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return corpus_of(tmp_path_factory, "kinds", CASES)


@pytest.mark.parametrize("name", CASES)
def test_a_string_or_input_free_case_is_taken_and_agrees_with_onnx_runtime(corpus, name):
    entry = taken_and_agreeing(corpus, name)
    assert entry["outputs"], entry  # outputs were compared, not skipped


def test_golden_text_is_unicode_and_loads_without_pickles(corpus):
    script, cases, workspace = corpus
    assert script.parity_verdict(cases["test_string_concat"], workspace)[0] == "pass"
    golden = workspace / "golden" / "test_string_concat"
    for file in ("inputs.npz", "reference.npz"):
        with np.load(golden / file, allow_pickle=False) as arrays:
            assert all(arrays[key].dtype.kind == "U" for key in arrays.files), (file, arrays.files)


def test_a_runtime_whose_strings_differ_from_the_expected_ones_fails(corpus):
    """Expected outputs that are not what the graph computes: the given strings are the golden, so ONNX Runtime's
    output fails against them, naming the first string that differs, as ONNX Runtime's own check fails."""
    script, cases, workspace = corpus

    def one_string_off(expected):
        expected = expected.astype(object)
        expected.flat[0] = str(expected.flat[0]) + "!"
        return expected

    case = with_expected(cases["test_string_concat"], "test_string_concat_wrong", one_string_off)
    assert script.ort_verdict(case)[0] == "fail"
    says, reason = script.parity_verdict(case, workspace)
    assert says == "fail" and "1 of" in reason and "strings differ" in reason, (says, reason)


def test_input_free_graph_has_no_inputs_and_no_batch_axis(corpus):
    script, cases, workspace = corpus
    assert script.parity_verdict(cases["test_constant"], workspace)[0] == "pass"
    from parity.model.workspace import Workspace

    spec = Workspace(workspace).load_spec("test_constant")
    assert spec.model_inputs == () and spec.check_shapes() == []
