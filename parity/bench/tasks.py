"""Worker tasks of a benchmark: series opened (each batch size, shape and training step verified before it is timed),
timed in blocks the orchestrator interleaves with other paths' (``parity.bench.rounds``), closed; and the time to
first result broken into parts in a fresh worker.

The timed region is the same for every path: an input already prepared as a host NumPy array ->
outputs ready as host NumPy arrays (``Runner.run``: torch tensors converted, TF eager results read,
JAX results materialised with ``np.asarray``, which waits for them).
"""

from __future__ import annotations

import importlib
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from parity.bench import audit, footprint, stats
from parity.bench import measure as bench
from parity.check import accuracy_gate
from parity.check import closeness as compare
from parity.golden import store as golden
from parity.golden import weights as golden_weights
from parity.model import batch_axes, feeds
from parity.model.workspace import Workspace
from parity.run import paths
from parity.run.tasks import build_runner
from parity.run.worker import process_origin, startup_seconds

# each model's spec and verified golden data, loaded once in this worker: (workspace, model, golden_dir) ->
# (spec, golden). Runners get copies of the weights, never these arrays.
_LOADED: dict[tuple[str, str, str], tuple] = {}


def _setup(workspace: str, model: str, path_id: str, golden_dir: str, device: str = "cpu", precision: str = "fp32"):
    key = (workspace, model, golden_dir)
    if key not in _LOADED:
        spec = Workspace(workspace).load_spec(model)
        _LOADED[key] = spec, golden.load(Path(golden_dir), spec)
    spec, verified = _LOADED[key]
    return spec, paths.by_id(path_id, device, precision), verified


def _weights(spec, verified):
    """A copy of the golden weights for one runner (a training step changes its runner's weights, never the golden
    ones it is checked against); for a user model whose golden data keeps none, what its builder takes (None where
    it holds its own: nothing to copy)."""
    weights = verified.arrays["weights.npz"]
    if isinstance(weights, golden_weights.ModelWeights):
        return golden_weights.for_build(spec, weights)
    return {name: np.array(value) for name, value in weights.items()}


def _runner(spec, path, verified, batch_size: int, threads: int, artifact_dir, artifact_meta, weights=None):
    return build_runner(
        spec,
        path,
        _weights(spec, verified) if weights is None else weights,
        batch_size,
        threads,
        artifact_dir,
        artifact_meta,
    )


# the runner the path's first result built, kept for the first series at the spec's batch size opened after it
# (built the same way from the same weights and artifact, and only run forward and backward since, never updated):
# (key, runner) or None
_SPARE_RUNNER: tuple | None = None


def _runner_key(model, path_id, precision, device, threads, batch_size, artifact_dir) -> tuple:
    return model, path_id, precision, device, threads, batch_size, artifact_dir


def _spare_or_new(key: tuple, build):
    """The spare runner if it is the one ``key`` names, else ``build()``; either way no spare is kept any more
    (one of another batch size is not kept alive while this one runs)."""
    global _SPARE_RUNNER
    spare_key, runner = _SPARE_RUNNER or (None, None)
    _SPARE_RUNNER = None
    return runner if spare_key == key else build()


