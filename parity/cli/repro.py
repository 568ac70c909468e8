"""``parity repro``: a failing path reduced to a minimal, runnable bug report (``parity.pipeline.jobs.repro``)."""

from __future__ import annotations

import shlex
import sys

import click

from parity.cli.common import PRECISION_CHOICES, handle_errors, note, say, workspace_option


@click.command("repro")
@click.option("--model", "-m", "model", required=True, help="Model name.")
@click.option("--path", "-p", "path_id", required=True, help="The failing path, e.g. torch/onnx/ort.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Folder to write the bug report into (must be empty, or --force).")
@click.option("--force", is_flag=True, help="Replace a non-empty --out folder.")
@click.option("--precision", type=click.Choice(PRECISION_CHOICES), default="fp32", show_default=True,
              help="Precision of the path.")
@click.option("--threads", type=click.IntRange(1), default=1, show_default=True, help="Intra-op threads.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1), default=300.0, show_default=True,
              help="Seconds one export, check or reduction may take.")
@workspace_option
@handle_errors
def repro(model, path_id, out_dir, force, precision, threads, timeout_s, workspace):
    """Reduce a failing path's exported ONNX graph to the smallest subgraph that still fails on the whole input
    set, and write a bug report anyone can run: model.onnx, test_data_set_0/, repro.py (numpy, onnx and the
    failing runtime only; exits 1 while the bug is present) and README.md (what diverges, the node, the tested
    cause, the link, the environment).

    \b
    Example:
        parity repro --model mymodel --path torch/onnx/ort --out bug/
    """
    from parity.pipeline import jobs

    command = "parity repro " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 2 else "parity repro"
    code, line = jobs.repro(workspace, model, path_id, out_dir, force, precision, threads, timeout_s, command,
                            progress=say, notice=note)
    click.echo(line, err=code != 0)
    sys.exit(code)
