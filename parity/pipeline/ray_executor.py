"""``--executor ray``: the verification matrix on a Ray cluster, each (model, path, device, precision) a cell.

A cell is one Ray task running parity's own pipeline for that one path on the node Ray places it on (golden
verification, export through the node's export cache, check, diagnosis, timing), so a cell's verdict is the one a
local run gives. It requests what it needs: one CPU for a check (``--threads`` for a timed cell), a GPU on a CUDA
device (a quarter for a check, a whole one for timing; of one model with ``--accelerator``), one unit of every software stack its steps import
(``parity.run.stacks``: ``parity-torch``, ``parity-tf``, ...) and, when it times, the node's single ``parity-bench``
unit, so no two timing cells share a node. A node that declares none of these (``ray start --head`` with no
options) is probed for the stacks installed there and given the cells it can run (``parity.pipeline.ray_nodes``).
A cell that no node can run is ``skip`` at once with the reason. The workspace's models and golden data travel as
one content-addressed bundle in Ray's object store, verified by sha256 where they arrive (``parity.pipeline.bundle``);
exports go through each node's export cache (a shared ``PARITY_CACHE_DIR`` makes one export serve the cluster:
entries are locked and verified).

A node lost mid-run: Ray runs its cells again where the resources exist (``MAX_RETRIES``); a cell that still
cannot finish is ``error`` with the reason. Each finished cell is kept in the results store at once, so
``--resume RUN_ID`` reruns only the cells without a result. Every result carries its node's environment manifest;
timings are compared with their baseline only on the same hardware, and the report says where they differ.
"""

from __future__ import annotations

import socket
import time
from dataclasses import replace

from parity.pipeline import ray_nodes
from parity.platform.errors import UsageError
from parity.results.store import hardware
from parity.run import stacks

MAX_RETRIES = 2
CHECK_GPU = 0.25
INSTALL = "pip install -c constraints.txt -e '.[ray]'"


def run_cell(bundle: dict, model: str, path_id: str, options) -> dict:
    """The cell's task, on its node: the bundle unpacked and verified, parity's pipeline run for the one path."""
    import ray

    from parity.model.workspace import Workspace
    from parity.pipeline import orchestrate
    from parity.pipeline.bundle import unpack
    from parity.platform.cache_dir import cache_root

    started = time.perf_counter()
    root = unpack(bundle, cache_root())
    report = orchestrate.check(Workspace(root), [model], replace(options, patterns=(path_id,)))
    result = next((r for r in report["results"] if r["path"] == path_id), None)
    if result is None:
        reason = "; ".join(e["reason"] for e in report["model_errors"]) or "the path did not run"
        result = {"model": model, "path": path_id, "verdict": "error", "reason": reason}
    return {
        "result": result,
        "env": report["env"],
        "host": report.get("host"),
        "node": {"id": ray.get_runtime_context().get_node_id(), "hostname": socket.gethostname()},
        "seconds": time.perf_counter() - started,
    }


def cell_key(model: str, path) -> str:
    return f"{model}|{path.id}|{path.device}|{path.precision}"


def _request(path, timing: bool, threads: int, accelerator: str | None = None) -> dict:
    resources = stacks.needed(path)
    if timing:
        resources[stacks.BENCH] = 1.0
    if accelerator and path.device_kind == "cuda":  # Ray advertises accelerator_type:<model> on GPU nodes
        resources[f"accelerator_type:{accelerator}"] = 0.001
    gpus = (1.0 if timing else CHECK_GPU) if path.device_kind == "cuda" else 0.0
    return {"num_cpus": float(threads if timing else 1), "num_gpus": gpus, "resources": resources}


def _connect(address: str | None):
    try:
        import ray
    except ImportError:
        raise UsageError(f"--executor ray needs Ray, which is not installed: {INSTALL}") from None
    if not ray.is_initialized():
        try:
            own = None if address else stacks.advertised()  # a Ray of this machine advertises its stacks
            # ray.init annotates logging_level as int, but takes a level name too (logging's own rule)
            ray.init(
                address=address,
                logging_level="ERROR",  # type: ignore[arg-type]
                log_to_driver=False,
                include_dashboard=False,
                resources=own,
            )
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise UsageError(f"--address {address}: cannot connect to a Ray cluster ({error})") from None
    return ray


def _lost(error) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"


