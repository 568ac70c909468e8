"""The ``parity`` command line: the click group, one module per command group, each command a few lines
over one library call (``parity.pipeline.jobs``). Nothing here imports an ML framework.

Exit codes: 0 all as expected, 1 a path failed or errored unexpectedly, 2 usage or input error.
Shared options and error handling live in ``common``, progress on stderr in ``progress``.
"""

from __future__ import annotations

import sys

import click

from parity.cli import check_onnx, compare, golden, history, info, models, plan, repro, run
from parity.cli.common import end, terminal_safe


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="parity")
def cli():
    """parity: prove that model conversion paths compute the same thing, then time them.

    \b
    Example:
        parity run --model mlp --json r.json
    """


for command in (
    run.check,
    run.run,
    run.bench,
    run.diagnose,
    compare.compare,
    info.paths,
    info.env,
    models.init,
    models.export_testdata,
    check_onnx.check_onnx,
    golden.golden,
    plan.plan,
    repro.repro,
    history.history,
    info.worker_resources,
    info.worker_service,
):
    cli.add_command(command)


def main():
    """The ``parity`` command, ended without the interpreter's teardown (``common.end``)."""
    terminal_safe(sys.stdout, sys.stderr)
    try:
        cli(prog_name="parity")
    except SystemExit as done:
        end(done.code)
