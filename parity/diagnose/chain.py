"""Diagnose one path: taps against the golden, the first divergent tap, a tested cause, and the chain link
where the drift enters (definition -> export -> runtime). Runs in the orchestrator: NumPy only; every
framework runs in a worker through ``parity.diagnose.collect``.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from parity.check import closeness as compare
from parity.check import noise_floor
from parity.diagnose import links, patterns
from parity.diagnose.causes import drift
from parity.diagnose.collect import ONNX_RUNTIMES
from parity.diagnose.descend import NO_TAP_DEPARTS, descend, merge_tree, source_framework, tree_group
from parity.diagnose.graph import mapping_check
from parity.diagnose.graph.runtime_link import leaf_scope
from parity.diagnose.tree import SOURCES
from parity.golden import store as golden
from parity.golden import weights as golden_weights
from parity.model import feeds
from parity.run import paths
from parity.run.worker import TaskFailed

COLLECT = "parity.diagnose.collect:collect"
RUNTIME_LINK = "parity.diagnose.collect:runtime_link"


def _fetcher(run, pool, spec):
    """``names`` -> the model's own weights so named, read in a worker of its framework."""

    def fetch(names: list[str]) -> dict:
        return pool.call(
            spec.frameworks[0],
            "parity.golden.weights:named",
            workspace=str(run.workspace.root),
            model=spec.name,
            names=names,
        )

    return fetch


def _collect(run, pool, spec, path, artifact, precision: str, group: str | None = None, **options) -> dict:
    """The path's taps collection (``COLLECT``), in its own worker group or in ``group``'s."""
    return pool.call(
        group or path.runtime.group,
        COLLECT,
        workspace=str(run.workspace.root),
        model=spec.name,
        path_id=path.id,
        golden_dir=str(run.workspace.golden_dir(spec.name)),
        precision=precision,
        threads=run.options.threads,
        artifact_dir=artifact and artifact["dir"],
        artifact_meta=artifact and artifact["meta"],
        device=path.device,
        tolerances=getattr(spec, "diagnosed_at", None),  # noise_floor.at_bound
        **options,
    )


