"""What every command shares: errors as one line and an exit code, the common options, one-line notes.

Nothing here imports an ML framework (``parity --help`` stays instant).
"""

from __future__ import annotations

import functools
import os
import sys

import click

from parity.platform.errors import ParityError
from parity.platform.precision import PRECISIONS
from parity.report.escape import visible
from parity.run import watch

# what --timeout bounds where it is not given, from the bounds themselves (run.watch)
TIMEOUT_DEFAULT = (
    f"[default: {watch.BASE_WALL_S:g}, plus {watch.WALL_S_PER_GB:g} per GB of the model's weights]. One that makes no "
    f"progress (uses no CPU, reads and writes nothing) is also killed after {watch.STALL_VARIABLE} seconds of it "
    f"(default {watch.DEFAULT_STALL_S:g})."
)

PRECISION_CHOICES = tuple(PRECISIONS)

# parameter types, one instance each, shared by every option that takes one (a type holds no per-option state;
# each construction costs a gettext look-up at start-up)
FOLDER = click.Path(file_okay=False)
EXISTING_FOLDER = click.Path(file_okay=False, exists=True)
FILE = click.Path(dir_okay=False)
EXISTING_FILE = click.Path(dir_okay=False, exists=True)
OUTPUT_FILE = click.Path(dir_okay=False, allow_dash=True)


def terminal_safe(*streams) -> None:
    """Write what a stream's encoding cannot hold (an emoji on a latin-1 terminal, a lone surrogate from a file name
    that is no UTF-8) as a backslash escape instead of raising ``UnicodeEncodeError`` half-way through a report."""
    for stream in streams:
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def fail(message: str, code: int = 2):
    click.echo(f"error: {visible(message)}", err=True)
    sys.exit(code)


def end(code) -> None:
    """End the process with ``code`` (``sys.exit``'s argument) once its output is flushed and every exit handler has
    run (multiprocessing's among them), skipping only the interpreter's teardown of its modules: a tenth of a second
    once NumPy and the report modules are loaded, longer than a small check itself. Every file parity writes is
    closed (atomically replaced) before this."""
    import atexit

    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): printed, exit status 1
        click.echo(code, err=True)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (| head) or stream: nothing more can reach it
            pass
    atexit._run_exitfuncs()
    os._exit(code)


