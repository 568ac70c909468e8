"""Worker tasks of a benchmark: each batch size verified then timed, a verified training step timed, and
the time to first result broken into parts in a fresh worker.

The timed region is the same for every path: an input already prepared as a host NumPy array ->
outputs ready as host NumPy arrays (``Runner.run``: torch tensors converted, TF eager results read,
JAX results materialised with ``np.asarray``, which waits for them).
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from parity.bench import measure as bench
from parity.bench import stats
from parity.check import closeness as compare
from parity.golden import store as golden
from parity.model.workspace import Workspace
from parity.run import paths
from parity.run.tasks import build_runner
from parity.run.worker import die_with_parent, quick_exit, reason_of, startup_seconds

# each model's spec and verified golden data, loaded once in this worker (and inherited by the processes forked
# from it): (workspace, model, golden_dir) -> (spec, golden). Runners get copies of the weights, never these arrays.
_LOADED: dict[tuple[str, str, str], tuple] = {}


def _setup(workspace: str, model: str, path_id: str, golden_dir: str, device: str = "cpu", precision: str = "fp32"):
    key = (workspace, model, golden_dir)
    if key not in _LOADED:
        spec = Workspace(workspace).load_spec(model)
        _LOADED[key] = spec, golden.load(Path(golden_dir), spec)
    spec, verified = _LOADED[key]
    return spec, paths.by_id(path_id, device, precision), verified


def _weights(verified) -> dict:
    """A copy of the golden weights for one runner (a training step changes its runner's weights, never the golden
    ones it is checked against)."""
    return {name: np.array(value) for name, value in verified.arrays["weights.npz"].items()}


def _runner(spec, path, verified, batch_size: int, threads: int, artifact_dir, artifact_meta, weights=None):
    return build_runner(spec, path, _weights(verified) if weights is None else weights, batch_size, threads,
                        artifact_dir, artifact_meta)


# the runner the last verified batch series timed at the spec's batch size, kept for that path's training step
# (built the same way from the same weights and artifact, and only run forward since): (key, runner) or None
_SPARE_RUNNER: tuple | None = None


def _runner_key(model, path_id, precision, device, threads, batch_size, artifact_dir) -> tuple:
    return model, path_id, precision, device, threads, batch_size, artifact_dir


def eval_slice(spec, verified, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``batch_size`` eval samples and their golden logits (what a batch size is verified on)."""
    x = verified.arrays["eval.npz"]["x"]
    if batch_size > len(x):
        raise ValueError(f"batch size {batch_size} is larger than the eval split ({len(x)} samples) it is verified on")
    return x[:batch_size], verified.arrays["reference.npz"]["eval/logits"][:batch_size]


def time_batch(workspace: str, model: str, path_id: str, golden_dir: str, precision: str, threads: int,
               batch_size: int, timing: dict, artifact_dir: str | None = None, artifact_meta: dict | None = None,
               device: str = "cpu") -> dict:
    """Verify ``batch_size`` (outputs on eval samples against the golden), then time it; never time a failure."""
    global _SPARE_RUNNER
    _SPARE_RUNNER = None
    spec, path, verified = _setup(workspace, model, path_id, golden_dir, device, precision)
    x, reference = eval_slice(spec, verified, batch_size)
    runner = _runner(spec, path, verified, batch_size, threads, artifact_dir, artifact_meta)
    output = spec.outputs[0]
    check = compare.error_stats(runner.run(x)[output], reference, spec.output_tolerances(precision).for_name(output))
    if not check["ok"]:
        return {"verdict": "fail", "reason": compare.describe(f"output at batch {batch_size}", output, check),
                "verified": check}
    measured = bench.measure(lambda: runner.run(x), **timing)
    result = {"verdict": "pass", "verified": check, **stats.summarize(measured["samples_ms"], batch_size), **measured}
    if path.device_kind == "cuda":
        result["gpu"] = gpu_figures(runner, x, timing, batch_size)
    if batch_size == spec.batch_size and runner.differentiable:
        _SPARE_RUNNER = _runner_key(model, path_id, precision, device, threads, batch_size, artifact_dir), runner
    return result


