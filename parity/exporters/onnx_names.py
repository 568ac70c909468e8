"""The names of an exported ONNX graph's inputs and outputs, and the checker every ONNX export passes.

Exporters name a graph's outputs by the spec's output names (a dict's keys). A key may be a name the graph
already gives an inner tensor (a torch ``nn.Embedding`` called ``embedding`` writes a tensor ``embedding``; the
model returns ``{"embedding": norm(h)}``): a plain rename then leaves two definitions of one name, which
onnx.reference reads past and ONNX Runtime refuses. ``name_graph`` renames so that never happens: the inner
tensor that holds a wanted name moves to a fresh name first, and an output that cannot be renamed in place (a
graph input passed through, a weight, one tensor returned under two names) is written by an ``Identity``.
"""

from __future__ import annotations

from pathlib import Path

from parity.platform.errors import ExportError, one_line

CHECKER_CHARS = 300  # a checker message is one line of at most this many characters


def name_graph(model, inputs: list[str] | None = None, outputs: list[str] | None = None) -> None:
    """Name ``model``'s graph inputs (those that are not initializers, in graph order) ``inputs`` and its graph
    outputs ``outputs`` (in graph order), in place, without two tensors ever sharing a name.

    Raises ``ExportError`` where the names themselves cannot all be given: more or fewer names than the graph
    has inputs or outputs, one name given twice, or an input and an output under one name."""
    graph = model.graph
    wanted_inputs = list(inputs) if inputs is not None else None
    wanted_outputs = list(outputs) if outputs is not None else None
    _check_wanted(graph, wanted_inputs, wanted_outputs)
    used = _all_names(graph)
    if wanted_inputs is not None:
        initializers = _initializer_names(graph)
        for position, new in enumerate(wanted_inputs):
            current = [i.name for i in graph.input if i.name not in initializers][position]
            if current == new:
                continue
            _free(graph, new, keep=current, used=used, inputs_movable=True)
            _rename(graph, current, new)
            used.add(new)
    if wanted_outputs is not None:
        for position, new in enumerate(wanted_outputs):
            current = graph.output[position].name
            listed = [o.name for o in graph.output].count(current)
            if current == new and listed == 1:
                continue
            _free(graph, new, keep=current, used=used)
            if listed == 1 and current in _produced(graph):
                _rename(graph, current, new)
            else:  # a graph input, a weight, or one tensor under several output names: copied by an Identity
                _identity(model, current, new, graph.output[position])
            used.add(new)


def free_names(model, names) -> list[str]:
    """Move every tensor of ``model`` called one of ``names`` (names a converter is about to create) to a fresh name,
    in place, so the converter's new tensors cannot collide with it; graph inputs and outputs keep their names.
    Returns the names that were moved."""
    graph = model.graph
    io = {v.name for v in (*graph.input, *graph.output)}
    used = _all_names(graph)
    moved = sorted(set(names) & used - io)
    for name in moved:
        fresh = _fresh(name, used)
        _rename(graph, name, fresh)
        used.add(fresh)
    return moved


def detach_outputs(model) -> list[str]:
    """Give every graph output that a node also reads an ``Identity`` of its own, in place: the nodes read the tensor
    under a fresh name and the output is its copy. A converter that casts at the graph's edges (the float16
    conversion's ``keep_io_types``) then casts the copy, not the value inner nodes read (onnxconverter-common 1.16
    hands BERT's pooler the float32 cast of ``last_hidden_state`` inside a float16 graph). Returns the outputs."""
    graph = model.graph
    read = {name for g in _graphs(graph) for node in g.node for name in node.input}
    produced = _produced(graph)
    detached = [o.name for o in graph.output if o.name in read and o.name in produced]
    used = _all_names(graph)
    for name in detached:
        inner = _fresh(name, used)
        used.add(inner)
        _rename(graph, name, inner)
        output = next(o for o in graph.output if o.name == inner)
        _identity(model, inner, name, output)
    return detached


