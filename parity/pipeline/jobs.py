"""What each ``parity`` command does, as one call: the CLI parses arguments, calls one function here
and prints what it is told (through callbacks or the values returned).

``check`` serves ``check``, ``run``, ``bench`` and ``diagnose``: refuse unwritable targets before any work,
select the models, run the orchestrator, hand the report over to be shown, then write the JSON and the
HTML report. No framework is imported here; every framework runs in a worker process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from parity.platform.errors import ParityError, UsageError

if TYPE_CHECKING:  # the benchmark plan is imported only by a run that times
    from parity.bench.plan import BenchOptions


def _quiet(message: str) -> None:
    pass


def open_workspace(workspace: str | None, notice: Callable[[str], None] = _quiet):
    """The workspace named (or the current folder, else the built-in zoo); ``notice`` hears about a fallback."""
    from parity.model.workspace import Workspace

    ws = Workspace(workspace)
    if ws.fallback_note:
        notice(f"note: {ws.fallback_note}")
    return ws


def check_targets(json_file: str | None, report_dir: str | None, junit_file: str | None = None) -> None:
    """Refuse now, before any work, a ``--json`` or ``--junit-xml`` file or ``--report`` folder that could not be
    written.

    ``--json`` and ``--junit-xml`` need their folder to exist; ``--report`` may be created, in a folder that exists.
    """
    from parity.platform.safefs import check_writable

    if json_file:
        check_writable(json_file, "--json", make_parents=False)
    if junit_file:
        check_writable(junit_file, "--junit-xml", make_parents=False)
    if report_dir:
        report = Path(os.path.abspath(report_dir))
        check_writable(report / "index.html" if os.path.lexists(report) else report, "--report", make_parents=False)


def bench_options(
    budget_s: float, min_runs: int, target_ci: float, batch_sizes, baseline: str | None, processes: int = 1
):
    """The timing options of ``run`` and ``bench``, refused with a usage error when out of range."""
    from parity.bench.plan import BenchOptions
    from parity.run import paths as path_registry

    if not budget_s > 0:
        raise UsageError(f"--budget must be a positive number of seconds, not {budget_s:g}")
    if min_runs < 1 or not 0 < target_ci < 1:
        raise UsageError("--min-runs must be at least 1 and --target-ci between 0 and 1")
    bad = [b for b in batch_sizes if b < 1]
    if bad:
        raise UsageError(f"--batch-size must be a positive integer, not {bad[0]}")
    if baseline and baseline not in path_registry.CHAIN_IDS:
        raise UsageError(f"--baseline {baseline!r} is not a path; known paths: {', '.join(path_registry.CHAIN_IDS)}")
    return BenchOptions(
        budget_s=budget_s,
        min_runs=min_runs,
        target_rel_ci=target_ci,
        batch_sizes=tuple(dict.fromkeys(batch_sizes)),
        baseline=baseline,
        processes=processes,
    )


@dataclass(frozen=True)
class CheckRequest:
    """What ``check``, ``run``, ``bench`` or ``diagnose`` was asked (``timing`` None: check only)."""

    workspace: str | None = None
    models: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    device: str = "cpu"
    precision: str = "fp32"
    threads: int = 1
    timeout_s: float | None = None  # each task's wall-clock limit; None: scaled with the model's weights
    use_cache: bool = True
    timing: BenchOptions | None = None
    diagnose: str | None = "failing"
    json_file: str | None = None  # "-": the JSON goes to stdout (the caller prints it), nothing is written
    report_dir: str | None = None
    command: str = "check"
    store: str | None = None  # SQLAlchemy URL or SQLite file; None: the workspace's .parity/results.sqlite
    use_store: bool = True
    against: str | None = None  # "last" or a run id in the store
    allow_different_env: bool = False
    executor: str = "local"  # or "ray"
    address: str | None = None  # the Ray cluster (None: one of this machine's own)
    resume: str | None = None  # a run id in the store whose finished cells are kept (ray)
    accelerator: str | None = None  # GPU cells only on nodes with accelerator_type:<this> (ray)
    junit_file: str | None = None  # JUnit XML of the verdicts, one testcase per model and path
    # Model Explorer node data of each diagnosis: a folder, "auto" (beside --json, when it names a file), or None
    model_explorer: str | None = None


def check(
    request: CheckRequest,
    *,
    progress=_quiet,
    on_checked: Callable[[dict], None] | None = None,
    show: Callable[[dict], None] = lambda report: None,
    notice: Callable[[str], None] = _quiet,
) -> int:
    """Check (and diagnose, and time) the selected paths; returns the exit code.

    ``progress(message[, step=k, steps=n])`` hears each step as the orchestrator starts it; ``on_checked(report)``
    hears the verdicts once every check and diagnosis is done, before any timing; ``show(report)`` gets the final report before the JSON and HTML files are written; ``notice`` hears
    one-line notes (a workspace fallback, each file written). A file that cannot be written after the run is a
    ``ParityError``.
    """
    from parity.platform.precision import parse_device

    to_stdout = request.json_file == "-"
    if (request.resume is not None or request.accelerator) and request.executor != "ray":
        raise UsageError("--resume and --accelerator place cells on a cluster: use them with --executor ray")
    device = parse_device(request.device)
    pool = _early_pool(request, device)  # first: it loads while the rest is checked here; the orchestrator closes it
    try:
        check_targets(None if to_stdout else request.json_file, request.report_dir, request.junit_file)
        from parity.pipeline.node_data import explorer_folder

        explorer = explorer_folder(request.model_explorer, None if to_stdout else request.json_file)
        ws = open_workspace(request.workspace, notice)
        names = ws.select(request.models)
        store, baseline, differ = _open_store(request, ws, device)  # refused here, before anything runs or is written
        from parity.pipeline import orchestrate, outcome
    except BaseException:
        if pool is not None:
            pool.close()
        raise
    options = orchestrate.Options(
        threads=request.threads,
        patterns=request.patterns,
        precision=request.precision,
        device=device,
        timeout_s=request.timeout_s,
        use_cache=request.use_cache,
        timing=request.timing,
        diagnose=request.diagnose,
        node_data=explorer is not None,
    )
    run_id = None
    if request.executor == "ray":
        from parity.pipeline import ray_executor
        from parity.results.store import new_run_id

        resumed = store.cell_results(request.resume) if request.resume is not None else None
        run_id = new_run_id() if store is not None else None
        report = ray_executor.check(
            ws,
            names,
            options,
            request.address,
            store,
            run_id,
            resumed,
            progress=progress,
            accelerator=request.accelerator,
        )
        if request.resume is not None:
            report["executor"]["resumed_from"] = request.resume
    else:
        report = orchestrate.check(ws, names, options, progress=progress, on_checked=on_checked, pool=pool)
    code = outcome.exit_code(report)
    history = _past_medians(store, report) if baseline is not None else None  # before this run is stored
    if store is not None:
        report["run_id"] = store.append(report, request.command, ws.root, code, run_id=run_id)
        if request.report_dir:  # the HTML report links the history of its paths over the stored runs
            _history_page(store, report, Path(request.report_dir))
    if baseline is not None:
        from parity.results import against as comparison

        text, against_code = comparison.render(baseline, report, differ, history)
        report["against"] = {"baseline": baseline.get("run_id"), "text": text, "exit_code": against_code}
        code = max(code, against_code)
    show(report)
    write_results(
        report,
        None if to_stdout else request.json_file,
        request.report_dir,
        notice,
        junit_file=request.junit_file,
        model_explorer=explorer,
    )
    if store is not None and not to_stdout:  # JSON on stdout: its run_id says it, nothing else is printed
        notice(f"stored as run {report['run_id']} in {store.url}")
    why = outcome.nothing_checked(report)
    if why:  # the verdicts and files are out; the exit code 2 is said last, in one line
        notice(f"error: {why}")
    return code


def _early_pool(request: CheckRequest, device: str):
    """The local run's worker pool, its spare process started now (None for Ray): the spare's Python, NumPy and
    parity load while this process imports the orchestrator, opens the results store and verifies the goldens."""
    if request.executor != "local":
        return None
    from parity.platform.cache_dir import cache_folder, cache_root
    from parity.platform.precision import worker_environment
    from parity.run.worker import WorkerPool

    root = cache_folder(cache_root())  # a file in the cache's place is named as the cache folder, not the log folder
    env = worker_environment(device, request.precision)
    # a timed run's workers are its own children (the timing audit counts their CPU as the run's own)
    pool = WorkerPool(request.threads, root / "logs", request.timeout_s, env, service=request.timing is None)
    pool.prestart()
    return pool


def _open_store(request: CheckRequest, ws, device: str):
    """The results store (None with ``use_store`` off), the ``--against`` baseline document and what differs from
    it; every refusal (not a store, locked, no driver, no such run, other hardware) raised before the run. An empty
    run id is refused like any other unknown one, never taken as no ``--against``."""
    if not request.use_store:
        if request.against is not None or request.resume is not None:
            raise UsageError("--against and --resume read the results store: drop --no-store")
        return None, None, []
    from parity.results import store as results

    store = results.Store.open(results.resolve(request.store, ws.root), create=request.against is None)
    if request.against is None:
        return store, None, []
    from parity.platform import env
    from parity.results.against import check_environment

    baseline = store.document(request.against)
    here = results.hardware({"cpu": env.cpu_model(), "cpu_count": os.cpu_count(), "gpu": env.gpu_info()})
    differ = check_environment(baseline, here, device, request.precision, request.allow_different_env)
    return store, baseline, differ


def history(
    workspace: str | None, models, patterns, store: str | None, report_dir: str | None, notice=_quiet
) -> tuple[str, Path | None]:
    """``parity history``: the text, and the HTML page written into ``report_dir`` (None without one)."""
    from parity.results import history as past
    from parity.results import store as results

    ws = open_workspace(workspace, notice)
    opened = results.Store.open(results.resolve(store, ws.root), create=False)
    runs = opened.history(tuple(models), tuple(patterns))
    series, envs = past.build(runs)
    written = None
    if report_dir:
        from parity.results import history_html

        written = history_html.write(series, envs, opened.url, Path(report_dir))
    return past.render(series, envs, opened.url, len(runs)), written


def _past_medians(store, report: dict) -> dict:
    """(model, path, batch) -> medians of that series in the store's earlier runs on this run's hardware; a
    generation series (its time to first token or decode step) under (model, path, batch, kind)."""
    from parity.results.store import hardware

    here = hardware(report.get("env") or {})
    models = tuple(dict.fromkeys(r["model"] for r in report["results"]))
    found: dict[tuple, list[float]] = {}
    for run in store.history(models, with_env=False):
        if run["hardware"] != here:
            continue
        for row in run["rows"]:
            if row["kind"] in ("batch", "ttft", "decode_step") and row["verdict"] == "pass" and row["median_ms"]:
                extra = () if row["kind"] == "batch" else (row["kind"],)
                found.setdefault((row["model"], row["path"], row["key"], *extra), []).append(row["median_ms"])
    return found


def _history_page(store, report: dict, out_dir: Path) -> None:
    from parity.results import history as past
    from parity.results import history_html

    paths = tuple(dict.fromkeys(r["path"] for r in report["results"]))
    models = tuple(dict.fromkeys(r["model"] for r in report["results"]))
    series, envs = past.build(store.history(models, paths))
    try:
        history_html.write([s for s in series if s.path in paths], envs, store.url, out_dir)
    except OSError as error:
        raise ParityError(f"--report {out_dir}: history.html could not be written: {error.strerror or error}") from None
    report["history_page"] = "history.html"


def write_results(
    report: dict,
    json_file: str | None,
    report_dir: str | None,
    notice=_quiet,
    junit_file: str | None = None,
    model_explorer: str | None = None,
) -> None:
    """The Model Explorer node data, the result JSON, the JUnit XML and the HTML report, each announced to
    ``notice`` once written (the node data first: the JSON and the HTML report say where it is; a node-data folder
    that could not be written is raised only once the others are out)."""
    failed = []
    if model_explorer:
        from parity.pipeline import node_data

        failed = node_data.write(report, model_explorer, notice)
    if json_file:
        from parity.report import json_report

        _write_after_run("--json", json_file, lambda: json_report.write(report, json_file), notice)
    if junit_file:
        from parity.report import junit

        _write_after_run("--junit-xml", junit_file, lambda: junit.write(report, junit_file), notice)
    if report_dir:
        from parity.report import html

        _write_after_run("--report", report_dir, lambda: html.write(report, report_dir), notice)
    if failed:
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise ParityError(f"--model-explorer could not be written after the run: {failed[0]}{more}")


def _write_after_run(option: str, target: str, write, notice) -> None:
    try:
        written = write()
    except OSError as error:
        raise ParityError(f"{option} {target} could not be written after the run: {error.strerror or error}") from None
    notice(f"wrote {written or target}")


@dataclass(frozen=True)
class GoldenOutcome:
    """One model's golden build or verification: the manifest, or the error that stopped it."""

    name: str
    golden_dir: Path
    manifest: dict | None = None
    error: str | None = None
    peaks: dict[str, int] | None = None  # worker task -> its peak memory (bytes)

    @property
    def summary(self) -> str:
        from parity.golden import store

        if self.manifest is None:  # the build or verification stopped: its error is the summary
            return self.error or "no golden data"
        if self.manifest.get("task"):  # a generation golden (``parity.generation.golden``)
            reference = self.manifest["reference"]
            return (
                f"float64 greedy generation, {reference['steps']} steps on {reference['prompts']} prompts, "
                f"vocabulary {reference['vocab']}, built in {self.manifest['build_seconds']} s"
            )
        return store.summary(self.manifest, self.golden_dir) + self.peak_memory

    @property
    def peak_memory(self) -> str:
        """`` | peak memory: reference 3.0 GB, ...``: each step's worker at its peak, the largest first."""
        if not self.peaks:
            return ""
        from parity.platform.memory import gb

        steps = sorted(self.peaks.items(), key=lambda item: -item[1])
        return " | peak memory: " + ", ".join(f"{task.rpartition(':')[2]} {gb(n)}" for task, n in steps[:4])