def gpu_figures(runner, x: np.ndarray, timing: dict, batch_size: int) -> dict:
    """On a GPU, beside the host-to-host latency timed by ``time_batch``: GPU compute alone (input already on
    the device, outputs left there, synchronised after every call), the GPU's name, driver and clocks and
    whether they were locked, board energy per inference sampled over the compute window, and peak device
    memory. What cannot be measured says so instead of a number."""
    from parity.bench import gpu as gpu_monitor

    index = int(runner.device.partition(":")[2] or 0)  # NVML and CUDA agree: workers set CUDA_DEVICE_ORDER=PCI_BUS_ID
    figures = {"state": gpu_monitor.gpu_state(index)}
    compute = runner.device_compute(runner.check_feed(x))
    if compute is None:
        figures["compute"] = {"reason": f"{type(runner).__name__} has no device-resident form: only the host-to-host "
                                        "latency is measured"}
        return figures
    with gpu_monitor.Sampler(index) as sampler:
        measured = bench.measure(compute, **timing)
    calls = measured["warmup_runs"] + len(measured["samples_ms"])
    figures["compute"] = {**stats.summarize(measured["samples_ms"], batch_size), **measured}
    figures.update(sampler.summary(calls))
    figures["energy"]["window"] = "warm-up and timed runs of GPU compute"
    figures["peak_device_memory_mb"] = runner.device_memory_peak_mb() or figures.get("peak_process_memory_mb")
    return figures


def time_train_step(workspace: str, model: str, path_id: str, golden_dir: str, precision: str, threads: int,
                    lr: float, timing: dict, artifact_dir: str | None = None, artifact_meta: dict | None = None,
                    device: str = "cpu") -> dict:
    """One SGD step verified from the golden weights (``parity.check.training.check_step``), then timed."""
    from parity.check.training import check_step

    global _SPARE_RUNNER
    spec, path, verified = _setup(workspace, model, path_id, golden_dir, device, precision)
    inputs = verified.arrays["inputs.npz"]
    x, labels = inputs["x"], inputs["labels"]
    # the runner the batch series at this batch size was timed on, if it was the last one: it has only run forward,
    # so it still holds the golden weights (``check_step`` checks that the step starts from them)
    key, runner = _SPARE_RUNNER or (None, None)
    _SPARE_RUNNER = None
    if key != _runner_key(model, path_id, precision, device, threads, spec.batch_size, artifact_dir):
        runner = _runner(spec, path, verified, spec.batch_size, threads, artifact_dir, artifact_meta)
    check = check_step(runner, x, labels, lr, verified.arrays["weights.npz"], verified.arrays["gradients.npz"],
                       spec.gradient_tolerances(precision))
    if not check["ok"]:
        worst = check["params"][check["worst"]]
        return {"verdict": "fail", "verified": check,
                "reason": f"one SGD step (lr {lr:g}) differs from golden weights - lr x golden gradient at "
                          f"{check['worst']}: {worst['tol_units']:.3g}x the tolerance"}
    measured = bench.measure(lambda: runner.train_step(x, labels, lr), **timing)
    summary = stats.summarize(measured["samples_ms"], spec.batch_size)
    return {"verdict": "pass", "verified": check, **summary, **measured,
            "steps_per_s": 1e3 / summary["median_ms"], "samples_per_s": summary["throughput"]}


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


# seconds each runtime package took to import in this worker (packages it imported before its first task: 0, their
# import is in ``startup_seconds``); read by every first result forked from it
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


def first_result(workspace: str, model: str, path_id: str, golden_dir: str, threads: int,
                 artifact_dir: str | None = None, artifact_meta: dict | None = None, device: str = "cpu",
                 precision: str = "fp32", import_s: float | None = None) -> dict:
    """In a fresh worker: the runtime's framework import, load/compile, first inference, first backward,
    each timed alone (an exported path imports only its runtime, not the framework it came from).
    ``import_s``: the import, already timed by the fresh worker this process was forked from.

    Memory: the high-water mark of resident memory (``ru_maxrss``) minus the resident memory
    after the framework import, i.e. what loading and running this path added.
    """
    path = paths.by_id(path_id, device, precision)
    parts = {"import_s": _import_runtime(path) if import_s is None else import_s}
    spec, path, verified = _setup(workspace, model, path_id, golden_dir, device, precision)
    weights = _weights(verified)
    baseline_mb = _rss_mb()
    inputs = verified.arrays["inputs.npz"]
    x = inputs["x"]
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
    return {**parts, "baseline_rss_mb": baseline_mb, "peak_rss_mb": peak_mb,
            "path_peak_mb": max(peak_mb - baseline_mb, 0.0)}