def check_exported(path) -> None:
    """The full ONNX checker (``full_check``: types and shapes too) on the exported ONNX file at ``path``. A model it
    refuses is the converter's failure, never the runtime's: raised as ``ExportError`` with the checker's own message
    in one line (the caller names the converter)."""
    import onnx

    try:
        onnx.checker.check_model(str(Path(path)), full_check=True)
    except Exception as error:  # noqa: BLE001 - the checker's reason is the export's reason
        message = one_line(str(error).strip() or type(error).__name__, CHECKER_CHARS)
        raise ExportError(f"the exported ONNX model fails the ONNX checker: {message}") from None


def _check_wanted(graph, inputs: list[str] | None, outputs: list[str] | None) -> None:
    initializers = _initializer_names(graph)
    graph_inputs = [i.name for i in graph.input if i.name not in initializers]
    for what, wanted, have in (("inputs", inputs, len(graph_inputs)), ("outputs", outputs, len(graph.output))):
        if wanted is None:
            continue
        if len(wanted) != have:
            raise ExportError(
                f"the exported graph has {have} {what}; the spec names {len(wanted)} ({', '.join(wanted)})"
            )
        twice = sorted({name for name in wanted if wanted.count(name) > 1})
        if twice:
            raise ExportError(f"the spec names two {what} {twice[0]!r}")
    both = sorted(set(inputs or ()) & set(outputs or ()))
    if both:
        raise ExportError(f"the spec names an input and an output {both[0]!r}: an ONNX graph cannot hold both")


def _initializer_names(graph) -> set[str]:
    return {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}


def _graphs(graph):
    """``graph`` and every subgraph its nodes hold (an ``If``'s branches, a ``Loop``'s body), at any depth."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            for sub in (*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs):
                yield from _graphs(sub)


def _all_names(graph) -> set[str]:
    """Every value name in ``graph`` and its subgraphs (subgraphs share the outer graph's names)."""
    names: set[str] = set()
    for g in _graphs(graph):
        names |= {v.name for v in (*g.input, *g.output, *g.value_info)}
        names |= _initializer_names(g)
        for node in g.node:
            names |= set(node.input) | set(node.output)
    names.discard("")
    return names


def _produced(graph) -> set[str]:
    """The names a node of the top-level graph writes."""
    return {name for node in graph.node for name in node.output if name}


def _free(graph, name: str, keep: str, used: set[str], inputs_movable: bool = False) -> None:
    """Move the tensor called ``name`` (when there is one, and it is not ``keep``) to a fresh name; a graph input
    moves only while the inputs are being named (the spec names them all)."""
    if name == keep or name not in used:
        return
    if not inputs_movable and name in {i.name for i in graph.input if i.name not in _initializer_names(graph)}:
        raise ExportError(f"the output name {name!r} is the name of one of the graph's inputs")
    fresh = _fresh(name, used)
    _rename(graph, name, fresh)
    used.add(fresh)


def _fresh(name: str, used: set[str]) -> str:
    k = 1
    while f"{name}_{k}" in used:
        k += 1
    return f"{name}_{k}"


def _rename(graph, old: str, new: str) -> None:
    """Rename the value ``old`` to ``new`` wherever ``graph`` and its subgraphs define, read or declare it."""
    for g in _graphs(graph):
        for value in (*g.input, *g.output, *g.value_info):
            if value.name == old:
                value.name = new
        for tensor in (*g.initializer, *(t.values for t in g.sparse_initializer)):
            if tensor.name == old:
                tensor.name = new
        for node in g.node:
            for k, name in enumerate(node.input):
                if name == old:
                    node.input[k] = new
            for k, name in enumerate(node.output):
                if name == old:
                    node.output[k] = new


def _identity(model, source: str, new: str, output) -> None:
    """``new`` as a copy of ``source`` by an ``Identity`` node, and the graph output ``output`` renamed to it."""
    import onnx

    node_names = {node.name for node in model.graph.node}
    node_name = _fresh(f"{new}_identity", node_names) if f"{new}_identity" in node_names else f"{new}_identity"
    model.graph.node.append(onnx.helper.make_node("Identity", [source], [new], name=node_name))
    output.name = new
