"""A diagnosis's drift as Google Model Explorer node data (``ai-edge-model-explorer``'s ``node_data_builder`` JSON).

Per diagnosed path, in a folder of its own: ``model.onnx`` (the exported graph, without external data: Model
Explorer's ONNX adapter does not read it), ``drift.json`` keyed by the node ids the ONNX adapter
(``model-explorer-onnx``) gives that graph, and ``modules.json`` keyed by the model's own module paths (every level
of the descent) and tap names. A value is the error of the tensor a node (or module) outputs, in units of its
tolerance (``tol_units``): green within half the tolerance, amber within it, red over it; a non-finite error is
written as the largest float (JSON has no infinity), red too. Open with
``model-explorer model.onnx --extensions=model_explorer_onnx --node_data_paths=drift.json``.

The format is written here, not through the package: parity does not depend on it. ``graph_ids`` runs in a worker
(it loads the graph with ``onnx``); the rest is plain JSON.
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import sys
from pathlib import Path

from parity.platform.safefs import write_json_atomic

GRAPH_FILE = "model.onnx"
DRIFT_FILE = "drift.json"
MODULES_FILE = "modules.json"
LARGEST = sys.float_info.max  # a non-finite error: over every tolerance, and valid JSON
# node_data_builder.ThresholdItem: a value <= ``value`` takes the first item's colours; past the last, none
THRESHOLDS = [
    {"value": 0.5, "bgColor": "#c8e6c9", "textColor": "#1b5e20"},  # within half the tolerance
    {"value": 1.0, "bgColor": "#ffe082", "textColor": "#5d4037"},  # near it, still within
    {"value": LARGEST, "bgColor": "#e57373", "textColor": "#ffffff"},  # over it
]


def graph_ids(onnx_file: str, tensors: list[str]) -> dict:
    """Worker task: the id Model Explorer's ONNX adapter gives the main graph of ``onnx_file`` (its name, ``<main>``
    when it has none), the id of each of ``tensors``' producing nodes, and the graph's output names (the adapter
    shows each as a node ``[value] NAME``). A node's id is its name after the adapter's first pass, onnx_ir's
    ``NameFixPass`` (an unnamed node becomes ``node``, ``node_1``, ..., a repeated name is made unique), run here too."""
    import onnx
    import onnx_ir as ir
    from onnx_ir.passes.common import NameFixPass

    proto = onnx.load(onnx_file, load_external_data=False)
    model = ir.serde.deserialize_model(proto)
    NameFixPass()(model)
    wanted = set(tensors)
    nodes = {}
    for before, after in zip(proto.graph.node, model.graph, strict=True):  # the same nodes, in order
        for output in before.output:
            if output in wanted:
                nodes[output] = after.name
    return {
        "name": "<main>" if model.graph.name is None else model.graph.name,
        "nodes": nodes,
        "outputs": [o.name for o in proto.graph.output],
    }


def cited_tensors(diagnosis: dict) -> list[str]:
    """The ONNX tensors a diagnosis compared: its taps' and every tree level's rows' (each once, in order)."""
    rows = [*(diagnosis.get("taps") or []), *_level_rows(diagnosis)]
    return list(dict.fromkeys(r["tensor"] for r in rows if r.get("tensor") and r.get("stats") is not None))


def _level_rows(diagnosis: dict) -> list[dict]:
    return [row for level in ((diagnosis.get("tree") or {}).get("levels") or []) for row in level.get("rows") or []]


def _value(stats: dict | None) -> float | None:
    """A row's error in tolerance units, None where it was not compared (or compared without units)."""
    if not stats:
        return None
    units = stats.get("tol_units")
    if units is None:  # non-finite elements: no units, never ok
        return None if stats.get("ok", True) else LARGEST
    return float(units) if math.isfinite(units) else LARGEST


def _graph_data(name: str, results: dict[str, float]) -> dict:
    """One ``GraphNodeData`` (``results``: key -> value)."""
    return {
        "name": name,
        "results": {key: {"value": value} for key, value in results.items()},
        "thresholds": THRESHOLDS,
    }


def module_values(diagnosis: dict) -> dict[str, float]:
    """Module path (or tap name) -> its drift: the flat taps, then every tree level, outermost first (a module
    compared at two levels keeps its deeper row)."""
    values = {}
    for row in [*(diagnosis.get("taps") or []), *_level_rows(diagnosis)]:
        value = _value(row.get("stats"))
        if value is not None:
            values[row["tap"]] = value
    return values


