"""A failing ONNX graph reduced to a small subgraph that still fails, judged on the whole input set at every step.

``known`` maps tensors to values known to be right: the graph inputs always; every intermediate where a trusted
evaluator ran the graph (``onnx.reference``, or ONNX Runtime with its optimisations off); only the mapped taps and
the outputs where the model's source is the reference (a converter fault). A candidate is the set of nodes that
computes one known tensor (its only output, compared with the known value) from a set of cut tensors (its inputs,
fed their known values); initializers it does not read are pruned, the opset imports are the graph's, and it must
pass ``onnx.checker.check_model(full_check=True)``. The reduction keeps the failure at every accepted step:

0. the whole graph must fail on the failing runtime (else there is nothing to reduce, and that is said);
1. the output side: the earliest known tensor in topological order whose subgraph from the graph inputs fails,
   bisected over the known tensors upstream of the failing output;
2. the input side: the cuts move forward, bisected over the topological order: the latest boundary (every node
   before it replaced by the known values it hands on) at which the subgraph still fails;
3. node removal: each remaining node but the output's, latest first, is cut away (its outputs fed their known
   values) where the rest still fails.

Each candidate runs alone with only its output marked: marking intermediates as outputs would change what an
optimiser fuses. Polygraphy's ``debug reduce`` and the former ``torch.onnx`` ``find_mismatch`` are the anchors;
they need a user-written check and judge one sample, this needs neither. NumPy at import; onnx / onnxruntime inside.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from parity.check.closeness import error_stats, times


@dataclass
class Reduced:
    """The outcome of ``reduce``: the smallest failing subgraph found, or ``model`` None and the ``reason``."""

    model: Any  # the reduced ModelProto, None where nothing reproduced
    failing: str = "ort"
    inputs: dict[str, np.ndarray] = field(default_factory=dict)  # its graph inputs -> known values
    output: str | None = None
    expected: np.ndarray | None = None  # the known value of ``output``
    stats: dict = field(default_factory=dict)  # the failing runtime's error on ``output``
    nodes_before: int = 0
    nodes_after: int = 0
    checks: int = 0  # candidates run on the failing runtime (the whole graph included)
    reproduced: int = 0  # of which failed
    seconds: float = 0.0
    steps: list[str] = field(default_factory=list)  # what each phase did, one line each
    reason: str | None = None


def _producers(model) -> dict[str, int]:
    return {name: i for i, node in enumerate(model.graph.node) for name in node.output if name}


def _needed(model, output: str, cuts: set[str], producers: dict[str, int] | None = None) -> list[int]:
    """Indices of the nodes that compute ``output`` from ``cuts``, the graph inputs and the initializers."""
    producers = producers if producers is not None else _producers(model)
    keep, stack = set(), [output]
    while stack:
        name = stack.pop()
        if name in cuts or name not in producers or producers[name] in keep:
            continue
        keep.add(producers[name])
        stack.extend(i for i in model.graph.node[producers[name]].input if i)
    return sorted(keep)


def subgraph(
    model, output: str | list[str], cuts: set[str], known: dict, name: str = "reduced", base_dir: Path | None = None
):
    """The nodes computing ``output`` (one tensor, or several) from ``cuts`` as a checker-valid model of its own,
    and its feed: its inputs are the tensors it reads that no kept node computes (cuts and graph inputs; initializers
    stay initializers), typed by their known values, as are its outputs. The model is self-contained: an initializer
    ``model`` keeps in external data is read from its data file in ``base_dir`` (the model's folder) into the cut.
    Raises KeyError when an input has no known value, ValueError when it reads none or an initializer's data cannot be
    read."""
    import onnx
    from onnx import helper

    outputs = [output] if isinstance(output, str) else list(output)
    producers = _producers(model)
    keep = sorted({i for each in outputs for i in _needed(model, each, cuts, producers)})
    nodes = [model.graph.node[i] for i in keep]
    produced = {name for node in nodes for name in node.output}
    initializers = {i.name: i for i in model.graph.initializer}
    read = list(dict.fromkeys(i for node in nodes for i in node.input if i and i not in produced))
    inputs = [name for name in read if name not in initializers]
    missing = [name for name in inputs if name not in known]
    if missing:
        raise KeyError(f"no known value for {missing[0]!r}")
    if not inputs:  # a subgraph of constants only: nothing of the input set reaches it
        raise ValueError(f"the nodes computing {', '.join(outputs)} read no graph input")

    def info(name):
        value = np.asarray(known[name])
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)

    graph = helper.make_graph(
        nodes,
        name,
        [info(name) for name in inputs],
        [info(each) for each in outputs],
        initializer=[_inline(initializers[name], base_dir) for name in read if name in initializers],
    )
    reduced = helper.make_model(graph, opset_imports=list(model.opset_import))
    reduced.ir_version = model.ir_version
    used = {(node.domain, node.op_type) for node in nodes}
    reduced.functions.extend(f for f in model.functions if (f.domain, f.name) in used)
    onnx.checker.check_model(reduced, full_check=True)
    return reduced, {name: np.asarray(known[name]) for name in inputs}


def _inline(tensor, base_dir: Path | None):
    """``tensor`` itself, or, where its data lies in an external file, a copy holding its data."""
    from onnx import TensorProto
    from onnx.external_data_helper import load_external_data_for_tensor

    if tensor.data_location != TensorProto.EXTERNAL:
        return tensor
    if base_dir is None:
        raise ValueError(f"initializer {tensor.name!r} lies in external data, and no folder to read it from was given")
    copy = TensorProto()
    copy.CopyFrom(tensor)
    try:
        load_external_data_for_tensor(copy, str(base_dir))
    except Exception as error:  # noqa: BLE001 - a missing or short data file
        raise ValueError(f"initializer {tensor.name!r}: its external data cannot be read ({error})") from None
    copy.data_location = TensorProto.DEFAULT
    del copy.external_data[:]
    return copy


class _Search:
    """One reduction's state: every candidate judged once, keyed by its output and node set."""

    def __init__(self, model, known, failing, tolerance_for, threads, result: Reduced, folder=None):
        self.model, self.known, self.failing, self.threads, self.folder = model, known, failing, threads, folder
        self.tolerance_for, self.result = tolerance_for, result
        self.producers = _producers(model)
        self.seen: dict[tuple, tuple | None] = {}
        self.errors: list[str] = []

    def nodes(self, output: str, cuts: set[str]) -> list[int]:
        return _needed(self.model, output, cuts, self.producers)

    def run(self, candidate, feed: dict, names: list[str]) -> dict:
        from parity.diagnose.graph.onnx_graph import run_tensors

        return run_tensors(self.failing, candidate, feed, names, self.threads, folder=self.folder)

    def compare(self, name: str, value) -> dict:
        return error_stats(np.asarray(value), np.asarray(self.known[name], np.float64), self.tolerance_for(name))

    def fails(self, output: str, cuts: set[str]) -> tuple | None:
        """``(candidate, feed, stats)`` when the subgraph fails on every sample at once, else None."""
        key = (output, frozenset(self.nodes(output, cuts)))
        if key not in self.seen:
            self.seen[key] = None
            try:
                candidate, feed = subgraph(self.model, output, cuts, self.known, base_dir=self.folder)
            except Exception:  # noqa: BLE001 - an input without a known value, or a candidate the checker refuses
                return None
            self.result.checks += 1
            try:
                stats = self.compare(output, self.run(candidate, feed, [output])[output])
            except Exception as error:  # noqa: BLE001 - a runtime that cannot run a candidate: not this failure
                self.errors.append(f"{type(error).__name__}: {' '.join(str(error).split())[:200]}")
                return None
            if not stats.get("ok", False):
                self.result.reproduced += 1
                self.seen[key] = (candidate, feed, stats)
        return self.seen[key]


def _boundaries(model, needed: list[int], known: dict) -> list[set[str]]:
    """For each node of ``needed`` (topological order) whose predecessors hand on only known tensors: the cut set
    that leaves that node and the ones after it (the boundary), earliest first."""
    nodes = model.graph.node
    last_use: dict[str, int] = {}
    for index in needed:
        for name in nodes[index].input:
            if name:
                last_use[name] = index
    produced: set[str] = set()
    found = []
    for index in needed:
        boundary = {name for name in produced if last_use.get(name, -1) >= index}
        if all(name in known for name in boundary):
            found.append(boundary)
        produced.update(name for name in nodes[index].output if name)
    return found


def _stop(result: Reduced, search: _Search, started: float, reason: str) -> Reduced:
    rate = f"it reproduced in {result.reproduced} of {result.checks} candidate checks"
    errors = search.errors and f"; the runtime refused {len(search.errors)} candidate(s), first: {search.errors[0]}"
    result.reason, result.seconds = f"{reason} ({rate}{errors or ''})", time.perf_counter() - started
    return result


def reduce(model, feed: dict, failing: str, known: dict, tolerance, threads: int = 1, folder=None) -> Reduced:
    """The smallest subgraph of ``model`` found that still fails on ``failing`` ("ort", "ort-noopt" or "onnxref")
    against ``known`` (see the module docstring), judged on all of ``feed`` (the whole input set) at once.
    ``tolerance``: a ``parity.model.spec.Tolerance``, or a function of the tensor name giving one. ``folder``: where
    the data files of a model read by ``parity.diagnose.graph.onnx_graph.load`` lie (each candidate holds the weights it
    reads)."""
    started = time.perf_counter()
    tolerance_for: Callable = tolerance if callable(tolerance) else (lambda name: tolerance)
    known = {**known, **feed}
    result = Reduced(None, failing=failing, nodes_before=len(model.graph.node))
    search = _Search(model, known, failing, tolerance_for, threads, result, folder)
    # 0. the whole graph, every known output judged
    outputs = [o.name for o in model.graph.output if o.name in known]
    if not outputs:
        return _stop(result, search, started, "no graph output has a known value to compare with")
    result.checks += 1
    try:
        whole = search.run(model, feed, outputs)
    except Exception as error:  # noqa: BLE001 - a graph the failing runtime cannot run is not a wrong answer
        return _stop(
            result,
            search,
            started,
            f"{failing} cannot run the whole graph: {type(error).__name__}: {' '.join(str(error).split())[:200]}",
        )
    bad = [
        name for name in outputs if name in search.producers and not search.compare(name, whole[name]).get("ok", False)
    ]
    if not bad:
        return _stop(
            result,
            search,
            started,
            f"the whole graph does not fail on {failing}: every output is within tolerance of the known values",
        )
    result.reproduced += 1
    target = min(bad, key=lambda name: search.producers.get(name, -1))
    # 1. the output side: the earliest known tensor upstream of the failing output whose subgraph fails
    upstream = {name for i in search.nodes(target, set()) for name in model.graph.node[i].output}
    order = sorted((t for t in known if t in upstream and t in search.producers), key=search.producers.__getitem__)
    if search.fails(target, set()) is None:
        return _stop(
            result,
            search,
            started,
            f"the failure stopped reproducing: output {target!r} fails when the "
            f"whole graph runs but not when only its own nodes run",
        )
    low, high = 0, order.index(target)
    while low < high:
        middle = (low + high) // 2
        if search.fails(order[middle], set()) is not None:
            high = middle
        else:
            low = middle + 1
    output = order[high]
    needed = search.nodes(output, set())
    result.steps.append(
        f"output side: {output!r}, the earliest of {len(order)} known tensors upstream of {target!r} "
        f"that fails ({len(needed)} nodes)"
    )
    # 2. the input side: the latest boundary that keeps the failure, bisected (the first boundary is no cut at all)
    bounds = _boundaries(model, needed, known)
    low, high = 0, len(bounds) - 1
    while low < high:
        middle = (low + high + 1) // 2
        if search.fails(output, bounds[middle]) is not None:
            low = middle
        else:
            high = middle - 1
    cuts = set(bounds[low])
    result.steps.append(
        f"input side: {len(search.nodes(output, cuts))} node(s) from "
        f"{', '.join(sorted(cuts)) or 'the graph inputs'} ({len(bounds)} boundaries with known values)"
    )
    # 3. node removal: each remaining node cut away where the rest still fails, latest first
    removed = 0
    for index in reversed(search.nodes(output, cuts)):
        kept = search.nodes(output, cuts)
        if index == search.producers[output] or index not in kept:
            continue
        handed = {name for name in model.graph.node[index].output if name}
        if search.fails(output, cuts | handed) is not None:
            cuts |= handed
            removed += 1
    result.steps.append(f"node removal: {removed} node(s) cut away where the rest still fails")
    found = search.fails(output, cuts)
    if found is None:  # every accepted step failed when it was judged; a runtime that stopped failing since
        return _stop(result, search, started, f"the failure stopped reproducing at {output!r}")
    # 4. shape arithmetic on the fixed input shapes folded into constants, kept only where the result still fails
    folded = _fold_shapes(found[0], found[1])
    if folded is not None:
        result.checks += 1
        try:
            stats = search.compare(output, search.run(folded, found[1], [output])[output])
        except Exception:  # noqa: BLE001 - a folded candidate the runtime refuses: keep the unfolded one
            stats = {"ok": True}
        if not stats.get("ok", False):
            result.reproduced += 1
            result.steps.append(
                f"shape folding: {len(found[0].graph.node) - len(folded.graph.node)} node(s) "
                f"computing shapes of the fixed inputs folded into constants"
            )
            found = (folded, found[1], stats)
    result.model, result.inputs, result.stats = found
    result.output, result.expected = output, np.asarray(known[output])
    result.nodes_after = len(result.model.graph.node)
    result.seconds = time.perf_counter() - started
    return result


def _fold_shapes(model, feed: dict):
    """``model`` with every node that computes only integers from constants and the static shapes of its tensors
    (``Shape``, then ``Gather``/``Concat``/... on the result) replaced by an initializer, checker-valid; None when
    nothing folds. Floating-point nodes are never folded: the fault is among them."""
    import onnx
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {name: np.asarray(value).shape for name, value in feed.items()}
    for info in inferred.graph.value_info:
        dims = info.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            shapes[info.name] = tuple(d.dim_value for d in dims)
    constants = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    kept, folded = [], []
    for node in model.graph.node:
        value: Any = None
        try:
            if node.op_type == "Shape" and node.input[0] in shapes:
                attrs = {a.name: a.i for a in node.attribute}
                value = [np.asarray(shapes[node.input[0]], np.int64)[attrs.get("start", 0) : attrs.get("end")]]
            elif node.input and all(i in constants for i in node.input if i) and node.domain in ("", "ai.onnx"):
                value = ReferenceEvaluator(node).run(None, {i: constants[i] for i in node.input if i})
        except Exception:  # noqa: BLE001 - a node the evaluator cannot take stays as it is
            value = None
        if value is None or not all(np.asarray(v).dtype.kind in "iub" for v in value):
            kept.append(node)
            continue
        constants.update({name: np.asarray(v) for name, v in zip(node.output, value)})
        folded.extend(node.output)
    if not folded:
        return None
    reads = {i for node in kept for i in node.input} | {o.name for o in model.graph.output}
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.graph.node[:]
    copy.graph.node.extend(kept)
    used = [
        numpy_helper.from_array(constants[name], name)
        for name in dict.fromkeys([*(i.name for i in model.graph.initializer), *folded])
        if name in reads
    ]
    del copy.graph.initializer[:]
    copy.graph.initializer.extend(used)
    try:
        onnx.checker.check_model(copy, full_check=True)
    except Exception:  # noqa: BLE001 - not a valid model after folding: keep the unfolded one
        return None
    return copy


def summary(result: Reduced) -> str:
    """One line: what the reduction found, or why it stopped."""
    if result.model is None:
        return f"no reduction: {result.reason}"
    ops = " -> ".join(node.op_type for node in result.model.graph.node)
    return (
        f"{result.failing} fails on {result.output!r} by {times(result.stats.get('tol_units', float('inf')))}: "
        f"{ops} ({result.nodes_before} nodes -> {result.nodes_after}, {result.checks} checks, "
        f"{result.seconds:.2f} s)"
    )
