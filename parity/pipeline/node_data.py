"""Model Explorer node data of a run's diagnoses (``parity diagnose --model-explorer``, or beside ``--json``): where
it goes (refused before any work), the graph each diagnosis is drawn on (located after the diagnosis, only when node
data is asked for) and the writing after the run. The format is ``parity.report.model_explorer``'s.
"""

from __future__ import annotations

import os
from pathlib import Path

from parity.platform.errors import one_line


def explorer_folder(option: str | None, json_file: str | None) -> str | None:
    """Where ``--model-explorer`` writes: the folder named, or with ``"auto"`` ``JSON_NAME.model-explorer`` beside a
    ``--json`` file (none for stdout, a FIFO or a device); refused now, before any work, when it could not be
    written."""
    from parity.platform.safefs import check_folder_target, writes_through

    if option == "auto":
        if not json_file or writes_through(json_file):
            return None
        target = Path(os.path.abspath(json_file))
        option = str(target.with_name(f"{target.stem}.model-explorer"))
    if option:
        check_folder_target(option, "--model-explorer")
    return option


def locate(run, pool, spec, manifest, path, diagnosis: dict) -> None:
    """``diagnosis["graph"]``: the exported graph Model Explorer reads (an ONNX file: its main graph's id and the node
    ids of the tensors and nodes the diagnosis cites, read in a worker; a ``.tflite`` file: keyed by tensor name, no
    worker), and its outputs by the spec's output names. ``run`` is the orchestrator's (its export cache). A graph that
    cannot be read leaves the diagnosis as it is, with a note."""
    if not isinstance(diagnosis, dict) or "error" in diagnosis or "int8" in diagnosis or not path.exports:
        return
    try:
        graph = _graph(run, pool, spec, manifest, path, diagnosis)
    except Exception as error:  # noqa: BLE001 - the diagnosis stands; only its graph view is missing
        reason = one_line(f"{type(error).__name__}: {error}", 300)
        diagnosis.setdefault("notes", []).append(f"the exported graph's node ids could not be read: {reason}")
        return
    if graph is not None:
        diagnosis["graph"] = graph


def _graph(run, pool, spec, manifest, path, diagnosis: dict) -> dict | None:
    from parity.report import model_explorer

    artifact = run._export(pool, spec, manifest, path, len(path.exports) - 1)  # the diagnosis's own (cached)
    meta = artifact.get("meta") or {}
    if "error" in artifact or not meta.get("file"):
        return None
    file = str(Path(artifact["dir"]) / meta["file"])
    if file.endswith(".tflite"):  # the diagnosis's rows name the file's own tensors: Model Explorer's keys
        outputs = {tensor: name for name, tensor in (meta.get("tflite_outputs") or {}).items()}
        return {"file": file, "format": "tflite", "outputs": outputs}
    if not file.endswith(".onnx"):
        return None
    found = pool.call(
        path.runtime.group,
        "parity.report.model_explorer:graph_ids",
        onnx_file=file,
        tensors=model_explorer.cited_tensors(diagnosis),
        names=model_explorer.cited_nodes(diagnosis),
    )
    by_graph_name = dict(zip(meta.get("output_names") or (), spec.outputs))
    return {
        "file": file,
        "format": "onnx",
        "name": found["name"],
        "nodes": found["nodes"],
        "ids": found["ids"],
        "outputs": {name: by_graph_name[name] for name in found["outputs"] if name in by_graph_name},
    }


def write(report: dict, folder: str, notice) -> list[str]:
    """Every diagnosis's folder under ``folder``, each announced to ``notice`` with the command that opens it. A
    folder that could not be written is recorded in its diagnosis and does not stop the others or the files written
    after it (the result JSON says where the node data is). Returns a line for each of those."""
    from parity.report import model_explorer

    folders, failed = model_explorer.write(report, folder)
    for result in model_explorer.diagnosed(report):
        explorer = result["diagnosis"].get("model_explorer") or {}
        if explorer.get("command"):
            notice(f"open in Model Explorer: {explorer['command']}")
    if folders:
        notice(f"wrote {folder} ({len(folders)} diagnosis folder(s))")
    return failed
