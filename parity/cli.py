"""The ``parity`` command line: a thin click layer over the library.

Nothing here imports an ML framework; every framework runs in a worker process.
Exit codes: 0 all as expected, 1 a path failed or errored unexpectedly, 2 usage or input error.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

import click

from parity.platform.errors import ParityError, UsageError
from parity.platform.precision import PRECISIONS

PRECISION_CHOICES = tuple(PRECISIONS)


def _fail(message: str, code: int = 2):
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _handle_errors(func):
    """Library errors become one line on stderr and exit code 2; never a traceback."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except ParityError as error:
            _fail(str(error))
        except KeyboardInterrupt:
            _fail("interrupted", 130)

    return wrapper


def _say(message: str) -> None:
    click.echo(f"  {message}", err=True)


class _Progress:
    """A live status line on a terminal (model, phase, path, elapsed); silent when stderr is not a terminal."""

    def __init__(self, live: bool):
        self.status = None
        if live:
            from rich.console import Console

            self.status = Console(stderr=True).status("starting")
        self.started = None

    def __call__(self, message: str) -> None:
        if self.status is not None:
            self.status.update(f"{message}  [{time.monotonic() - self.started:.0f} s]")

    def __enter__(self):
        self.started = time.monotonic()
        if self.status is not None:
            self.status.start()
        return self

    def __exit__(self, *exc):
        if self.status is not None:
            self.status.stop()


def workspace_option(func):
    return click.option("--workspace", "-w", type=click.Path(file_okay=False), default=None,
                        help="Folder with models/ and golden/ (default: the current folder, else the built-in zoo).")(func)


def model_option(func):
    return click.option("--model", "-m", "models", multiple=True, help="Model name (repeatable; default: all).")(func)


def check_options(func):
    """Options shared by `check` and `run`."""
    from parity.platform.env import default_threads

    decorators = [
        workspace_option,
        model_option,
        click.option("--path", "-p", "patterns", multiple=True, help="Glob on the path id, e.g. 'torch/*' (repeatable)."),
        click.option("--device", default="cpu", show_default=True, metavar="cpu|cuda|cuda:N",
                     help="Where every path runs; a path that cannot run there is a skip with the reason."),
        click.option("--precision", type=click.Choice(PRECISION_CHOICES), default="fp32", show_default=True,
                     help="fp32 (TF32 off), tf32 (GPU), fp16, bf16; checked against the float64 golden."),
        click.option("--json", "json_file", type=click.Path(dir_okay=False, allow_dash=True), default=None,
                     help="Write the result JSON here ('-': to stdout, instead of the tables). Its folder must "
                          "exist. A symlink is followed: the file it resolves to is replaced atomically, the link "
                          "kept. A FIFO or device (/dev/stdout, /dev/null) is written to directly."),
        click.option("--threads", type=click.IntRange(1), default=default_threads(), show_default=True,
                     help="Intra-op threads, the same for every framework and runtime."),
        click.option("--timeout", "timeout_s", type=click.FloatRange(1), default=300.0, show_default=True,
                     help="Seconds one export or check may take before it is killed and called an error."),
        click.option("--no-cache", is_flag=True, help="Export again instead of using the export cache."),
        click.option("--verbose", "-v", is_flag=True, help="Print every path's full reason, expected errors and skips too."),
        click.option("--report", "report_dir", type=click.Path(file_okay=False), default=None,
                     help="Write a self-contained HTML report (index.html) into this folder (created if missing; "
                          "its parent must exist). A symlinked folder or index.html is followed to its target."),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="parity")
def cli():
    """parity: prove that model conversion paths compute the same thing, then time them.

    \b
    Example:
        parity run --model mlp --json r.json
    """


def _workspace(workspace):
    from parity.model.workspace import Workspace

    ws = Workspace(workspace)
    if ws.fallback_note:
        click.echo(f"note: {ws.fallback_note}", err=True)
    return ws