def diagnose(
    run,
    pool,
    spec,
    manifest,
    path: paths.PathDef,
    artifact: dict | None = None,
    failing: list[str] | None = None,
    split: str = "inputs",
    tolerances: dict | None = None,
    plain: dict | None = None,
) -> dict:
    """The diagnosis of ``path`` (a dict for the result JSON), or ``{"error": why}`` when nothing can be diagnosed.

    ``artifact`` overrides the path's exported artifact (``{"dir", "meta"}``), e.g. a graph
    edited on purpose; by default the run's (cached) export is used. ``failing``: the outputs the path's check
    found out of tolerance, which the instrumented run must reproduce before anything it shows is trusted.
    ``split="eval"``: the path fails on the eval split only; it is diagnosed on the eval samples that fail.
    ``tolerances`` (``Tolerances.to_json``): the path's precision judged at these instead of the spec's (a passing
    path far above the float32 noise floor, at the floor's bound: ``parity.check.noise_floor``). ``plain``: the
    path's outputs on the golden inputs from its check (by the spec's names, as the model gave them), which the taps
    collection of an ONNX graph reads as its plain run (``graph_tree.GraphLevels``).
    """
    if tolerances is not None:
        spec = noise_floor.at_bound(copy.copy(spec), path.precision, tolerances)
    if path.exports and artifact is None:
        artifact = run._export(pool, spec, manifest, path, len(path.exports) - 1)
        if "error" in artifact:
            return {
                "model": spec.name,
                "path": path.id,
                "error": f"nothing to diagnose: the export failed ({artifact['error']})",
            }
    arrays = golden.load(run.workspace.golden_dir(spec.name), spec).arrays
    if not golden_weights.kept(manifest):  # the model's own weights, from a worker where a cause test needs them
        arrays[golden_weights.FILE] = golden_weights.Fetched(  # type: ignore[assignment]  # a Mapping of arrays
            manifest, _fetcher(run, pool, spec)
        )
    definition = path
    if path.exports and path.definition != path.id:
        definition = paths.by_id(
            path.definition, path.device if path.definition in paths.NATIVE else "cpu", path.precision
        )
    try:
        extra: dict[str, Any] = {}
        note: str | None = None
        if split == "eval":
            extra, arrays, note = _eval_rows(run, pool, spec, path, definition, artifact, arrays)
            if not extra:
                return {"model": spec.name, "path": path.id, "error": note}
        # on the fixed input set the runtime link is its own task, after the descent that may scope it
        linked_later = (
            split != "eval" and artifact is not None and path.runtime.name in ONNX_RUNTIMES and path.device == "cpu"
        )
        observed = _collect(
            run,
            pool,
            spec,
            path,
            artifact,
            path.precision,
            collect_group(spec, path, artifact) if split != "eval" and path.device == "cpu" else None,
            runtime_link=path.runtime.name in ONNX_RUNTIMES and not linked_later,
            gradients=split != "eval",
            plain=plain if split != "eval" and artifact is not None else None,
            weight_perturbation=run.options.weight_perturbation.get((spec.name, path.id)),
            **extra,
        )
        source = observed
        if definition is not path:
            artifact_of_definition = (
                run._export(pool, spec, manifest, definition, len(definition.exports) - 1)
                if definition.exports
                else None
            )
            source = _collect(
                run, pool, spec, definition, artifact_of_definition, path.precision, gradients=False, **extra
            )
        tree = None
        if split != "eval":
            try:
                tree = descend(run, pool, spec, path, artifact, observed.get("outputs"))
            except TaskFailed as error:
                tree = {"descended": False, "reason": f"the tree could not be read ({error})"}
        if linked_later:
            observed["runtime_compare"] = _runtime_link(run, pool, spec, path, artifact, arrays, observed, tree)
        if tree is not None:
            tree.pop("runtime_link", None)
    except TaskFailed as error:
        return {"model": spec.name, "path": path.id, "error": f"nothing to diagnose: the path did not run ({error})"}
    result = analyse(spec, path, arrays, observed, source, failing if split != "eval" else None)
    if tree is not None:
        merge_tree(spec, result, tree)
    if path.precision == "fp16" and path.exports and path.exports[-1].name == "float16" and failing:
        parent = run._export(pool, spec, manifest, path, len(path.exports) - 2)
        if "error" not in parent:
            result["repair"] = pool.call(
                path.runtime.group,
                "parity.diagnose.precision.float16_repair:repair_for_diagnosis",
                workspace=str(run.workspace.root),
                model=spec.name,
                golden_dir=str(run.workspace.golden_dir(spec.name)),
                precision=path.precision,
                threads=run.options.threads,
                artifact_dir=parent["dir"],
                artifact_meta=parent["meta"],
                path_id=path.id,
                device=path.device,
            )
    if note:
        result["split"] = {"name": "eval", "rows": extra["rows"]}
        result["notes"].insert(0, note)
    return result


def collect_group(spec, path, artifact: dict | None) -> str | None:
    """The worker group of the taps collection of a path whose file the descent into the model's tree reads in its
    own worker next: the descent's, so the diagnosis does not switch workers (which would drop what the source's
    worker keeps, ``parity.run.kept``) and an ONNX graph on ONNX Runtime or the reference evaluator is read from one
    run (``parity.diagnose.tree.graph_tree.graph_levels``); None (the path's own) otherwise."""
    if artifact is None or source_framework(spec, path) not in SOURCES:
        return None
    meta = artifact["meta"]
    onnx = meta.get("format") == "onnx" and path.runtime.name in ONNX_RUNTIMES
    return tree_group(spec, path, artifact) if onnx or str(meta.get("file", "")).endswith(".tflite") else None


