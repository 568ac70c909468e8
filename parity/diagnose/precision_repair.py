"""Precision repair: the smallest set of nodes to keep in float32 for a failing float16 ONNX path to pass.

The float16 path is the float32 export converted by onnxconverter-common (``parity.exporters.onnx_fp16``); its
``node_block_list`` keeps named nodes in float32 with casts around them. The search, judged on the whole fixed
input set with the path's own float16 tolerances:

1. rank the nodes by where float16 hurts: every intermediate of the float16 and the float32 graphs is compared,
   and a node scores by how much it grows the relative error of what it reads (a non-finite result where float32
   has none first, then a float32 value beyond float16's range);
2. grow the block list in rank order, doubling the number of nodes added each round, until the path passes;
3. prune: drop each blocked node whose removal keeps the pass, until no node can go. The result is minimal: the
   path fails with any one of its nodes converted back to float16 (each of those runs is made, and counted).

NumPy at import; onnx, onnxconverter-common and onnxruntime inside.
"""

from __future__ import annotations

import math
import time
import warnings

import numpy as np

from parity.check.closeness import compare_named

FLOAT16_MAX = 65504.0
CONVERTER_LIMIT = 1e4  # onnxconverter-common's default max_finite_val: larger weights are clipped to it
MAX_RUNS = 80  # conversions + runs one repair may spend


