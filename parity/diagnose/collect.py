"""The worker task of a diagnosis: one path's taps, outputs and gradients on the fixed input set.

Native sources report their taps themselves. An ONNX path finds each tap's tensor in the graph,
adds those tensors as graph outputs and runs once; on request it also compares ONNX Runtime with
the reference evaluator on every intermediate tensor of the same file (the runtime link).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from parity.check import noise_floor
from parity.diagnose.graph.runtime_link import RUNTIMES as ONNX_RUNTIMES  # the runtime link's paths
from parity.golden import store as golden
from parity.model import feeds
from parity.model.workspace import Workspace
from parity.run import kept, paths
from parity.run.tasks import build_runner, weights_for
from parity.runtimes.base import Runner
from parity.runtimes.onnx_common import onnx_feed

SAVEDMODEL_REASON = "a SavedModel made by jax2tf exposes only its outputs, not its layers"


def collect(
    workspace: str,
    model: str,
    path_id: str,
    golden_dir: str,
    precision: str,
    threads: int,
    artifact_dir: str | None = None,
    artifact_meta: dict | None = None,
    runtime_link: bool = False,
    gradients: bool = True,
    weight_perturbation: dict | None = None,
    device: str = "cpu",
    rows: list[int] | None = None,
    eval_reference: dict | None = None,
    tolerances: dict | None = None,
    plain: dict | None = None,
) -> dict:
    """``{"outputs", "taps", "located", "gradients", "runtime_compare"}`` for one path (canonical layout).

    ``gradients`` False skips them (a source run only for the converter link needs none);
    ``weight_perturbation`` is the deliberate drift a check may add to a native source's weights; ``rows``: eval
    rows to run instead of the fixed input set, with ``eval_reference`` (``{"outputs", "taps"}``) their float64
    reference (``parity.diagnose.eval_split``). ``tolerances``: the path's precision judged at these
    (``noise_floor.at_bound``). ``plain``: an ONNX path's outputs on the fixed input set from its check (by the spec's
    names), read as the plain run (``graph_tree.GraphLevels``)."""
    spec = noise_floor.at_bound(Workspace(workspace).load_spec(model), precision, tolerances)
    path = paths.by_id(path_id, device, precision)
    verified = golden.load(Path(golden_dir), spec)
    inputs = verified.arrays["inputs.npz"]
    x, labels = feeds.from_arrays(spec, inputs), inputs.get("labels")
    reference = verified.arrays["reference.npz"]
    golden_taps = {t: reference[f"tap/{t}"] for t in spec.taps}
    if rows is not None:  # eval rows that fail, against the float64 reference on them (``eval_split``)
        from parity.diagnose.eval_split import eval_rows

        assert eval_reference is not None, "eval rows come with their float64 reference"
        x, labels = eval_rows(spec, verified.arrays["eval.npz"], rows), None
        reference, golden_taps = eval_reference["outputs"], eval_reference["taps"]
    graph_taps = path.runtime.name in ONNX_RUNTIMES or (
        path.runtime is paths.OPENVINO and (artifact_meta or {}).get("format") == "onnx"
    )
    if artifact_dir is not None and graph_taps and path.device == "cpu":
        return _collect_onnx(
            spec,
            path,
            artifact_dir,
            artifact_meta,
            x,
            golden_taps,
            reference,
            precision,
            threads,
            runtime_link,
            plain if rows is None else None,
        )
    if artifact_dir is None and rows is None and not weight_perturbation:  # the source's own run, kept (``kept``)
        key = (*kept.model_key(spec, verified.manifest), path.id, path.device, precision, threads, gradients)
        found = kept.kept(
            "source-run", key, lambda: _collect_native(spec, path, verified, x, labels, threads, gradients)
        )
        return {name: dict(value) if isinstance(value, dict) else value for name, value in found.items()}
    return _collect_native(
        spec, path, verified, x, labels, threads, gradients, weight_perturbation, artifact_dir, artifact_meta
    )


def _collect_native(
    spec, path, verified, x, labels, threads, gradients, weight_perturbation=None, artifact_dir=None, artifact_meta=None
) -> dict:
    """A path that reports its own taps (a native source, a compiled one, a runtime reading its own tensors), or
    only its outputs."""
    runner = build_runner(
        spec,
        path,
        weights_for(spec, verified, weight_perturbation),
        spec.batch_size,
        threads,
        artifact_dir,
        artifact_meta,
    )
    if artifact_dir is None:  # a native source (or a compiled one, which says how it read them) reports its taps
        taps = runner.taps(x) if spec.taps else {}
        located = {t: runner.tap_locations.get(t, {"found": "native"}) for t in taps}
    elif type(runner).taps_impl is not Runner.taps_impl and spec.taps:  # a runtime that reads its own tensors
        taps = runner.taps(x)
        located = {
            t: runner.tap_locations.get(t, {"found": "unmapped", "reason": "not reported by this runtime"})
            for t in spec.taps
        }
    else:
        reason = SAVEDMODEL_REASON if path.runtime is paths.TF_SAVEDMODEL else runner.no_taps_reason
        taps, located = {}, {t: {"found": "unmapped", "reason": reason} for t in spec.taps}
    return {
        "outputs": runner.run(x),
        "taps": taps,
        "located": located,
        "gradients": runner.gradients(x, labels) if gradients and runner.differentiable and spec.loss else None,
        "runtime_compare": None,
        "instrumentation": None,
        "optimiser": None,
    }


def _collect_onnx(
    spec, path, artifact_dir, meta, x, golden_taps, reference, precision, threads, runtime_link, plain=None
) -> dict:
    """An ONNX path: the plain run's outputs (what the check saw), the taps from the largest set of tap tensors
    whose marking as outputs leaves those outputs unchanged, the optimiser's part (ONNX Runtime) and the runtime
    link with its third opinion. The graph is read and run through the ``GraphLevels`` a descent in this worker
    reads it by next (``graph_tree.graph_levels``): the instrumented run that reads the taps reads the descent's
    tensors too."""
    from parity.diagnose.graph import instrument, mapping_check, onnx_taps
    from parity.diagnose.graph import runtime_link as link
    from parity.diagnose.tree.graph_tree import graph_levels

    levels = graph_levels(spec, path, artifact_dir, meta, x, threads, plain)
    model, folder, feed, graph, run = levels.model, levels.folder, levels.feed, levels.graph, levels.run
    graph_outputs = list(meta["output_names"])
    tolerances = spec.output_tolerances(precision)
    by_graph_name = dict(zip(graph_outputs, spec.outputs))

    def tolerance_for(name):
        return tolerances.for_name(by_graph_name.get(name, name))

    plain = levels.plain
    candidates = onnx_taps.candidate_names(model, spec, golden_taps, meta["input_layout"], graph) if spec.taps else []
    values = levels.observe(candidates, tolerance_for) if candidates else plain  # with the descent's tensors
    if values is None:  # reading them all changes the outputs: the taps' tensors alone
        values = run(list(dict.fromkeys([*graph_outputs, *candidates])))
    located, taps, instrumentation = {}, {}, None
    if spec.taps:
        # the exporter that named the nodes (the float16 conversion keeps them); jax2tf's graphs carry no Keras names:
        # tf2onnx mapping falls back to values
        exporter = next(e.name for e in reversed(path.exports) if e.name != "float16")
        mapped = onnx_taps.map_taps(model, spec, exporter, golden_taps, values, meta["input_layout"], graph)
        reproduced = instrument.same_outputs(plain, values, tolerance_for)
        if not reproduced and not instrument.same_outputs(plain, run(graph_outputs), tolerance_for):
            # two plain runs differ (a random op, e.g. Dropout in training mode): no run reproduces another, so the
            # taps come from the one instrumented run, and the report says why
            instrumentation = {"nondeterministic": True}
        elif not reproduced:
            tap_tensors = {t: w["tensor"] for t, w in mapped.items() if w.get("tensor") and w["how"] != "fused"}
            seen = instrument.observe(run, plain, tap_tensors, tolerance_for)
            values = seen["values"]
            instrumentation = {
                "reproduces_with_every_tap": False,
                "observable": seen["observable"],
                "disturbing": seen["disturbing"],
                "runs": seen["runs"],
            }
            for item in seen["disturbing"]:
                mapped[item["tap"]] = {
                    **mapped[item["tap"]],
                    "how": "unobservable",
                    "reason": f"marking {item['tensor']!r} as a graph output changes the outputs",
                }
        for tap, where in mapped.items():
            if where["how"] not in ("fused", "unmapped", "unobservable") and where.get("tensor") in values:
                try:  # settle proves (or sets) the axis order and says how in the reason
                    taps[tap] = mapping_check.settle(
                        values[where["tensor"]], where, golden_taps[tap], tolerances.for_name(tap)
                    )
                except ValueError as error:  # the tensor found does not fit the tap: report it, compare the rest
                    located[tap] = {"found": "unmapped", "tensor": where.get("tensor"), "reason": str(error)}
                    continue
            located[tap] = {
                "found": where["how"],
                "tensor": where.get("tensor"),
                "fused_into": where.get("fused_into"),
                "reason": where.get("reason"),
                "feeds_outputs": mapping_check.feeds_outputs(graph, where.get("tensor")),
                **({"order": where["order"]} if where.get("order") else {}),
            }
    expected = {name: reference[by_graph_name[name]] for name in graph_outputs}
    optimiser = None
    if path.runtime.name == "ort":
        from parity.diagnose.graph.optimiser import optimiser_effect

        optimiser = optimiser_effect(
            model, feed, graph_outputs, expected, tolerance_for, threads, plain=plain, folder=folder, data=levels.data
        )
    runtime_compare = None
    if runtime_link:
        boundary = graph_outputs + [where["tensor"] for where in located.values() if where.get("tensor")]
        runtime_compare = link.compare(
            model, feed, expected, tolerance_for, tolerances.default, threads, boundary, folder=folder
        )
    outputs = {name: plain[tensor] for name, tensor in zip(spec.outputs, graph_outputs)}
    return {
        "outputs": outputs,
        "taps": taps,
        "located": located,
        "gradients": None,
        "runtime_compare": runtime_compare,
        "instrumentation": instrumentation,
        "optimiser": optimiser,
    }


def runtime_link(
    workspace: str,
    model: str,
    path_id: str,
    golden_dir: str,
    precision: str,
    threads: int,
    artifact_dir: str,
    artifact_meta: dict,
    scope: dict | None = None,
    boundary: Sequence[str] = (),
    tolerances: dict | None = None,
) -> dict:
    """Worker task: the runtime link of an ONNX path on its own (``parity.diagnose.graph.runtime_link``), on the
    whole graph or on the ``scope`` the descent into the model's tree found (where the descent did not link it)."""
    from parity.diagnose.graph import onnx_graph
    from parity.diagnose.graph import runtime_link as link

    spec = noise_floor.at_bound(Workspace(workspace).load_spec(model), precision, tolerances)
    path = paths.by_id(path_id, "cpu", precision)
    verified = golden.load(Path(golden_dir), spec)
    reference = verified.arrays["reference.npz"]
    graph, folder = onnx_graph.load(Path(artifact_dir) / artifact_meta["file"])
    feed = onnx_feed(spec, artifact_meta, feeds.from_arrays(spec, verified.arrays["inputs.npz"]))
    graph = onnx_graph.pinned(graph, feed, in_place=True)
    graph_outputs = list(artifact_meta["output_names"])
    by_graph_name = dict(zip(graph_outputs, spec.outputs))
    at_precision = spec.output_tolerances(path.precision)
    expected = {name: reference[by_graph_name[name]] for name in graph_outputs}
    return link.compare(
        graph,
        feed,
        expected,
        lambda name: at_precision.for_name(by_graph_name.get(name, name)),
        at_precision.default,
        threads,
        [*graph_outputs, *boundary],
        scope,
        folder,
    )
