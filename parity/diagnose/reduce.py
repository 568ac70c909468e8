"""A failing ONNX graph reduced to a small subgraph that still fails on the whole input set.

``known`` maps tensors to values known to be right (graph inputs always; every intermediate where a trusted
evaluator ran the graph; only the taps and outputs where the source is the reference). A candidate is the set of
nodes that computes one known tensor (its output, compared with the known value) from a set of known tensors (its
inputs, fed their known values). The reduction keeps the failure at every step, judged on every sample at once:

1. the output side: the earliest known tensor, in topological order, whose subgraph from the graph inputs fails
   (bisected over the order, then confirmed);
2. the input side: the known tensors nearest the output are tried as cuts one by one, latest first; a cut that
   keeps the failure is kept (the subgraph shrinks towards the output).

Each candidate runs alone, with only its output marked: marking intermediates would change what an optimiser does.
Polygraphy's ``debug reduce`` and the former ``torch.onnx`` ``find_mismatch`` are the anchors; they need a
user-written check and judge one sample, this needs neither. NumPy at import; onnx / onnxruntime inside.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from parity.check.closeness import error_stats


@dataclass
class Reduced:
    model: object | None  # the reduced ModelProto, or None when the failure did not reproduce
    inputs: dict[str, np.ndarray] = field(default_factory=dict)  # graph input -> known value
    output: str | None = None
    expected: np.ndarray | None = None
    stats: dict = field(default_factory=dict)  # error of the failing runtime on the reduced graph
    nodes_before: int = 0
    nodes_after: int = 0
    checks: int = 0
    reproduced: int = 0
    seconds: float = 0.0
    reason: str | None = None


def _producers(model) -> dict[str, int]:
    return {name: i for i, node in enumerate(model.graph.node) for name in node.output if name}


def _needed(model, output: str, cuts: set[str]) -> list[int]:
    """Indices of the nodes that compute ``output`` from ``cuts``, the graph inputs and the initializers."""
    producers = _producers(model)
    keep, stack = set(), [output]
    while stack:
        name = stack.pop()
        if name in cuts or name not in producers:
            continue
        index = producers[name]
        if index in keep:
            continue
        keep.add(index)
        stack.extend(i for i in model.graph.node[index].input if i)
    return sorted(keep)


def subgraph(model, output: str, cuts: set[str], known: dict):
    """The nodes computing ``output`` from ``cuts`` as a model of its own: its inputs are the tensors it reads that
    no kept node computes (cuts and graph inputs; initializers stay initializers), fed their known values."""
    import onnx
    from onnx import helper

    nodes = [model.graph.node[i] for i in _needed(model, output, cuts)]
    produced = {name for node in nodes for name in node.output}
    initializers = {i.name: i for i in model.graph.initializer}
    read = list(dict.fromkeys(i for node in nodes for i in node.input if i and i not in produced))
    inputs = [name for name in read if name not in initializers]
    missing = [name for name in inputs if name not in known]
    if missing:
        raise KeyError(f"no known value for {missing[0]!r}")
    infos = []
    for name in inputs:
        value = np.asarray(known[name])
        infos.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape))
    graph = helper.make_graph(nodes, "reduced", infos, [helper.make_empty_tensor_value_info(output)],
                              initializer=[initializers[name] for name in read if name in initializers])
    reduced = helper.make_model(graph, opset_imports=list(model.opset_import))
    reduced.ir_version = model.ir_version
    reduced = onnx.shape_inference.infer_shapes(reduced)
    typed = {v.name: v for v in reduced.graph.value_info}
    if output in typed:
        del reduced.graph.output[:]
        reduced.graph.output.append(typed[output])
    return reduced, {name: np.asarray(known[name]) for name in inputs}


def _position(model) -> dict[str, int]:
    return {name: i for i, node in enumerate(model.graph.node) for name in node.output if name}


def reduce(model, known: dict[str, np.ndarray], run: Callable, tolerance_for,
           order: list[str] | None = None) -> Reduced:
    """The smallest subgraph found that still fails (see the module docstring). ``run(model, feed) -> value`` runs
    a candidate on the failing runtime and returns its one output; ``tolerance_for(tensor)`` the tolerance it is
    judged with; ``order``: the known tensors to try as outputs (default every known tensor a node computes)."""
    started = time.perf_counter()
    result = Reduced(None, nodes_before=len(model.graph.node))
    positions = _position(model)
    graph_inputs = {i.name for i in model.graph.input}
    outputs = sorted(order or [t for t in known if t in positions], key=positions.__getitem__)

    def fails(output: str, cuts: set[str]):
        result.checks += 1
        candidate, feed = subgraph(model, output, cuts, known)
        value = np.asarray(run(candidate, feed), np.float64)
        stats = error_stats(value, np.asarray(known[output], np.float64), tolerance_for(output))
        bad = not stats.get("ok", False)
        result.reproduced += bad
        return (candidate, feed, stats) if bad else None

    # 1. the output side: bisect for the earliest failing output (failure is assumed to persist downstream)
    low, high = 0, len(outputs) - 1
    if not outputs or fails(outputs[high], set()) is None:
        result.reason = ("the whole graph's " + (f"{outputs[-1]!r} " if outputs else "") +
                         "does not fail on the failing runtime when run alone")
        result.seconds = time.perf_counter() - started
        return result
    while low < high:
        middle = (low + high) // 2
        if fails(outputs[middle], set()) is not None:
            high = middle
        else:
            low = middle + 1
    output = outputs[high]
    found = fails(output, set())
    if found is None:
        result.reason = f"the failure stopped reproducing at {output!r} (the bisection was not monotone)"
        result.seconds = time.perf_counter() - started
        return result
    # 2. the input side: cut at known tensors nearest the output first
    cuts: set[str] = set()
    ancestors = {name for i in _needed(model, output, set()) for name in model.graph.node[i].output}
    for tensor in sorted((t for t in known if t in ancestors and t != output and t not in graph_inputs),
                         key=positions.__getitem__, reverse=True):
        if tensor in cuts or not set(_needed(model, output, cuts)) - set(_needed(model, output, cuts | {tensor})):
            continue
        attempt = fails(output, cuts | {tensor})
        if attempt is not None:
            cuts.add(tensor)
            found = attempt
    result.model, result.inputs, result.stats = found
    result.output, result.expected = output, np.asarray(known[output])
    result.nodes_after = len(result.model.graph.node)
    result.seconds = time.perf_counter() - started
    return result
