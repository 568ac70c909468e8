"""ONNX Runtime's graph optimiser as a cause: the level at which a failure appears, the nodes it rewrote there,
and the one optimisation whose removal makes the path pass (a tested fix).

The optimiser rewrites the graph before it runs (fusions fold a ``Mul`` into a ``MatMul``'s alpha, a ``BatchNorm``
into a ``Conv``'s weights); a rewrite is algebra, not float32 arithmetic, and can change the result. It also only
fires where no intermediate is a graph output, which is why marking taps as outputs can make such a failure
vanish. A fused node's name records the fusions that made it (``node_matmul/MatMulScaleFusion/``); each one
named there is tested by running the graph with it disabled (``disabled_optimizers``).

Imports onnxruntime inside; this module imports only NumPy.
"""

from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path

from parity.check.closeness import compare_named, times

LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")
# rewrites that change arithmetic, tried one at a time when no fused node's name records the rewrite (a fusion
# that only edits a node's weights, like ConvMulFusion, keeps the node's name)
KNOWN = (
    "ConvMulFusion",
    "ConvAddFusion",
    "ConvBNFusion",
    "MatMulScaleFusion",
    "MatMulAddFusion",
    "DivMulFusion",
    "GemmActivationFusion",
    "ConvActivationFusion",
    "LayerNormFusion",
    "SimplifiedLayerNormFusion",
    "GeluFusion",
    "BiasGeluFusion",
    "FastGeluFusion",
    "QuickGeluFusion",
    "BiasSoftmaxFusion",
    "AttentionFusion",
    "SkipLayerNormFusion",
    "MatmulTransposeFusion",
    "NoopElimination",
    "ConstantFolding",
    "NchwcTransformer",
)
_FUSION = re.compile(r"/([A-Z][A-Za-z0-9]*(?:Fusion|Elimination|Transformer|Folding|Rewriter))/")


def session(
    model_bytes: bytes,
    level: str = "ORT_ENABLE_ALL",
    threads: int = 1,
    disabled=(),
    saved: str | None = None,
    folder=None,
):
    """An ONNX Runtime session of ``model_bytes`` at ``level``; ``saved``: where the optimised graph is written (its
    weights in a data file beside it where the model keeps them in one, in ``folder``)."""
    import onnxruntime as ort

    from parity.diagnose.graph.onnx_graph import ort_options

    options = ort_options(threads, True, folder)
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    if saved:
        options.optimized_model_filepath = saved
        if folder is not None:  # past protobuf's 2 GiB the optimised graph keeps its weights in a file of its own
            options.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", f"{Path(saved).name}.data"
            )
    extra = {"disabled_optimizers": list(disabled)} if disabled else {}
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"], **extra)


def _worst(outputs: dict, expected: dict, tolerance_for) -> tuple[bool, float]:
    stats = compare_named(outputs, expected, tolerance_for)
    worst = max((s.get("tol_units", math.inf) for s in stats.values()), default=0.0)
    return all(s["ok"] for s in stats.values()), worst


def _nodes(path: str) -> list[tuple[str, str, tuple]]:
    """(name, op type, inputs) of every node: a fusion that rewrites a node's weights gives it new inputs."""
    import onnx

    return [(n.name, n.op_type, tuple(n.input)) for n in onnx.load(path, load_external_data=False).graph.node]


