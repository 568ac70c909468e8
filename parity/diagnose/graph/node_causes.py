"""Causes on the nodes of an exported graph, each named only when recomputing the node with the change reproduces
what the path computed, each with a fix tested where one can be:

* ``composite_rounding``: a node whose float32 result under- or overflows (``Sigmoid`` of a large negative to 0)
  feeding one that cannot take it (``Log`` of 0 = -inf), where the pair computed together in float64 is finite.
  Named on the producer; the fix (a stable form of the pair, where one is known) is checked in float32.
* ``opset_axis``: an op whose axis means something else below opset 13 (``Softmax``/``LogSoftmax``/``Hardmax``
  normalise over every axis from ``axis`` on): the graph is rerun with the node given its opset-13 meaning
  (a ``Transpose`` around it, the axis last); the path passing with it is the test.

NumPy only at import; onnx / onnxruntime inside the functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from parity.diagnose.graph import onnx_ops

# stable float32 forms of a pair (producer, consumer) -> (description, function of the producer's input)
_STABLE = {
    ("Sigmoid", "Log"): (
        "Neg(Softplus(Neg(x))), the log-sigmoid torch computes",
        lambda x: -np.logaddexp(np.float32(0), -x),
    )
}
AXIS_OPS = ("Softmax", "LogSoftmax", "Hardmax")


def _unary_float_producer(graph, name):
    index = graph.producer.get(name)
    if index is None:
        return None
    node = graph.nodes[index]
    return node if len([i for i in node.input if i]) == 1 else None


def composite_rounding(model, values: dict, tol, folder=None) -> dict | None:
    """The first (producer, consumer) pair in topological order where the consumer's value on the path has
    non-finite elements that the pair computed in float64 does not, where the producer's float32 result lost its
    smallest values (0, or off by more than half their size) or overflowed, and the consumer recomputed in float64
    from that result reproduces the path's value. ``values``: the path's tensors (graph inputs included); ``folder``:
    where the data files of a model read by ``onnx_graph.load`` lie."""
    from collections import ChainMap

    from parity.diagnose.graph.onnx_graph import Weights, _Graph

    graph = _Graph(model)
    opset = onnx_ops.opset_of(model)
    known: ChainMap = ChainMap(values, Weights(model, folder))  # type: ignore[arg-type]  # read-only weights
    for node in graph.nodes:
        out = node.output[0] if node.output else None
        if out not in values or np.all(np.isfinite(values[out])):
            continue
        for position, name in enumerate(node.input):
            producer = _unary_float_producer(graph, name)
            if producer is None or producer.input[0] not in known:
                continue
            x = np.asarray(known[producer.input[0]], np.float64)
            exact, _ = onnx_ops.evaluate(producer, [x], opset)
            if exact is None:
                continue
            computed = np.asarray(values.get(producer.output[0], np.nan), np.float64)
            if computed.shape != exact.shape:
                continue
            # the producer is right by its own (absolute) tolerance, yet its smallest results are lost: 0, or off by
            # more than half their size; or it overflowed where the exact result is finite
            lost = (exact != 0) & ((computed == 0) | (np.abs(computed - exact) > 0.5 * np.abs(exact)))
            flushed = int(np.count_nonzero(lost & np.isfinite(computed)))
            overflowed = int(np.count_nonzero(np.isfinite(exact) & ~np.isfinite(computed)))
            if not flushed and not overflowed:
                continue
            args = [np.asarray(known[i], np.float64) if i in known else None for i in node.input]
            args[position] = exact
            together, _ = onnx_ops.evaluate(node, args, opset)
            args[position] = computed
            from_computed, _ = onnx_ops.evaluate(node, args, opset)
            if together is None or from_computed is None or not np.all(np.isfinite(together)):
                continue
            if onnx_ops.units(values[out], from_computed, tol) > 1.0:
                continue  # the producer's float32 result does not explain what the consumer computed
            what = (
                f"{flushed} element(s) too small for float32 (0, or off by more than half their size)"
                if flushed
                else f"{overflowed} element(s) overflow to inf"
            )
            result = {
                "cause": "float32_rounding",
                "node": producer.name,
                "op_type": producer.op_type,
                "consumer": {"node": node.name, "op_type": node.op_type},
                "description": (
                    f"float32 {'underflow' if flushed else 'overflow'} in the composite "
                    f"{node.op_type}({producer.op_type}(x)): {producer.op_type} {producer.name}'s "
                    f"result has {what}, and {node.op_type} {node.name} turns them into "
                    f"{int(np.count_nonzero(~np.isfinite(values[out])))} non-finite values; "
                    f"computed together in float64 the pair is finite"
                ),
                "fix": None,
                "fix_tested": False,
            }
            stable = _STABLE.get((producer.op_type, node.op_type))
            if stable is not None:
                with np.errstate(all="ignore"):
                    fixed = stable[1](x.astype(np.float32))
                ok = onnx_ops.units(fixed, together, tol) <= 1.0
                result["fix"] = (
                    f"compute the pair as {stable[0]}: in float32 it is within "
                    f"{'' if ok else 'NOT '}the tolerance of the float64 composite"
                )
                result["fix_tested"] = bool(ok)
            return result
    return None


def single_axis(model, node_name: str, rank: int):
    """A copy of ``model`` whose node ``node_name`` (Softmax-like, below opset 13) normalises over its ``axis``
    alone, as opset 13 defines it: the axis is moved last by a Transpose, normalised there, moved back."""
    import onnx
    from onnx import helper

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    index = next(i for i, n in enumerate(graph.node) if n.name == node_name)
    node = graph.node[index]
    axis = onnx_ops.attributes(node).get("axis", 1) % rank
    perm = [d for d in range(rank) if d != axis] + [axis]
    back = [perm.index(d) for d in range(rank)]
    moved, normalised = f"{node.output[0]}__axis_last_in", f"{node.output[0]}__axis_last_out"
    new = [
        helper.make_node("Transpose", [node.input[0]], [moved], perm=perm, name=f"{node_name}__to_last"),
        helper.make_node(node.op_type, [moved], [normalised], axis=rank - 1, name=f"{node_name}__last_axis"),
        helper.make_node("Transpose", [normalised], [node.output[0]], perm=back, name=f"{node_name}__back"),
    ]
    del graph.node[index]
    for offset, extra in enumerate(new):
        graph.node.insert(index + offset, extra)
    return copy


def opset_axis(model, node, rank: int, run_outputs, expected_ok) -> dict | None:
    """The opset-dependent axis of ``node`` as the cause, when the graph rerun with the node's opset-13 meaning
    passes (``rank``: of the node's input; ``run_outputs(model) -> outputs``; ``expected_ok(outputs) -> (ok, worst
    tol_units)``)."""
    opset = onnx_ops.opset_of(model)
    if node.op_type not in AXIS_OPS or opset >= 13:
        return None
    axis = onnx_ops.attributes(node).get("axis", 1)
    try:
        ok, worst = expected_ok(run_outputs(single_axis(model, node.name, rank)))
    except Exception:  # noqa: BLE001 - a rewrite that cannot run is no cause
        return None
    if not ok:
        return None
    return {
        "cause": "opset_axis",
        "node": node.name,
        "op_type": node.op_type,
        "description": (
            f"{node.op_type} {node.name} has axis={axis} at opset {opset}, where the ONNX spec "
            f"normalises over every axis from {axis} on (the input flattened to 2-D); the source "
            f"normalises over axis {axis} alone, which is {node.op_type}'s meaning from opset 13"
        ),
        "fix": (
            f"use opset 13 or later (the graph with {node.name} normalising over axis {axis} alone "
            f"passes: {worst:.3g}x the tolerance, tested)"
        ),
        "fix_tested": True,
    }


def judge(
    model,
    feed: dict,
    values: dict[str, dict],
    first: dict | None,
    expected: dict | None,
    tolerance_for,
    tol,
    threads: int = 1,
    folder=None,
) -> dict:
    """What the two runtimes' full runs (``values``: runtime -> tensors) say beyond their differences: which
    runtime's outputs pass against ``expected`` (the golden, by graph output name), which one follows the spec at
    the ``first`` disputed node (a third opinion), and a node cause where one is reproduced. ``expected`` None:
    ``model`` is one module's nodes cut out of the whole graph, whose outputs are not compared here (and no axis is
    rerun). ``folder``: where the data files of a model read by ``onnx_graph.load`` lie."""
    from parity.check.closeness import compare_named
    from parity.diagnose.graph.onnx_graph import run_tensors

    def passes(outputs) -> tuple[bool, float]:
        assert expected is not None  # called only where the graph's outputs are compared
        stats = compare_named(outputs, expected, tolerance_for)
        return all(s["ok"] for s in stats.values()), max(
            (s.get("tol_units", np.inf) for s in stats.values()), default=0.0
        )

    outputs_ok = (
        {runtime: passes({n: tensors[n] for n in expected})[0] for runtime, tensors in values.items()}
        if expected is not None
        else {}
    )
    result: dict[str, Any] = {"outputs_ok": outputs_ok, "third_opinion": None, "node_cause": None}
    node = None
    if first is not None:
        node = next(n for n in model.graph.node if first["tensor"] in n.output)
        result["third_opinion"] = onnx_ops.third_opinion(model, node, values, tol, folder)
    cause = composite_rounding(model, values["ort"], tol, folder)
    if cause is None and node is not None and node.op_type in AXIS_OPS and expected is not None:
        rank = np.asarray(values["ort"][node.input[0]]).ndim
        cause = opset_axis(
            model,
            node,
            rank,
            lambda edited: run_tensors("ort", edited, feed, list(expected), threads, folder=folder),
            passes,
        )
    if cause is not None:
        trusted = next((r for r, ok in outputs_ok.items() if ok), "source")
        result["node_cause"] = {**cause, "trusted": trusted}
    return result
