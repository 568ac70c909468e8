"""One level of a model's tree inside its exported ONNX graph: where each module path's nodes are, their boundary
tensors, and their values on the path's runtime.

A module's nodes are those the exporter recorded under its path (``parity.diagnose.graph.onnx_taps``: torch.onnx
metadata, tf2onnx names), else its tensor is found by value. A module called more than once has the nodes of every
call under one path: its first call is the first connected group of them, used when the groups are as many as the
calls (else the module is reported unmapped, with why). An ONNX file as the source is read by its own tree's
rules (``onnx_tree.locate``: the same scopes, or tensors, in the path's copy of the file). The module's input
tensor is the tensor its nodes read from outside whose size is the input's on the reference side. Reading a tensor must
not change what is read: where marking the level's tensors as outputs changes the plain run's outputs, the tensors are
bisected to the largest set that does not (``parity.diagnose.graph.instrument``) and the others are reported
unobservable.

A descent opens one instrumented session, not one per level, and shares it with the diagnosis's taps collection in
the same worker (``graph_levels``): the graph's scopes are known up front (the exporter's records), so the first
level's run also marks as outputs the boundary and input tensors of every scope, the
shallowest first (in a graph without records, where modules are found by value: every tensor), up to
``AHEAD_BYTES`` of values; where those extra outputs change the plain run's outputs, that
run is dropped and each level marks only its own tensors. A graph whose weights lie in a data file is read without
them (``onnx_graph.load``). Imports onnx inside.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from parity.diagnose.graph import axis_order, instrument, mapping_check, onnx_graph, onnx_taps
from parity.diagnose.tree import onnx_tree

INPUT_MATCH = 1e-3  # a module's input found by value agrees with the reference's to this relative L2 error
AHEAD_BYTES = 1 << 30  # the values of every scope's tensors read by a descent's first run: at most this many bytes


class LevelTaps:
    """A level's children as ``onnx_taps.map_taps`` reads a spec: names in network order, each read from the one
    before it."""

    def __init__(self, spec, names):
        self.taps = tuple(names)
        self.model_inputs = spec.model_inputs

    def layer_inputs(self, tap: str) -> tuple[str, ...]:
        index = self.taps.index(tap)
        return (self.taps[index - 1],) if index else ("input",)


class GraphLevels:
    """A path's exported graph, loaded and pinned to the golden feed's sizes once, and its plain run's outputs
    (``plain``, by the spec's output names: those the diagnosis's taps collection ran, so the run is not repeated);
    each ``level`` call observes one level's module paths in it."""

    def __init__(self, spec, path, artifact_dir, meta, x, threads, plain: dict | None = None):
        from parity.runtimes.onnx_common import onnx_feed

        self.spec, self.path, self.meta, self.threads = spec, path, meta, threads
        self.feed = onnx_feed(spec, meta, x)
        file = Path(artifact_dir) / meta["file"]
        model, self.folder = onnx_graph.load(file)
        self.model = onnx_graph.pinned(model, self.feed, in_place=True)
        self.graph = onnx_graph._Graph(self.model)
        self.outputs = list(meta["output_names"])
        self.exporter = next(e.name for e in reversed(path.exports) if e.name != "float16")
        self.runs = 0  # the runs of the graph so far (sessions opened), the plain one included
        # the file's bytes, each run's outputs appended to them (``onnx_graph.run_tensors``): ONNX Runtime only
        self.data = file.read_bytes() if path.runtime.name.startswith("ort") else None
        by_name = dict(zip(self.outputs, spec.outputs))
        if plain is not None and all(by_name.get(name) in plain for name in self.outputs):
            self.plain = {name: np.asarray(plain[by_name[name]]) for name in self.outputs}  # the taps' own plain run
        else:
            self.plain = self.run(self.outputs)
        self.held: dict = {}  # tensor -> its value, read by runs that left the outputs as the plain run has them
        self.ahead = scope_tensors(self.model, self.graph, self.exporter)  # read with the first level's tensors

    def run(self, tensors):
        self.runs += 1
        return onnx_graph.run_tensors(
            self.path.runtime.name,
            self.model,
            self.feed,
            tensors,
            self.threads,
            self.graph.infos,
            self.folder,
            self.data,
        )

    def observe(self, tensors, tolerance_for) -> dict | None:
        """The plain outputs and ``tensors``' values, each tensor read once per descent (the graph and the feed do
        not change between levels; a graph input is the feed's): those not read yet by one run with the outputs
        (the first such run reads every scope's tensors too, see the module docstring); None where that run changes
        the outputs (the caller reads them its own way)."""
        missing = [
            t for t in dict.fromkeys(tensors) if t not in self.held and t not in self.plain and t not in self.feed
        ]
        if missing:
            wanted = set(missing)
            ahead = [t for t in self.ahead if t not in wanted and t not in self.held and t not in self.plain]
            self.ahead = []
            values = self.run([*self.outputs, *missing, *ahead]) if ahead else None
            if values is not None and instrument.same_outputs(self.plain, values, tolerance_for):
                self.held.update({t: values[t] for t in (*missing, *ahead) if t in values})
            else:
                values = self.run([*self.outputs, *missing])
                if not instrument.same_outputs(self.plain, values, tolerance_for):
                    return None
                self.held.update({t: values[t] for t in missing if t in values})
        known = {**self.feed, **self.held}
        return {**{t: known[t] for t in tensors if t in known}, **self.plain}

    def level(self, names, calls, expected, expected_inputs) -> dict:
        """``{"values", "inputs", "located", "instrumentation"}`` for the module paths ``names`` (network order);
        ``expected`` / ``expected_inputs``: the reference's values and inputs (shapes, layouts, value fallback)."""
        return _level(self, names, calls, expected, expected_inputs)