def optimiser_effect(
    model,
    feed: dict,
    output_names: list[str],
    expected: dict,
    tolerance_for,
    threads: int = 1,
    plain: dict | None = None,
    folder=None,
    data: bytes | None = None,
) -> dict | None:
    """Whether the failure of ``model``'s outputs (``output_names`` in order, compared with ``expected`` keyed the
    same way) depends on ONNX Runtime's optimisation level. None when it does not: the outputs fail with every
    optimisation off too, or pass at every level.

    Otherwise ``{"appears_at", "passes_at", "levels": {level: tol_units}, "rewritten": {"removed", "added"},
    "optimisations": [{"name", "passes", "tol_units"}], "fix": one line}``: ``removed``/``added`` are the nodes
    (name, op type) of the optimised graph at the last passing level that the failing level replaced. ``plain``: the
    outputs of the path's own run (every optimisation on), when the caller has them: where they pass, or where the
    run with every optimisation off fails too, no level is tried further. ``folder``: where the data files of a model
    read by ``parity.diagnose.graph.onnx_graph.load`` lie (the model is serialised without its weights); ``data``: the
    bytes of the file ``model`` was read from, where the caller has them (the model is not serialised again)."""
    from parity.diagnose.graph.onnx_graph import _check_folder

    _check_folder(model, folder)
    data = model.SerializeToString() if data is None else data
    if plain is not None and _worst(plain, expected, tolerance_for)[0]:
        return None  # the path's own run passes: nothing depends on the level
    off = session(data, "ORT_DISABLE_ALL", threads, folder=folder).run(output_names, feed)
    if not _worst(dict(zip(output_names, off)), expected, tolerance_for)[0]:
        return None  # it fails with every optimisation off too
    levels, graphs = {}, {}
    with tempfile.TemporaryDirectory(prefix="parity-ort-opt-") as scratch:
        for level in LEVELS:
            saved = str(Path(scratch) / f"{level}.onnx")
            values = session(data, level, threads, saved=saved, folder=folder).run(output_names, feed)
            levels[level] = _worst(dict(zip(output_names, values)), expected, tolerance_for)
            graphs[level] = _nodes(saved) if Path(saved).exists() else []
    if not levels["ORT_DISABLE_ALL"][0] or levels["ORT_ENABLE_ALL"][0]:
        return None
    appears = next(level for level in LEVELS if not levels[level][0])
    passes = LEVELS[LEVELS.index(appears) - 1]
    before, after = set(graphs[passes]), set(graphs[appears])
    added = [n[:2] for n in graphs[appears] if n not in before]
    removed = [n[:2] for n in graphs[passes] if n not in after]
    names = list(dict.fromkeys(m for name, _ in added for m in _FUSION.findall(f"{name}/")))
    tried = []
    for name in names or KNOWN:
        values = session(data, "ORT_ENABLE_ALL", threads, disabled=[name], folder=folder).run(output_names, feed)
        ok, worst = _worst(dict(zip(output_names, values)), expected, tolerance_for)
        if names or ok:  # from the known list, only the ones that make a difference are worth reporting
            tried.append({"name": name, "passes": ok, "tol_units": worst})
    fixing = [t["name"] for t in tried if t["passes"]]
    if fixing:
        fix = (
            f"disable the {fixing[0]} optimisation: InferenceSession(..., disabled_optimizers=['{fixing[0]}']) "
            f"passes (tested)"
        )
    else:
        fix = f"SessionOptions.graph_optimization_level = {passes} passes (tested)"
    return {
        "appears_at": appears,
        "passes_at": passes,
        "levels": {k: v[1] for k, v in levels.items()},
        "rewritten": {"removed": removed, "added": added},
        "optimisations": tried,
        "fix": fix,
    }


def describe(effect: dict) -> str:
    """One sentence: where the optimiser changes the result, which nodes it rewrote, and the tested fix."""
    removed = ", ".join(f"{name} ({op})" for name, op in effect["rewritten"]["removed"]) or "no node"
    added = ", ".join(f"{name} ({op})" for name, op in effect["rewritten"]["added"]) or "nothing"
    added += (
        " (the same names, new inputs: rewritten weights)"
        if set(effect["rewritten"]["added"]) & set(effect["rewritten"]["removed"])
        else ""
    )
    culprits = [t["name"] for t in effect["optimisations"] if t["passes"]]
    by = f" by {', '.join(culprits)}" if culprits else ""
    return (
        f"ONNX Runtime's graph optimiser changes the result: the path passes at {effect['passes_at']} "
        f"({times(effect['levels'][effect['passes_at']])}) and fails from {effect['appears_at']} "
        f"({times(effect['levels'][effect['appears_at']])}), where {removed} are rewritten{by} into {added}; "
        f"fix: {effect['fix']}"
    )