def _relative(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return math.inf
    if not np.all(np.isfinite(a)) and np.all(np.isfinite(b)):
        return math.inf
    scale = float(np.sqrt(np.sum(np.square(b)))) or 1.0
    with np.errstate(all="ignore"):
        return float(np.sqrt(np.nansum(np.square(a - b)))) / scale


def rank(fp32_model, fp16_model, feed: dict, threads: int = 1) -> list[str]:
    """Node names of ``fp32_model`` (with a name), most harmed by float16 first."""
    from parity.diagnose.onnx_graph import intermediate_names, run_tensors

    names = intermediate_names(fp32_model)
    full = run_tensors("ort-noopt", fp32_model, feed, names, threads)
    present = set(intermediate_names(fp16_model))
    half = run_tensors("ort-noopt", fp16_model, feed, [n for n in names if n in present], threads)
    scores = []
    for node in fp32_model.graph.node:
        outs = [o for o in node.output if o in half and o in full]
        if not node.name or not outs:
            continue
        own = max(_relative(half[o], full[o]) for o in outs)
        inherited = max([_relative(half[i], full[i]) for i in node.input if i in half and i in full] or [0.0])
        beyond = max(float(np.max(np.abs(full[o]), initial=0.0)) for o in outs) > FLOAT16_MAX
        growth = own / inherited if inherited > 0 else (math.inf if own > 0 else 0.0)
        scores.append(((math.isinf(own) and not math.isinf(inherited)), beyond, growth, own, node.name))
    scores.sort(reverse=True)
    return [s[-1] for s in scores]


def repair(fp32_model, feed: dict, output_names: list[str], expected: dict, tolerance_for, threads: int = 1) -> dict:
    """``{"passes", "node_block_list", "op_types", "before", "after", "minimal", "runs", "seconds", "toolchain"}``,
    or ``{"passes": False, "reason"}`` when no repair exists (see the module docstring)."""
    from onnxconverter_common import float16

    from parity.diagnose.onnx_graph import run_tensors

    started, runs = time.perf_counter(), 0
    named = [n.name for n in fp32_model.graph.node if n.name]
    op_of = {n.name: n.op_type for n in fp32_model.graph.node}

    clipped = _clipped(fp32_model)
    limit = CONVERTER_LIMIT

    def convert(block):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the converter warns for every weight it clips
            converted = float16.convert_float_to_float16(fp32_model, keep_io_types=True, max_finite_val=limit,
                                                         op_block_list=float16.DEFAULT_OP_BLOCK_LIST,
                                                         node_block_list=list(block))
        return keep_weights(converted, fp32_model, block)

    def judge(model) -> tuple[bool, float]:
        nonlocal runs
        runs += 1
        values = run_tensors("ort", model, feed, output_names, threads)
        stats = compare_named(values, expected, tolerance_for)
        return all(s["ok"] for s in stats.values()), max(s.get("tol_units", math.inf) for s in stats.values())

    def passes(block) -> tuple[bool, float]:
        return judge(convert(block))

    base_ok, base = passes([])
    if base_ok:
        return {"passes": True, "node_block_list": [], "reason": "the float16 path passes as converted", "runs": runs}
    converter = None
    if clipped:  # the converter clips weights beyond max_finite_val (1e4 by default): the largest float16 first
        limit = FLOAT16_MAX
        ok, units = passes([])
        converter = {"clipped_weights": clipped, "option": f"max_finite_val={FLOAT16_MAX:g}", "passes": ok,
                     "tol_units": units}
        if ok:
            return {"passes": True, "node_block_list": [], "converter": converter, "op_types": {},
                    "before": {"tol_units": base}, "after": {"tol_units": units}, "minimal": True, "runs": runs,
                    "seconds": time.perf_counter() - started, "toolchain": _toolchain([], limit)}
    twin_ok, _ = judge(fp32_model)
    if not twin_ok:
        return {"passes": False, "reason": "the float32 twin fails too: no float16 repair can make the path pass",
                "runs": runs, "seconds": time.perf_counter() - started}
    all_ok, _ = passes(named)
    if not all_ok:
        return {"passes": False, "reason": "with every node kept in float32 the path still fails (the float16 casts "
                                           "at its inputs and outputs)", "runs": runs,
                "seconds": time.perf_counter() - started}
    order = rank(fp32_model, convert([]), feed, threads)
    order += [n for n in named if n not in order]
    block, step, worst = [], 1, base
    while runs < MAX_RUNS:
        block = order[:min(len(order), len(block) + step)]
        ok, worst = passes(block)
        if ok:
            break
        step *= 2
    else:
        return {"passes": False, "reason": f"no repair found within {MAX_RUNS} runs", "runs": runs,
                "seconds": time.perf_counter() - started}
    changed = True
    while changed and runs < MAX_RUNS:  # prune until every kept node is needed
        changed = False
        for name in list(reversed(block)):
            trial = [n for n in block if n != name]
            ok, units = passes(trial)
            if ok:
                block, worst, changed = trial, units, True
    minimal = not changed
    counts: dict[str, int] = {}
    for name in block:
        counts[op_of[name]] = counts.get(op_of[name], 0) + 1
    return {"passes": True, "node_block_list": block, "converter": converter, "op_types": counts,
            "before": {"tol_units": base}, "after": {"tol_units": worst}, "minimal": minimal, "runs": runs,
            "seconds": time.perf_counter() - started, "toolchain": _toolchain(block, limit)}


def _toolchain(block: list[str], limit: float) -> dict:
    option = f", max_finite_val={limit:g}" if limit != CONVERTER_LIMIT else ""
    return {"onnxconverter_common": f"float16.convert_float_to_float16(model, keep_io_types=True{option}, "
                                    f"node_block_list={block!r}), the blocked nodes' weights kept in float32",
            "tensorrt": {"layers_in_float32": block,
                         "how": "for each layer named here: layer.precision = trt.float32 and "
                                "layer.set_output_type(0, trt.float32), with "
                                "config.set_flag(trt.BuilderFlag.OBEY_PRECISION_CONSTRAINTS) (not run here)"}}


def _clipped(model) -> int:
    """How many float32 weights the converter's default ``max_finite_val`` clips."""
    from onnx import numpy_helper

    count = 0
    for initializer in model.graph.initializer:
        value = numpy_helper.to_array(initializer)
        if value.dtype == np.float32:
            count += int(np.count_nonzero(np.abs(value) > CONVERTER_LIMIT))
    return count


def keep_weights(converted, original, block) -> object:
    """``converted`` with the blocked nodes reading their weights in float32, as the original has them:
    onnxconverter-common converts every initializer to float16 (and clips it) and casts it back for a blocked node."""
    from onnx import TensorProto, helper

    block = set(block)
    weights = {i.name: i for i in original.graph.initializer}
    converted_weights = {i.name for i in converted.graph.initializer}
    readers = {}
    for node in converted.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    added = set()
    for node in converted.graph.node:
        if node.op_type != "Cast" or node.input[0] not in weights or node.input[0] not in converted_weights:
            continue
        if not all(reader.name in block for reader in readers.get(node.output[0], [])):
            continue
        kept = f"{node.input[0]}__float32"
        if kept not in added:
            copy = TensorProto()
            copy.CopyFrom(weights[node.input[0]])
            copy.name = kept
            converted.graph.initializer.append(copy)
            added.add(kept)
        node.input[0] = kept
        del node.attribute[:]
        node.attribute.append(helper.make_attribute("to", weights[node.input[0].removesuffix("__float32")].data_type))
    return converted


def render(result: dict) -> list[str]:
    """Terminal lines for a repair."""
    if not result.get("passes"):
        return [f"  precision repair: none: {result.get('reason')}"]
    lines = []
    converter = result.get("converter")
    if converter:
        lines.append(f"  precision repair: onnxconverter-common clipped {converter['clipped_weights']} weight(s) "
                     f"beyond its max_finite_val (1e4) to it; with {converter['option']} the path "
                     f"{'passes' if converter['passes'] else 'still fails'} ({converter['tol_units']:.3g}x the "
                     f"tolerance, tested)")
    block = result.get("node_block_list") or []
    if block:
        ops = ", ".join(f"{k} x{v}" for k, v in sorted(result["op_types"].items()))
        lines.append(f"  precision repair: keep {len(block)} node(s) in float32 ({ops}): {', '.join(block)}; the "
                     f"path then passes ({result['before']['tol_units']:.3g}x -> {result['after']['tol_units']:.3g}x "
                     f"the tolerance; {'minimal' if result['minimal'] else 'not proven minimal'}, {result['runs']} "
                     f"runs, {result['seconds']:.1f} s); {result['toolchain']['onnxconverter_common']}")
    return lines


def repair_task(workspace: str, model: str, golden_dir: str, precision: str, threads: int, artifact_dir: str,
                artifact_meta: dict) -> dict:
    """The worker task: repair of a float16 path from its float32 parent export (``artifact_*``)."""
    from pathlib import Path

    import onnx

    from parity.diagnose.onnx_graph import pinned
    from parity.golden import store as golden
    from parity.model import feeds
    from parity.model.workspace import Workspace
    from parity.runtimes.onnx_common import onnx_feed

    spec = Workspace(workspace).load_spec(model)
    verified = golden.load(Path(golden_dir), spec)
    feed = onnx_feed(spec, artifact_meta, feeds.from_arrays(spec, verified.arrays["inputs.npz"]))
    fp32 = pinned(onnx.load(str(Path(artifact_dir) / artifact_meta["file"])), feed)
    names = list(artifact_meta["output_names"])
    by_graph = dict(zip(names, spec.outputs))
    reference = verified.arrays["reference.npz"]
    tolerances = spec.output_tolerances(precision)
    return repair(fp32, feed, names, {n: reference[by_graph[n]] for n in names},
                  lambda name: tolerances.for_name(by_graph.get(name, name)), threads)
