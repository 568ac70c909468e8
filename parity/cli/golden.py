"""``golden build`` and ``golden verify``: golden data per model (golden/<model>/)."""

from __future__ import annotations

import sys

import click

from parity.cli.common import fail, handle_errors, model_option, note, say, threads_option, workspace_option


@click.group()
def golden():
    """Build or verify golden data (golden/<model>/).

    \b
    Example:
        parity golden verify
    """


@golden.command("build")
@model_option
@workspace_option
@threads_option("Intra-op threads for training and references.")
@handle_errors
def golden_build(models, workspace, threads):
    """Train weights, run every framework in float64, prove they agree, write golden data.

    \b
    Example:
        parity golden build --model mlp
    """
    from parity.pipeline import model_jobs

    _report(
        model_jobs.build_goldens(workspace, models, threads, progress=say, notice=note),
        "build",
        lambda outcome: f"wrote {outcome.golden_dir} | {outcome.summary}",
    )


def _report(outcomes, action: str, done) -> None:
    """One line per model (``done(outcome)``, or why its golden ``action`` failed, on stderr); exit 2 if any failed."""
    failures = 0
    for outcome in outcomes:
        if outcome.error is not None:
            failures += 1
            click.echo(f"{outcome.name}: golden {action} failed: {outcome.error}", err=True)
            continue
        click.echo(f"{outcome.name}: {done(outcome)}")
    if failures:
        sys.exit(2)


@golden.command("upgrade")
@model_option
@workspace_option
@threads_option("Intra-op threads for the references.")
@handle_errors
def golden_upgrade(models, workspace, threads):
    """Bring golden data written by an older parity to the current manifest schema.

    Every file is verified against its old manifest and kept byte for byte; what the new schema adds (the
    reference at the verification shapes) is computed by the reference framework; the manifest is resealed.

    \b
    Example:
        parity golden upgrade --model mlp
    """
    from parity.pipeline import model_jobs

    _report(
        model_jobs.build_goldens(workspace, models, threads, progress=say, notice=note, upgrade=True),
        "upgrade",
        lambda outcome: f"{outcome.golden_dir} is {outcome.manifest['schema']}",
    )


@golden.command("verify")
@model_option
@workspace_option
@handle_errors
def golden_verify(models, workspace):
    """Check every golden file's sha256 against its manifest (exit 2 naming a corrupted file).

    \b
    Example:
        parity golden verify --model mlp
    """
    from parity.pipeline import model_jobs

    failures = 0
    for outcome in model_jobs.verify_goldens(workspace, models, notice=note):
        if outcome.error is not None:
            failures += 1
            click.echo(f"{outcome.name}: FAILED {outcome.error}")
            continue
        click.echo(
            f"{outcome.name}: ok ({len(outcome.manifest['files'])} files and the manifest verified, built "
            f"with parity {outcome.manifest['versions']['parity']})"
        )
    if failures:
        fail(f"{failures} model(s) failed verification")
