"""ONNX files whose inputs or outputs are bfloat16, float8, int4, uint4 or float4, as scripts/onnx_corpus.py takes ONNX's
own backend cases: fed and read through ml_dtypes, golden inputs kept as raw bits (no pickles), outputs judged by their
own dtype. ``onnx/onnxref`` takes every one; ``onnx/ort`` every one ONNX Runtime loads, agreeing with ONNX Runtime's
own verdict, and where ONNX Runtime has no kernel the path is an error with ONNX Runtime's own reason."""

from __future__ import annotations

import numpy as np
import pytest

from tests.interop.test_onnx_corpus import corpus_of, with_expected

CASES = {  # case: the dtype it takes or gives that NumPy holds only through ml_dtypes
    "test_castlike_BFLOAT16_to_FLOAT": "bfloat16 in",
    "test_castlike_FLOAT_to_BFLOAT16": "bfloat16 out",
    "test_castlike_FLOAT_to_FLOAT8E4M3FN": "float8 out",
    "test_castlike_FLOAT8E5M2_to_FLOAT": "float8 in",
    "test_castlike_INT4_to_FLOAT": "int4 in",
    "test_castlike_FLOAT_to_INT4": "int4 out",
    "test_castlike_UINT4_to_UINT8": "uint4 in",
}
NO_ORT_KERNEL = "test_castlike_FLOAT_to_FLOAT4E2M1"  # ONNX Runtime 1.31 has no float4 Cast kernel
IR14 = "test_cast_FLOAT_to_BFLOAT16"  # IR version 14, which ONNX Runtime 1.31 cannot read


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return corpus_of(tmp_path_factory, "lowp", {*CASES, NO_ORT_KERNEL, IR14})


@pytest.mark.parametrize("name", CASES)
def test_onnx_runtime_judges_the_case_itself(corpus, name):
    script, cases, _ = corpus
    assert script.ort_verdict(cases[name]) == ("pass", None)


@pytest.mark.parametrize("path", ["onnx/ort", "onnx/onnxref"])
@pytest.mark.parametrize("name", CASES)
def test_a_low_precision_case_is_taken_and_agrees_with_onnx_runtime(corpus, name, path):
    script, cases, workspace = corpus
    says, reason, entry = script.parity_result(cases[name], workspace, path=path)
    assert says == "pass", (CASES[name], path, says, reason)
    assert entry["outputs"]["output"]["size"] > 0  # compared, not skipped


def test_a_float8_output_is_judged_at_one_unit_in_its_last_place(corpus):
    script, cases, workspace = corpus
    _, _, entry = script.parity_result(cases["test_castlike_FLOAT_to_FLOAT8E4M3FN"], workspace)
    assert entry["outputs"]["output"]["tolerance"]["dtype"] == "float8_e4m3fn", entry["outputs"]


def test_golden_inputs_keep_raw_bits_and_load_without_pickles(corpus):
    script, cases, workspace = corpus
    import ml_dtypes
    from onnx import TensorProto, numpy_helper

    from parity.model.workspace import Workspace

    name = "test_castlike_INT4_to_FLOAT"
    assert script.parity_verdict(cases[name], workspace)[0] == "pass"
    spec = Workspace(workspace).load_spec(name)
    assert [i.dtype for i in spec.model_inputs] == ["int4", "float32"]
    with np.load(workspace / "golden" / name / "inputs.npz", allow_pickle=False) as arrays:
        bits = arrays["input/input"]
    proto = TensorProto()
    proto.ParseFromString((cases[name] / "test_data_set_0" / "input_0.pb").read_bytes())
    given = numpy_helper.to_array(proto)
    assert bits.dtype == np.uint8 and np.array_equal(bits.view(ml_dtypes.int4), given)


def test_a_missing_onnx_runtime_kernel_is_an_error_with_its_reason(corpus):
    script, cases, workspace = corpus
    ort_says, ort_reason = script.ort_verdict(cases[NO_ORT_KERNEL])
    assert ort_says == "cannot load" and "NOT_IMPLEMENTED" in ort_reason
    says, reason, _ = script.parity_result(cases[NO_ORT_KERNEL], workspace, path="onnx/ort")
    assert says == "error" and "NOT_IMPLEMENTED" in reason and "\n" not in reason, (says, reason)
    assert script.parity_verdict(cases[NO_ORT_KERNEL], workspace, path="onnx/onnxref")[0] == "pass"


def test_a_runtime_off_by_two_float8_steps_fails(corpus):
    """Expected float8 outputs two steps away from what the graph computes: the given outputs are the golden, so ONNX
    Runtime fails against them, as its own check does."""
    import ml_dtypes

    script, cases, workspace = corpus

    def two_steps_up(expected):
        bits = expected.view(np.uint8).copy()
        bits.flat[0] += 2  # 0.46875 -> 0.53125 in float8_e4m3fn
        return bits.view(ml_dtypes.float8_e4m3fn)

    case = with_expected(cases["test_castlike_FLOAT_to_FLOAT8E4M3FN"], "test_castlike_float8_departs", two_steps_up)
    assert script.ort_verdict(case)[0] == "fail"
    says, reason = script.parity_verdict(case, workspace)
    assert says == "fail" and "output" in reason, (says, reason)


@pytest.mark.parametrize("dtype", ["int4", "uint4", "float4_e2m1fn"])
def test_four_bit_packing_is_onnx_own(dtype):
    """parity packs 4-bit tensors for ONNX Runtime exactly as ONNX serialises them (two a byte, low nibble first)."""
    import ml_dtypes
    from onnx import numpy_helper

    from parity.model import values

    array = (
        np.arange(-3, 4).astype(np.float32).reshape(7, 1).astype(getattr(ml_dtypes, dtype))
        if dtype != "uint4"
        else np.arange(7, dtype=np.uint8).reshape(7, 1).astype(ml_dtypes.uint4)
    )
    packed = values.pack4(array)
    assert packed.tobytes() == numpy_helper.from_array(array).raw_data
    assert np.array_equal(values.unpack4(packed, dtype, array.shape).view(np.uint8), values.to_bits(array))


def test_a_file_converted_to_an_older_opset_gets_the_ir_version_that_opset_allows(corpus):
    """``init --opset 13`` converts the opset with onnx.version_converter, which keeps the file's IR version 14;
    ONNX Runtime reads 13 at most, so the converted file is written at the lowest IR version its opsets and types
    allow, and ONNX Runtime takes it."""
    import onnx

    script, cases, workspace = corpus
    assert script.ort_verdict(cases[IR14])[0] == "cannot load"
    says, reason, _ = script.parity_result(cases[IR14], workspace, opset=13)
    assert says == "pass", reason
    converted = next((workspace / "models").glob("*.opset13.onnx"))
    assert onnx.load(str(converted)).ir_version == 7