def build_goldens(
    workspace: str | None, models, threads: int | None, progress=_quiet, notice=_quiet, upgrade: bool = False
) -> Iterator[GoldenOutcome]:
    """Build each selected model's golden data in turn (one model's failure does not stop the next); ``upgrade``:
    bring golden data of an older schema to the current one instead (``parity.golden.shapes.upgrade``)."""
    from parity.generation import golden as generation_golden
    from parity.golden import build as golden_build
    from parity.golden import shapes
    from parity.pipeline import generation
    from parity.platform.cache_dir import cache_root
    from parity.platform.env import default_threads
    from parity.run.worker import TaskFailed, WorkerPool

    ws = open_workspace(workspace, notice)
    if ws.is_fallback:
        raise UsageError(
            f"golden {'upgrade' if upgrade else 'build'} writes only into a workspace you name: run it "
            f"in a folder with models/, or pass --workspace {ws.root} for the built-in zoo"
        )
    with WorkerPool(threads or default_threads(), cache_root() / "logs", timeout_s=1800) as pool:
        for name in ws.select(models):
            try:
                # the spec as declared: the golden data it replaces may be what is refused
                spec = ws.load_spec(name, attach_golden=False)
                if generation.is_generation(spec):  # a language model's golden: its greedy generation, step by step
                    if upgrade:
                        raise UsageError(f"{name}: generation golden data has one schema; nothing to upgrade")
                    manifest = generation_golden.build(ws, spec, pool, progress=progress)
                    yield GoldenOutcome(name, ws.golden_dir(name), manifest=manifest)
                    continue
                step = shapes.upgrade if upgrade else golden_build.build
                pool.peaks.clear()
                with pool.for_model(_weights_bytes(pool, ws, spec)):  # each step's memory said before it starts
                    manifest = step(ws, spec, pool, progress=progress)
            except (ParityError, TaskFailed) as error:
                yield GoldenOutcome(name, ws.golden_dir(name), error=str(error))
                continue
            yield GoldenOutcome(name, ws.golden_dir(name), manifest=manifest, peaks=dict(pool.peaks))


