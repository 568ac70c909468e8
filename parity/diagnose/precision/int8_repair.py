"""int8 repair: the fewest ONNX nodes to keep in float for a failing ONNX Runtime int8 path to pass its accuracy gate.

Every candidate is the model ``parity.exporters.onnx_int8.quantize`` writes with that ``nodes_to_exclude`` list (the
exporter's own call: same pre-process, calibration samples and method), run by the path's own runner on the whole
labelled eval split and judged by ``parity.check.accuracy_gate.judge`` with the spec's gate. The search:

1. add the layers in the order the diagnosis ranks them (the gate metric each regains, then SQNR), each with the
   nodes that keep its output in float (``int8_layers``), until the gate decision is ``pass``;
2. drop each added node, the last added first, while the gate still passes;
3. prove each remaining node needed: with it put back into int8 the gate does not pass (a node found not needed
   is dropped and the proof rerun). Steps 1-3 stop at ``max_runs`` quantize-and-run candidates: the shortest list
   known to pass is then returned with ``"minimal": False``.

The nodes the spec already keeps in float for the path (``Quantization.keep_float``) stay in every candidate.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from parity.platform.errors import ExportError

MAX_RUNS = 40  # candidates (a quantization and a run of the eval split each) one repair may judge


class Budget(Exception):
    """``max_runs`` candidates were judged."""


class Candidates:
    """Quantize-and-judge with a node list kept in float; each list judged once, runs counted.

    ``source``: the float ONNX file the path is quantized from; ``batches``/``method``/``dynamic``: the exporter's
    calibration feeds, method and kind; ``kept``: the nodes the spec keeps in float for the path; ``evaluate(path,
    meta) -> logits``: the path's runner on the eval split; ``judge(logits) -> gate result``."""

    def __init__(self, source, meta: dict, batches, method, dynamic: bool, kept, scratch, evaluate, judge):
        self.source, self.meta, self.batches, self.method, self.dynamic = source, meta, batches, method, dynamic
        self.kept, self.scratch, self.evaluate, self.judge = list(kept), Path(scratch), evaluate, judge
        self.runs = 0
        self.seen: dict[frozenset[str], dict[str, Any]] = {}  # the gate result of each list judged
        self.files: dict[frozenset[str], Path] = {}
        self.records: dict[frozenset[str], dict[str, Any]] = {}
        self.max_runs: int | None = None
        self.consulted: set = set()  # the lists a search asked about, judged now or before

    def gate(self, extra=(), budgeted: bool = False) -> dict:
        """The gate result of the model quantized with ``kept`` + ``extra`` in float."""
        from parity.exporters.onnx_int8 import quantize

        excluded = list(dict.fromkeys([*self.kept, *extra]))
        key = frozenset(excluded)
        self.consulted.add(key)
        if key not in self.seen:
            if budgeted and self.max_runs is not None and self.runs >= self.max_runs:
                raise Budget
            self.runs += 1
            folder = self.scratch / f"candidate-{self.runs}"
            folder.mkdir(parents=True)
            try:
                self.records[key] = quantize(
                    self.source, folder / "model.onnx", self.batches, self.method, excluded, self.dynamic
                )
            except ExportError as error:  # every layer kept in float is no int8 model: no repair
                self.seen[key] = {"decision": "fail", "reason": str(error), "value": None}
                return self.seen[key]
            self.files[key] = folder / "model.onnx"
            self.seen[key] = self.judge(self.evaluate(folder, {**self.meta, "file": "model.onnx"}))
        return self.seen[key]

    def file(self, extra=()) -> Path:
        """The model file of a judged candidate."""
        return self.files[frozenset([*self.kept, *extra])]

    def record(self, extra=()) -> dict:
        """The quantizer's record (``onnx_int8.quantize``) of a judged candidate."""
        return self.records[frozenset([*self.kept, *extra])]

    def passes(self, extra) -> bool:
        return self.gate(extra, budgeted=True)["decision"] == "pass"


def repair(candidates: Candidates, units: list[list[str]], max_runs: int = MAX_RUNS) -> dict:
    """The search of the module docstring over ``units`` (node lists, best first) on ``candidates``; ``{"passes",
    "nodes_to_exclude", "added", "minimal", "needed", "runs", "judged", "seconds", ...}``: ``runs`` new
    quantize-and-run candidates, ``judged`` the lists the search asked about (some judged by the ranking before)."""
    started, runs_before = time.perf_counter(), candidates.runs
    candidates.max_runs = runs_before + max_runs
    candidates.consulted = set()
    added: list[str] = []
    passing = None
    minimal, needed = False, {}
    try:
        for unit in units:
            added += [name for name in unit if name not in added and name not in candidates.kept]
            if candidates.passes(added):
                passing = list(added)
                break
        if passing is not None:
            for name in reversed(list(passing)):  # the last added, least useful first
                trial = [n for n in passing if n != name]
                if trial and candidates.passes(trial):
                    passing = trial
            while True:  # each one needed: put back into int8, the gate does not pass
                needed = {name: candidates.gate([n for n in passing if n != name], budgeted=True) for name in passing}
                spare = [name for name, judged in needed.items() if judged["decision"] == "pass"]
                if not spare:
                    minimal = True
                    break
                passing = [n for n in passing if n != spare[0]]
    except Budget:
        pass
    seconds = time.perf_counter() - started
    runs = candidates.runs - runs_before
    if passing is None:
        why = (
            f"the run budget ({max_runs}) ran out first"
            if runs >= max_runs
            else f"not even with all {len(added)} quantized node(s) kept in float"
        )
        return {
            "passes": False,
            "reason": f"no node list found that passes the gate: {why}",
            "runs": runs,
            "judged": len(candidates.consulted),
            "seconds": seconds,
            "minimal": False,
            "max_runs": max_runs,
        }
    excluded = [*candidates.kept, *passing]
    after = candidates.gate(passing)
    return {
        "passes": True,
        "nodes_to_exclude": excluded,
        "added": passing,
        "given": list(candidates.kept),
        "minimal": minimal,
        "max_runs": max_runs,
        "needed": {name: gate_summary(judged) for name, judged in needed.items()} if minimal else {},
        "after": gate_summary(after),
        "runs": runs,
        "judged": len(candidates.consulted),
        "seconds": seconds,
    }


def toolchain(path_id: str, nodes: list[str], passed: list[str], method: str | None, dynamic: bool) -> dict:
    """The repair in the quantizer's own call (``passed``: the list ``onnx_int8.quantize`` gave it) and as the line of
    the model spec that makes it the path (``nodes``: the graph's node names)."""
    call = "quantize_dynamic" if dynamic else "quantize_static"
    spec_line = f"quantization=Quantization(keep_float={{{path_id!r}: {tuple(nodes)!r}}})"
    if method and method != "MinMax":
        spec_line = spec_line.replace("Quantization(", f"Quantization(calibration={method!r}, ")
    return {"onnxruntime": f"{call}(..., nodes_to_exclude={list(passed)!r})", "spec": spec_line.replace("'", '"')}


def gate_summary(judged: dict) -> dict:
    """The fields of an accuracy gate result a diagnosis shows."""
    return {key: judged.get(key) for key in ("decision", "metric", "value", "golden", "drop", "interval", "reason")}
