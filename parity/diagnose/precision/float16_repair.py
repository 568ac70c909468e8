"""Precision repair: the fewest nodes to keep in float32 for a failing float16 ONNX path to pass.

A float16 ONNX path is its float32 export converted by onnxconverter-common; ``parity.exporters.onnx_fp16.convert``
with a ``node_block_list`` keeps those nodes, their weights and the values between them in float32. Every candidate
is that conversion, run on the path's own runtime and judged as the check judges the path: every output of the
fixed input set within the path's float16 tolerances (``tol_units <= 1``). The search:

1. the model as converted must fail, the float32 model must pass the float16 tolerances and so must the model with
   every node kept in float32; otherwise no repair exists and the reason says which (weights beyond the converter's
   ``max_finite_val``, 1e4, which it clips: ``max_finite_val=65504`` is tried first and kept for the search);
2. rank the nodes from one run of every intermediate tensor of the float16 and the float32 model: a node reading
   or writing a float32 value beyond float16's range (65504) first, then one whose output turns non-finite, then
   by how much it grows the relative error of what it reads;
3. grow the block list in rank order (1, 2, 4, ... nodes) until the path passes, bisect back to the shortest
   passing prefix, then drop nodes (halves, quarters, ... single nodes) while the path still passes;
4. verify: with any one node of the list converted back to float16 the path fails (``minimal``, with each run's
   ``tol_units``). Steps 3 and 4 stop at ``max_runs`` runs: the shortest list known to pass is then not ``minimal``.

ONNX Runtime's CPU provider (1.31) has no float16 kernel for Add, Sub, Mul, Div, Exp, Sqrt, Gemm, MatMul,
ReduceSum, Softmax and most other ops: it computes them in float32 and removes the casts around them, the model's
own too (optimisations off as well), so there a float16 model rounds little more than its stored weights and an
activation beyond 65504 does not overflow; ``onnx.reference`` computes in float16 as the model says, as a GPU does.

NumPy at import; onnx, onnxconverter-common and onnxruntime inside.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any

import numpy as np

from parity.check.closeness import compare_named
from parity.exporters.onnx_fp16 import FLOAT16_MAX

MAX_RUNS = 60  # candidates (a conversion and a run each) one repair may judge
DEFAULT_PATH = "onnx/ort"  # the runtime a repair is judged on when the caller names no path: ONNX Runtime, CPU
TENSORRT_NOTE = (
    "for each layer named: layer.precision = trt.float32 and layer.set_output_type(i, trt.float32) for "
    "its outputs, with config.set_flag(trt.BuilderFlag.OBEY_PRECISION_CONSTRAINTS); TensorRT's ONNX "
    "parser names a layer after the ONNX node it comes from (unverified: TensorRT does not run here)"
)


class _Budget(Exception):
    """``max_runs`` runs were made."""


def repair_path(
    fp32_model,
    feed: dict,
    expected: dict,
    tolerance_for,
    *,
    runtime: str = "ort",
    run=None,
    rank_on: str | None = None,
    threads: int = 1,
    max_runs: int = MAX_RUNS,
) -> dict:
    """The repair of the float16 conversion of ``fp32_model`` (see the module docstring).

    ``feed``: graph input name -> array (the fixed input set); ``expected``: output name -> float64 golden;
    ``tolerance_for(name)``: the path's float16 ``Tolerance``. ``run(model) -> {output name: array}`` runs a
    candidate as the path does (default: ``runtime``, one of ``ort``, ``ort-noopt``, ``onnxref``, on the graph's
    output names; with ``run`` given, ``runtime`` only labels the result); ``rank_on``: the CPU runtime that ranks
    the nodes (default ``runtime`` where it is one, else ``onnxref``, which computes in float16 as a GPU does).

    Returns ``{"passes", "node_block_list", "op_types", "before", "after", "minimal", "minimal_checks", "runs",
    "seconds", "runtime", "ranked_on", "converter", "toolchain"}``; ``{"passes": True, "node_block_list": [],
    "reason"}`` when the path passes as converted; ``{"passes": False, "reason", ...}`` when no repair exists.
    """
    from parity.diagnose.graph.onnx_graph import RUNTIMES, run_tensors
    from parity.exporters import onnx_fp16

    started = time.perf_counter()
    if run is None:
        names = list(expected)
        run = lambda model: run_tensors(runtime, model, feed, names, threads)
    search = _Search(fp32_model, run, expected, tolerance_for, max_runs)

    def done(**fields) -> dict:
        return {**fields, "runs": search.runs, "seconds": time.perf_counter() - started, "runtime": runtime}

    base = search.passes([], budgeted=False)
    if base[0]:
        return done(
            passes=True,
            node_block_list=[],
            reason=f"the float16 path passes as converted on {runtime}",
            before=_units(base),
            after=_units(base),
        )
    converter, converted = None, base
    clipped = onnx_fp16.clipped_weights(fp32_model)
    if clipped:  # the converter clips weights beyond max_finite_val to it: float16's own limit first
        search.limit = FLOAT16_MAX
        converted = search.passes([], budgeted=False)
        converter = {
            "clipped_weights": clipped,
            "option": f"max_finite_val={FLOAT16_MAX:g}",
            "passes": converted[0],
            "tol_units": converted[1],
        }
        if converted[0]:
            return done(
                passes=True,
                node_block_list=[],
                converter=converter,
                op_types={},
                before=_units(base),
                after=_units(converted),
                minimal=True,
                minimal_checks={},
                ranked_on=None,
                toolchain=_toolchain([], search.limit),
            )
    twin = search.judge(fp32_model)
    if not twin[0]:
        return done(
            passes=False,
            reason=f"the float32 twin fails too ({_times(twin[1])} the float16 tolerance): no "
            f"node kept in float32 can make the float16 path pass",
            before=_units(base),
        )
    named = [node.name for node in fp32_model.graph.node if node.name]
    if not named:
        return done(
            passes=False,
            reason="no node has a name, and onnxconverter-common's node_block_list names nodes",
            before=_units(base),
        )
    every = search.passes(named, budgeted=False)
    if not every[0]:
        return done(
            passes=False,
            before=_units(base),
            reason=f"even with every node kept in float32 the path fails ({_times(every[1])} the tolerance)",
        )
    ranked_on = rank_on or (runtime if runtime in RUNTIMES else "onnxref")
    try:
        order = rank_nodes(fp32_model, onnx_fp16.convert(fp32_model, (), search.limit), feed, ranked_on, threads)
    except Exception as error:  # noqa: BLE001 - a ranking is a shortcut: graph order still finds a repair
        order, ranked_on = [], f"graph order ({ranked_on} did not run every tensor: {_first_line(error)})"
    order += [name for name in named if name not in order]
    block, minimal, checks = search.smallest(order)
    after = search.passes(block)
    alone = search.judge(onnx_fp16.convert(fp32_model, block, search.limit, strict=False))
    return done(
        passes=True,
        node_block_list=block,
        op_types=dict(Counter(search.op_of[n] for n in block)),
        before=_units(base),
        after=_units(after),
        minimal=minimal,
        minimal_checks=checks,
        ranked_on=ranked_on,
        converter=converter,
        toolchain=_toolchain(block, search.limit, alone),
    )


class _Search:
    """Candidates judged once each (by block list and converter option), counted against ``max_runs``."""

    def __init__(self, model, run, expected, tolerance_for, max_runs: int):
        self.model, self.run, self.expected, self.tolerance_for = model, run, expected, tolerance_for
        self.max_runs, self.runs = max_runs, 0
        self.limit: float | None = None  # the converter's max_finite_val, where weights beyond float16's are clipped
        self.seen: dict[tuple[frozenset[str], float | None], tuple[bool, float, dict]] = {}
        self.op_of = {node.name: node.op_type for node in model.graph.node}

    def judge(self, model) -> tuple[bool, float, dict]:
        """(passes, worst tol_units, tol_units per output) of one run of ``model``."""
        self.runs += 1
        try:
            values = self.run(model)
        except Exception as error:  # noqa: BLE001 - a candidate the runtime cannot run is a candidate that fails
            return False, math.inf, {"error": _first_line(error)}
        stats = compare_named(values, self.expected, self.tolerance_for)
        units = {name: s.get("tol_units", math.inf) for name, s in stats.items()}
        return all(s["ok"] for s in stats.values()), max(units.values(), default=0.0), units

    def passes(self, block, budgeted: bool = True) -> tuple[bool, float, dict]:
        """The judged conversion with ``block`` kept in float32 (each one once; ``_Budget`` past ``max_runs``)."""
        from parity.exporters.onnx_fp16 import convert

        key = (frozenset(block), self.limit)
        if key not in self.seen:
            if budgeted and self.runs >= self.max_runs:
                raise _Budget
            self.seen[key] = self.judge(convert(self.model, list(block), self.limit))
        return self.seen[key]

    def smallest(self, order: list[str]) -> tuple[list[str], bool, dict]:
        """The shortest passing prefix of ``order`` (``order`` itself passes), pruned, and whether it is verified
        minimal, with each single node's ``tol_units`` when it alone is converted back to float16."""
        block = list(order)  # always a list known to pass: what is returned when the budget runs out
        try:
            failing, passing, size = 0, len(order), 1
            while size < passing:  # grow by doubling
                if self.passes(order[:size])[0]:
                    passing = size
                    break
                failing, size = size, size * 2
            block = order[:passing]
            while passing - failing > 1:  # bisect to the shortest passing prefix
                middle = (failing + passing) // 2
                failing, passing = (failing, middle) if self.passes(order[:middle])[0] else (middle, passing)
                block = order[:passing]
            chunk = len(block) // 2
            while chunk >= 1:  # drop halves, quarters, ... single nodes while the path still passes
                at = 0
                while at < len(block):
                    trial = block[:at] + block[at + chunk :]
                    if trial and self.passes(trial)[0]:
                        block = trial
                    else:
                        at += chunk
                chunk //= 2
            while True:  # verify: every node is needed (a drop that passes after another one is made here)
                checks = {name: self.passes([n for n in block if n != name]) for name in block}
                needless = [name for name, outcome in checks.items() if outcome[0]]
                if not needless:
                    return block, True, {name: outcome[1] for name, outcome in checks.items()}
                block = [n for n in block if n != needless[0]]
        except _Budget:
            return block, False, {}


