"""A user's ONNX file as a source: refused files, the float64 copy and its reference outputs, on
hand-made graphs and a real torch export."""

from __future__ import annotations

import numpy as np
import pytest

from parity.interop.onnx_file import OnnxFileError, float64_reference, load_checked, reference_outputs, to_float64

onnx = pytest.importorskip("onnx")
TensorProto, helper, numpy_helper = onnx.TensorProto, onnx.helper, onnx.numpy_helper

DOUBLE = TensorProto.DOUBLE


def _save(model, path):
    onnx.save(model, str(path))
    return path


def _double_checked(model):
    """The float64 copy, which must still pass the full checker (types consistent everywhere)."""
    converted = to_float64(model)
    onnx.checker.check_model(converted, full_check=True)
    return converted


# --------------------------------------------------------------------------- a small hand-made graph


def small_model():
    """y = Softmax(Relu((x @ w + b + Cast<float>(k)) * c) * 0.5), c and 0.5 Constant nodes."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 3)).astype(np.float32)
    b = rng.normal(size=3).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["xwb"]),
        helper.make_node("Cast", ["k"], ["kf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["xwb", "kf"], ["h"]),
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array([1.5, -2.0, 3.25], np.float32))),
        helper.make_node("Mul", ["h", "c"], ["hc"]),
        helper.make_node("Relu", ["hc"], ["r"]),
        helper.make_node("Constant", [], ["half"], value_float=0.5),
        helper.make_node("Mul", ["r", "half"], ["rh"]),
        helper.make_node("Softmax", ["rh"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(b, "b"),
            numpy_helper.from_array(np.array([1, 2, 3], np.int64), "k"),
        ],
        value_info=[helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(model, full_check=True)
    return model, w, b


def small_numpy(x, w, b):
    h = (x @ w.astype(np.float64) + b.astype(np.float64) + np.array([1.0, 2.0, 3.0])) * np.array([1.5, -2.0, 3.25])
    z = np.maximum(h, 0.0) * 0.5
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_to_float64_converts_every_float_type_and_leaves_integers():
    model, _, _ = small_model()
    converted = _double_checked(model)
    graph = converted.graph
    assert graph.input[0].type.tensor_type.elem_type == DOUBLE
    assert graph.output[0].type.tensor_type.elem_type == DOUBLE
    assert graph.value_info[0].type.tensor_type.elem_type == DOUBLE
    types = {t.name: t.data_type for t in graph.initializer}
    assert types == {"w": DOUBLE, "b": DOUBLE, "k": TensorProto.INT64}
    cast = next(n for n in graph.node if n.op_type == "Cast")
    assert helper.get_attribute_value(cast.attribute[0]) == DOUBLE
    constants = [n.attribute[0] for n in graph.node if n.op_type == "Constant"]
    assert [(a.name, a.t.data_type) for a in constants] == [("value", DOUBLE), ("value", DOUBLE)]
    assert numpy_helper.to_array(constants[1].t) == 0.5
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT  # the original is untouched


def test_float64_reference_matches_numpy_and_float32_does_not():
    model, w, b = small_model()
    x = np.random.default_rng(1).normal(scale=3.0, size=(2, 4))
    expected = small_numpy(x, w, b)
    outputs, used, reason = float64_reference(model, {"x": x})
    assert (used, reason) == ("float64", None)
    assert outputs["y"].dtype == np.float64
    np.testing.assert_allclose(outputs["y"], expected, rtol=0, atol=1e-12)
    single = reference_outputs(model, {"x": x}, "float32")["y"]
    assert single.dtype == np.float32
    assert np.abs(single.astype(np.float64) - expected).max() > 1e-9


def test_reference_outputs_rejects_other_dtypes():
    model, _, _ = small_model()
    with pytest.raises(ValueError, match="float16"):
        reference_outputs(model, {"x": np.zeros((2, 4))}, "float16")


def test_if_branches_and_local_functions_are_converted():
    then_graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["one"], value_floats=[0.1, 0.2]),
            helper.make_node("Add", ["x", "one"], ["t"]),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])],
    )
    else_graph = helper.make_graph(
        [
            helper.make_node("ConstantOfShape", ["shape"], ["zeros"]),  # no value: float zeros by default
            helper.make_node("Scale", ["x"], ["s"], domain="local"),
            helper.make_node("Add", ["s", "zeros"], ["e"]),
        ],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.array([2], np.int64), "shape")],
    )
    scale = helper.make_function(
        "local",
        "Scale",
        ["a"],
        ["b"],
        [
            helper.make_node("Constant", [], ["third"], value_float=1 / 3),
            helper.make_node("Cast", ["third"], ["third_f"], to=TensorProto.FLOAT16),
            helper.make_node("Cast", ["third_f"], ["third_ff"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["a", "third_ff"], ["b"]),
        ],
        [helper.make_opsetid("", 21)],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph)],
        "if",
        [
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(
        graph, functions=[scale], opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("local", 1)]
    )
    onnx.checker.check_model(model, full_check=True)

    converted = _double_checked(model)
    branches = {a.name: a.g for a in converted.graph.node[0].attribute}
    assert branches["then_branch"].output[0].type.tensor_type.elem_type == DOUBLE
    assert branches["then_branch"].node[0].attribute[0].t.data_type == DOUBLE
    assert branches["else_branch"].node[0].attribute[0].t.data_type == DOUBLE
    assert branches["else_branch"].initializer[0].data_type == TensorProto.INT64
    assert [a.i for n in converted.functions[0].node for a in n.attribute if a.name == "to"] == [DOUBLE, DOUBLE]

    # value_float(s) hold float32 numbers; the FLOAT16 round trip must not round them any further
    x = np.array([1.0 / 7.0, 2.0 / 3.0])
    one, third = np.float32([0.1, 0.2]).astype(np.float64), np.float64(np.float32(1 / 3))
    for cond, expected in ((True, x + one), (False, x * third)):
        outputs, used, _ = float64_reference(model, {"cond": np.array(cond), "x": x})
        assert used == "float64"
        np.testing.assert_allclose(outputs["y"], expected, rtol=0, atol=1e-15)


# --------------------------------------------------------------------------- a real torch export


@pytest.fixture(scope="module")
def torch_export(tmp_path_factory):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 2),
    )
    with torch.no_grad():
        module[1].running_mean.normal_()
        module[1].running_var.uniform_(0.5, 2.0)
        module[1].weight.normal_()
        module[1].bias.normal_()
    module.eval()
    path = tmp_path_factory.mktemp("torch") / "model.onnx"
    # optimize=False keeps BatchNormalization: the optimizer folds it into the Conv weights in
    # float32, which moves the float64 result ~1e-8 away from torch's float64 run
    torch.onnx.export(
        module,
        (torch.zeros(2, 3, 8, 8),),
        str(path),
        input_names=["x"],
        output_names=["y"],
        dynamo=True,
        external_data=False,
        optimize=False,
        verbose=False,
    )
    return module, path


def test_torch_export_in_float64_matches_torch_in_float64(torch_export):
    import torch

    module, path = torch_export
    model = load_checked(path)
    assert "BatchNormalization" in {node.op_type for node in model.graph.node}
    _double_checked(model)
    x = np.random.default_rng(2).normal(size=(2, 3, 8, 8))
    outputs, used, reason = float64_reference(model, {"x": x})
    assert (used, reason) == ("float64", None)
    with torch.no_grad():
        expected = module.double()(torch.from_numpy(x)).numpy()
    module.float()
    np.testing.assert_allclose(outputs["y"], expected, rtol=0, atol=1e-10)
    single = reference_outputs(model, {"x": x}, "float32")["y"]
    assert np.abs(single.astype(np.float64) - expected).max() > 1e-10


# --------------------------------------------------------------------------- refused files


def _refused(path, pattern):
    with pytest.raises(OnnxFileError, match=pattern) as caught:
        load_checked(path)
    message = str(caught.value)
    assert str(path) in message and "\n" not in message
    return message


def test_missing_file_is_refused(tmp_path):
    _refused(tmp_path / "nope.onnx", "no such file")


def test_garbage_and_truncated_files_are_not_onnx_models(tmp_path, torch_export):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00\xffthis is not an ONNX model\n" * 20)
    _refused(garbage, r"not an ONNX model \(DecodeError")
    (tmp_path / "empty.onnx").write_bytes(b"")
    _refused(tmp_path / "empty.onnx", r"not an ONNX model \(no graph\)")
    data = torch_export[1].read_bytes()
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(data[: len(data) // 2])
    _refused(truncated, "not an ONNX model")


def test_model_failing_the_checker_is_refused(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["never_produced"], ["y"])],
        "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    path = _save(helper.make_model(graph), tmp_path / "bad.onnx")
    message = _refused(path, "fails the ONNX checker: Nodes in a graph must be topologically sorted")
    assert "never_produced" in message


def test_missing_external_data_is_refused(tmp_path):
    model, _, _ = small_model()
    path = tmp_path / "ext.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)
    assert load_checked(path).graph.initializer[0].data_location == TensorProto.DEFAULT  # data loaded
    (tmp_path / "weights.bin").unlink()
    _refused(path, "external data file\\(s\\) missing: weights.bin")


# --------------------------------------------------------------------------- float64 fallback


def test_op_without_a_float64_form_falls_back_to_float32_with_the_reason():
    # onnx.reference runs MeanVarianceNormalization by its schema's function body, whose epsilon
    # is a float32 Constant: in float64 the body's Add mixes float64 and float32 and fails.
    graph = helper.make_graph(
        [helper.make_node("MeanVarianceNormalization", ["x"], ["y"])],
        "mvn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    x = np.random.default_rng(3).normal(size=(1, 2, 3, 3))
    with pytest.raises(Exception, match="Input type mismatch"):
        reference_outputs(model, {"x": x}, "float64")

    outputs, used, reason = float64_reference(model, {"x": x})
    assert used == "float32"
    assert reason.startswith("float64 run failed: RuntimeTypeError: Input type mismatch")
    assert reason.endswith("; reference computed in float32") and "\n" not in reason
    assert outputs["y"].dtype == np.float64
    np.testing.assert_array_equal(outputs["y"], reference_outputs(model, {"x": x}, "float32")["y"])
    mean, std = x.mean(axis=(0, 2, 3), keepdims=True), x.std(axis=(0, 2, 3), keepdims=True)
    np.testing.assert_allclose(outputs["y"], (x - mean) / (std + 1e-9), atol=1e-5)
