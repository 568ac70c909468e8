"""Sequence and optional inputs and outputs of ONNX files, as scripts/onnx_corpus.py takes ONNX's own backend cases:
a sequence is held as its elements (``s/0``, ``s/1``, ...) and compared element by element, an optional by its
presence and then its value. parity takes them and its verdict agrees with ONNX Runtime's own."""

from __future__ import annotations

import numpy as np
import pytest

from tests.interop.test_onnx_corpus import corpus_of, taken_and_agreeing

CASES = (
    "test_identity_sequence",
    "test_sequence_insert_at_back",
    "test_split_to_sequence_1",
    "test_identity_opt",
    "test_if_opt",
    "test_loop13_seq",
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return corpus_of(tmp_path_factory, "sequences", CASES)


def _case(folder, model, inputs: list, outputs: list):
    """A case folder as ONNX writes one: ``model.onnx`` and ``test_data_set_0`` (values by the graph slot's kind)."""
    import onnx
    from onnx import numpy_helper

    (folder / "test_data_set_0").mkdir(parents=True)
    onnx.save(model, str(folder / "model.onnx"))
    for kind, values, infos in (("input", inputs, model.graph.input), ("output", outputs, model.graph.output)):
        for j, (value, info) in enumerate(zip(values, infos)):
            if info.type.HasField("optional_type"):
                proto = numpy_helper.from_optional(value, info.name)
            elif info.type.HasField("sequence_type"):
                proto = numpy_helper.from_list(value, info.name)
            else:
                proto = numpy_helper.from_array(np.asarray(value), info.name)
            (folder / "test_data_set_0" / f"{kind}_{j}.pb").write_bytes(proto.SerializeToString())
    return folder


@pytest.mark.parametrize("name", CASES)
def test_a_sequence_or_optional_case_is_taken_and_agrees_with_onnx_runtime(corpus, name):
    entry = taken_and_agreeing(corpus, name)
    assert entry["outputs"], entry  # outputs were compared, not skipped


def test_a_sequence_is_stored_by_element_without_pickles(corpus):
    script, cases, workspace = corpus
    assert script.parity_verdict(cases["test_split_to_sequence_1"], workspace)[0] == "pass"
    from parity.model.workspace import Workspace

    golden = workspace / "golden" / "test_split_to_sequence_1"
    with np.load(golden / "reference.npz", allow_pickle=False) as arrays:
        assert {"seq/0", "seq/1", "seq/2"} <= set(arrays.files) and arrays["seq/0"].shape == (3, 2), arrays.files
    import json

    manifest = json.loads((golden / "manifest.json").read_text())
    assert manifest["containers"] == {"seq": {"kind": "sequence", "length": 3}}
    spec = Workspace(workspace).load_spec("test_split_to_sequence_1")
    assert spec.check_shapes() == [] and not any(i.batched for i in spec.model_inputs)


def _edited(script, source, name: str, edit):
    """A copy of case ``source`` whose expected sequence output 0 is ``edit(list of arrays)``."""
    from onnx import SequenceProto, numpy_helper

    case = source.parent / name
    (case / "test_data_set_0").mkdir(parents=True)
    (case / "model.onnx").write_bytes((source / "model.onnx").read_bytes())
    for file in (source / "test_data_set_0").iterdir():
        data = file.read_bytes()
        if file.name == "output_0.pb":
            proto = SequenceProto()
            proto.ParseFromString(data)
            data = numpy_helper.from_list(edit(numpy_helper.to_list(proto)), proto.name).SerializeToString()
        (case / "test_data_set_0" / file.name).write_bytes(data)
    return case


def test_an_edited_expected_element_fails_naming_the_element(corpus):
    script, cases, workspace = corpus

    def edit(items):
        items[1] = items[1] + 1.0
        return items

    case = _edited(script, cases["test_split_to_sequence_1"], "test_split_to_sequence_wrong", edit)
    assert script.ort_verdict(case)[0] == "fail"
    says, reason = script.parity_verdict(case, workspace)
    assert says == "fail" and "output seq/1:" in reason, (says, reason)


def test_an_expected_sequence_of_another_length_fails_naming_it(corpus):
    script, cases, workspace = corpus
    case = _edited(script, cases["test_split_to_sequence_1"], "test_split_to_sequence_short", lambda items: items[:2])
    assert script.ort_verdict(case)[0] == "fail"
    says, reason = script.parity_verdict(case, workspace)
    assert says == "fail" and "output seq: a sequence of 3 where the golden output is a sequence of 2" in reason, (
        says,
        reason,
    )


def test_an_absent_optional_input_and_output_are_taken(corpus, tmp_path):
    """An optional input given absent, and an optional output the graph leaves absent: fed and read as None."""
    from onnx import TensorProto, helper

    script, _, workspace = corpus
    tensor = helper.make_tensor_type_proto(TensorProto.FLOAT, [3])
    optional = helper.make_optional_type_proto(tensor)
    graph = helper.make_graph(
        [
            helper.make_node("OptionalHasElement", ["maybe"], ["has"]),
            helper.make_node("Optional", [], ["none"], type=tensor),
            helper.make_node("Neg", ["x"], ["y"]),
        ],
        "absent",
        [helper.make_value_info("maybe", optional), helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [
            helper.make_tensor_value_info("has", TensorProto.BOOL, []),
            helper.make_value_info("none", optional),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [3]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    x = np.arange(3, dtype=np.float32)
    case = _case(tmp_path / "test_optional_absent", model, [None, x], [np.array(False), None, -x])
    assert script.ort_verdict(case)[0] == "pass"
    says, reason, entry = script.parity_result(case, workspace)
    assert says == "pass", (says, reason)
    assert set(entry["outputs"]) == {"has", "y"}, entry["outputs"]

    present = _case(tmp_path / "test_optional_present_expected", model, [None, x], [np.array(False), x, -x])
    assert script.ort_verdict(present)[0] == "fail"
    says, reason = script.parity_verdict(present, workspace)
    assert says == "fail" and "output none: absent where the golden output is present" in reason, (says, reason)