def rank_nodes(fp32_model, fp16_model, feed: dict, runtime: str = "onnxref", threads: int = 1) -> list[str]:
    """Named nodes of ``fp32_model``, where float16 hurts most first (see the module docstring), from one run of
    every intermediate tensor of each model on ``runtime`` (nodes producing no float tensor are left out)."""
    from parity.diagnose.graph.onnx_graph import intermediate_names, run_tensors

    names = intermediate_names(fp32_model)
    full = run_tensors(runtime, fp32_model, feed, names, threads)
    present = set(intermediate_names(fp16_model))
    half = run_tensors(runtime, fp16_model, feed, [n for n in names if n in present], threads)
    full.update(feed)
    half.update(feed)
    scores = []
    for node in fp32_model.graph.node:
        outputs = [o for o in node.output if o in half and o in full]
        if not node.name or not outputs:
            continue
        own = max(_relative(half[o], full[o]) for o in outputs)
        read = [i for i in node.input if i in half and i in full]
        inherited = max([_relative(half[i], full[i]) for i in read] or [0.0])
        beyond = max(_largest(full[t]) for t in outputs + read) > FLOAT16_MAX
        growth = 0.0 if math.isinf(inherited) else own / inherited if inherited > 0 else math.inf if own > 0 else 0.0
        scores.append((beyond, math.isinf(own) and not math.isinf(inherited), growth, own, node.name))
    scores.sort(key=lambda score: score[:4], reverse=True)
    return [score[-1] for score in scores]


