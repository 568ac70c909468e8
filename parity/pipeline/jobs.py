"""What each ``parity`` command does, as one call: the CLI parses arguments, calls one function here (or in
``parity.pipeline.model_jobs``: golden data, the path list, init, export-testdata, repro) and prints what it is
told (through callbacks or the values returned).

``check`` serves ``check``, ``run``, ``bench`` and ``diagnose``: refuse unwritable targets before any work,
select the models, run the orchestrator, hand the report over to be shown, then write the JSON and the
HTML report. No framework is imported here; every framework runs in a worker process.
"""

from __future__ import annotations

import os
from collections.abc import Callable
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
    from parity.run.pool import WorkerPool

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