def _weights_bytes(pool, ws, spec) -> int | None:
    """The size of a user model's weights before its golden build (``parity.model.size``), None where it is not
    known without building the model (the zoo's are small)."""
    if not spec.weights_from_model:
        return None
    return pool.call(
        spec.frameworks[0],
        "parity.model.size:weights_bytes",
        workspace=str(ws.root),
        model=spec.name,
    )


def verify_goldens(workspace: str | None, models, notice=_quiet) -> Iterator[GoldenOutcome]:
    """Verify each selected model's golden files against its manifest (every model, failures included)."""
    from parity.generation import golden as generation_golden
    from parity.golden import store
    from parity.pipeline import generation

    ws = open_workspace(workspace, notice)
    for name in ws.select(models):
        try:
            spec = ws.load_spec(name)
            if generation.is_generation(spec):
                manifest = generation_golden.verify(ws.golden_dir(name), spec, ws.root)
            else:
                manifest = store.verify(ws.golden_dir(name), spec)
        except ParityError as error:
            yield GoldenOutcome(name, ws.golden_dir(name), error=str(error))
            continue
        yield GoldenOutcome(name, ws.golden_dir(name), manifest=manifest)


def path_rows(workspace: str | None, models, devices, precisions, notice=_quiet) -> list[dict]:
    """The path matrix as rows (id, device, precision, export steps, why unavailable, runtime note), limited to
    the frameworks of ``models`` when any are named."""
    from parity.pipeline import generation
    from parity.platform.precision import parse_device
    from parity.run import paths as path_registry

    frameworks = None
    generating: dict[str, None] = {}  # the generation paths of the named text-generation models
    if models:
        ws = open_workspace(workspace, notice)
        frameworks = set()
        for name in ws.select(models):
            spec = ws.load_spec(name)
            if generation.is_generation(spec):
                generating.update(dict.fromkeys(generation.selected(spec, ())))
            else:
                frameworks.update(spec.frameworks)
    devices = tuple(dict.fromkeys(parse_device(d) for d in devices)) or ("cpu", "cuda:0")
    rows = [
        {
            "id": path_id,
            "device": "cpu",
            "precision": "fp32",
            "steps": " -> ".join(generation.PATHS[path_id].stages),
            "reason": None,
            "note": "text-generation: prefill and greedy decode steps with a key/value cache",
        }
        for path_id in generating
    ]
    for path in path_registry.matrix(devices, precisions or path_registry.ALL):
        if frameworks is None or path.source in frameworks:
            rows.append(
                {
                    "id": path.id,
                    "device": path.device,
                    "precision": path.precision,
                    "steps": " -> ".join(s.name for s in path.exports)
                    or ("native" if path.id in path_registry.NATIVE else path.runtime.name),
                    "reason": path_registry.unavailable_reason(path),
                    "note": "; ".join(
                        n
                        for n in (
                            path.runtime.note,
                            *(s.note for s in path.exports),
                            path.opt_in and f"opt-in ({path.opt_in}): name it with --path",
                        )
                        if n
                    ),
                }
            )
    return rows


