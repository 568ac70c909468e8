"""A diagnosis's drift as Google Model Explorer node data (``ai-edge-model-explorer``'s ``node_data_builder`` JSON).

Per diagnosed path whose graph Model Explorer reads (an exported ONNX file, a ``.tflite`` file), in a folder of its
own: the graph (``model.onnx`` without external data, which the ONNX adapter does not read; ``model.tflite``),
hard-linked from the export cache where it is on the same file system (else copied); ``drift.json``, each compared
tensor's drift on the node that outputs it; and ``modules.json``, each module's drift on every node the descent
located for it (the innermost compared module's, where modules nest). ONNX keys are the node ids the ONNX adapter
(``model-explorer-onnx``) gives the graph; TFLite keys are tensor names, which the built-in TFLite adapter matches
against each node's ``tensor_name`` output metadata. A value is the error of a tensor in units of its tolerance
(``tol_units``): green within half the tolerance, amber within it, red over it; a non-finite error is written as the
largest float (JSON has no infinity), red too.

The format is written here, not through the package: parity does not depend on it. ``graph_ids`` runs in a worker
(it loads the graph with ``onnx`` and ``onnx_ir``); the rest is plain JSON.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

from parity.platform.errors import one_line
from parity.platform.safefs import owned_tempdir, replace_dir, resolve_target, sweep, write_json_atomic

GRAPH_FILES = {"onnx": "model.onnx", "tflite": "model.tflite"}  # by the graph's format
DRIFT_FILE = "drift.json"
MODULES_FILE = "modules.json"
LARGEST = sys.float_info.max  # a non-finite error: over every tolerance, and valid JSON
# node_data_builder.ThresholdItem: a value <= ``value`` takes the first item's colours; past the last, none
THRESHOLDS = [
    {"value": 0.5, "bgColor": "#c8e6c9", "textColor": "#1b5e20"},  # within half the tolerance
    {"value": 1.0, "bgColor": "#ffe082", "textColor": "#5d4037"},  # near it, still within
    {"value": LARGEST, "bgColor": "#e57373", "textColor": "#ffffff"},  # over it
]


def graph_ids(onnx_file: str, tensors: list[str], names: list[str] | None = None) -> dict:
    """Worker task: the id Model Explorer's ONNX adapter gives the main graph of ``onnx_file`` (its name, ``<main>``
    when it has none), the id of each of ``tensors``' producing nodes (``nodes``) and of each node named in ``names``
    (``ids``; a name two nodes share is left out), and the graph's output names (the adapter shows each as a node
    ``[value] NAME``). A node's id is its name after the adapter's first pass, onnx_ir's ``NameFixPass`` (an unnamed
    node becomes ``node``, ``node_1``, ..., a repeated name is made unique), run here too."""
    import onnx
    import onnx_ir as ir
    from onnx_ir.passes.common import NameFixPass

    proto = onnx.load(onnx_file, load_external_data=False)
    model = ir.serde.deserialize_model(proto)
    NameFixPass()(model)
    wanted, named = set(tensors), set(names or ())
    nodes, ids, seen = {}, {}, set()
    for before, after in zip(proto.graph.node, model.graph, strict=True):  # the same nodes, in order
        for output in before.output:
            if output in wanted:
                nodes[output] = after.name
        if before.name in named:
            ids[before.name] = None if before.name in seen else after.name
        seen.add(before.name)
    return {
        "name": "<main>" if model.graph.name is None else model.graph.name,
        "nodes": nodes,
        "ids": {name: node for name, node in ids.items() if node is not None},
        "outputs": [o.name for o in proto.graph.output],
    }


def _rows(diagnosis: dict) -> list[dict]:
    """The flat taps' rows, then every tree level's, outermost first."""
    levels = (diagnosis.get("tree") or {}).get("levels") or []
    return [*(diagnosis.get("taps") or []), *(row for level in levels for row in level.get("rows") or [])]


def cited_tensors(diagnosis: dict) -> list[str]:
    """The graph tensors a diagnosis compared: its taps' and every tree level's rows' (each once, in order)."""
    return list(dict.fromkeys(r["tensor"] for r in _rows(diagnosis) if r.get("tensor") and r.get("stats") is not None))


