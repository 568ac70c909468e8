"""ONNX's own backend test cases, as scripts/onnx_corpus.py takes them: several inputs, scalars, outputs without a
batch axis, NaN in the given data, integer outputs; parity's verdict agrees with ONNX Runtime's own."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO

CASES = (
    "test_add",
    "test_matmul_2d",
    "test_size",
    "test_isnan",
    "test_shape",
    "test_reduce_sum_keepdims_example",
    "test_where_example",
    "test_mvn",  # the ONNX checker cannot infer through MeanVarianceNormalization's body; ONNX Runtime loads it
    "test_scatter_with_axis",
)  # Scatter (deprecated for ScatterElements) has no onnx.reference implementation


def _script():
    spec = importlib.util.spec_from_file_location("onnx_corpus", REPO / "scripts" / "onnx_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def corpus_of(tmp_path_factory, folder: str, names) -> tuple:
    """The corpus script, the node cases ``names`` written as it writes them (by name), and a workspace for them."""
    script = _script()
    root = tmp_path_factory.mktemp(folder)
    cases = {case.name: case for case in script.write_node_cases(root / "cases", set(names))}
    return script, cases, root / "ws"


def taken_and_agreeing(corpus, name: str) -> dict:
    """Case ``name`` of a ``corpus_of`` corpus passes on ONNX Runtime by its own test data and parity takes it and
    agrees: the path's entry of the result JSON."""
    script, cases, workspace = corpus
    ort_says, _ = script.ort_verdict(cases[name])
    says, reason, entry = script.parity_result(cases[name], workspace)
    assert ort_says == "pass" and says == "pass", (ort_says, says, reason)
    return entry


def with_expected(source: Path, name: str, change) -> Path:
    """A copy of case ``source`` beside it as ``name``, its first expected output ``change``d (``change(array) ->
    array``): the runtime computes what it did, so against the changed outputs it departs from them."""
    from onnx import TensorProto, numpy_helper

    case = source.parent / name
    (case / "test_data_set_0").mkdir(parents=True)
    (case / "model.onnx").write_bytes((source / "model.onnx").read_bytes())
    for file in (source / "test_data_set_0").iterdir():
        proto = TensorProto()
        proto.ParseFromString(file.read_bytes())
        if file.name == "output_0.pb":
            proto = numpy_helper.from_array(change(numpy_helper.to_array(proto)), proto.name)
        (case / "test_data_set_0" / file.name).write_bytes(proto.SerializeToString())
    return case


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return corpus_of(tmp_path_factory, "corpus", CASES)


@pytest.mark.parametrize("name", CASES)
def test_a_case_onnx_runtime_loads_is_taken_and_agrees_with_its_own_verdict(corpus, name):
    taken_and_agreeing(corpus, name)


def test_a_runtime_that_departs_from_the_expected_outputs_fails(corpus):
    """Given outputs set the golden; the tolerance grows only by their own distance from the float64 reference, so
    ONNX Runtime departing from them by more than float32 explains fails (a blanket x10 once passed it)."""
    from onnx import numpy_helper

    script, cases, workspace = corpus
    case = cases["test_add"].parent / "test_add_departs"
    case.mkdir()
    (case / "model.onnx").write_bytes((cases["test_add"] / "model.onnx").read_bytes())
    data = case / "test_data_set_0"
    data.mkdir()
    source = cases["test_add"] / "test_data_set_0"
    for file in source.iterdir():
        proto = numpy_helper.to_array(_tensor(file))
        if file.name == "input_1.pb":  # the runtime computes x + (y + 5e-4): 5e-4 more than the expected outputs
            proto = proto + np.float32(5e-4)
        (data / file.name).write_bytes(numpy_helper.from_array(proto, _tensor(file).name).SerializeToString())
    # the expected outputs stay x + y: the model run on these inputs departs from them by 5e-4
    says, reason = script.parity_verdict(case, workspace)
    assert says == "fail" and "output sum: max_abs 0.0005" in reason, (says, reason)


def _tensor(file):
    from onnx import TensorProto

    proto = TensorProto()
    proto.ParseFromString(file.read_bytes())
    return proto


def test_a_bfloat16_input_and_output_pass_on_openvino(tmp_path_factory):
    """``test_compress_bfloat16`` on OpenVINO, which types the graph's input and output bf16 and hands their bits over
    as float16: fed float32, the path was an error ("could not broadcast ... (3,4) into ... (3,2)")."""
    script, cases, workspace = corpus_of(tmp_path_factory, "bf16", ["test_compress_bfloat16"])
    pytest.importorskip("openvino")
    says, reason, _ = script.parity_result(cases["test_compress_bfloat16"], workspace, path="onnx/openvino")
    assert says == "pass", reason