def _relative(a, b) -> float:
    """Relative error of ``a`` against ``b`` (Frobenius); infinite where ``a`` is not finite and ``b`` is."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or (not np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return math.inf
    with np.errstate(all="ignore"):
        return float(np.sqrt(np.nansum(np.square(a - b)))) / (float(np.sqrt(np.nansum(np.square(b)))) or 1.0)


def _largest(value) -> float:
    value = np.asarray(value)
    finite = np.abs(value[np.isfinite(value)].astype(np.float64)) if value.dtype.kind == "f" else np.zeros(0)
    return float(finite.max()) if finite.size else 0.0


def _units(outcome) -> dict:
    return {"tol_units": outcome[1], "outputs": outcome[2]}


def _times(units: float) -> str:
    return f"{units:.3g}x" if math.isfinite(units) else "non-finite"


def _first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"


def _toolchain(block: list[str], limit: float | None, alone=None) -> dict:
    """The repair in the converter's and TensorRT's terms; ``alone``: the judged run of the converter's own model
    (without ``keep_float32``), which says whether the converter call alone reproduces the pass."""
    option = "" if limit is None else f", max_finite_val={limit:g}"
    call = f"convert_float_to_float16(model, keep_io_types=True{option}, node_block_list={block!r})"
    result: dict[str, Any] = {"onnxconverter_common": call, "tensorrt": list(block), "tensorrt_note": TENSORRT_NOTE}
    if alone is not None:
        result["converter_alone"] = {"passes": alone[0], "tol_units": alone[1]}
        if not alone[0]:
            result["onnxconverter_common"] = (
                f"{call}, then parity.exporters.onnx_fp16.keep_float32(converted, model, "
                f"node_block_list) (the converter alone leaves float16 around the "
                f"blocked nodes: {_times(alone[1])} the tolerance without it)"
            )
    return result


def repair_for_diagnosis(
    workspace: str,
    model: str,
    golden_dir: str,
    precision: str,
    threads: int,
    artifact_dir: str,
    artifact_meta: dict,
    path_id: str | None = None,
    device: str = "cpu",
    max_runs: int = MAX_RUNS,
) -> dict:
    """The worker task whose dict a diagnosis carries under ``"repair"``: the repair of the ``precision`` path
    ``path_id`` on ``device`` (its runner judges every candidate; default ONNX Runtime on the CPU) from its float32
    parent export (``artifact_dir`` / ``artifact_meta``), on the golden fixed input set and the spec's tolerances."""
    import tempfile
    from pathlib import Path

    import onnx

    from parity.diagnose.graph.onnx_graph import RUNTIMES, pinned
    from parity.golden import store as golden
    from parity.model import feeds
    from parity.model.workspace import Workspace
    from parity.run import paths
    from parity.run.tasks import build_runner
    from parity.runtimes.onnx_common import onnx_feed

    if precision != "fp16":
        why = (
            "no float32 -> bfloat16 ONNX conversion runs here (bf16 ONNX paths run on TensorRT only)"
            if precision == "bf16"
            else f"a {precision} path has no float16 conversion to repair"
        )
        return {"passes": False, "reason": why, "runs": 0, "seconds": 0.0}
    path = paths.by_id(path_id or DEFAULT_PATH, device, precision)
    if not path.exports or path.exports[-1].name != "float16":
        return {
            "passes": False,
            "reason": f"{path.id} at {precision} is not converted by onnxconverter-common",
            "runs": 0,
            "seconds": 0.0,
        }
    spec = Workspace(workspace).load_spec(model)
    verified = golden.load(Path(golden_dir), spec)
    x = feeds.from_arrays(spec, verified.arrays["inputs.npz"])
    feed = onnx_feed(spec, artifact_meta, x)
    fp32 = pinned(onnx.load(str(Path(artifact_dir) / artifact_meta["file"])), feed)
    reference = verified.arrays["reference.npz"]
    tolerances = spec.output_tolerances(precision)
    with tempfile.TemporaryDirectory(prefix="parity-repair-") as scratch:
        meta = {**artifact_meta, "file": "candidate.onnx"}

        def run(candidate) -> dict:
            onnx.save_model(candidate, str(Path(scratch) / meta["file"]))
            return build_runner(spec, path, {}, spec.batch_size, threads, scratch, meta).run(x)

        on_cpu = path.device == "cpu"
        result = repair_path(
            fp32,
            feed,
            {name: reference[name] for name in spec.outputs},
            tolerances.for_name,
            runtime=path.runtime.name if on_cpu else f"{path.runtime.name} on {path.device}",
            run=run,
            rank_on=path.runtime.name if on_cpu and path.runtime.name in RUNTIMES else "onnxref",
            threads=threads,
            max_runs=max_runs,
        )
    return {**result, "path": path.id if path_id else None}