def _forward_pass(ws, name: str, command: str):
    """``name``'s spec, refused with one line where it is a generation model (checked step by step, not as one
    forward pass: ``parity check`` verifies it)."""
    from parity.pipeline import generation

    spec = ws.load_spec(name)
    if generation.is_generation(spec):
        raise UsageError(f"{command} works on one forward pass; {name} is a text-generation model: parity check it")
    return spec


def export_test_data(workspace: str | None, model: str, out_dir: str, notice=_quiet) -> tuple[Path, object]:
    """A model's golden inputs and outputs as ONNX test data under ``out_dir``; the folder written and the spec."""
    import numpy as np

    from parity.golden import store
    from parity.interop import onnx_test_data as interop
    from parity.model import feeds

    ws = open_workspace(workspace, notice)
    (name,) = ws.select([model])
    spec = _forward_pass(ws, name, "export-testdata")
    verified = store.load(ws.golden_dir(name), spec)
    reference = verified.arrays["reference.npz"]
    written = interop.write_test_data(
        Path(out_dir),
        feeds.from_arrays(spec, verified.arrays["inputs.npz"]),
        {
            out: reference[out].astype(np.float32) if reference[out].dtype.kind == "f" else reference[out]
            for out in spec.outputs
        },
    )
    return written, spec