def rotation(spec, verified, batch_size: int, most: int = audit.MAX_FEEDS) -> list[tuple[dict, np.ndarray]]:
    """Up to ``most`` consecutive slices of ``batch_size`` eval samples with their golden eval output (the first output
    with a batch axis): the inputs a series is verified on and cycles through while it is timed (one, the whole input
    set, for a model whose inputs have no batch axis; where no output has a batch axis, the first slice and the
    output whole, at the golden batch size only)."""
    x = feeds.from_arrays(spec, verified.arrays["eval.npz"])
    available = feeds.samples(spec, x)
    if batch_size > available:
        raise ValueError(
            f"batch size {batch_size} is larger than the eval split ({available} samples) it is verified on"
        )
    golden = verified.arrays["reference.npz"]["eval/logits"]
    if not any(i.batched for i in spec.model_inputs):  # one whole input set: its outputs as they are
        return [(x, golden)]
    axes = batch_axes.recorded(verified.manifest)
    axis = batch_axes.axis_of(axes, batch_axes.eval_output(spec, axes))
    if axis is None:  # its golden is the output of the golden batch's first slice: verified at that size only
        if batch_size != spec.batch_size:
            raise ValueError(
                f"no output has a batch axis: the golden output holds at batch {spec.batch_size} only, so "
                f"batch size {batch_size} cannot be verified"
            )
        return [(feeds.rows(spec, x, 0, batch_size), golden)]
    return [
        (
            feeds.rows(spec, x, k * batch_size, (k + 1) * batch_size),
            batch_axes.rows(golden, axis, k * batch_size, (k + 1) * batch_size),
        )
        for k in range(min(available // batch_size, most))
    ]


# this worker's resident size before it built any runner (its frameworks imported, the golden data loaded): what a
# series' peak memory is measured above
_IDLE_MB: float | None = None
_METER: footprint.BlockMeter | None = None

# series open in this worker, timed block by block in rounds with other paths' series (``parity.bench.rounds``):
# name -> {"kind", "batch", "runner", "run" + "feeds" + "verify" (audited forward calls) or "call" (a training step)}
_OPEN: dict[str, dict] = {}


def open_series(
    series: str,
    kind: str,
    workspace: str,
    model: str,
    path_id: str,
    golden_dir: str,
    precision: str,
    threads: int,
    artifact_dir: str | None = None,
    artifact_meta: dict | None = None,
    device: str = "cpu",
    batch_size: int | None = None,
    index: int | None = None,
    lr: float | None = None,
) -> dict:
    """Set series ``series`` up in this worker, verified before it is ever timed: a batch size on every input it will
    cycle through (outputs against the golden), a verification shape on its inputs, a training step from the
    golden weights. A failure is returned (``"verdict": "fail"``) and the series is not kept."""
    global _IDLE_MB
    spec, path, verified = _setup(workspace, model, path_id, golden_dir, device, precision)
    if _IDLE_MB is None:  # no first result measured here: idle before this worker's first runner
        _import_runtime(path)
        _IDLE_MB = footprint.resident_mb()
    build = lambda b: _runner(spec, path, verified, b, threads, artifact_dir, artifact_meta)
    key = _runner_key(model, path_id, precision, device, threads, batch_size or spec.batch_size, artifact_dir)
    openers: dict[str, Callable[..., dict[str, Any]]] = {
        "batch": _open_batch,
        "shape": _open_shape,
        "train_step": _open_train,
    }
    opened = openers[kind](spec, path, verified, precision, key, build, batch_size=batch_size, index=index, lr=lr)
    if opened.pop("verdict", "pass") != "pass":
        return {"verdict": "fail", **opened}
    meta = opened.pop("meta")
    _OPEN[series] = {**opened, "kind": kind, "device_kind": path.device_kind}
    return {"verdict": "pass", **meta}


def _open_batch(spec, path, verified, precision, key, build, batch_size, **_) -> dict:
    inputs = rotation(spec, verified, batch_size)
    runner = _spare_or_new(key, lambda: build(batch_size))
    output = batch_axes.eval_output(spec, batch_axes.recorded(verified.manifest))  # what ``rotation`` pairs
    first = runner.run(inputs[0][0])
    # judged as the check judged it: at the dtype the path computes the output in
    tolerance = compare.OutputTolerances(spec.output_tolerances, precision, runner.output_dtypes).for_name(output)

    def check(outputs, expected):
        return compare.error_stats(outputs[output], expected, tolerance)

    def audit_check(outputs, expected):  # the full statistics only where the quick bound is exceeded
        units = compare.quick_units(outputs[output], expected, tolerance)
        return {"ok": True, "tol_units": units} if units <= 1 else check(outputs, expected)

    if path.quantized:  # the gate passed its task metric: timed runs must reproduce the int8 outputs themselves
        inputs = _own_outputs(runner, output, first, inputs)
    checks = [check(first, inputs[0][1])] + [check(runner.run(x), expected) for x, expected in inputs[1:]]
    audit_check(runner.run(inputs[0][0]), inputs[0][1])  # its first call's set-up outside the timed series
    worst = max(range(len(checks)), key=lambda k: (not checks[k]["ok"], checks[k].get("tol_units", 0.0)))
    if not checks[worst]["ok"]:
        return {
            "verdict": "fail",
            "verified": checks[worst],
            "reason": compare.describe(f"output at batch {batch_size} (input {worst})", output, checks[worst]),
        }
    return {
        "meta": {"verified": checks[worst]},
        "batch": batch_size,
        "runner": runner,
        "run": runner.run,
        "feeds": [x for x, _ in inputs],
        "verify": lambda k, out: audit_check(out, inputs[k][1]),
    }


def _own_outputs(runner, output: str, first: dict, inputs: list) -> list:
    """A quantized path's rotation paired with its own outputs (the first call's for the first input): an int8
    output differs from the golden by more than float rounding, so its timed calls are audited against what the
    gated model computed. A NaN, a wrong shape or a missing output still fails the opening check."""
    own = [(inputs[0][0], first[output])] + [(x, runner.run(x)[output]) for x, _ in inputs[1:]]
    for (_, value), (_, reference) in zip(own, inputs):
        if np.shape(value) != np.shape(reference) or not np.all(np.isfinite(value)):
            return inputs  # the ordinary check reports it
    return own


def _open_shape(spec, path, verified, precision, key, build, index, **_) -> dict:
    from parity.golden import shapes

    shape = verified.manifest["shapes"][index]
    arrays = verified.arrays["shapes.npz"]
    x = shapes.feeds_at(spec, arrays, index)
    runner = build(spec.batch_size)
    expected = {n: arrays[f"{index}/output/{n}"] for n in spec.outputs}
    outputs = runner.run(x)
    tolerances = compare.OutputTolerances(spec.output_tolerances, precision, dict(runner.output_dtypes))
    check = compare.compare_outputs(outputs, expected, tolerances)
    if path.quantized:  # as the check judged it: by SQNR here; the timed calls reproduce the int8 outputs
        check = accuracy_gate.by_sqnr(check, outputs, expected)
        expected = {name: value for name, value in outputs.items() if name in expected}
    failing = compare.first_failure(check)
    if failing:
        return {
            "verdict": "fail",
            "reason": compare.describe(f"output at {shapes.describe(shape)}", *failing),
            "verified": check,
        }

    def verify(_, outputs) -> dict:
        failing = compare.first_failure(compare.compare_named(outputs, expected, tolerances.for_name))
        return {"ok": True} if failing is None else failing[1]

    return {
        "meta": {"verified": check, "shape": shape},
        "batch": shape.get("batch", 1),
        "runner": runner,
        "run": runner.run,
        "feeds": [x],
        "verify": verify,
    }


def _open_train(spec, path, verified, precision, key, build, lr, **_) -> dict:
    """One SGD step verified from the golden weights (``parity.check.training.check_step``), on a runner of its own
    (the one the path's first result built, where it is still here: it has only run forward)."""
    from parity.check.training import check_step

    inputs = verified.arrays["inputs.npz"]
    x, labels = feeds.from_arrays(spec, inputs), inputs["labels"]
    runner = _spare_or_new(key, lambda: build(spec.batch_size))
    check = check_step(
        runner,
        x,
        labels,
        lr,
        verified.arrays["weights.npz"],
        verified.arrays["gradients.npz"],
        spec.gradient_tolerances(precision),
    )
    if not check["ok"]:
        worst = check["params"][check["worst"]]
        return {
            "verdict": "fail",
            "verified": check,
            "reason": f"one SGD step (lr {lr:g}) differs from golden weights - lr x golden gradient at "
            f"{check['worst']}: {worst['tol_units']:.3g}x the tolerance",
        }
    return {
        "meta": {"verified": check},
        "batch": spec.batch_size,
        "runner": runner,
        "call": lambda: runner.train_step(x, labels, lr),
    }


def time_block(
    series: str,
    timing: dict,
    seed: int = 0,
    audits: int = audit.AUDITS_MIN,
    probe: int | None = None,
    final: bool = True,
) -> dict:
    """One block of timed calls of an open series under ``measure``'s rules (``timing``; the series' first block
    warms it up, the next ones pass ``max_warmup_runs=0``), with its output audits and share of the repeat probe
    (``parity.bench.audit``; a training step changes its weights, so its outputs are not audited)."""
    global _METER
    state = _OPEN[series]
    _METER = _METER or footprint.BlockMeter()
    _METER.start()
    if "call" in state:
        measured = {**bench.measure(state["call"], **timing), "audit": None}
    else:
        measured = audit.audited_measure(
            state["run"],
            state["feeds"],
            state["verify"],
            timing,
            seed=seed,
            audits=audits,
            probe=probe,
            final=final,
            start=state.get("next_feed", 1),
        )
        state["next_feed"] = measured["audit"]["next_feed"]  # the rotation goes on where this block left it
    checked = measured["audit"] or {}
    calls = (
        len(measured["warmup_ms"])
        + len(measured["samples_ms"])
        + len(checked.get("outputs") or ())
        + len(checked.get("probe_ms") or ())
    )
    measured["footprint"] = {**_METER.stop(calls), "idle_rss_mb": _IDLE_MB}
    return measured


def close_series(series: str, timing: dict) -> dict:
    """Forget an open series; for a batch size on a GPU, its GPU figures first (``gpu_figures``)."""
    state = _OPEN.pop(series)
    if state["kind"] == "batch" and state["device_kind"] == "cuda":
        return {"gpu": gpu_figures(state["runner"], state["feeds"][0], timing, state["batch"])}
    return {}


def gpu_figures(runner, x: dict, timing: dict, batch_size: int) -> dict:
    """On a GPU, beside the host-to-host latency of a batch series: GPU compute alone (input already on
    the device, outputs left there, synchronised after every call), the GPU's name, driver and clocks and
    whether they were locked, board energy per inference sampled over the compute window, and peak device
    memory. What cannot be measured says so instead of a number."""
    from parity.bench import gpu as gpu_monitor

    index = int(runner.device.partition(":")[2] or 0)  # NVML and CUDA agree: workers set CUDA_DEVICE_ORDER=PCI_BUS_ID
    figures: dict[str, Any] = {"state": gpu_monitor.gpu_state(index)}
    compute = runner.device_compute(runner.check_feed(x))
    if compute is None:
        figures["compute"] = {
            "reason": f"{type(runner).__name__} has no device-resident form: only the host-to-host latency is measured"
        }
        return figures
    with gpu_monitor.Sampler(index) as sampler:
        measured = bench.measure(compute, **timing)
    calls = measured["warmup_runs"] + len(measured["samples_ms"])
    figures["compute"] = {**stats.summarize(measured["samples_ms"], batch_size), **measured}
    figures.update(sampler.summary(calls))
    figures["energy"]["window"] = "warm-up and timed runs of GPU compute"
    figures["peak_device_memory_mb"] = runner.device_memory_peak_mb() or figures.get("peak_process_memory_mb")
    return figures


# seconds each runtime package took to import in this worker (packages it or its template imported before its first
# task: 0, their import is in ``startup_seconds``)
_IMPORT_S: dict[str, float] = {}


def _import_runtime(path) -> float:
    """Import ``path``'s runtime packages here (each timed the first time); seconds they took, start-up included."""
    for package in path.runtime.packages:
        if package not in _IMPORT_S:
            started = time.perf_counter()
            if package not in sys.modules:
                importlib.import_module(package)
            _IMPORT_S[package] = time.perf_counter() - started
    return startup_seconds() + sum(_IMPORT_S[p] for p in path.runtime.packages)


def first_result(
    workspace: str,
    model: str,
    path_id: str,
    golden_dir: str,
    threads: int,
    artifact_dir: str | None = None,
    artifact_meta: dict | None = None,
    device: str = "cpu",
    precision: str = "fp32",
) -> dict:
    """In a fresh worker, that has run nothing before: the runtime's framework import, load/compile, first
    inference, first backward, each timed alone (an exported path imports only its runtime, not the framework
    it came from). A worker forked from its group's template counts the template's import of the frameworks.

    Memory: the high-water mark of resident memory (``ru_maxrss``) minus the resident memory
    after the framework import, i.e. what loading and running this path added.
    """
    global _SPARE_RUNNER, _IDLE_MB
    path = paths.by_id(path_id, device, precision)
    parts: dict[str, float | None] = {"import_s": _import_runtime(path)}
    spec, path, verified = _setup(workspace, model, path_id, golden_dir, device, precision)
    weights = _weights(spec, verified)
    baseline_mb = footprint.resident_mb()
    _IDLE_MB = baseline_mb if _IDLE_MB is None else _IDLE_MB
    inputs = verified.arrays["inputs.npz"]
    x = feeds.from_arrays(spec, inputs)
    t0 = time.perf_counter()
    runner = _runner(spec, path, verified, spec.batch_size, threads, artifact_dir, artifact_meta, weights)
    parts["load_s"] = time.perf_counter() - t0
    for name in ("first_inference_s", "second_inference_s"):
        t0 = time.perf_counter()
        runner.run(x)
        parts[name] = time.perf_counter() - t0
    parts["first_backward_s"] = None
    if runner.differentiable and spec.loss is not None:  # a user model without labels has no loss
        t0 = time.perf_counter()
        runner.gradients(x, inputs["labels"])
        parts["first_backward_s"] = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    parts["device_peak_mb"] = runner.device_memory_peak_mb()
    # forward and gradients only, its weights still the golden ones: the path's series and training step may use it
    _SPARE_RUNNER = _runner_key(model, path_id, precision, device, threads, spec.batch_size, artifact_dir), runner
    return {
        **parts,
        "baseline_rss_mb": baseline_mb,
        "peak_rss_mb": peak_mb,
        "path_peak_mb": max(peak_mb - baseline_mb, 0.0),
        "process": process_origin(),
    }