def graph_levels(spec, path, artifact_dir, meta, x, threads, plain: dict | None = None) -> GraphLevels:
    """``GraphLevels`` of the path's graph, kept by the worker for the next task of the same diagnosis (``parity.run.
    kept``): the taps collection's instrumented run then also reads the descent's tensors, and the descent in the
    same worker runs the graph no more. Kept for the file as it is on disk (its size and modification time), the
    path and its precision, the threads, the feed and the tolerances the runs are judged at."""
    import hashlib
    import json

    from parity.run import kept

    file = Path(artifact_dir) / meta["file"]
    stat = file.stat()
    digest = hashlib.sha256()
    for name in sorted(x):
        digest.update(name.encode() + np.ascontiguousarray(x[name]).tobytes())
    tolerances = json.dumps(spec.output_tolerances(path.precision).to_json(), sort_keys=True)
    on_disk = (str(file.resolve()), stat.st_size, stat.st_mtime_ns)
    key = (*on_disk, spec.name, path.id, path.device, path.precision, threads, digest.hexdigest(), tolerances)
    return kept.kept("graph-levels", key, lambda: GraphLevels(spec, path, artifact_dir, meta, x, threads, plain))


def scope_tensors(model, graph, exporter: str, budget: int = AHEAD_BYTES) -> list[str]:
    """The boundary outputs and the float tensors read from outside of every scope the exporter recorded
    (``onnx_tree.node_scopes``: torch.onnx's module paths, tf2onnx's or an ONNX file's name scopes), the
    shallowest scopes first, as many as fit ``budget`` bytes of values (a tensor of unknown size is left out).
    A graph without such records (jax2onnx's) has its modules found by value among every tensor of their shapes,
    level after level: every float tensor of the graph, in its order, as many as fit."""
    kind = onnx_taps._scope_kind(exporter)
    kind = {"metadata": onnx_tree.METADATA, "name": onnx_tree.NAMES}.get(kind or "")
    if kind is None and exporter == "onnx file":
        kind = onnx_tree.scope_kind(graph)
    if kind in (None, onnx_tree.FLAT):
        return _fitting(graph, graph.names, budget)
    scopes: dict[str, list[int]] = {}
    depth: dict[str, int] = {}
    for index, node in enumerate(graph.nodes):
        for level, scope in enumerate(onnx_tree.node_scopes(node, kind)):
            scopes.setdefault(scope, []).append(index)
            depth.setdefault(scope, level)
    wanted: dict[str, None] = {}
    for scope in sorted(scopes, key=lambda s: (depth[s], scopes[s][0])):
        nodes = scopes[scope]
        reads = onnx_graph.outside_inputs(model, [graph.nodes[i] for i in nodes])
        wanted.update(
            dict.fromkeys((*onnx_taps._boundary_outputs(graph, nodes), *(t for t in reads if t in graph.position)))
        )
    return _fitting(graph, wanted, budget)


def _fitting(graph, tensors, budget: int) -> list[str]:
    """The first of ``tensors`` whose values fit ``budget`` bytes together (a tensor of unknown size is left out)."""
    from onnx import helper

    chosen, total = [], 0
    for tensor in tensors:
        shape, info = graph.shapes.get(tensor), graph.infos.get(tensor)
        if shape is None or info is None:
            continue
        size = int(np.prod(shape)) * helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type).itemsize
        if total + size > budget:
            break
        chosen.append(tensor)
        total += size
    return chosen