def init_model(
    name: str,
    sources: dict[str, str | None],
    input_decls: tuple[str, ...],
    axes: tuple[str, ...],
    files: dict[str, str | None],
    seed: int,
    force: bool,
    workspace: str | None,
    opset: int | None = None,
) -> tuple[Path, dict, str]:
    """``parity init``: ``sources`` maps torch/tf/jax/onnx to what was given (exactly one), ``files`` the data
    files (inputs_file, test_data, polygraphy_inputs, polygraphy_outputs). Returns the spec written, what the
    model said about itself, and the source kind."""
    from parity.pipeline import scaffold
    from parity.platform.env import default_threads

    chosen = [(kind, ref) for kind, ref in sources.items() if ref]
    if len(chosen) != 1:
        raise UsageError("give exactly one of --torch, --keras, --jax, --onnx")
    kind, reference = chosen[0]
    root = Path(workspace or ".").resolve()
    params_file = None
    if kind == "jax":
        reference, _, params_file = reference.partition(",")
        if not params_file:
            raise UsageError("--jax takes MODULE:FUNCTION,PARAMS.npz (the apply function and its weights)")
        params_file = scaffold.workspace_reference(params_file, root)
    request = scaffold.Request(
        name=name,
        kind=kind,
        reference=scaffold.workspace_reference(reference, root),
        params_file=params_file,
        inputs=tuple(scaffold.parse_input(text) for text in input_decls),
        axes=tuple(scaffold.parse_axis(text) for text in axes),
        seed=seed,
        opset=opset,
        # the file options only: mypy reads every field's type into the ** expansion
        **{key: value and scaffold.workspace_reference(value, root) for key, value in files.items()},  # type: ignore[arg-type]
    )
    written, info = scaffold.init(root, request, force, default_threads())
    return written, info, kind


