"""Which axis of the model's input each axis of an exported graph's tensor holds, read from the graph's structure.

A converter that moves a layout (tf2onnx runs a Keras NHWC model's convolutions in NCHW between Transposes) leaves
tensors whose axes are a permutation of the source's. Where the graph says which, a tap's axis order is proven by
structure, not guessed from its shape (which cannot tell NCHW from NHWC when channels, height and width agree) nor
from its values (which on a failing path may be the fault itself). The order of a tensor is followed from the graph's
inputs through the ops that keep the meaning of every axis (elementwise ops, convolutions, pooling, batch
normalisation, resizing, padding) and through Transposes; any other op (a reshape, a matmul, a reduction that drops
an axis) ends what is known. NumPy at import; the graph is ``onnx_graph._Graph`` of the model.
"""

from __future__ import annotations

import numpy as np

# ops whose output axes mean what their (first non-constant) input's axes mean
KEEPS_AXES = frozenset(
    {
        "Abs", "Add", "AveragePool", "BatchNormalization", "Cast", "Ceil", "Celu", "Clip", "Conv", "ConvTranspose",
        "Div", "Dropout", "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid", "HardSwish", "Identity",
        "InstanceNormalization", "LeakyRelu", "Log", "LpNormalization", "LRN", "Max", "MaxPool", "Min", "Mish", "Mul",
        "Neg", "Pad", "Pow", "PRelu", "QuantizeLinear", "DequantizeLinear", "Reciprocal", "Relu", "Resize", "Round",
        "Selu", "Sigmoid", "Sign", "Sin", "Cos", "Softplus", "Softsign", "Sqrt", "Sub", "Sum", "Tanh",
        "ThresholdedRelu", "Upsample", "Where",
    }
)  # fmt: skip
# ops whose later inputs are parameters (scales, pads, statistics), not data: their first input alone sets the order
FIRST_ONLY = frozenset(
    {"BatchNormalization", "Clip", "Conv", "ConvTranspose", "DequantizeLinear", "Dropout", "InstanceNormalization",
     "Pad", "PRelu", "QuantizeLinear", "Resize", "Upsample"}
)  # fmt: skip


def _graph_input_orders(model, input_layout: str, canonical: str) -> dict[str, tuple[int, ...]]:
    """Each graph input's axes as the model input's axes: the identity, or NHWC's where the export feeds an NCHW
    model NHWC."""
    from parity.diagnose.graph import onnx_graph

    orders = {}
    for value in model.graph.input:
        shape = onnx_graph._static_shape(value)
        if shape is None:
            continue
        rank = len(shape)
        orders[value.name] = (
            (0, 2, 3, 1) if rank == 4 and input_layout == "nhwc" and canonical == "nchw" else tuple(range(rank))
        )
    return orders


def axis_orders(model, graph, input_layout: str, canonical: str) -> dict[str, tuple[int, ...]]:
    """``{tensor: order}``: ``order[i]`` is the axis of the model's input that the tensor's axis ``i`` holds, for
    every tensor whose order the structure proves (see the module docstring); computed once per graph."""
    cached = getattr(graph, "_axis_orders", None)
    if cached is not None:
        return cached
    constants = {t.name for t in model.graph.initializer}
    orders = _graph_input_orders(model, input_layout, canonical)
    for node in graph.nodes:
        if node.op_type == "Constant":
            constants.update(node.output)
            continue
        read = [t for t in node.input if t and t not in constants]
        if node.op_type in FIRST_ONLY:
            read = [t for t in node.input[:1] if t and t not in constants]
        if not read or any(t not in orders for t in read):
            continue
        known = [orders[t] for t in read]
        if node.op_type == "Transpose" and len(read) == 1:
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            source = known[0]
            perm = perm if perm is not None else list(reversed(range(len(source))))
            if len(perm) == len(source):
                orders[node.output[0]] = tuple(source[p] for p in perm)
        elif node.op_type in KEEPS_AXES and len(set(known)) == 1 and node.output:
            shape = graph.shapes.get(node.output[0])
            if shape is not None and len(shape) == len(known[0]):
                orders[node.output[0]] = known[0]
    graph._axis_orders = orders
    return orders


def to_golden(order: tuple[int, ...], shape, golden_shape) -> tuple[int, ...] | None:
    """The transpose that puts a tensor of ``shape`` whose axes hold the model input's axes ``order`` into the
    golden's order, when that gives the golden's shape; else None."""
    if shape is None or len(order) != len(golden_shape) or sorted(order) != list(range(len(order))):
        return None
    transpose = tuple(int(i) for i in np.argsort(order))
    if tuple(shape[i] for i in transpose) != tuple(golden_shape):
        return None
    return transpose