def _level(levels: GraphLevels, names, calls, expected, expected_inputs) -> dict:
    spec, path, meta, model, graph = levels.spec, levels.path, levels.meta, levels.model, levels.graph
    outputs, exporter, run, plain = levels.outputs, levels.exporter, levels.run, levels.plain
    taps = LevelTaps(spec, names)
    tolerances = spec.output_tolerances(path.precision)
    by_graph_name = dict(zip(outputs, spec.outputs))

    def tolerance_for(name):
        return tolerances.for_name(by_graph_name.get(name, name))

    scoped, guessed = None, {}  # type: dict | None, dict
    if exporter == "onnx file":  # an ONNX source: the scopes (or tensors) of its own tree, by its rules
        mapped, scoped = onnx_tree.locate(model, graph, names)
    else:
        if onnx_taps._scope_kind(exporter) is None:  # no records of the source: one run of every candidate tensor
            # of a module's output's shape or of its input's (found by value too, where no sibling has its shape)
            shapes = {**{f"{n} input": v for n, v in expected_inputs.items()}, **expected}
            candidates = onnx_taps.candidate_names(model, taps, shapes, meta["input_layout"], graph)
            seen = levels.observe(candidates, tolerance_for)
            guessed = {t: seen[t] for t in candidates if t in seen} if seen is not None else run(candidates)
        mapped = onnx_taps.map_taps(model, taps, exporter, expected, guessed, meta["input_layout"], graph)
    located = {}
    for name in names:
        where = {**mapped[name], "found": mapped[name]["how"]}
        if scoped is not None:
            nodes = scoped.get(name, []) if where["tensor"] else []
        elif where["how"] in ("metadata", "name"):
            nodes = _first_call(graph, name, calls.get(name, 1), exporter)
        else:
            nodes = []
        if where["found"] == "value" and name in expected_inputs:  # no records: the input by value too
            by_value = _input_by_value(graph, guessed, where, expected_inputs[name])
            if by_value:
                where["input_tensor"], nodes = by_value, _between(model, by_value, where["tensor"])
        if nodes is None:
            where.update(
                found="unmapped",
                tensor=None,
                reason=f"called {calls[name]} times, and its nodes do not fall into as many groups",
            )
            nodes = []
        elif nodes and calls.get(name, 1) > 1:
            where["tensor"] = onnx_taps._pick_boundary(
                graph, onnx_taps._boundary_outputs(graph, nodes), expected.get(name)
            )
        where["nodes"] = [[graph.nodes[i].name, graph.nodes[i].op_type] for i in nodes]
        where["feeds_outputs"] = mapping_check.feeds_outputs(graph, where.get("tensor"))
        where["input_tensor"] = where.get("input_tensor") or _input_tensor(
            model, graph, nodes, expected_inputs.get(name)
        )
        located[name] = where
    tensors = {n: w["tensor"] for n, w in located.items() if w.get("tensor") and w["found"] != "fused"}
    inputs = {n: w["input_tensor"] for n, w in located.items() if w.get("input_tensor")}
    wanted = [*outputs, *tensors.values(), *inputs.values()]
    values = levels.observe(wanted, tolerance_for)
    if values is None:
        values = run(wanted)
    instrumentation = None
    if not instrument.same_outputs(plain, values, tolerance_for):
        seen = instrument.observe(
            run, plain, {**tensors, **{f"{n} input": t for n, t in inputs.items()}}, tolerance_for
        )
        values = seen["values"]
        instrumentation = {"observable": seen["observable"], "disturbing": seen["disturbing"], "runs": seen["runs"]}
        for item in seen["disturbing"]:
            name = item["tap"].removesuffix(" input")
            if item["tap"] == name:
                located[name].update(
                    found="unobservable", reason=f"marking {item['tensor']!r} as a graph output changes the outputs"
                )
            else:
                located[name]["input_tensor"] = None
    found, found_inputs = {}, {}
    for name, where in located.items():
        if where["found"] in ("fused", "unmapped", "unobservable") or where.get("tensor") not in values:
            continue
        try:
            found[name] = mapping_check.settle(values[where["tensor"]], where, expected[name], tolerance_for(name))
        except ValueError as error:
            where.update(found="unmapped", reason=str(error))
            continue
        tensor = where.get("input_tensor")
        if isinstance(tensor, str) and tensor in values and name in expected_inputs:
            read = _input_location(levels, where, tensor, np.shape(values[tensor]), expected_inputs[name])
            try:
                found_inputs[name] = mapping_check.settle(
                    values[tensor], read, expected_inputs[name], tolerance_for(name)
                )
            except ValueError:
                where["input_tensor"] = None
            else:
                if read.get("order"):  # the order settled or proven: a reproducer cuts there in the graph's own
                    where["input_order"] = read["order"]
    for where in located.values():
        where.pop("how", None)
    return {"values": found, "inputs": found_inputs, "located": located, "instrumentation": instrumentation}


