"""A failing generation path's first divergent step written as a bug report anyone can run.

The diagnosis (``parity.generation.diagnose``) names the step, its mode and the leaf module that departs first. At
that step the path's exported graph is cut at the leaf's boundary: its nodes (torch.onnx's ``name_scopes``
metadata, as the diagnosis reads them), the tensors they read from outside as inputs and their boundary outputs as
outputs. The inputs are the values the path itself computed at that step: the graph run by the path's own decode
loop, teacher-forced as the check ran it (the golden's tokens fed after each earlier step, the path's own cache from
its own earlier calls). The expected outputs are the float64 reference's module outputs at the same call, paired
with the boundary tensors as the diagnosis pairs them (on a left-padded prefill the pad positions carry the path's
own values: nothing reads them). Where the leaf cannot be cut (a graph without module scopes, a leaf that is the
root or has no boundary output the reference's values fit, a cut that agrees alone), the whole step's graph is
written with its feed (the step's tokens, mask, positions and the past cache the path produced) and the reference's
logits, and the README says why.

The folder (written atomically, as ``parity.diagnose.repro`` writes a forward path's) holds ``model.onnx``,
``test_data_set_0/`` in the ONNX test-data layout, ``repro.py`` (ONNX Runtime on the CPU with the path's session
options; exits 1 while the outputs differ beyond ``atol + rtol * |expected|``, 0 once they agree) and ``README.md``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np

from parity.generation.ort_decoder import tapped_step
from parity.generation.verify import FLOAT32_TOLERANCES, tol_units
from parity.platform import safefs
from parity.platform.errors import UsageError


def cut(model, outputs: list[str], cuts: set[str], known: dict):
    """``reduce.subgraph`` of ``outputs`` from ``cuts``, where a tensor of ``cuts`` made by a node that reads nothing
    (a ``Constant``) is computed, not fed."""
    from parity.diagnose.graph.reduce import _producers, subgraph

    producers = _producers(model)
    constants = {t for t in cuts if t in producers and not any(model.graph.node[producers[t]].input)}
    return subgraph(model, outputs, cuts - constants, known, "step")


def _expected(ref: np.ndarray, got: np.ndarray, keep) -> np.ndarray:
    """The reference's value in the graph tensor's shape and dtype; pads of a left-padded call take the path's."""
    value = np.asarray(ref, np.float64).reshape(got.shape)
    if keep is not None and value.ndim >= 2 and value.shape[:2] == keep.shape:
        value = np.where(keep.reshape(keep.shape + (1,) * (value.ndim - 2)), value, np.asarray(got, np.float64))
    return value.astype(got.dtype)


def _leaf_tensors(model, graph, leaf: str) -> tuple:
    """``(node indices, boundary outputs, outside inputs)`` of the leaf's scope, or ``(None, why)``."""
    from parity.diagnose.graph import onnx_graph, onnx_taps
    from parity.diagnose.tree import onnx_tree

    kind = onnx_tree.scope_kind(graph)
    if kind != onnx_tree.METADATA:
        return None, "the graph carries no torch.onnx module scopes"
    nodes = onnx_tree.nodes_of(graph, kind, [leaf]).get(leaf)
    if not nodes:
        return None, f"no node of the graph is in the module {leaf!r}'s scope"
    boundary = onnx_taps._boundary_outputs(graph, nodes)
    if not boundary:
        return None, f"the nodes of {leaf!r} hand nothing on outside it"
    return nodes, boundary, onnx_graph.outside_inputs(model, [graph.nodes[i] for i in nodes])


def _leaf_cut(model, found: tuple, ref_values: list, feed_known, outputs_known, keep, tol) -> tuple:
    """``(cut model, feed, expected)`` of the leaf's nodes, or ``(None, why)``."""
    from parity.generation.diagnose import pair

    _nodes, boundary, inputs = found
    candidates = [(t, np.asarray(outputs_known[t])) for t in boundary if t in outputs_known]
    matched, _units, _ = pair(ref_values, candidates, keep, tol)
    if matched is None:
        return None, "no boundary output has the size of the reference module's values"
    names = [next(t for t, v in candidates if v is m) for m in matched]
    expected = {t: _expected(r, outputs_known[t], keep) for t, r in zip(names, ref_values)}
    known = {**feed_known, **{t: outputs_known[t] for t in (*inputs, *names) if t in outputs_known}}
    try:
        made, feed = cut(model, names, set(inputs), known)
    except (KeyError, ValueError) as error:  # an input with no value, or nodes that read no input at all
        return None, str(error)
    return made, feed, expected


