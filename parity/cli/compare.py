"""``compare``: two result files side by side."""

from __future__ import annotations

import sys

import click

from parity.cli.common import FILE, handle_errors


@click.command()
@click.argument("first", type=FILE)
@click.argument("second", type=FILE)
@handle_errors
def compare(first, second):
    """Compare two result files: environment first, then verdict changes, then timing ratios.

    \b
    Example:
        parity compare before.json after.json
    """
    from parity.report import compare as compare_report

    text, code = compare_report.render(compare_report.load(first), compare_report.load(second))
    click.echo(text)
    sys.exit(code)
