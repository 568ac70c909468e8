"""``paths`` and ``env``: what can run here, and the environment a result is recorded in."""

from __future__ import annotations

import click

from parity.cli.common import PRECISION_CHOICES, handle_errors, model_option, note, threads_option, workspace_option


@click.command()
@model_option
@workspace_option
@click.option(
    "--device",
    "devices",
    multiple=True,
    metavar="cpu|cuda|cuda:N",
    help="Only this device (repeatable; default: cpu and cuda:0).",
)
@click.option(
    "--precision",
    "precisions",
    multiple=True,
    type=click.Choice(PRECISION_CHOICES),
    help="Only this precision (repeatable; default: all).",
)
@handle_errors
def paths(models, workspace, devices, precisions):
    """The path matrix: every path on every device at every precision, and why each unavailable one is.

    \b
    Example:
        parity paths --model cnn --device cuda
    """
    from parity.pipeline import model_jobs
    from parity.report.terminal import render_paths

    click.echo(render_paths(model_jobs.path_rows(workspace, models, devices, precisions, notice=note)))


@click.command()
@threads_option("Thread count to record.")
def env(threads):
    """Print the environment manifest (versions, CPU, GPU, threads, flags) as JSON.

    \b
    Example:
        parity env > env.json
    """
    import json

    from parity.platform.env import environment

    click.echo(json.dumps(environment(threads), indent=2))


@click.command("worker-resources")
def worker_resources():
    """What this node should advertise to a Ray cluster for `--executor ray`: its installed stacks and one
    parity-bench unit (Ray adds its CPUs, GPUs and accelerator_type itself). Prints the JSON for `ray start`.
    A node started without it is asked the same by a probe task, and a timing cell there takes all its CPUs.

    \b
    Example:
        ray start --address HEAD:6379 --resources "$(parity worker-resources)"
    """
    import json

    from parity.run import stacks

    click.echo(json.dumps(stacks.advertised()))


@click.command("worker-service")
@click.option("--stop", is_flag=True, help="Retire every service of yours: each ends once its clients have left.")
@handle_errors
def worker_service(stop):
    """This user's worker services: the processes that keep worker templates warm between parity commands, so a
    small check forks its worker instead of starting Python and a runtime again (Linux; off with
    PARITY_WORKER_SERVICE=off; each ends after PARITY_WORKER_SERVICE_IDLE_S idle seconds, 600 by default).

    \b
    Example:
        parity worker-service --stop
    """
    from parity.platform.errors import UsageError
    from parity.run import service

    try:
        found = service.running(silent=True)
    except service.Unavailable as error:
        raise UsageError(f"no worker service here: {error}") from None
    silent = [s for s in found if s.get("silent")]
    found = [s for s in found if not s.get("silent")]
    if stop:
        asked = service.retire([s["key"] for s in found])
        click.echo(f"retired {len(asked)} worker service{'s' if len(asked) != 1 else ''}")
    elif not found and not silent:
        click.echo("no worker service is running")
    for s in silent:  # parity's clients give it up and fork their own workers
        click.echo(
            f"pid {s['pid'] or '?'}  key {s['key']}  does not answer (stopped or hung; commands do not use it)"
            f"{'  not retired: end it with kill' if stop else ''}"
        )
    for s in [] if stop else found:
        click.echo(
            f"pid {s['pid']}  key {s['key']}  templates {', '.join(s['templates']) or '-'}  workers {s['workers']}  "
            f"clients {s['clients']}  idle {s['idle_s']:g} s{'  retiring' if s['retiring'] else ''}"
        )
