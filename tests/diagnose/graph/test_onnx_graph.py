"""ONNX graph plumbing (intermediates, extra outputs, one run on ORT or onnx.reference) and the two
runtimes compared tensor by tensor, on small hand-made graphs (no export needed)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from parity.diagnose.graph import onnx_graph as og
from parity.model.spec import Tolerance

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

REPO = Path(__file__).resolve().parents[3]
TOL = Tolerance(1e-6, 1e-6)


# --------------------------------------------------------------------------- first divergent node


def _entries(units: dict[str, float]) -> list[dict]:
    return [
        {"node": f"n_{t}", "op_type": "Op", "tensor": t, "max_abs": u * 1e-5, "tol_units": u} for t, u in units.items()
    ]


def test_first_divergent_node_all_within():
    entries = _entries({"a": 0.2, "b": 1.0, "c": 0.7})
    assert og.first_divergent_node(entries, {"a": ["x"], "b": ["a"], "c": ["b"]}) is None


def test_first_divergent_node_is_the_source_not_its_consumers():
    entries = _entries({"a": 0.3, "b": 4.0, "c": 9.0, "d": 20.0})
    inputs = {"a": ["x", "w"], "b": ["a", "w2"], "c": ["b"], "d": ["c", "a"]}
    assert og.first_divergent_node(entries, inputs)["tensor"] == "b"


def test_first_divergent_node_skips_entries_that_only_carry_an_input_error():
    # 'carry' reads 'big' and is no worse than it: not divergent of its own, whatever the order given
    entries = _entries({"carry": 6.0, "big": 6.0, "mix": 7.5})
    inputs = {"carry": ["big"], "big": ["x", "w"], "mix": ["carry"]}
    assert og.first_divergent_node(entries, inputs)["tensor"] == "big"
    # an input with no entry (graph input, initializer) counts as exact
    assert og.first_divergent_node(entries, {**inputs, "carry": ["x"]})["tensor"] == "carry"


def test_first_divergent_node_non_finite():
    entries = _entries({"a": 0.1, "b": float("inf"), "c": float("inf")})
    assert og.first_divergent_node(entries, {"b": ["a"], "c": ["b"]})["tensor"] == "b"


def test_first_divergent_node_nan_counts_as_inf():
    entries = _entries({"a": 0.1, "b": float("nan"), "c": 2.0})
    assert og.first_divergent_node(entries, {"b": ["a"], "c": ["b"]})["tensor"] == "b"


# --------------------------------------------------------------------------- non-finite values


def test_finite_stats_nonfinite_alike_is_left_out():
    a = np.array([1.0, np.nan, np.inf, -np.inf, 2.0], dtype=np.float32)
    stats = og._finite_stats(a, a.copy(), TOL)
    assert stats["ok"] and stats["tol_units"] == 0.0 and stats["max_abs"] == 0.0


@pytest.mark.parametrize(
    "actual, reference",
    [
        ([1.0, np.nan], [1.0, 2.0]),  # NaN in the first runtime only
        ([1.0, 2.0], [1.0, np.nan]),  # NaN in the second only (error_stats alone gives tol_units NaN)
        ([np.nan, 2.0], [1.0, np.nan]),  # NaN on both sides, at different positions
        ([np.inf, 2.0], [-np.inf, 2.0]),  # Inf at the same position, different signs
        ([np.inf, 2.0], [np.nan, 2.0]),  # Inf against NaN
        ([1.0, np.inf], [1.0, 2.0]),  # Inf in one runtime only
    ],
)
def test_finite_stats_nonfinite_mismatch_is_inf(actual, reference):
    stats = og._finite_stats(np.array(actual, dtype=np.float32), np.array(reference, dtype=np.float32), TOL)
    assert stats["tol_units"] == math.inf and stats["max_abs"] == math.inf and stats["ok"] is False
    assert "NaN or Inf" in stats["reason"]


def test_finite_stats_never_nan():
    exact_zero = og._finite_stats(np.zeros(3), np.zeros(3), Tolerance(0.0, 1e-3))  # 0/0 with atol 0
    assert exact_zero["tol_units"] == 0.0 and exact_zero["ok"]
    off_zero = og._finite_stats(np.array([0.0, 1e-9]), np.zeros(2), Tolerance(0.0, 1e-3))
    assert off_zero["tol_units"] == math.inf and not off_zero["ok"]
    shapes = og._finite_stats(np.zeros(3), np.zeros(4), TOL)
    assert shapes["tol_units"] == math.inf and not shapes["ok"] and "shape" in shapes["reason"]
    close = og._finite_stats(np.array([1.0, 2.0]), np.array([1.0, 2.0 + 4e-6]), TOL)
    assert close["tol_units"] == pytest.approx(4e-6 / (1e-6 + 1e-6 * (2.0 + 4e-6))) and not close["ok"]


def test_nonfinite_node_is_the_first_divergent():
    """A node that produces NaN where the other runtime does not is picked, not its consumers."""
    ort = {"a": np.array([1.0, 2.0]), "b": np.array([np.nan, 1.0]), "c": np.array([np.nan, 3.0])}
    ref = {"a": np.array([1.0, 2.0]), "b": np.array([0.5, 1.0]), "c": np.array([0.5, 3.0])}
    entries = [
        {"node": f"n_{t}", "op_type": "Op", "tensor": t, **{k: s[k] for k in ("max_abs", "tol_units")}}
        for t in ort
        for s in [og._finite_stats(ort[t], ref[t], TOL)]
    ]
    assert [e["tol_units"] for e in entries] == [0.0, math.inf, math.inf]
    assert og.first_divergent_node(entries, {"a": ["x"], "b": ["a"], "c": ["b"]})["tensor"] == "b"


# --------------------------------------------------------------------------- small graphs


def _tiny_model():
    from onnx import TensorProto, helper

    w = helper.make_tensor("w", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["m"], name="mul"),
        helper.make_node("Shape", ["m"], ["s"], name="shape"),  # int64: not an intermediate
        helper.make_node("Relu", ["m"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "x"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def test_intermediates_and_with_outputs():
    model = _tiny_model()
    before = model.SerializeToString()
    assert og.intermediate_names(model) == ["m", "r", "y"]
    extended = og.with_outputs(model, ["m", "r", "y"])
    assert model.SerializeToString() == before
    outputs = {o.name: o for o in extended.graph.output}
    assert list(outputs) == ["y", "m", "r"]
    assert [d.dim_value for d in outputs["r"].type.tensor_type.shape.dim] == [2, 3]
    feed = {"x": np.array([[1.0, -1.0, 2.0], [-3.0, 0.5, 1.0]], dtype=np.float32)}
    expected_m = feed["x"] * np.array([1.0, 2.0, 3.0], dtype=np.float32)
    for runtime in ("ort", "onnxref"):
        got = og.run_tensors(runtime, model, feed, ["m", "r"])
        np.testing.assert_array_equal(got["m"], expected_m)
        np.testing.assert_array_equal(got["r"], np.maximum(expected_m, 0))
    with pytest.raises(ValueError):
        og.run_tensors("tvm", model, feed, ["m"])


def test_outputs_appended_to_the_models_own_bytes_parse_as_the_model_with_them():
    model = _tiny_model()
    data = model.SerializeToString()
    appended = onnx.ModelProto()
    appended.ParseFromString(og.serialized_with_outputs(model, data, ["y", "m", "r"]))
    assert appended == og.with_outputs(model, ["y", "m", "r"])  # "y" is an output already: not added twice
    feed = {"x": np.array([[1.0, -1.0, 2.0], [-3.0, 0.5, 1.0]], dtype=np.float32)}
    for runtime in ("ort", "ort-noopt"):  # from the bytes given, and with outputs ONNX Runtime types itself
        got = og.run_tensors(runtime, model, feed, ["m", "r"], data=data)
        want = og.run_tensors("onnxref", model, feed, ["m", "r"])
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])


def test_compare_runtimes_tiny():
    model = _tiny_model()
    feed = {"x": np.ones((2, 3), dtype=np.float32)}
    result = og.compare_runtimes(model, feed, Tolerance(1e-6, 1e-6))
    assert [(e["node"], e["op_type"], e["tensor"]) for e in result["nodes"]] == [
        ("mul", "Mul", "m"),
        ("relu", "Relu", "r"),
        ("add", "Add", "y"),
    ]
    assert result["first_divergent"] is None and all(e["max_abs"] == 0.0 for e in result["nodes"])


def test_compare_runtimes_when_onnx_reference_cannot_run():
    """ORT runs a com.microsoft contrib op that onnx.reference does not implement: no raise."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Relu", ["x"], ["m"], name="relu"),
        helper.make_node("Gelu", ["m"], ["y"], name="gelu", domain="com.microsoft"),
    ]
    graph = helper.make_graph(
        nodes,
        "contrib",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)], ir_version=8
    )
    result = og.compare_runtimes(model, {"x": np.ones((2, 3), dtype=np.float32)}, TOL)
    assert set(result) == {"nodes", "first_divergent", "error"}
    assert result["nodes"] == [] and result["first_divergent"] is None
    assert result["error"].startswith("onnx.reference cannot run the graph") and "Gelu" in result["error"]
    assert "\n" not in result["error"]


def test_module_imports_no_framework():
    import subprocess
    import sys

    probe = (
        "import sys, parity.diagnose.graph.onnx_graph; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('onnx', 'onnxruntime', 'torch', 'tensorflow', 'jax')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_shape_inference_without_the_weights_types_every_tensor_as_with_them():
    """A weight past ``SKELETON_ELEMENTS`` is given to shape inference as an input of its type; the small constants
    whose values shapes depend on (a Reshape's target) keep theirs: every tensor is typed as by the whole model."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((48, 48)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([0, 6, 8], np.int64), "shape")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Reshape", ["h", "shape"], ["r"]),
            helper.make_node("Softmax", ["r"], ["y"], axis=-1),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 48])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[weight, shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    whole = og._value_infos(onnx.shape_inference.infer_shapes(model, data_prop=True))
    inferred = og._inferred(model)
    assert weight.dims[0] * weight.dims[1] > og.SKELETON_ELEMENTS and [i.name for i in inferred.graph.input] == ["x"]
    found = og._value_infos(inferred)
    assert {n: i.type for n, i in found.items()} == {n: i.type for n, i in whole.items()}
    assert og._static_shape(found["y"]) == (2, 6, 8)