def first_result_forked(**kwargs) -> dict:
    """``first_result`` in a process forked from this worker, which must be fresh: it has imported its frameworks
    (and this path's runtime packages, timed here once per worker) and run nothing else (it only holds the specs
    and golden data it loaded for its children). The child loads and runs only this path, so each path's first
    result starts from the same fresh state, without paying the framework import again for every path of the
    group."""
    path = paths.by_id(kwargs["path_id"], kwargs.get("device", "cpu"), kwargs.get("precision", "fp32"))
    import_s = _import_runtime(path)
    # the model's spec and golden data, loaded here once for every path of the model (data, no path run)
    _setup(kwargs["workspace"], kwargs["model"], kwargs["path_id"], kwargs["golden_dir"], path.device, path.precision)
    read_end, write_end = os.pipe()

    def child():
        os.close(read_end)
        with os.fdopen(write_end, "w") as out:
            json.dump(_outcome(lambda: first_result(**kwargs, import_s=import_s)), out, default=float)

    pid = _fork(child)
    os.close(write_end)
    with os.fdopen(read_end) as incoming:
        data = incoming.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        raise RuntimeError(f"the process measuring the first result died (wait status {status})")
    kind, payload = json.loads(data)
    if kind != "ok":
        raise RuntimeError(payload)
    payload["process"] = "forked from a fresh worker (framework import timed there)"
    return payload


def _fork(child) -> int:
    """Fork this worker: the child dies with it, runs ``child()`` and exits without the interpreter's teardown;
    returns the child's pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 1
        try:
            die_with_parent(parent)
            child()
            status = 0
        finally:
            quick_exit(status)
    return pid


def _outcome(task) -> tuple:
    """``("ok", task())``, or ``("error", reason)`` with the traceback in the worker log: a reply across a pipe
    as JSON (NumPy scalars written as numbers)."""
    try:
        return "ok", task()
    except BaseException as error:  # noqa: BLE001 - the receiving side reports it as the task's error
        traceback.print_exc()
        return "error", reason_of(error)


# a copy of this worker forked while it was fresh (frameworks imported, no task run), waiting to fork each path's
# first-result process: (pid, requests, replies) or None
_HELD: tuple | None = None


def hold_fresh_copy() -> bool:
    """Fork a copy of this worker now, while it is fresh, and keep it waiting: ``first_result_held`` later forks
    each path's first-result process from that copy, so this worker can run other tasks (checks, then timed
    series) in between and still give every first result the fresh state of ``first_result_forked``. The copy
    dies with this worker. Linux only (False elsewhere, and when one is already held)."""
    global _HELD
    if _HELD is not None or not sys.platform.startswith("linux"):
        return False
    request_read, request_write = os.pipe()
    reply_read, reply_write = os.pipe()

    def copy():  # serves requests until this worker closes the pipe or dies
        os.close(request_write)
        os.close(reply_read)
        _serve_held(request_read, reply_write)

    pid = _fork(copy)
    os.close(request_read)
    os.close(reply_write)
    _HELD = pid, os.fdopen(request_write, "w"), os.fdopen(reply_read)
    return True


def _serve_held(request_fd: int, reply_fd: int) -> None:
    with os.fdopen(request_fd) as requests, os.fdopen(reply_fd, "w") as replies:
        for line in requests:
            reply = _outcome(lambda: first_result_forked(**json.loads(line)))
            replies.write(json.dumps(reply, default=float) + "\n")
            replies.flush()


def first_result_held(**kwargs) -> dict | None:
    """``first_result_forked`` in the fresh copy ``hold_fresh_copy`` kept (the path's process is forked from it);
    None when this worker holds none (the caller then measures it in a fresh worker)."""
    if _HELD is None:
        return None
    _, requests, replies = _HELD
    try:
        requests.write(json.dumps(kwargs, default=float) + "\n")
        requests.flush()
        line = replies.readline()
    except OSError:
        line = ""
    if not line:
        release_fresh_copy()
        raise RuntimeError("the fresh copy of the worker that measures first results died; see the worker log")
    kind, payload = json.loads(line)
    if kind != "ok":
        raise RuntimeError(payload)
    return payload


def release_fresh_copy() -> None:
    """End the fresh copy ``hold_fresh_copy`` kept, if any."""
    global _HELD
    if _HELD is None:
        return
    pid, requests, replies = _HELD
    _HELD = None
    for stream in (requests, replies):
        try:
            stream.close()
        except OSError:
            pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