def cited_nodes(diagnosis: dict) -> list[str]:
    """The graph nodes the descent located for the modules it compared (each row's ``nodes``: ``[name, op]``; for a
    ``.tflite`` graph the name is the op's output tensor's)."""
    return list(dict.fromkeys(node[0] for r in _rows(diagnosis) if r.get("stats") for node in r.get("nodes") or ()))


def _value(stats: dict | None) -> float | None:
    """A row's error in tolerance units, None where it was not compared (or compared without units)."""
    if not stats:
        return None
    units = stats.get("tol_units")
    if units is None:  # non-finite elements: no units, never ok
        return None if stats.get("ok", True) else LARGEST
    return float(units) if math.isfinite(units) else LARGEST


def _key(graph: dict, table: str, name: str | None) -> str | None:
    """The node-data key of a tensor (``table`` "nodes") or node (``table`` "ids") of ``graph``: on ONNX the node id
    the adapter gives it (None where unknown); on TFLite the tensor's name, matched against ``tensor_name``."""
    if name is None or graph.get("format") == "tflite":
        return name
    return (graph.get(table) or {}).get(name)


def _graph_data(name: str, results: dict[str, float]) -> dict:
    """One ``GraphNodeData`` (``results``: key -> value)."""
    return {
        "name": name,
        "results": {key: {"value": value} for key, value in results.items()},
        "thresholds": THRESHOLDS,
    }


def _by_graph(graph: dict, data: dict) -> dict:
    """A ``ModelNodeData`` (graph id -> ``GraphNodeData``) where the graph's id is known (ONNX); else the
    ``GraphNodeData`` alone, which Model Explorer applies to the graph it shows (a ``.tflite`` file's one graph)."""
    return {graph["name"]: data} if graph.get("name") else data


def node_values(diagnosis: dict, outputs: dict[str, dict] | None = None) -> dict[str, float]:
    """Node key -> the drift of the tensor it outputs (each compared row's; a tensor compared again deeper keeps
    the deeper row's), and the drift of each graph output (``outputs``: the result's output statistics by the spec's
    output name; ``diagnosis["graph"]["outputs"]`` maps graph output names to those): on ONNX as the node
    ``[value] NAME`` the adapter shows, on TFLite as the output tensor's own name where no row compared it."""
    graph = diagnosis.get("graph") or {}
    values = {}
    for row in _rows(diagnosis):
        value, key = _value(row.get("stats")), _key(graph, "nodes", row.get("tensor"))
        if value is not None and key is not None:
            values[key] = value
    for graph_output, name in (graph.get("outputs") or {}).items():
        value = _value((outputs or {}).get(name))
        if value is not None:
            values.setdefault(graph_output if graph.get("format") == "tflite" else f"[value] {graph_output}", value)
    return values


def module_values(diagnosis: dict) -> dict[str, float]:
    """Node key -> the drift of the innermost compared module the descent located that node in (each row's
    ``nodes``; the levels outermost first, so a deeper module's row overrides its parent's on its own nodes)."""
    graph = diagnosis.get("graph") or {}
    values = {}
    for row in _rows(diagnosis):
        value = _value(row.get("stats"))
        if value is None:
            continue
        for node in row.get("nodes") or ():
            key = _key(graph, "ids", node[0])
            if key is not None:
                values[key] = value
    return values


def node_data(diagnosis: dict, outputs: dict[str, dict] | None = None) -> dict:
    """``drift.json``: each compared tensor's drift on the node that outputs it."""
    title = f"parity drift {diagnosis.get('path', '')} (x tolerance)".replace("  ", " ")
    return _by_graph(diagnosis["graph"], _graph_data(title, node_values(diagnosis, outputs)))