def node_values(diagnosis: dict, outputs: dict[str, dict] | None = None) -> dict[str, float]:
    """ONNX node id -> the drift of the tensor it outputs (``diagnosis["graph"]`` maps tensors to node ids), and
    ``[value] NAME`` -> the drift of each graph output (``outputs``: the result's output statistics by the spec's
    output name; ``diagnosis["graph"]["outputs"]`` maps graph output names to those)."""
    graph = diagnosis.get("graph") or {}
    producers = graph.get("nodes") or {}
    values = {}
    for row in [*(diagnosis.get("taps") or []), *_level_rows(diagnosis)]:
        value = _value(row.get("stats"))
        node = producers.get(row.get("tensor"))
        if value is not None and node is not None:
            values[node] = value
    for graph_output, name in (graph.get("outputs") or {}).items():
        value = _value((outputs or {}).get(name))
        if value is not None:
            values[f"[value] {graph_output}"] = value
    return values


def node_data(diagnosis: dict, outputs: dict[str, dict] | None = None) -> dict:
    """``drift.json``: a ``ModelNodeData`` (graph id -> ``GraphNodeData``) keyed by the ONNX adapter's node ids."""
    graph = diagnosis["graph"]
    title = f"parity drift {diagnosis.get('path', '')} (x tolerance)".replace("  ", " ")
    return {graph["name"]: _graph_data(title, node_values(diagnosis, outputs))}


def module_data(diagnosis: dict) -> dict:
    """``modules.json``: one ``GraphNodeData`` keyed by module path (applied to the graph open in Model Explorer)."""
    return _graph_data(f"parity drift by module {diagnosis.get('path', '')} (x tolerance)", module_values(diagnosis))


def folder_for(root: Path, result: dict) -> Path:
    """``root/MODEL/PATH`` with the path id's ``/`` as ``_`` (``mlp/torch_onnx_ort``)."""
    return root / _safe(result["model"]) / _safe(result["path"].replace("/", "_"))


def _safe(part: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in part) or "_"


def how_to(folder: Path, has_graph: bool) -> str:
    """The one-line command that opens a written folder in Model Explorer."""
    if not has_graph:
        return f"model-explorer YOUR_GRAPH --node_data_paths={shlex.quote(str(folder / MODULES_FILE))}"
    return (
        f"model-explorer {shlex.quote(str(folder / GRAPH_FILE))} --extensions=model_explorer_onnx "
        f"--node_data_paths={shlex.quote(str(folder / DRIFT_FILE))}"
    )


def diagnosed(report: dict) -> list[dict]:
    """The results with a diagnosis that compared something (not an error, not an int8 ranking)."""
    return [
        r
        for r in report.get("results") or []
        if isinstance(r.get("diagnosis"), dict)
        and not r["diagnosis"].get("error")
        and "int8" not in r["diagnosis"]
        and (r["diagnosis"].get("taps") or _level_rows(r["diagnosis"]))
    ]


def write(report: dict, root: str | Path) -> list[Path]:
    """Write every diagnosed result's folder under ``root`` (created); record it in the result's diagnosis as
    ``model_explorer`` (``folder``, ``files``, ``command``) for the JSON and the HTML report. Returns the folders."""
    root = Path(os.path.abspath(root))
    written = []
    for result in diagnosed(report):
        diagnosis = result["diagnosis"]
        folder = folder_for(root, result)
        folder.mkdir(parents=True, exist_ok=True)
        files = [MODULES_FILE]
        write_json_atomic(folder / MODULES_FILE, module_data(diagnosis))
        graph = diagnosis.get("graph") or {}
        has_graph = bool(graph.get("file")) and os.path.isfile(graph["file"])
        if has_graph:
            _copy(Path(graph["file"]), folder / GRAPH_FILE)
            write_json_atomic(folder / DRIFT_FILE, node_data(diagnosis, result.get("outputs")))
            files = [GRAPH_FILE, DRIFT_FILE, MODULES_FILE]
        diagnosis["model_explorer"] = {"folder": str(folder), "files": files, "command": how_to(folder, has_graph)}
        written.append(folder)
    return written


def _copy(source: Path, target: Path) -> None:
    """``source`` at ``target``, replaced atomically (a temporary file beside it, then renamed)."""
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        shutil.copyfile(source, partial)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