def check(
    workspace,
    names,
    options,
    address: str | None = None,
    store=None,
    run_id: str | None = None,
    resume: dict | None = None,
    progress=lambda message, **kw: None,
    accelerator: str | None = None,
) -> dict:
    """The merged report of every cell of ``names`` x the selected paths, run on the cluster at ``address``
    (None: a Ray of this machine's own); ``resume``: finished cells (key -> cell) not run again; ``accelerator``:
    GPU cells only on nodes of that GPU model (``accelerator_type:<model>``, e.g. H100)."""
    from parity.pipeline import orchestrate
    from parity.pipeline.bundle import pack
    from parity.platform.env import environment

    ray = _connect(address)
    plan_run = orchestrate.Run(workspace, options)
    plan = plan_run._plan(names)
    timing = options.timing is not None
    models = list(dict.fromkeys(spec.name for spec, _, _ in plan))
    bundle = ray.put(pack(workspace.root, models)) if plan else None
    task = ray.remote(run_cell)
    nodes = ray_nodes.probe(ray) if any(not resume or cell_key(s.name, p) not in resume for s, _, p in plan) else []
    cells, pending, reused = {}, {}, 0
    for spec, _, path in plan:
        key = cell_key(spec.name, path)
        if resume and key in resume:
            cells[key], reused = resume[key], reused + 1
            continue
        placement, why = ray_nodes.place(_request(path, timing, options.threads, accelerator), nodes, timing)
        if placement is None:
            cells[key] = {
                "result": {
                    "model": spec.name,
                    "path": path.id,
                    "stages": path.stages,
                    "device": path.device,
                    "precision": path.precision,
                    "verdict": "skip",
                    "reason": why,
                }
            }
            continue
        ref = task.options(**placement, max_retries=MAX_RETRIES, retry_exceptions=False).remote(
            bundle, spec.name, path.id, options
        )
        pending[ref] = (key, spec, path)
    done = 0
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        key, spec, path = pending.pop(ready[0])
        try:
            cell = ray.get(ready[0])
        except Exception as error:  # noqa: BLE001 - a task error, a lost node after its retries: the cell's error
            cell = {
                "result": {
                    "model": spec.name,
                    "path": path.id,
                    "stages": path.stages,
                    "device": path.device,
                    "precision": path.precision,
                    "verdict": "error",
                    "reason": f"the cell did not finish on the cluster ({_lost(error)})",
                }
            }
        cells[key] = cell
        if store is not None and run_id is not None:
            store.add_cell(run_id, key, cell)
        done += 1
        message = f"cell {key.replace('|', ' ')}: {cell['result']['verdict']}"
        if orchestrate.accepts_steps(progress):
            progress(message, step=done, steps=done + len(pending))
        else:
            progress(message)
    results = []
    for spec, _, path in plan:
        cell = cells[cell_key(spec.name, path)]
        result = dict(cell["result"])
        if cell.get("node"):
            result["node"] = {
                **cell["node"],
                "hardware": hardware(cell["env"]),
                "env": cell["env"],
                "host": cell.get("host"),
            }
        results.append(result)
    compare_by_hardware(plan, results, options)
    hardware_of = {r["node"]["id"]: r["node"]["hardware"] for r in results if r.get("node")}
    report = {
        "schema": orchestrate.RESULT_SCHEMA,
        "env": environment(options.threads),
        "results": results,
        "model_errors": plan_run.model_errors,
        "stage_seconds": {},
        "executor": {"kind": "ray", "address": address, "cells": len(plan), "reused": reused, "nodes": hardware_of},
    }
    warnings = [
        f"{r['node']['hostname']}: {w}"
        for r in results
        if r.get("node")
        for w in ((r["node"].get("host") or {}).get("warnings") or [])
    ]
    if warnings:  # each node's host audit, said once per node and finding
        report["host"] = {"warnings": list(dict.fromkeys(warnings))}
    return report


def compare_by_hardware(plan, results: list[dict], options) -> None:
    """Each timed path against its baseline where both were timed on the same hardware; elsewhere the comparison
    says that the baseline was timed on other hardware, and is not made."""
    if options.timing is None:
        return
    from parity.bench.plan import _compare_to_baselines

    groups: dict[str, list] = {}
    for (spec, manifest, path), result in zip(plan, results, strict=True):
        groups.setdefault((result.get("node") or {}).get("hardware", ""), []).append((spec, manifest, path, result))
    for items in groups.values():
        _compare_to_baselines(items, options.timing)
    for spec, _, _path, result in (item for items in groups.values() for item in items):
        for entry in ((result.get("timing") or {}).get("batches") or {}).values():
            vs = (entry or {}).get("vs_baseline") or {}
            if vs.get("reason", "").startswith("the baseline was not timed"):
                others = [
                    r for r in results if r["model"] == spec.name and r["path"] == vs["baseline"] and r.get("timing")
                ]
                if others:
                    vs["reason"] = (
                        f"the baseline was timed on other hardware ({others[0]['node']['hardware']}, "
                        f"this on {result['node']['hardware']}): not compared"
                    )