def _runtime_link(run, pool, spec, path, artifact, arrays, observed, tree) -> dict:
    """ONNX Runtime against the reference evaluator (``collect.runtime_link``): on the module where the descent found
    the drift beginning, when it found one with nodes of its own (both runtimes compute it from the same inputs);
    else on the whole graph. A path exported from a framework whose outputs and taps all agree with the golden gives
    the runtimes nothing to dispute; an ONNX file's path is always compared (its golden is the reference
    evaluator's)."""
    reference = arrays["reference.npz"]
    tolerances = spec.output_tolerances(path.precision)
    if path.source in paths.NATIVE:
        outputs_ok = all(s["ok"] for s in _output_stats(spec, observed, reference, tolerances).values())
        rows = drift.tap_rows(
            spec,
            {t: reference[f"tap/{t}"] for t in spec.taps},
            observed["taps"],
            observed["located"],
            tolerances.for_name,
        )
        if outputs_ok and all(r["stats"] is None or r["stats"]["ok"] for r in rows):
            return {
                "nodes": [],
                "first_divergent": None,
                "error": "the path's outputs and taps agree with the golden: nothing for the runtimes to dispute",
            }
    if (tree or {}).get("runtime_link") is not None:  # linked on the module by the descent, from its own run
        return tree["runtime_link"]
    scope = leaf_scope(tree)
    boundary = [w["tensor"] for w in observed["located"].values() if w.get("tensor")]
    common = {
        "workspace": str(run.workspace.root),
        "model": spec.name,
        "path_id": path.id,
        "golden_dir": str(run.workspace.golden_dir(spec.name)),
        "precision": path.precision,
        "threads": run.options.threads,
        "artifact_dir": artifact["dir"],
        "artifact_meta": artifact["meta"],
        "boundary": boundary,
        "tolerances": getattr(spec, "diagnosed_at", None),  # noise_floor.at_bound
    }
    if scope is not None:
        try:
            return pool.call(path.runtime.group, RUNTIME_LINK, scope=scope, **common)
        except TaskFailed:  # the module's nodes cannot be cut out on their own: the whole graph
            pass
    return pool.call(path.runtime.group, RUNTIME_LINK, **common)


def _eval_rows(run, pool, spec, path, definition, artifact, arrays) -> tuple[dict, dict, str]:
    """``({"rows", "eval_reference"}, arrays on those rows, note)`` for a path failing on the eval split only:
    the failing rows (worst first, repeated up to the golden batch size so a graph of static batch runs them),
    and the float64 reference of the model's own source on them; ``({}, arrays, why)`` when no row fails again."""
    common = {
        "workspace": str(run.workspace.root),
        "model": spec.name,
        "golden_dir": str(run.workspace.golden_dir(spec.name)),
    }
    bad = pool.call(
        path.runtime.group,
        "parity.diagnose.eval_split:failing_rows",
        path_id=path.id,
        precision=path.precision,
        threads=run.options.threads,
        artifact_dir=artifact and artifact["dir"],
        artifact_meta=artifact and artifact["meta"],
        device=path.device,
        **common,
    )
    if not bad:
        return {}, arrays, "nothing to diagnose: no eval sample fails when the path runs the eval split again"
    rows = (bad * spec.batch_size)[: spec.batch_size]
    framework = spec.frameworks[0]
    source_group = paths.by_id(framework if framework in paths.NATIVE else "onnx/onnxref").runtime.group
    reference = pool.call(source_group, "parity.diagnose.eval_split:reference_rows", rows=rows, **common)
    evals = arrays["eval.npz"]
    picked = {k: v[np.asarray(rows)] for k, v in evals.items() if v.ndim}
    arrays = {
        **arrays,
        "inputs.npz": picked,
        "reference.npz": {**reference["outputs"], **{f"tap/{t}": v for t, v in reference["taps"].items()}},
    }
    note = (
        f"the path agrees on the fixed input set and fails on the eval split only: diagnosed on the "
        f"{len(set(rows))} eval sample(s) that fail (rows {', '.join(map(str, sorted(set(rows))[:8]))}"
        f"{', ...' if len(set(rows)) > 8 else ''}), against the float64 reference of {spec.frameworks[0]} on them"
    )
    return {"rows": rows, "eval_reference": reference}, arrays, note