def _check_or_run(models, patterns, device, precision, json_file, threads, timeout_s, no_cache, verbose, workspace,
                  report_dir, timing=None, diagnose="failing"):
    from parity.pipeline import orchestrate
    from parity.report import diagnosis, json_report, terminal

    to_stdout = json_file == "-"
    check_targets(None if to_stdout else json_file, report_dir)
    from parity.platform.precision import parse_device

    device = parse_device(device)
    ws = _workspace(workspace)
    names = ws.select(models)
    options = orchestrate.Options(threads=threads, patterns=patterns, precision=precision, device=device,
                                  timeout_s=timeout_s, use_cache=not no_cache, timing=timing, diagnose=diagnose)
    with _Progress(live=sys.stderr.isatty() and not to_stdout) as progress:
        report = orchestrate.check(ws, names, options, progress=progress)
    if to_stdout:
        click.echo(json.dumps(json_report.sanitize(report), indent=2))
    else:
        click.echo(terminal.render(report, timed=timing is not None, verbose=verbose))
        for block in (diagnosis.render_all(report), _timing_block(report, timing)):
            if block:
                click.echo("\n" + block)
    if json_file and not to_stdout:
        _write_after_run("--json", json_file, lambda: json_report.write(report, json_file))
    if report_dir:
        from parity.report import html

        _write_after_run("--report", report_dir, lambda: html.write(report, report_dir))
    sys.exit(orchestrate.exit_code(report))


def _timing_block(report: dict, timing) -> str:
    if timing is None:
        return ""
    from parity.report import timing_table

    return timing_table.render(report)


def check_targets(json_file: str | None, report_dir: str | None) -> None:
    """Refuse now, before any work, a ``--json`` file or ``--report`` folder that could not be written.

    ``--json`` needs its folder to exist; ``--report`` may be created, in a folder that exists.
    """
    from parity.platform.safefs import check_writable

    if json_file:
        check_writable(json_file, "--json", make_parents=False)
    if report_dir:
        report = Path(os.path.abspath(report_dir))
        check_writable(report / "index.html" if os.path.lexists(report) else report, "--report", make_parents=False)


def _write_after_run(option: str, target: str, write) -> None:
    try:
        written = write()
    except OSError as error:
        _fail(f"{option} {target} could not be written after the run: {error.strerror or error}")
    click.echo(f"wrote {written or target}", err=True)


@cli.command()
@check_options
@_handle_errors
def check(**common):
    """Verify goldens and check every path: outputs, gradients, metrics, determinism; diagnose failing paths.

    \b
    Example:
        parity check --model mlp --path 'torch*' --json check.json
    """
    _check_or_run(**common)


