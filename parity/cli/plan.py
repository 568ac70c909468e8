"""``plan``: each step's estimated memory and time for a model, against this machine's memory."""

from __future__ import annotations

import click

from parity.cli.common import handle_errors, note, workspace_option


@click.command()
@workspace_option
@click.option(
    "--model", "-m", default=None, help="A model of the workspace (its golden data's size, else its weights)."
)
@click.option("--params", type=float, default=None, help="A Llama-shaped model of this many parameters, e.g. 7e9.")
@click.option("--batch", type=click.IntRange(1), default=None, help="Samples per batch [default: the spec's; 2].")
@click.option("--seq", type=click.IntRange(1), default=None, help="Tokens per sample, with --params [default: 64].")
@click.option(
    "--mapped",
    is_flag=True,
    help="With --params: the model's weights memory-mapped from its safetensors files (parity init --weights).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON (the model, the memory here, each step).")
@handle_errors
def plan(workspace, model, params, batch, seq, mapped, as_json):
    """Each step's estimated peak memory and rough time (golden build; check and diagnosis of torch/onnx/ort) against
    the memory available here (cgroup limit, MemAvailable or PARITY_MEMORY_LIMIT), and for a step that does not
    fit, the Ray node memory it would fit in.

    \b
    Example:
        parity plan --params 7e9
        parity plan --params 7e9 --mapped
    """
    from parity.pipeline import plan as planner

    planned = planner.plan(workspace, model, params, batch, seq, notice=note, mapped=mapped)
    click.echo(planned.as_json() if as_json else planned.render())