def analyse(spec, path, arrays: dict, observed: dict, source: dict, failing: list[str] | None = None) -> dict:
    """Everything a diagnosis says, from the collected arrays (see ``diagnose``). Where the instrumented run no
    longer reproduces a failing output of the check (``failing``), that is said first and the chain of links is
    not reported as ok: what the instrumented run shows is not what failed."""
    reference = arrays["reference.npz"]
    golden_taps = {t: reference[f"tap/{t}"] for t in spec.taps}
    tolerances = spec.output_tolerances(path.precision)
    output_stats = _output_stats(spec, observed, reference, tolerances)
    if path.exports:  # a tap read from a graph is trusted only where its mapping holds
        observed = {
            **observed,
            "taps": mapping_check.verify(
                observed["taps"],
                golden_taps,
                observed["located"],
                tolerances.for_name,
                all(s["ok"] for s in output_stats.values()),
            ),
        }
    rows = drift.tap_rows(spec, golden_taps, observed["taps"], observed["located"], tolerances.for_name)
    notes = []
    if path.exports:  # a graph-read divergence that the outputs computed from it contradict is withdrawn
        output_units = mapping_check.output_units(output_stats)
        for tap in mapping_check.withdraw_contradicted(rows, observed["located"], output_units):
            notes.append(f"{tap}: {next(r['reason'] for r in rows if r['tap'] == tap)}")
    first = drift.first_divergent(rows)
    if not spec.taps:
        notes.append("the model declares no taps: only outputs and gradients are compared")
    if spec.taps and first is None and any(not s["ok"] for s in output_stats.values()):
        notes.append(
            f"{NO_TAP_DEPARTS}: the drift is after the last compared tap or in a tap that could not be compared"
        )
    cause_test = _test_cause(spec, first, arrays, observed, golden_taps, tolerances) if first else None
    cause = None
    if cause_test and cause_test.get("cause"):
        cause = {"tap": first, **cause_test["cause"]}
    grad_stats = None
    if observed["gradients"] is not None:
        grad_stats = compare.compare_named(
            observed["gradients"], arrays["gradients.npz"], spec.gradient_tolerances(path.precision).for_name
        )
    output = spec.outputs[0]
    vanished = [name for name in failing or () if output_stats.get(name, {}).get("ok")]
    if vanished:
        notes.insert(
            0,
            f"the failure disappears under instrumentation: output {', '.join(vanished)} is out of "
            f"tolerance in the check but within it when the taps are read too; an optimisation that "
            f"depends on which tensors are graph outputs changes the result (the taps, the chain and the "
            f"cause below describe the instrumented graph, not the failing one)",
        )
    instrumentation = observed.get("instrumentation")
    if instrumentation:
        notes.insert(0, _instrumentation_note(instrumentation))
    optimiser = observed.get("optimiser")
    runtime = observed.get("runtime_compare") or {}
    node_cause = runtime.get("node_cause")
    if optimiser:
        from parity.diagnose.graph.optimiser import describe

        removed = optimiser["rewritten"]["removed"] or optimiser["rewritten"]["added"] or [(None, None)]
        node_cause = {
            "cause": "optimiser_rewrite",
            "node": removed[0][0],
            "op_type": removed[0][1],
            "description": describe(optimiser),
            "fix": optimiser["fix"],
            "fix_tested": True,
            "trusted": "ort-noopt",
            "nodes": optimiser["rewritten"],
        }
    return {
        "reproduces": not vanished,
        "model": spec.name,
        "path": path.id,
        "tolerance": tolerances.default.to_json(),
        "taps": rows,
        "first_divergent_tap": first,
        "cause": cause,
        "cause_test": cause_test,
        "node_cause": node_cause,
        "instrumentation": instrumentation,
        "optimiser": optimiser,
        "gradients": drift.gradient_layers(
            spec, grad_stats, first, _stopped(observed["gradients"], arrays.get("gradients.npz"))
        ),
        "links": {"checks": [], "unreliable": True}
        if vanished
        else links.judge(
            spec,
            path,
            observed,
            source,
            {"taps": golden_taps, "outputs": {n: reference[n] for n in spec.outputs}},
            tolerances,
        ),
        "patterns": patterns.output_patterns(
            observed["outputs"][output], reference[output], tolerances.for_name(output)
        ),
        "notes": notes,
    }