def init_generation(
    name: str, hf: str | None, torch_ref: str | None, force: bool, workspace: str | None, prompts: str | None = None
) -> Path:
    """``parity init --task text-generation``: the spec of a causal LM from a folder or a factory (``prompts``: a
    ``.npz`` of input_ids and attention_mask instead of seeded random prompts)."""
    from parity.pipeline import generation, scaffold

    root = Path(workspace or ".").resolve()
    reference = torch_ref and scaffold.workspace_reference(torch_ref, root)
    return generation.init(root, name, hf, reference, force, prompts and scaffold.workspace_reference(prompts, root))


def repro(
    workspace: str | None,
    model: str,
    path_id: str,
    out_dir: str,
    force: bool,
    precision: str,
    threads: int,
    timeout_s: float | None,
    command: str,
    progress=_quiet,
    notice=_quiet,
    device: str = "cpu",
) -> tuple[int, str]:
    """``parity repro``: check and diagnose one path, reduce its exported graph, write the bug report folder.

    Returns ``(exit code, one line)``: 0 with the folder written, or when the path passes (nothing to reduce); 1 when
    the failure stops reproducing during the reduction; 2 when there is no exported graph to reduce (an error, a
    skip, a native path or tf/litert with no leaf layer that fails alone (``repro_native``), a drift that enters at
    the definition). A non-empty ``out_dir`` needs ``force``; the reduction runs on the CPU runtimes only (``device`` other than cpu is a usage error)."""
    from parity.diagnose.repro import trusted_for
    from parity.golden import store as golden
    from parity.pipeline import orchestrate
    from parity.platform.cache_dir import cache_root
    from parity.platform.env import environment
    from parity.platform.precision import parse_device
    from parity.platform.safefs import check_folder_target
    from parity.run import paths, watch
    from parity.run.worker import TaskFailed, WorkerPool

    out = check_folder_target(out_dir, "--out")  # links followed; a file in the way refused before any work
    if out.exists() and any(out.iterdir()) and not force:
        raise UsageError(f"--out {out_dir} is not an empty folder: choose another or pass --force to replace it")
    if parse_device(device) != "cpu":
        raise UsageError(
            f"--device {device}: parity repro reduces graphs on the CPU runtimes (ort, ort-noopt, onnxref) only"
        )
    ws = open_workspace(workspace, notice)
    names = ws.select([model])
    from parity.pipeline import generation

    if generation.is_generation(ws.load_spec(names[0])):  # its first divergent step, cut at the diagnosis's leaf
        from parity.pipeline import generation_repro

        return generation_repro.repro(ws, names[0], path_id, out, precision, threads, timeout_s, command, progress)
    path = paths.by_id(path_id, "cpu", precision)
    options = orchestrate.Options(threads=threads, patterns=(path_id,), precision=precision, timeout_s=timeout_s)
    report = orchestrate.check(ws, names, options, progress=progress)
    result = next((r for r in report["results"] if r["path"] == path.id), None)
    if result is None:
        errors = "; ".join(str(e) for e in report.get("model_errors") or []) or "not checked"
        return 2, f"nothing to reduce: {model} {path.id} was not checked ({errors})"
    where = f"{model} {path.id}"
    if result["verdict"] == "pass":
        return 0, f"nothing to reduce: {where} passes"
    if result["verdict"] != "fail":
        return 2, f"nothing to reduce: {where} is {result['verdict']} ({result.get('reason') or 'no reason'})"
    diagnosis = result.get("diagnosis") or {}
    from parity.pipeline import repro_native

    if not path.exports or path.runtime.name not in ("ort", "ort-noopt", "onnxref"):  # no ONNX graph: one layer
        if path.id not in repro_native.PATHS or diagnosis.get("split"):
            return 2, repro_native.refusal(where, path, diagnosis)
        spec = ws.load_spec(model)
        manifest = golden.verify(ws.golden_dir(model), spec)
        return repro_native.repro(ws, spec, manifest, path, options, diagnosis, out, out_dir, command, progress)
    if diagnosis.get("error"):
        return 2, f"nothing to reduce: {diagnosis['error']}"
    if diagnosis.get("split"):
        return 2, repro_native.refusal(where, path, diagnosis)
    if trusted_for(diagnosis, path.runtime.name) is None:
        link = (diagnosis.get("links") or {}).get("enters_at")
        return 2, (
            f"nothing to reduce: {where}'s drift enters at the {link}, not in the exported graph"
            if link
            else f"nothing to reduce: the diagnosis of {where} names no link that a graph could reproduce"
        )
    spec = ws.load_spec(model)
    manifest = golden.verify(ws.golden_dir(model), spec)
    with WorkerPool(threads, cache_root() / "logs", timeout_s) as pool, pool.for_model(watch.weights_bytes(manifest)):
        run = orchestrate.Run(ws, options)
        run._identify(pool, [(spec, manifest, path, None)])  # the export is keyed on the weights, as check keys it
        artifact = run._export(pool, spec, manifest, path, len(path.exports) - 1)
        leaf = {}
        if trusted_for(diagnosis, path.runtime.name) == "source":  # cut at the leaf the descent found
            from parity.diagnose.descend import leaf_known

            leaf = leaf_known(pool, spec, path, str(ws.root), str(ws.golden_dir(model)), threads, diagnosis)
        progress(f"{model}: reduce {path.id}")
        try:
            outcome = pool.call(
                path.runtime.group,
                "parity.diagnose.repro:write",
                workspace=str(ws.root),
                model=model,
                path_id=path.id,
                golden_dir=str(ws.golden_dir(model)),
                precision=precision,
                threads=threads,
                artifact_dir=artifact["dir"],
                artifact_meta=artifact["meta"],
                diagnosis=diagnosis,
                out_dir=str(out),
                environment=environment(threads),
                command=command,
                leaf_known=leaf,
            )
        except TaskFailed as error:
            return 1, f"the reduction of {where} failed: {error}"
    counts = (
        f"{outcome['nodes_before']} nodes -> {outcome['nodes_after']}, {outcome['checks']} checks, "
        f"{outcome['seconds']:.2f} s"
    )
    if not outcome["written"]:
        return 1, f"no bug report: the failure of {where} does not reproduce in its reduced graph: {outcome['reason']}"
    return 0, (
        f"wrote {out_dir}: {where} reduced to {' -> '.join(outcome['ops'])} ({counts}); "
        f"`python {Path(out_dir) / 'repro.py'}` exits 1 while the bug is present"
    )
