"""The runtime link of an ONNX path: ONNX Runtime against the reference evaluator on every tensor of the graph, or
on the nodes of the one module where a descent found the drift beginning, both fed what the path computed at that
module's inputs, with a third opinion and node causes (``node_causes.judge``).

Imports onnx and onnxruntime inside; this module imports only the graph room.
"""

from __future__ import annotations

RUNTIMES = ("ort", "ort-noopt", "onnxref")  # the runtimes of the link's paths; OpenVINO reads an ONNX graph's taps too


def compare(
    model,
    feed: dict,
    expected: dict,
    tolerance_for,
    tol,
    threads: int,
    boundary: list[str],
    scope: dict | None = None,
    folder=None,
    values: dict | None = None,
) -> dict:
    """The runtime link, its verdict judged at the ``boundary`` tensors. ``scope`` (``{"nodes": [names], "output":
    tensor}``): only the nodes of the module where the drift begins, fed what the path computed at their inputs in
    the whole graph (``values``, by tensor, where the caller read them; else ONNX Runtime computes them), so both
    runtimes compute that module from the same values; the boundary is then its output. ``folder``: where the data
    files of a model read by ``onnx_graph.load`` lie."""
    from parity.diagnose.graph import onnx_graph
    from parity.diagnose.graph.node_causes import judge

    if scope is not None and set(scope["nodes"]) >= {node.name for node in model.graph.node}:
        scope = None  # the module is the whole graph (a one-node ONNX source): judged against the golden as such
    if scope is not None:
        model, feed = _scoped(model, feed, scope, threads, folder, values or {})
        folder = None  # the module's nodes hold their weights
        boundary = [scope["output"]]
    values_by_runtime: dict = {}
    compared = onnx_graph.compare_runtimes(model, feed, tol, threads, keep=values_by_runtime, folder=folder)
    if values_by_runtime:
        compared.update(
            judge(
                model,
                feed,
                values_by_runtime,
                compared["first_divergent"],
                expected if scope is None else None,
                tolerance_for,
                tol,
                threads,
                folder,
            )
        )
    compared["boundary_tensors"] = boundary
    if scope is not None:
        compared["scope"] = {"nodes": len(model.graph.node), "output": scope["output"]}
    return compared


def leaf_scope(tree: dict | None) -> dict | None:
    """The ``scope`` of the link in a descent's result (``{"nodes", "output"}``): the module where it found the drift
    beginning (a leaf, or a scope's own operations), where that module has nodes and an output tensor of its own."""
    leaf = (tree or {}).get("leaf") or {}
    if (tree or {}).get("verdict") not in ("leaf", "own_operations") or not (leaf.get("nodes") and leaf.get("tensor")):
        return None
    return {"nodes": [name for name, _ in leaf["nodes"]], "output": leaf["tensor"]}


def _scoped(model, feed: dict, scope: dict, threads: int, folder, values: dict):
    """The subgraph of ``scope``'s nodes that computes its output from what they read outside it, and that feed:
    ``values`` where they hold every tensor it needs, else as ONNX Runtime computes them in the whole graph (the
    subgraph holds the weights it reads, also from a data file)."""
    from parity.diagnose.graph import onnx_graph
    from parity.diagnose.graph.reduce import subgraph

    names = set(scope["nodes"])
    read = onnx_graph.outside_inputs(model, [n for n in model.graph.node if n.name in names])
    wanted = [*read, scope["output"]]
    if all(t in values or t in feed for t in wanted):
        values = {t: values[t] for t in wanted if t in values}
    else:
        values = onnx_graph.run_tensors("ort", model, feed, wanted, threads, folder=folder)
    values.update({name: feed[name] for name in read if name in feed})
    return subgraph(model, scope["output"], set(read), values, base_dir=folder)