def _judge(made, feed: dict, expected: dict, tol: dict, threads: int) -> dict:
    """Each output's ``{"tol_units", "max_abs"}`` with the cut run as ``repro.py`` runs it."""
    from parity.diagnose.graph import onnx_graph

    got = onnx_graph.run_tensors("ort", made, feed, list(expected), threads)
    found = {}
    for name, want in expected.items():
        value, want = np.asarray(got[name], np.float64), np.asarray(want, np.float64)
        units = tol_units(want, value, tol)
        finite = np.isfinite(units)
        found[name] = {"tol_units": units, "max_abs": float(np.abs(value - want).max()) if finite else float("inf")}
    return found


def write(
    source: dict,
    golden_file: str,
    artifact_dir: str,
    meta: dict,
    diagnosis: dict,
    generation: dict,
    out_dir: str,
    threads: int,
    title: str,
    environment: dict,
    command: str,
) -> dict:
    """Worker task: cut the path's graph at the diagnosis's step and leaf and write the folder (module docstring);
    ``{"written", "scope", "nodes_before", "nodes_after", "ops", "errors", "note", "seconds"}``, where ``scope`` is
    the leaf cut, or "step" for the whole step's graph; ``written`` False (with ``reason``) where even the whole
    step agrees with the reference alone."""
    import onnx
    import torch

    from parity.diagnose.graph import onnx_graph
    from parity.generation.diagnose import call_inputs, torch_step
    from parity.generation.model import load
    from parity.generation.onnx_export import ONNX_FILE
    from parity.generation.tasks import read_golden

    started = time.perf_counter()
    step, batch, mode = diagnosis.get("step"), diagnosis.get("batch"), diagnosis.get("mode")
    if step is None or batch is None:
        raise UsageError("the diagnosis names no step to reproduce")
    sets, gold = read_golden(golden_file)
    if batch not in sets:
        raise UsageError(f"the golden has no batch {batch!r}")
    ids, mask, forced = sets[batch]["input_ids"], sets[batch]["attention_mask"], gold[batch]["tokens"]
    torch.set_num_threads(max(1, int(threads)))
    reference = torch_step(load(source, "float64"), ids, mask, forced, int(step))
    model = onnx.load(str(Path(artifact_dir) / ONNX_FILE))
    graph = onnx_graph._Graph(model)
    tol = dict(generation.get("tolerances") or FLOAT32_TOLERANCES)
    call = call_inputs(ids, mask, forced, int(step))
    keep = call["attention_mask"].astype(bool) if int(step) == 0 and not call["attention_mask"].all() else None
    leaf = ((diagnosis.get("leaf") or {}).get("path") or "").replace("(root)", "")
    notes: list[str] = []
    found: tuple = (None, "the diagnosis names no leaf module")
    if leaf and not reference.values.get(leaf):
        found = (None, f"the reference's module {leaf} returns no floating tensor")
    elif leaf:
        found = _leaf_tensors(model, graph, leaf)
    outputs = {o.name for o in model.graph.output}
    wanted = [*found[1], *found[2]] if found[0] is not None else []  # the leaf's boundary and what it reads
    tapped = [t for t in dict.fromkeys(wanted) if t in graph.producer and t not in outputs]
    feed, outs = tapped_step(model, tapped, graph.infos, meta, ids, mask, forced, int(step), threads)
    made = None
    if found[0] is None:
        notes.append(f"the leaf cannot be cut: {found[1]}" if leaf else found[1])
    else:
        cut_found = _leaf_cut(model, found, reference.values[leaf], feed, outs, keep, tol)
        if cut_found[0] is None:
            notes.append(f"the leaf {leaf} cannot be cut: {cut_found[1]}")
        else:
            made, fed, expected = cut_found
            errors = _judge(made, fed, expected, tol, threads)
            if all(e["tol_units"] <= 1 for e in errors.values()):
                notes.append(f"the leaf {leaf}'s nodes alone agree with the reference at this step")
                made = None
    scope = leaf if made is not None else "step"
    if made is None:  # the whole step: the graph's logits from the step's feed, the past cache included
        made, fed = cut(model, ["logits"], set(), {**feed, "logits": outs["logits"]})
        expected = {"logits": _expected(reference.values[""][0], outs["logits"], keep)}
        errors = _judge(made, fed, expected, tol, threads)
        notes.append("the whole step's graph is written with the step's feed")
    numbers = {
        "scope": scope,
        "nodes_before": len(model.graph.node),
        "nodes_after": len(made.graph.node),
        "ops": [n.op_type for n in made.graph.node],
        "errors": {k: {m: _number(x) for m, x in v.items()} for k, v in errors.items()},
        "note": "; ".join(notes),
    }
    if not any(e["tol_units"] > 1 for e in errors.values()):
        return {
            **numbers,
            "written": False,
            "reason": f"step {step}'s graph agrees with the reference when run alone on the step's feed",
            "seconds": round(time.perf_counter() - started, 3),
        }
    context = {"title": title, "step": step, "batch": batch, "mode": mode, "leaf": leaf, "tol": tol}
    context["positions"] = call["position_ids"]
    _write_folder(
        Path(out_dir), made, fed, expected, threads, tol, {**numbers, **context}, diagnosis, environment, command
    )
    return {**numbers, "written": True, "seconds": round(time.perf_counter() - started, 3)}