def module_data(diagnosis: dict) -> dict:
    """``modules.json``: each compared module's drift on the nodes the descent located for it."""
    title = f"parity drift by module {diagnosis.get('path', '')} (x tolerance)".replace("  ", " ")
    return _by_graph(diagnosis["graph"], _graph_data(title, module_values(diagnosis)))


def folder_for(root: Path, result: dict) -> Path:
    """``root/MODEL/PATH`` with the path id's ``/`` as ``_`` (``mlp/torch_onnx_ort``)."""
    return root / _safe(result["model"]) / _safe(result["path"].replace("/", "_"))


def _safe(part: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in part) or "_"


def how_to(folder: Path, graph_file: str, node_files: list[str]) -> str:
    """The one-line command that opens a written folder in Model Explorer (an ONNX graph through its adapter's
    extension; a ``.tflite`` file through the built-in adapter)."""
    extension = " --extensions=model_explorer_onnx" if graph_file.endswith(".onnx") else ""
    data = ",".join(str(folder / name) for name in node_files)
    return f"model-explorer {shlex.quote(str(folder / graph_file))}{extension} --node_data_paths={shlex.quote(data)}"


def diagnosed(report: dict) -> list[dict]:
    """The results with a diagnosis that compared something (not an error, not an int8 ranking) on a graph
    Model Explorer reads (``diagnosis["graph"]``, its file still there)."""
    found = []
    for r in report.get("results") or []:
        d = r.get("diagnosis")
        if not isinstance(d, dict) or d.get("error") or "int8" in d or not _rows(d):
            continue
        graph = d.get("graph") or {}
        if graph.get("format", "onnx") in GRAPH_FILES and graph.get("file") and os.path.isfile(graph["file"]):
            found.append(r)
    return found


def write(report: dict, root: str | Path) -> tuple[list[Path], list[str]]:
    """Write every diagnosed result's folder under ``root`` (created), each replacing what was there at once; record
    it in the result's diagnosis as ``model_explorer`` (``folder``, ``files``, ``graph``: linked or copied,
    ``command``; or ``folder`` and ``error`` where it could not be written) for the JSON and the HTML report.
    Returns the folders written and a line per folder that could not be."""
    root = Path(os.path.abspath(root))
    written, failed = [], []
    for result in diagnosed(report):
        diagnosis = result["diagnosis"]
        folder = folder_for(root, result)
        try:
            diagnosis["model_explorer"] = {"folder": str(folder), **_write_folder(folder, result)}
        except OSError as error:
            reason = one_line(error.strerror or str(error), 200)
            diagnosis["model_explorer"] = {"folder": str(folder), "error": f"could not be written: {reason}"}
            failed.append(f"{folder}: {reason}")
            continue
        written.append(folder)
    return written, failed


def _write_folder(folder: Path, result: dict) -> dict:
    """The folder's files, built in a scratch folder beside it and exchanged with it at once (no file of an earlier
    run is left behind)."""
    diagnosis = result["diagnosis"]
    graph = diagnosis["graph"]
    graph_file = GRAPH_FILES[graph.get("format", "onnx")]
    target = resolve_target(folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep(target.parent, rf"^\.{re.escape(target.name)}\.tmp-")
    scratch = owned_tempdir(target.parent, f".{target.name}.tmp-")
    try:
        how = _link(Path(graph["file"]), scratch / graph_file)
        write_json_atomic(scratch / DRIFT_FILE, node_data(diagnosis, result.get("outputs")))
        node_files = [DRIFT_FILE]
        if module_values(diagnosis):  # a descent located nodes for the modules it compared
            write_json_atomic(scratch / MODULES_FILE, module_data(diagnosis))
            node_files.append(MODULES_FILE)
        replace_dir(scratch, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"files": [graph_file, *node_files], "graph": how, "command": how_to(folder, graph_file, node_files)}


def _link(source: Path, target: Path) -> str:
    """``source`` at ``target``: hard-linked where both are on one file system ("linked": the export cache replaces
    a file by a new one, never in place), else copied ("copied")."""
    try:
        os.link(source, target)
        return "linked"
    except OSError:
        shutil.copyfile(source, target)
        return "copied"
