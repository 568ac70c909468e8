"""``check-onnx``: many ONNX files, with their ONNX test data, checked in one session and shown in one table."""

from __future__ import annotations

import sys

import click

from parity.cli.common import (
    FILE,
    FOLDER,
    PRECISION_CHOICES,
    TIMEOUT_DEFAULT,
    handle_errors,
    junit_option,
    threads_option,
)


@click.command("check-onnx")
@click.argument("sources", nargs=-1, required=True, metavar="DIR_OR_FILE...")
@click.option(
    "--path", "-p", "patterns", multiple=True, help="Glob on the path id (repeatable; default onnx/ort), e.g. 'onnx/*'."
)
@click.option(
    "--opset",
    type=click.IntRange(1),
    default=None,
    help="Convert every file to this opset first (onnx.version_converter), as parity init --opset does.",
)
@click.option("--device", default="cpu", show_default=True, metavar="cpu|cuda|cuda:N", help="Where every path runs.")
@click.option(
    "--precision",
    type=click.Choice(PRECISION_CHOICES),
    default="fp32",
    show_default=True,
    help="fp32 (TF32 off), tf32 (GPU), fp16, bf16; checked against the float64 golden.",
)
@click.option(
    "--workspace",
    "-w",
    type=FOLDER,
    default=None,
    help="Keep each case's models/<case>.py and golden data here, to check again with parity check "
    "(default: a temporary folder, removed afterwards).",
)
@click.option("--force", is_flag=True, help="Replace models/<case>.py files that exist in --workspace.")
@click.option(
    "--json",
    "json_file",
    type=FILE,
    default=None,
    help="Write the result JSON of every case here (its folder must exist).",
)
@junit_option
@threads_option("Intra-op threads, the same for every runtime.")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(1),
    default=None,
    help=f"Seconds one step of a case (init, golden build, export, check) may take before it is an error "
    f"{TIMEOUT_DEFAULT}",
)
@click.option("--no-cache", is_flag=True, help="Export again instead of using the export cache.")
@click.option("--verbose", "-v", is_flag=True, help="List skip and expected-error reasons in full too.")
@handle_errors
def check_onnx(
    sources,
    patterns,
    opset,
    device,
    precision,
    workspace,
    force,
    json_file,
    junit_file,
    threads,
    timeout_s,
    no_cache,
    verbose,
):
    """Check many ONNX files in one session: each with its ONNX test data, one table, one exit code.

    Each DIR_OR_FILE is an ONNX file or a folder searched for them: a backend-test case (model.onnx beside
    test_data_set_N/input_i.pb, output_i.pb, whose outputs are the golden), or a folder of such cases. Each case
    is taken as parity init --onnx FILE --test-data DIR, golden build and check take it, in one workspace and one
    worker pool. Exit code 0: every path passed; 1: a case was refused or a path failed; 2: bad input.

    \b
    Example:
        parity check-onnx cases/ extra/model.onnx --json all.json --junit-xml junit.xml
    """
    from parity.cli.progress import Progress
    from parity.pipeline import check_onnx as batch

    cases = batch.find_cases(sources, opset)
    request = batch.Request(
        patterns=patterns or batch.DEFAULT_PATHS,
        device=device,
        precision=precision,
        threads=threads,
        timeout_s=timeout_s,
        use_cache=not no_cache,
        workspace=workspace,
        force=force,
        json_file=json_file,
        junit_file=junit_file,
    )

    def show(report: dict) -> None:
        from parity.report import cases as table

        progress.close()
        click.echo(table.render(report, verbose=verbose))

    with Progress("live" if sys.stderr.isatty() else "lines") as progress:
        _, code = batch.check(cases, request, progress=progress, show=show, notice=progress.note)
    sys.exit(code)
