"""``parity repro``: a failing path reduced to a minimal, runnable bug report (``pipeline.model_jobs.repro``)."""

from __future__ import annotations

import sys

import click

from parity.cli.common import (
    PRECISION_CHOICES,
    TIMEOUT_DEFAULT,
    handle_errors,
    note,
    say,
    threads_option,
    workspace_option,
)


@click.command("repro")
@click.option("--model", "-m", "model", required=True, help="Model name.")
@click.option("--path", "-p", "path_id", required=True, help="The failing path, e.g. torch/onnx/ort.")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    required=True,
    help="Folder to write the bug report into (must be empty, or --force).",
)
@click.option("--force", is_flag=True, help="Replace a non-empty --out folder.")
@click.option(
    "--precision",
    type=click.Choice(PRECISION_CHOICES),
    default="fp32",
    show_default=True,
    help="Precision of the path.",
)
@click.option(
    "--device",
    default="cpu",
    show_default=True,
    metavar="cpu",
    help="Where the path runs; the reduction runs on the CPU runtimes only.",
)
@threads_option("Intra-op threads, for the check and for every candidate of the reduction.")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(1),
    default=None,
    help=f"Seconds one export, check or reduction may take {TIMEOUT_DEFAULT}",
)
@workspace_option
@handle_errors
def repro(model, path_id, out_dir, force, precision, device, threads, timeout_s, workspace):
    """Reduce a failing path's exported ONNX graph to the smallest subgraph that still fails on the whole input
    set, and write a bug report anyone can run: model.onnx, test_data_set_0/, repro.py (numpy, onnx and the
    failing runtime only; exits 1 while the bug is present) and README.md (what diverges, the node, the tested
    cause, the link, the environment). On tf/litert, tf/xla, tf and jax (no ONNX graph) the leaf layer the
    diagnosis names is written alone in the path's format (model.tflite, saved_model/, leaf.jax_exported) with its
    float64 input.npy and expected.npy, repro.py and README.md, once it is seen to fail alone as the path does.

    Exit codes: 0 written, or the path passes (nothing to reduce); 1 the failure stopped reproducing during the
    reduction; 2 nothing to reduce (an error or skip verdict, a native path whose layer alone does not fail, a
    drift entering at the definition) or bad input (a non-empty --out without --force).

    \b
    Example:
        parity repro --model mymodel --path torch/onnx/ort --out bug/
    """
    import shlex

    from parity.pipeline import model_jobs

    given = [
        ("--workspace", workspace),
        ("--model", model),
        ("--path", path_id),
        ("--out", out_dir),
        ("--precision", precision if precision != "fp32" else None),
    ]
    command = " ".join(["parity repro", *(f"{flag} {shlex.quote(str(value))}" for flag, value in given if value)])
    code, line = model_jobs.repro(
        workspace,
        model,
        path_id,
        out_dir,
        force,
        precision,
        threads,
        timeout_s,
        command,
        progress=say,
        notice=note,
        device=device,
    )
    click.echo(line, err=code != 0)
    sys.exit(code)