def _brief(value: np.ndarray) -> str:
    value = np.asarray(value)
    return str(value.tolist()) if value.size <= 16 else f"{list(value.shape)}, from {value.min()} to {value.max()}"


def _number(x: float) -> float | None:
    return round(float(x), 6) if np.isfinite(x) else None


def _write_folder(out: Path, made, feed, expected, threads, tol, facts, diagnosis, environment, command) -> None:
    """The folder, through a scratch folder beside ``out`` exchanged with it at the end (a symlink is followed)."""
    from parity.diagnose.repro import SCRIPT
    from parity.exporters.common import LARGE_BYTES, save_onnx
    from parity.interop.onnx_test_data import write_test_data

    out = safefs.resolve_target(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = safefs.owned_tempdir(out.parent, f".{out.name}.tmp-")
    try:
        save_onnx(made, scratch, threshold=LARGE_BYTES)  # one file below protobuf's 2 GiB
        write_test_data(scratch, feed, expected)
        script = SCRIPT.replace("@RUNTIME@", "ort").replace("@THREADS@", str(max(1, int(threads))))
        script = script.replace("@ATOL@", repr(float(tol["atol"]))).replace("@RTOL@", repr(float(tol["rtol"])))
        (scratch / "repro.py").write_text(script)
        (scratch / "README.md").write_text(_readme(made, feed, facts, diagnosis, environment, command, threads))
        safefs.replace_dir(scratch, out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _readme(made, feed, facts, diagnosis, environment, command, threads) -> str:
    from parity.diagnose.repro import environment_lines

    cause = diagnosis.get("cause") or diagnosis.get("cause_tested") or {}
    leaf = diagnosis.get("leaf") or {}
    scope = facts["scope"]
    where = (
        f"the nodes of the leaf module `{scope}` ({leaf.get('class', '?')})"
        if scope != "step"
        else "the whole step's graph (its logits)"
    )

    def shapes(values):
        def one(name, value):
            value = np.asarray(value)
            small = f" = {value.tolist()}" if value.dtype.kind in "iub" and value.size <= 8 else ""
            return f"`{name}` {value.dtype} {list(value.shape)}{small}"

        return ", ".join(one(k, v) for k, v in values.items())

    lines = [
        f"# {facts['title']}: step {facts['step']} ({facts['mode']}) departs from the float64 reference",
        "",
        *environment_lines(environment.get("packages", {}), environment),
        "",
        "## What diverges",
        "",
        (
            f"- step {facts['step']} ({facts['mode']}) of the `{facts['batch']}` prompt batch, teacher-forced; the "
            f"call's positions (`position_ids`) {_brief(facts['positions'])}"
        ),
        f"- leaf: `{leaf.get('path') or 'none'}`" + (f" ({leaf['class']})" if leaf.get("class") else ""),
        f"- diagnosis: {diagnosis.get('note') or 'none'}",
        f"- cause: {cause.get('explanation') or cause.get('description') or 'none tested'}",
        *[
            f"- `{name}`: max abs error {e['max_abs']} = {e['tol_units']} tolerance units "
            f"(atol {facts['tol']['atol']:g} + rtol {facts['tol']['rtol']:g} * |expected|)"
            for name, e in facts["errors"].items()
        ],
        "",
        "## The graph",
        "",
        f"- {where}: {facts['nodes_before']} nodes -> {facts['nodes_after']}: "
        + " -> ".join(n.op_type for n in made.graph.node),
        *([f"- {facts['note']}"] if facts["note"] else []),
        f"- inputs: {shapes(feed)}: the values the path computed at this step (its own decode loop and cache)",
        "- expected outputs: the float64 reference model's values at the same call (cast to the graph's dtype)",
        f"- runtime: ONNX Runtime, CPU, graph optimisation level ORT_ENABLE_ALL, {threads} intra-op thread(s)",
        "",
        "## Reproduce",
        "",
        "    python repro.py    # exits 1 while the bug is present, 0 once fixed",
        "",
        *([f"Made by `{command}`.", ""] if command else []),
    ]
    return "\n".join(lines)
