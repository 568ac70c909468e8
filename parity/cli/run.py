"""``check``, ``run``, ``bench`` and ``diagnose``: each one call of ``parity.pipeline.jobs.check``.

Verdicts are printed as soon as every check (and diagnosis) is done, before any timing starts; the
timing tables and the time by stage follow the run.
"""

from __future__ import annotations

import sys

import click

from parity.cli.common import (
    FOLDER,
    check_options,
    executor_options,
    handle_errors,
    junit_option,
    store_options,
    timing_options,
)

# json and parity.cli.progress are imported by the command that runs: `parity --help` does not load them


def _check_or_run(
    models,
    patterns,
    device,
    precision,
    json_file,
    threads,
    timeout_s,
    no_cache,
    verbose,
    workspace,
    report_dir,
    timing=None,
    diagnose="failing",
    command="diagnose",
    store=None,
    no_store=True,
    against=None,
    allow_different_env=False,
    executor="local",
    address=None,
    resume=None,
    accelerator=None,
    junit_file=None,
    model_explorer=None,
):
    from parity.cli.progress import Progress
    from parity.pipeline import jobs

    to_stdout = json_file == "-"
    shown = []  # the verdicts, once printed before the timing

    def on_checked(report: dict) -> None:
        with progress.pause():
            _print_verdicts(report, timed=False, verbose=verbose)
        shown.append(True)

    def show(report: dict) -> None:
        progress.close()
        if to_stdout:
            import json

            from parity.report import json_report

            click.echo(json.dumps(json_report.sanitize(report), indent=2))
            return
        if not shown:
            _print_verdicts(report, timed=timing is not None, verbose=verbose)
        for block in (_timing_block(report, timing), (report.get("against") or {}).get("text"), _stage_block(report)):
            if block:
                click.echo("\n" + block)

    request = jobs.CheckRequest(
        workspace=workspace,
        models=models,
        patterns=patterns,
        device=device,
        precision=precision,
        threads=threads,
        timeout_s=timeout_s,
        use_cache=not no_cache,
        timing=timing,
        diagnose=diagnose,
        json_file=json_file,
        report_dir=report_dir,
        command=command,
        store=store,
        use_store=not no_store,
        against=against,
        allow_different_env=allow_different_env,
        executor=executor,
        address=address,
        resume=resume,
        accelerator=accelerator,
        junit_file=junit_file,
        model_explorer=model_explorer,
    )
    mode = "off" if to_stdout else ("live" if sys.stderr.isatty() else "lines")
    with Progress(mode) as progress:
        code = jobs.check(
            request, progress=progress, on_checked=None if to_stdout else on_checked, show=show, notice=progress.note
        )
    sys.exit(code)


def _print_verdicts(report: dict, timed: bool, verbose: bool) -> None:
    from parity.report import terminal

    click.echo(terminal.render(report, timed=timed, verbose=verbose))
    diagnosed = (r.get("diagnosis") or (r.get("generation") or {}).get("diagnosis") for r in report["results"])
    if any(diagnosed):  # its renderer (and the diagnosis modules) only then
        from parity.report import diagnosis

        click.echo("\n" + diagnosis.render_all(report))


def _timing_block(report: dict, timing) -> str:
    if timing is None:
        return ""
    from parity.report import timing_table

    return timing_table.render(report)


def _stage_block(report: dict) -> str:
    from parity.report import terminal

    return terminal.stage_seconds(report)


def _timing(budget_s, min_runs, target_ci, batch_sizes, baseline, processes):
    from parity.pipeline import jobs

    return jobs.bench_options(budget_s, min_runs, target_ci, batch_sizes, baseline, processes)


@click.command()
@check_options
@junit_option
@store_options
@executor_options
@handle_errors
def check(**common):
    """Verify goldens and check every path: outputs, gradients, metrics, determinism; diagnose failing paths.

    \b
    Example:
        parity check --model mlp --path 'torch*' --json check.json
    """
    _check_or_run(**common, command="check")


@click.command()
@check_options
@timing_options
@junit_option
@store_options
@executor_options
@handle_errors
def run(budget_s, min_runs, target_ci, batch_sizes, baseline, processes, **common):
    """The main job: check every path, diagnose the ones that failed, time the ones that passed (the gate).

    A full cycle of the built-in zoo takes about 2-3 minutes on 2 cores with a cold export cache, about 2
    with a warm one; --model and --path narrow it. Verdicts are printed before the timing starts.

    \b
    Example:
        parity run --model mlp --json r.json --report report/
    """
    _check_or_run(
        **common, timing=_timing(budget_s, min_runs, target_ci, batch_sizes, baseline, processes), command="run"
    )


@click.command()
@check_options
@timing_options
@store_options
@executor_options
@handle_errors
def bench(budget_s, min_runs, target_ci, batch_sizes, baseline, processes, **common):
    """Check every path, then time only those that passed: per batch size, training steps, first result.

    Every batch size is verified before it is timed; statistics per series: median with its 95 % CI,
    mean, std, cv, p90, p99, min, throughput; each path against its baseline with a ratio of medians,
    its 95 % CI and Welch's t-test on log-times. Raw samples are kept in the JSON.

    \b
    Example:
        parity bench --model mlp --batch-size 1 --batch-size 64 --json b.json
    """
    _check_or_run(
        **common,
        timing=_timing(budget_s, min_runs, target_ci, batch_sizes, baseline, processes),
        diagnose=None,
        command="bench",
    )


@click.command()
@check_options
@click.option(
    "--model-explorer",
    "model_explorer",
    type=FOLDER,
    default=None,
    help="Write each diagnosis's drift as Google Model Explorer node data into this folder (created if missing): "
    "MODEL/PATH/ holds the exported graph (model.onnx or model.tflite, hard-linked from the export cache where it "
    "can be), drift.json (each compared tensor's node) and modules.json (each module's nodes). "
    "Default: beside --json, as JSON_NAME.model-explorer/.",
)
@handle_errors
def diagnose(model_explorer, **common):
    """Layer-by-layer drift of the selected paths (default: every failing path).

    Per tap in network order: error statistics against the golden, the first divergent tap, a cause
    tested by recomputing that layer with known variants, and the link of the chain (definition,
    converter, runtime) where the drift enters.

    \b
    Example:
        parity diagnose --model transformer --path torch/onnx/ort --report report/
    """
    _check_or_run(
        **common, diagnose="all" if common["patterns"] else "failing", model_explorer=model_explorer or "auto"
    )