def timing_options(func):
    """Options shared by `run` and `bench`: the stopping rule, batch sizes, baseline."""
    decorators = [
        click.option("--budget", "budget_s", type=float, default=1.0, show_default=True,
                     help="Seconds of timed runs per path and batch size, after warm-up (at least --min-runs runs)."),
        click.option("--min-runs", type=int, default=30, show_default=True, help="Fewest timed runs per series."),
        click.option("--target-ci", type=float, default=0.02, show_default=True,
                     help="Stop once the 95 % CI of the median is within this fraction of it."),
        click.option("--batch-size", "batch_sizes", type=int, multiple=True,
                     help="Batch size to time (repeatable; default: the spec's bench_batch_sizes)."),
        click.option("--baseline", default=None, help="Path id every path is compared with (default: its native source)."),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def _bench_options(budget_s, min_runs, target_ci, batch_sizes, baseline):
    from parity.bench.plan import BenchOptions
    from parity.run import paths as path_registry

    if not budget_s > 0:
        raise UsageError(f"--budget must be a positive number of seconds, not {budget_s:g}")
    if min_runs < 1 or not 0 < target_ci < 1:
        raise UsageError("--min-runs must be at least 1 and --target-ci between 0 and 1")
    bad = [b for b in batch_sizes if b < 1]
    if bad:
        raise UsageError(f"--batch-size must be a positive integer, not {bad[0]}")
    if baseline and baseline not in path_registry.CHAIN_IDS:
        raise UsageError(f"--baseline {baseline!r} is not a path; known paths: {', '.join(path_registry.CHAIN_IDS)}")
    return BenchOptions(budget_s=budget_s, min_runs=min_runs, target_rel_ci=target_ci,
                        batch_sizes=tuple(dict.fromkeys(batch_sizes)), baseline=baseline)


@cli.command()
@check_options
@timing_options
@_handle_errors
def run(budget_s, min_runs, target_ci, batch_sizes, baseline, **common):
    """The main job: check every path, diagnose the ones that failed, time the ones that passed (the gate).

    \b
    Example:
        parity run --model mlp --json r.json --report report/
    """
    _check_or_run(**common, timing=_bench_options(budget_s, min_runs, target_ci, batch_sizes, baseline))


@cli.command()
@check_options
@timing_options
@_handle_errors
def bench(budget_s, min_runs, target_ci, batch_sizes, baseline, **common):
    """Check every path, then time only those that passed: per batch size, training steps, first result.

    Every batch size is verified before it is timed; statistics per series: median with its 95 % CI,
    mean, std, cv, p90, p99, min, throughput; each path against its baseline with a ratio of medians,
    its 95 % CI and Welch's t-test on log-times. Raw samples are kept in the JSON.

    \b
    Example:
        parity bench --model mlp --batch-size 1 --batch-size 64 --json b.json
    """
    _check_or_run(**common, timing=_bench_options(budget_s, min_runs, target_ci, batch_sizes, baseline), diagnose=None)


@cli.command()
@click.argument("first", type=click.Path(dir_okay=False))
@click.argument("second", type=click.Path(dir_okay=False))
@_handle_errors
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


@cli.command()
@check_options
@_handle_errors
def diagnose(**common):
    """Layer-by-layer drift of the selected paths (default: every failing path).

    Per tap in network order: error statistics against the golden, the first divergent tap, a cause
    tested by recomputing that layer with known variants, and the link of the chain (definition,
    converter, runtime) where the drift enters.

    \b
    Example:
        parity diagnose --model transformer --path torch/onnx/ort --report report/
    """
    _check_or_run(**common, diagnose="all" if common["patterns"] else "failing")


@cli.command()
@model_option
@workspace_option
@click.option("--device", "devices", multiple=True, metavar="cpu|cuda|cuda:N",
              help="Only this device (repeatable; default: cpu and cuda:0).")
@click.option("--precision", "precisions", multiple=True, type=click.Choice(PRECISION_CHOICES),
              help="Only this precision (repeatable; default: all).")
@_handle_errors
def paths(models, workspace, devices, precisions):
    """The path matrix: every path on every device at every precision, and why each unavailable one is.

    \b
    Example:
        parity paths --model cnn --device cuda
    """
    from parity.platform.precision import parse_device
    from parity.report.terminal import render_paths
    from parity.run import paths as path_registry

    frameworks = None
    if models:
        ws = _workspace(workspace)
        frameworks = set()
        for name in ws.select(models):
            frameworks.update(ws.load_spec(name).frameworks)
    devices = tuple(dict.fromkeys(parse_device(d) for d in devices)) or ("cpu", "cuda:0")
    rows = []
    for path in path_registry.matrix(devices, precisions or path_registry.ALL):
        if frameworks is None or path.source in frameworks:
            rows.append({"id": path.id, "device": path.device, "precision": path.precision,
                         "steps": " -> ".join(s.name for s in path.exports) or "native",
                         "reason": path_registry.unavailable_reason(path), "note": path.runtime.note})
    click.echo(render_paths(rows))


@cli.command()
@click.option("--threads", type=click.IntRange(1), default=None, help="Thread count to record (default: all cores).")
def env(threads):
    """Print the environment manifest (versions, CPU, GPU, threads, flags) as JSON.

    \b
    Example:
        parity env > env.json
    """
    from parity.platform.env import default_threads, environment

    click.echo(json.dumps(environment(threads or default_threads()), indent=2))


@cli.command()
@click.argument("name")
@click.option("--torch", "torch_ref", metavar="MODULE:FUNCTION", help="A function returning the torch.nn.Module "
              "(package.module:make_model or path/to/file.py:make_model).")
@click.option("--keras", "keras_ref", metavar="FILE", help="A Keras model file (.keras).")
@click.option("--jax", "jax_ref", metavar="MODULE:FUNCTION,PARAMS.npz", help="apply(params, x) and its weights.")
@click.option("--onnx", "onnx_ref", metavar="FILE", help="An ONNX file: the file itself is the source model.")
@click.option("--input", "input_decl", metavar="NAME=BATCHxDIMx...[:DTYPE]", help="The input, batch first, e.g. x=1x3x224x224.")
@click.option("--inputs", "inputs_file", type=click.Path(dir_okay=False, exists=True),
              help=".npz with the input (and optional labels, eval_x, eval_labels); default: seeded random.")
@click.option("--test-data", type=click.Path(file_okay=False, exists=True),
              help="ONNX test-data folder (test_data_set_N/input_i.pb, output_i.pb): inputs and golden outputs.")
@click.option("--polygraphy-inputs", type=click.Path(dir_okay=False, exists=True),
              help="Inputs saved by polygraphy run --save-inputs.")
@click.option("--polygraphy-outputs", type=click.Path(dir_okay=False, exists=True),
              help="Golden outputs saved by polygraphy run --save-outputs.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of random inputs.")
@click.option("--force", is_flag=True, help="Replace an existing models/NAME.py.")
@click.option("--workspace", "-w", type=click.Path(file_okay=False), default=None,
              help="Folder to write models/NAME.py into (default: the current folder).")
@_handle_errors
def init(name, torch_ref, keras_ref, jax_ref, onnx_ref, input_decl, inputs_file, test_data, polygraphy_inputs,
         polygraphy_outputs, seed, force, workspace):
    """Write models/NAME.py for your own model: a short spec to edit, then golden build and run.

    \b
    Example:
        parity init resnet --torch mymodels.py:make_model --input x=1x3x224x224
        parity golden build --model resnet
        parity run --model resnet
    """
    from parity.pipeline import scaffold
    from parity.platform.env import default_threads

    given = {"torch": torch_ref, "tf": keras_ref, "jax": jax_ref, "onnx": onnx_ref}
    chosen = [(kind, ref) for kind, ref in given.items() if ref]
    if len(chosen) != 1:
        raise UsageError("give exactly one of --torch, --keras, --jax, --onnx")
    kind, reference = chosen[0]
    root = Path(workspace or ".").resolve()
    params_file = None
    if kind == "jax":
        reference, _, params_file = reference.partition(",")
        if not params_file:
            raise UsageError("--jax takes MODULE:FUNCTION,PARAMS.npz (the apply function and its weights)")
        params_file = scaffold.workspace_reference(params_file, root)
    input_name, shape, dtype, values = scaffold.parse_input(input_decl) if input_decl else (None, None, "float32", None)
    request = scaffold.Request(
        name=name, kind=kind, reference=scaffold.workspace_reference(reference, root), params_file=params_file,
        input_name=input_name, input_shape=shape, input_dtype=dtype, input_values=values, seed=seed,
        **{key: value and scaffold.workspace_reference(value, root) for key, value in (
            ("inputs_file", inputs_file), ("test_data", test_data), ("polygraphy_inputs", polygraphy_inputs),
            ("polygraphy_outputs", polygraphy_outputs))})
    written, info = scaffold.init(root, request, force, default_threads())
    taps = len(info.get("taps") or [])
    click.echo(f"wrote {written} ({kind}, {info['n_params']:,} parameters, outputs {', '.join(info['outputs'])}, "
               f"{taps} taps)")
    click.echo(f"next: parity golden build --model {name} && parity run --model {name}")


@cli.command("export-testdata")
@click.option("--model", "-m", "model", required=True, help="Model name.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Folder to write test_data_set_0/ into (next to a model.onnx, say).")
@workspace_option
@_handle_errors
def export_testdata(model, out_dir, workspace):
    """Write a model's golden inputs and outputs as ONNX test data (test_data_set_0/input_0.pb, output_i.pb).

    The layout ONNX's backend tests and ONNX Runtime's onnx_test_runner read. Inputs are in the spec's
    canonical layout (NCHW images), outputs float32 as an exported model gives them.

    \b
    Example:
        parity export-testdata --model cnn --out cnn-testdata/
    """
    import numpy as np

    from parity.golden import store as golden_lib
    from parity.interop import onnx_test_data as interop

    ws = _workspace(workspace)
    (name,) = ws.select([model])
    spec = ws.load_spec(name)
    verified = golden_lib.load(ws.golden_dir(name), spec)
    reference = verified.arrays["reference.npz"]
    written = interop.write_test_data(
        Path(out_dir), {spec.input.name: verified.arrays["inputs.npz"]["x"]},
        {out: reference[out].astype(np.float32) if reference[out].dtype.kind == "f" else reference[out]
         for out in spec.outputs})
    click.echo(f"wrote {written} (input {spec.input.name!r}, outputs {', '.join(spec.outputs)}; batch {spec.batch_size})")


@cli.group()
def golden():
    """Build or verify golden data (golden/<model>/).

    \b
    Example:
        parity golden verify
    """


@golden.command("build")
@model_option
@workspace_option
@click.option("--threads", type=click.IntRange(1), default=None, help="Intra-op threads for training and references.")
@_handle_errors
def golden_build(models, workspace, threads):
    """Train weights, run every framework in float64, prove they agree, write golden data.

    \b
    Example:
        parity golden build --model mlp
    """
    from parity.golden import build as golden_build
    from parity.golden import store as golden_lib
    from parity.platform.cache_dir import cache_root
    from parity.platform.env import default_threads
    from parity.run.worker import TaskFailed, WorkerPool

    ws = _workspace(workspace)
    if ws.is_fallback:
        raise UsageError(f"golden build writes only into a workspace you name: run it in a folder with models/, "
                         f"or pass --workspace {ws.root} to rebuild the built-in zoo")
    failures = 0
    with WorkerPool(threads or default_threads(), cache_root() / "logs", timeout_s=1800) as pool:
        for name in ws.select(models):
            try:
                # the spec as declared: the golden data it replaces may be what is refused
                manifest = golden_build.build(ws, ws.load_spec(name, attach_golden=False), pool, progress=_say)
            except (ParityError, TaskFailed) as error:
                failures += 1
                click.echo(f"{name}: golden build failed: {error}", err=True)
                continue
            click.echo(f"{name}: wrote {ws.golden_dir(name)} | {golden_lib.summary(manifest, ws.golden_dir(name))}")
    if failures:
        sys.exit(2)


@golden.command("verify")
@model_option
@workspace_option
@_handle_errors
def golden_verify(models, workspace):
    """Check every golden file's sha256 against its manifest (exit 2 naming a corrupted file).

    \b
    Example:
        parity golden verify --model mlp
    """
    from parity.golden import store as golden_lib

    ws = _workspace(workspace)
    failures = 0
    for name in ws.select(models):
        try:
            manifest = golden_lib.verify(ws.golden_dir(name), ws.load_spec(name))
        except ParityError as error:
            failures += 1
            click.echo(f"{name}: FAILED {error}")
            continue
        click.echo(f"{name}: ok ({len(manifest['files'])} files and the manifest verified, built with parity "
                   f"{manifest['versions']['parity']})")
    if failures:
        _fail(f"{failures} model(s) failed verification")


def main():
    cli(prog_name="parity")


if __name__ == "__main__":
    main()
