"""The ONNX definition of single nodes in float64, at the model's opset: the third opinion on a node where ONNX
Runtime and ``onnx.reference`` disagree.

``evaluate`` computes a node from its inputs in float64 NumPy for the ops written out here (their semantics
follow the ONNX operator documents, including the ones that change with the opset: ``Softmax``/``LogSoftmax``
below opset 13 normalise over every axis from ``axis`` on, flattened to 2-D, not over ``axis`` alone); any other
op goes through ONNX Runtime with its graph optimisations off, on a one-node model in float64. ``third_opinion``
judges each runtime on its *own* inputs of the node, so a runtime is not blamed for a difference it inherited.

Every function imports onnx / onnxruntime inside; this module imports only NumPy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from parity.check.closeness import error_stats

NUMPY = "parity's float64 NumPy definition of the op"
ORT_FLOAT64 = "ONNX Runtime in float64 with graph optimisations off"


def attributes(node) -> dict:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def opset_of(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _softmax(x, axis: int, opset: int, log: bool = False) -> np.ndarray:
    axis = axis % x.ndim
    if opset < 13:  # coerced to 2-D at ``axis``: normalised over every trailing axis together
        flat = x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)
        return _softmax(flat, 1, 13, log).reshape(x.shape)
    shifted = x - np.max(x, axis=axis, keepdims=True)
    if log:
        return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def sigmoid(x) -> np.ndarray:
    """Sigmoid without overflow in exp at either end."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _defaults(opset: int) -> int:
    return 1 if opset < 13 else -1  # Softmax's default axis


_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Sigmoid": sigmoid,
    "Log": np.log,
    "Exp": np.exp,
    "Tanh": np.tanh,
    "Relu": lambda x: np.maximum(x, 0.0),
    "Sqrt": np.sqrt,
    "Reciprocal": lambda x: 1.0 / x,
    "Neg": np.negative,
    "Abs": np.abs,
    "Softplus": lambda x: np.logaddexp(0.0, x),
    "Identity": lambda x: x,
}
_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": np.divide,
    "Pow": np.power,
    "MatMul": np.matmul,
}


def evaluate(node, inputs: list, opset: int) -> tuple[np.ndarray | None, str | None]:
    """``(output in float64, evaluator)`` of ``node``'s first output from ``inputs`` (arrays, float64), or
    ``(None, None)`` when neither NumPy here nor ONNX Runtime in float64 can compute it."""
    op, attrs = node.op_type, attributes(node)
    with np.errstate(all="ignore"):
        if node.domain in ("", "ai.onnx"):
            if op in ("Softmax", "LogSoftmax"):
                return _softmax(inputs[0], attrs.get("axis", _defaults(opset)), opset, op == "LogSoftmax"), NUMPY
            if op in _UNARY and len(inputs) == 1:
                return _UNARY[op](inputs[0]), NUMPY
            if op in _BINARY and len(inputs) == 2:
                return _BINARY[op](inputs[0], inputs[1]), NUMPY
    value = _ort_float64(node, inputs, opset)
    return (value, ORT_FLOAT64) if value is not None else (None, None)


def _ort_float64(node, inputs: list, opset: int) -> np.ndarray | None:
    """``node`` alone in a float64 model through ONNX Runtime without optimisations; None where it has no float64
    kernel (or the node takes non-float inputs this cannot type)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    names = [f"in{i}" for i in range(len(inputs))]
    used = [n if n else "" for n in node.input]
    graph_inputs, feed = [], {}
    for name, original, value in zip(names, used, inputs):
        if not original:
            continue
        value = np.asarray(value)
        dtype = np.float64 if value.dtype.kind == "f" else value.dtype
        feed[name] = value.astype(dtype)
        graph_inputs.append(
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), value.shape)
        )
    clone = helper.make_node(
        node.op_type, [n if o else "" for n, o in zip(names, used)], ["out"], domain=node.domain or None
    )
    clone.attribute.extend(node.attribute)
    graph = helper.make_graph(
        [clone], "node", graph_inputs, [helper.make_tensor_value_info("out", TensorProto.DOUBLE, None)]
    )
    try:
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = min(model.ir_version, 10)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 4
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return np.asarray(session.run(["out"], feed)[0], np.float64)
    except Exception:  # noqa: BLE001 - no float64 kernel (or an op this cannot rebuild): no third opinion
        return None


def _inputs(node, values: dict, initializers: Mapping) -> list[np.ndarray | None] | None:
    out: list[np.ndarray | None] = []
    for name in node.input:
        if not name:
            out.append(None)
            continue
        value = values.get(name, initializers.get(name))
        if value is None:
            return None
        value = np.asarray(value)
        out.append(value.astype(np.float64) if value.dtype.kind == "f" else value)
    return out


def units(actual, expected, tol) -> float:
    """``actual``'s error against ``expected`` in tolerance units; non-finite values alike on both sides agree."""
    stats = error_stats(np.asarray(actual, np.float64), expected, tol)
    if "tol_units" in stats:
        return float(stats["tol_units"])
    # equal non-finite values at the same places count as agreeing (log(0) = -inf on both sides)
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    if (
        a.shape == e.shape
        and np.array_equal(np.isfinite(a), np.isfinite(e))
        and np.array_equal(a[~np.isfinite(a)], e[~np.isfinite(e)])
    ):
        finite = np.isfinite(a)
        return float(error_stats(a[finite], e[finite], tol).get("tol_units", math.inf)) if finite.any() else 0.0
    return math.inf


def third_opinion(model, node, values: dict[str, dict], tol, folder=None) -> dict:
    """Which runtime computes ``node`` as the ONNX spec defines it at the model's opset, each judged on its own
    inputs of the node: ``values`` maps a runtime (``ort``, ``onnxref``) to its tensors.

    ``{"evaluator", "opset", "runtimes": {runtime: {"tol_units", "follows"}}, "follows_spec": "ort" | "onnxref" |
    "both" | "neither" | None}`` (None: the node could not be evaluated, with ``reason``). ``folder``: where the data
    files of a model read by ``parity.diagnose.graph.onnx_graph.load`` lie (the node's weights alone are read)."""
    from parity.diagnose.graph.onnx_graph import Weights

    opset = opset_of(model)
    initializers = Weights(model, folder)
    judged, evaluator = {}, None
    for runtime, tensors in values.items():
        inputs = _inputs(node, tensors, initializers)
        if inputs is None or node.output[0] not in tensors:
            continue
        expected, evaluator = evaluate(node, inputs, opset)
        if expected is None:
            return {
                "evaluator": None,
                "opset": opset,
                "runtimes": {},
                "follows_spec": None,
                "reason": f"no float64 definition of {node.op_type} here and ONNX Runtime has no float64 kernel",
            }
        off = units(tensors[node.output[0]], expected, tol)
        judged[runtime] = {"tol_units": off, "follows": bool(off <= 1.0)}
    following = [r for r, j in judged.items() if j["follows"]]
    verdict = "both" if len(following) == len(judged) == 2 else following[0] if len(following) == 1 else "neither"
    return {"evaluator": evaluator, "opset": opset, "runtimes": judged, "follows_spec": verdict if judged else None}
