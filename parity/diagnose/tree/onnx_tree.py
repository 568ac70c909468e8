"""An ONNX file's own tree, one level at a time, when the file is the source: the scopes a scope holds, in the order
their first node runs, and their values under ``onnx.reference`` in the golden's dtype.

The tree is the exporter's record of where each node came from, read from the file alone: torch.onnx's
``pkg.torch.onnx.name_scopes`` metadata (module paths, ``blocks.5.norm``), else node names that are ``/``-separated
scopes (the legacy torch exporter's ``/encoder/layer.0/attention/MatMul``, tf2onnx's ``model/dense/MatMul``; the last
component names the op). A file with neither is flat: the children of the root are its nodes' float outputs in
topological order, each a leaf. A scope's children are the scopes one level below it (a ``ModuleList`` never called
is skipped, as torch.onnx records it); a scope with none is a leaf. A scope's value is its boundary output
(``onnx_taps._boundary_outputs``, the last in topological order), its input the first float tensor its nodes read
from outside (not a weight). The path's side (``graph_tree``) finds the same tensors in its copy of the file by the
same rules (``locate``). Imports onnx inside.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from parity.diagnose.graph import onnx_graph, onnx_taps

METADATA, NAMES, FLAT = "metadata", "names", "flat"


def node_scopes(node, kind: str) -> list[str]:
    """The scopes ``node`` was computed under, outermost first (the root and the op's own name left out)."""
    if kind == METADATA:
        return onnx_taps.torch_module_paths(node)
    if kind == NAMES:
        parts = [p for p in node.name.strip("/").split("/")[:-1] if p]
        return ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return []


def scope_kind(graph) -> str:
    """How the file records its tree: ``metadata``, ``names`` or ``flat`` (see the module docstring)."""
    for kind in (METADATA, NAMES):
        if any(node_scopes(node, kind) for node in graph.nodes):
            return kind
    return FLAT


def children(graph, kind: str, scope: str) -> list[tuple[str, list[int], bool]]:
    """``[(path, node indices, leaf)]`` one level below ``scope`` (``''``: the root), in the order of their first
    node; a flat graph's root has its float node outputs as leaves (each with its producer)."""
    if kind == FLAT:
        return [] if scope else [(name, [graph.producer[name]], True) for name in graph.names]
    found: dict[str, list[int]] = {}
    deeper: set[str] = set()
    for index, node in enumerate(graph.nodes):
        scopes = node_scopes(node, kind)
        if scope:
            if scope not in scopes:
                continue
            scopes = scopes[scopes.index(scope) + 1 :]
        if scopes:
            found.setdefault(scopes[0], []).append(index)
            if len(scopes) > 1:
                deeper.add(scopes[0])
    return [(path, nodes, path not in deeper) for path, nodes in found.items()]


def nodes_of(graph, kind: str, names) -> dict[str, list[int]]:
    """The node indices under each of ``names`` (scope paths, or a flat graph's tensors: their producer)."""
    if kind == FLAT:
        return {name: [graph.producer[name]] for name in names if name in graph.position}
    wanted = set(names)
    found: dict[str, list[int]] = {}
    for index, node in enumerate(graph.nodes):
        for scope in node_scopes(node, kind):
            if scope in wanted:
                found.setdefault(scope, []).append(index)
    return found


def boundary(graph, kind: str, name: str, nodes: list[int]) -> str | None:
    """The tensor that holds ``name``'s value: a flat graph's tensor itself, else its scope's boundary output."""
    if kind == FLAT:
        return name
    outputs = onnx_taps._boundary_outputs(graph, nodes)
    return onnx_taps._pick_boundary(graph, outputs, None) if outputs else None


def input_of(model, graph, nodes: list[int]) -> str | None:
    """The first float tensor ``nodes`` read from outside themselves that is not a weight (a graph input or another
    node's output)."""
    floats = {i.name for i in model.graph.input if i.type.tensor_type.elem_type in onnx_graph._float_types()}
    return next(
        (
            t
            for t in onnx_graph.outside_inputs(model, [graph.nodes[i] for i in nodes])
            if t in graph.position or t in floats
        ),
        None,
    )


def locate(model, graph, names) -> tuple[dict, dict]:
    """The path's side of a level of an ONNX source (``graph_tree``): ``({name: onnx_taps.map_taps entry},
    {name: node indices})`` for the reference side's ``names``, by the rules that chose them."""
    kind = scope_kind(graph)
    found = nodes_of(graph, kind, names)
    mapped = {}
    for name in names:
        tensor = boundary(graph, kind, name, found[name]) if name in found else None
        how = "name" if kind == FLAT else kind
        reason = (
            None
            if tensor
            else (
                f"the file has no {'tensor' if kind == FLAT else 'scope'} {name!r}"
                if name not in found
                else "its nodes feed nothing outside the scope"
            )
        )
        mapped[name] = {
            "tensor": tensor,
            "how": how if tensor else "unmapped",
            "fused_into": None,
            "layout": None,
            "reason": reason,
        }
    return mapped, found


class OnnxReference:
    """The source ONNX file under ``onnx.reference`` in ``dtype`` (its float64 copy, ``onnx_file.to_float64``, for a
    float64 golden), built once, and its tree read from the file pinned to the golden feed's sizes; every tensor of
    the one run on the golden feed is kept for the levels that read them."""

    def __init__(self, spec, dtype: str, x: dict):
        import onnx  # noqa: F401 - onnx.reference below needs it
        from onnx.reference import ReferenceEvaluator

        from parity.interop import onnx_file as onnx_source
        from parity.model import values

        if spec.containers:
            raise ValueError("the tree of an ONNX file with sequence or optional inputs or outputs is not read")
        self.spec = spec
        self.model = onnx_source.load_checked(spec.onnx_model_path)
        computing = onnx_source.to_float64(self.model) if dtype == "float64" else self.model
        declared = {i.name: i.type for i in computing.graph.input}
        feed = values.typed_inputs(spec, x)
        self.feed = {
            name: onnx_source._cast(value, declared[name]) if name in declared else value
            for name, value in feed.items()
        }
        self.graph = onnx_graph._Graph(onnx_graph.pinned(self.model, feed))
        self.kind = scope_kind(self.graph)
        self.evaluator = ReferenceEvaluator(computing, new_ops=onnx_source._deprecated_ops())
        self._results: Any = None  # ReferenceEvaluator's intermediate results: {name: value}

    def results(self) -> dict:
        """Every tensor of the run on the golden feed, by name (computed at the first call)."""
        if self._results is None:
            self._results = self.evaluator.run(None, self.feed, intermediate=True)
        return self._results


def level_of(runner: OnnxReference, x: dict, scope: str, names: list[str] | None = None) -> dict:
    """``torch_tree.level``'s contract for an ONNX source: ``{"children", "values", "inputs", "outputs", "masks"}``
    under ``scope`` (or at ``names``), values as float64 arrays keyed by scope path (``x``: the golden feed the
    runner was built on)."""
    graph, kind = runner.graph, runner.kind
    if names is None:
        level = children(graph, kind, scope)
    else:
        found = nodes_of(graph, kind, names)
        level = [(name, found[name], True) for name in names if name in found]
    results = runner.results()
    found_children, found_values, found_inputs = [], {}, {}
    for path, nodes, leaf in level:
        tensor = boundary(graph, kind, path, nodes)
        value = results.get(tensor) if tensor else None
        has_value = isinstance(value, np.ndarray) and value.dtype.kind == "f"
        if has_value:
            found_values[path] = np.asarray(value, np.float64)
        source = input_of(runner.model, graph, nodes)
        read = results.get(source) if source else None
        if isinstance(read, np.ndarray) and read.dtype.kind == "f":
            found_inputs[path] = np.asarray(read, np.float64)
        node = graph.nodes[nodes[0]]
        read_from_outside = {t for t in node.input if t and (t in graph.position or t in runner.feed)}
        found_children.append(
            {
                "path": path,
                "class": node.op_type if kind == FLAT else "scope",
                "calls": 1,
                "leaf": leaf,
                "kind": None,
                "attrs": None,
                "single_input": kind == FLAT and len(read_from_outside) == 1,
                "has_value": has_value,
            }
        )
    outputs = {name: np.asarray(results[name]) for name in runner.spec.outputs if name in results}
    return {"children": found_children, "values": found_values, "inputs": found_inputs, "outputs": outputs, "masks": {}}
