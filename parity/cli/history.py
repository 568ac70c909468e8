"""``history``: verdicts and timings over the stored runs, with the steps and verdict changes found in them."""

from __future__ import annotations

import click

from parity.cli.common import FOLDER, handle_errors, model_option, note, workspace_option


@click.command()
@workspace_option
@model_option
@click.option("--path", "-p", "patterns", multiple=True, help="Glob on the path id (repeatable; default: all).")
@click.option(
    "--store",
    default=None,
    metavar="URL|FILE",
    help="Results store to read (default: $PARITY_STORE, else .parity/results.sqlite in the workspace).",
)
@click.option(
    "--report",
    "report_dir",
    type=FOLDER,
    default=None,
    help="Also write history.html into this folder: one plot per series, steps marked.",
)
@handle_errors
def history(workspace, models, patterns, store, report_dir):
    """Per path: verdict and median (95 % CI) over the stored runs, the versions that changed between runs, and
    the runs where a path started failing or became slower or faster.

    \b
    Example:
        parity history --model mlp --path 'torch/onnx/*'
    """
    from parity.pipeline import jobs

    text, written = jobs.history(workspace, models, patterns, store, report_dir, notice=note)
    click.echo(text)
    if written:
        note(f"wrote {written}")