def _stopped(observed: dict | None, golden_gradients: dict | None) -> set[str]:
    """Gradients that are exactly zero where the golden's are not."""
    if not observed or not golden_gradients:
        return set()
    return {
        name
        for name, value in observed.items()
        if name in golden_gradients and not np.any(value) and np.any(golden_gradients[name])
    }


def _instrumentation_note(seen: dict) -> str:
    if seen.get("nondeterministic"):
        return (
            "the graph is not deterministic (two plain runs give different outputs): the taps come from one "
            "instrumented run, and whether reading them changes the result cannot be checked"
        )
    disturbing = ", ".join(f"{d['tap']} ({d['tensor']})" for d in seen["disturbing"]) or "none alone"
    return (
        f"reading every tap changes what the graph computes: marking a tensor as a graph output stops an "
        f"optimisation that depends on it not being one, so the failure disappears under full instrumentation; "
        f"{len(seen['observable'])} tap(s) were read without changing the outputs ({seen['runs']} runs, "
        f"bisecting the taps); unobservable: {disturbing}"
    )


def _output_stats(spec, observed, reference, tolerances) -> dict:
    return compare.compare_named(observed["outputs"], {n: reference[n] for n in spec.outputs}, tolerances.for_name)


def _test_cause(spec, tap: str, arrays: dict, observed: dict, golden_taps: dict, tolerances) -> dict | None:
    """Recompute the first divergent layer from its input (the path's own, else the golden) with each variant."""
    from parity.diagnose.causes.cause import not_its_kind, test_layer

    layer = spec.layers.get(tap)
    if layer is None:
        return {
            "tap": tap,
            "kind": None,
            "cause": None,
            "explanation": f"{tap} has no layer type in the spec, so no cause can be tested",
        }
    inputs, provenance = [], []
    reference_inputs: list[np.ndarray | None] = []
    for name in spec.layer_inputs(tap):
        if name == drift.INPUT:
            inputs.append(feeds.from_arrays(spec, arrays["inputs.npz"])[spec.model_inputs[0].name].astype(np.float64))
            provenance.append("the model input")
            reference_inputs.append(inputs[-1])
            continue
        reference_inputs.append(golden_taps.get(name))
        if name in observed["taps"]:
            inputs.append(np.asarray(observed["taps"][name], dtype=np.float64))
            provenance.append(f"{name} as this path computed it")
        else:
            inputs.append(golden_taps[name])
            provenance.append(f"{name} from the golden")
    # the layer's own (those its prefix names): a user model's are read from the model in a worker
    weights = {
        k: np.asarray(v, np.float64)
        for k, v in golden_weights.under(arrays["weights.npz"], layer.params or tap).items()
    }
    if tap in golden_taps and all(x is not None for x in reference_inputs):
        unlike = not_its_kind(
            layer, reference_inputs, weights, golden_taps[tap], tolerances.for_name(tap), layer.params or tap, tap
        )
        if unlike:
            return {"tap": tap, **unlike}
    result = test_layer(
        layer,
        inputs,
        weights,
        np.asarray(observed["taps"][tap], dtype=np.float64),
        tolerances.for_name(tap),
        prefix=layer.params or tap,
    )
    return {"tap": tap, "inputs": provenance, **result}