def _input_location(levels: GraphLevels, where: dict, tensor: str, shape: tuple, expected: np.ndarray) -> dict:
    """How to read a module's input ``tensor`` (its value of ``shape``): in the axis order the graph's structure
    proves, else in its output's layout, proven by value where its shape permutes the reference input's."""
    canonical = levels.spec.model_inputs[0].layout
    orders = axis_order.axis_orders(levels.model, levels.graph, levels.meta["input_layout"], canonical)
    order = orders.get(tensor)
    proven = order and axis_order.to_golden(order, shape, expected.shape)
    if proven:
        return {"tensor": tensor, "order": list(proven)}
    layout = where["layout"] if len(shape) == expected.ndim == 4 else None
    unproven = onnx_taps._permutes(shape, expected.shape)
    return {"tensor": tensor, "layout": layout, "unproven": unproven or where.get("unproven", False)}


def _input_by_value(graph, values: dict, where: dict, expected_input: np.ndarray) -> str | None:
    """Where a module was found by value: the tensor before its output, of its input's size, closest to the
    reference's input (relative L2 error at most ``INPUT_MATCH``; the latest of equals), or None."""
    end = graph.position.get(where["tensor"])
    if end is None:
        return None
    best, target = None, np.asarray(expected_input, np.float64)
    scale = float(np.sqrt(np.sum(np.square(target)))) or 1.0
    for name in graph.names[:end]:
        value = values.get(name)
        if value is None or np.asarray(value).size != target.size:
            continue
        try:
            canonical = onnx_taps.to_canonical(value, {"layout": where.get("layout"), "tensor": name}, target.shape)
        except ValueError:
            continue
        error = float(np.sqrt(np.sum(np.square(canonical.astype(np.float64) - target)))) / scale
        if error <= INPUT_MATCH and (best is None or error <= best[1]):
            best = (name, error)
    return best and best[0]


def _between(model, start: str, end: str) -> list[int]:
    """The nodes that compute ``end`` from ``start`` and weights alone (a module found by value, as its nodes); none
    where ``end`` also reads something else the graph computes (its nodes cannot be told from others')."""
    from parity.diagnose.graph.reduce import _needed

    nodes = _needed(model, end, {start})
    inside = {t for i in nodes for t in model.graph.node[i].output} | {start}
    weights = {i.name for i in model.graph.initializer}
    reads = {t for i in nodes for t in model.graph.node[i].input if t}
    return nodes if reads <= inside | weights else []


def _first_call(graph, name: str, calls: int, exporter: str) -> list[int] | None:
    """The node indices of ``name``'s first call (all its nodes when it is called once); None when a module called
    more than once does not split into as many connected groups."""
    kind = onnx_taps._scope_kind(exporter)
    nodes = onnx_taps._scopes(graph, (name,), kind).get(name, [])
    if calls <= 1 or not nodes:
        return nodes
    groups = _components(graph, nodes)
    return groups[0] if len(groups) == calls else None


def _components(graph, nodes: list[int]) -> list[list[int]]:
    """``nodes`` in groups connected by the tensors one hands another, the earliest group first."""
    return components(nodes, lambda i: (r for t in graph.nodes[i].output for r in graph.consumers.get(t, ())))


def components(nodes: list[int], readers) -> list[list[int]]:
    """``nodes`` (indices in execution order) in groups connected by what one hands another (``readers(node)``: the
    nodes that read its outputs), the earliest group first."""
    inside = set(nodes)
    parent = {i: i for i in nodes}

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for index in nodes:
        for reader in readers(index):
            if reader in inside:
                parent[find(reader)] = find(index)
    groups: dict[int, list[int]] = {}
    for index in nodes:
        groups.setdefault(find(index), []).append(index)
    return sorted(groups.values(), key=min)


def _input_tensor(model, graph, nodes: list[int], expected_input: np.ndarray | None) -> str | None:
    """The tensor ``nodes`` read from outside (a graph input or another node's output, not a weight) that can hold
    the reference's input of the module (by size), the first such in the order the nodes read them."""
    if not nodes or expected_input is None:
        return None
    graph_inputs = {i.name: i for i in model.graph.input}
    for tensor in onnx_graph.outside_inputs(model, [graph.nodes[i] for i in nodes]):
        info = graph_inputs.get(tensor)
        shape = (
            graph.shapes.get(tensor)
            if tensor in graph.position
            else (onnx_graph._static_shape(info) if info is not None else None)
        )
        if shape is not None and int(np.prod(shape)) == expected_input.size:
            return tensor
    return None