def render_repair(repair: dict) -> list[str]:
    """Terminal lines for a diagnosis's ``repair``."""
    if not repair.get("passes"):
        return [f"  precision repair: none: {repair.get('reason')}"]
    lines = []
    if repair.get("reason"):
        lines.append(f"  precision repair: not needed: {repair['reason']}")
    converter = repair.get("converter")
    if converter:
        lines.append(
            f"  precision repair: onnxconverter-common clipped {converter['clipped_weights']} weight(s) "
            f"beyond its max_finite_val (1e4) to it; with {converter['option']} the path "
            f"{'passes' if converter['passes'] else 'still fails'} ({_times(converter['tol_units'])} the "
            f"tolerance, tested)"
        )
    block = repair.get("node_block_list") or []
    if block:
        ops = ", ".join(f"{op} x{count}" for op, count in sorted(repair["op_types"].items()))
        proof = (
            "minimal: with any one of them converted back it fails"
            if repair["minimal"]
            else "not proven minimal: the run budget ran out"
        )
        lines.append(
            f"  precision repair: keep {len(block)} node(s) in float32 ({ops}): {', '.join(block)}; the path "
            f"then passes on {repair['runtime']} ({_times(repair['before']['tol_units'])} -> "
            f"{_times(repair['after']['tol_units'])} the tolerance; {proof}; {repair['runs']} runs, "
            f"{repair['seconds']:.1f} s)"
        )
        lines.append(
            f"  precision repair, as the toolchain takes it: {repair['toolchain']['onnxconverter_common']}; "
            f"TensorRT: layers {', '.join(block)} in float32 with OBEY_PRECISION_CONSTRAINTS (unverified)"
        )
    return lines