def handle_errors(func):
    """Library errors become one line on stderr and exit code 2; never a traceback."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except ParityError as error:
            fail(str(error))
        except KeyboardInterrupt:
            fail("interrupted", 130)

    return wrapper


def say(message: str) -> None:
    """A progress message, indented, on stderr."""
    click.echo(f"  {visible(message)}", err=True)


def note(message: str) -> None:
    """A one-line note on stderr (a workspace fallback, a file written)."""
    click.echo(visible(message), err=True)


def workspace_option(func):
    return click.option(
        "--workspace",
        "-w",
        type=FOLDER,
        default=None,
        help="Folder with models/ and golden/ (default: the current folder, else the built-in zoo).",
    )(func)


def model_option(func):
    return click.option("--model", "-m", "models", multiple=True, help="Model name (repeatable; default: all).")(func)


def _apply(func, decorators):
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def threads_option(help_text: str):
    """``--threads``: as given, else ``PARITY_THREADS``, else every core (``default_threads``)."""
    return click.option(
        "--threads",
        type=click.IntRange(1),
        callback=_threads_default,
        default=None,
        show_default="every core, or $PARITY_THREADS",
        help=help_text,
    )


def _threads_default(ctx, param, value):
    if value is not None:
        return value
    from parity.platform.env import default_threads
    from parity.platform.errors import UsageError

    try:
        return default_threads()
    except UsageError as error:
        raise click.BadParameter(str(error)) from None


def check_options(func):
    """Options shared by `check`, `run`, `bench` and `diagnose`."""

    return _apply(
        func,
        [
            workspace_option,
            model_option,
            click.option(
                "--path", "-p", "patterns", multiple=True, help="Glob on the path id, e.g. 'torch/*' (repeatable)."
            ),
            click.option(
                "--device",
                default="cpu",
                show_default=True,
                metavar="cpu|cuda|cuda:N",
                help="Where every path runs; a path that cannot run there is a skip with the reason.",
            ),
            click.option(
                "--precision",
                type=click.Choice(PRECISION_CHOICES),
                default="fp32",
                show_default=True,
                help="fp32 (TF32 off), tf32 (GPU), fp16, bf16; checked against the float64 golden.",
            ),
            click.option(
                "--json",
                "json_file",
                type=OUTPUT_FILE,
                default=None,
                help="Write the result JSON here ('-': to stdout, instead of the tables). Its folder must "
                "exist. A symlink is followed: the file it resolves to is replaced atomically, the link "
                "kept. A FIFO or device (/dev/stdout, /dev/null) is written to directly.",
            ),
            threads_option("Intra-op threads, the same for every framework and runtime."),
            click.option(
                "--timeout",
                "timeout_s",
                type=click.FloatRange(1),
                default=None,
                help=f"Seconds one export or check may take before it is killed and called an error {TIMEOUT_DEFAULT}",
            ),
            click.option("--no-cache", is_flag=True, help="Export again instead of using the export cache."),
            click.option(
                "--verbose", "-v", is_flag=True, help="Print every path's full reason, expected errors and skips too."
            ),
            click.option(
                "--report",
                "report_dir",
                type=FOLDER,
                default=None,
                help="Write a self-contained HTML report (index.html) into this folder (created if missing; "
                "its parent must exist). A symlinked folder or index.html is followed to its target.",
            ),
        ],
    )


def junit_option(func):
    """``--junit-xml FILE``: the verdicts as JUnit XML for a CI system (``check``, ``run``, ``check-onnx``)."""
    return click.option(
        "--junit-xml",
        "junit_file",
        type=FILE,
        default=None,
        help="Write the verdicts as JUnit XML here, for CI: one testcase per model and path (a failure "
        "with the reason and the first divergent layer, an error, or skipped). Its folder must "
        "exist; replaced atomically.",
    )(func)


def store_options(func):
    """Options shared by `check`, `run` and `bench`: the results store and the baseline from it."""
    return _apply(
        func,
        [
            click.option(
                "--store",
                default=None,
                metavar="URL|FILE",
                help="Results store every run is appended to: an SQLAlchemy URL (a shared server) or an SQLite "
                "file (default: $PARITY_STORE, else .parity/results.sqlite in the workspace).",
            ),
            click.option("--no-store", is_flag=True, help="Do not append this run to the results store."),
            click.option(
                "--against",
                default=None,
                metavar="last|RUN_ID",
                help="Compare with a stored run: a changed verdict or a timing changed beyond its noise exits 1.",
            ),
            click.option(
                "--allow-different-env",
                is_flag=True,
                help="Let --against compare with a run on other hardware, device or precision (listed first).",
            ),
        ],
    )


def executor_options(func):
    """Options shared by `check`, `run` and `bench`: where the cells run."""
    return _apply(
        func,
        [
            click.option(
                "--executor",
                type=click.Choice(("local", "ray")),
                default="local",
                show_default=True,
                help="Run every (model, path) cell here, or each as a task on a Ray cluster.",
            ),
            click.option(
                "--address",
                default=None,
                metavar="ADDR",
                help="The Ray cluster to use with --executor ray (default: start one on this machine).",
            ),
            click.option(
                "--resume",
                default=None,
                metavar="RUN_ID",
                help="With --executor ray: keep the finished cells of a stored run, run only the others.",
            ),
            click.option(
                "--accelerator",
                default=None,
                metavar="MODEL",
                help="With --executor ray and a CUDA device: GPU cells only on nodes whose GPU is this model "
                "(Ray's accelerator_type, e.g. H100).",
            ),
        ],
    )


def timing_options(func):
    """Options shared by `run` and `bench`: the stopping rule, batch sizes, baseline."""
    return _apply(
        func,
        [
            click.option(
                "--budget",
                "budget_s",
                type=float,
                default=1.0,
                show_default=True,
                help="Seconds of timed runs per path and batch size, after warm-up (at least --min-runs runs).",
            ),
            click.option("--min-runs", type=int, default=30, show_default=True, help="Fewest timed runs per series."),
            click.option(
                "--target-ci",
                type=float,
                default=0.02,
                show_default=True,
                help="Stop once the 95 % CI of the median is within this fraction of it.",
            ),
            click.option(
                "--batch-size",
                "batch_sizes",
                type=int,
                multiple=True,
                help="Batch size to time (repeatable; default: the spec's bench_batch_sizes).",
            ),
            click.option(
                "--baseline", default=None, help="Path id every path is compared with (default: its native source)."
            ),
            click.option(
                "--processes",
                type=click.IntRange(1),
                default=1,
                show_default=True,
                help="Fresh worker processes each path's series run in (pooled; process-to-process variation "
                "reported apart from run-to-run).",
            ),
        ],
    )
