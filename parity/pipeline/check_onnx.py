"""``parity check-onnx``: many ONNX files checked in one session.

Each case (an ONNX file, with the ONNX test data beside it where there is some) is taken as ``parity init --onnx
FILE --test-data DIR``, ``golden build`` and ``check`` take it, but all cases share one workspace (a temporary one
unless named), one worker pool (its ONNX worker started once, not three times per case) and one orchestrated run,
so the environment is read once and every case's results land in one report. A case refused on the way (a file the
checker rejects, an input shape it cannot know) is that case's error; the next case goes on.
"""

from __future__ import annotations

import keyword
import re
import shutil
import tempfile
import time
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from parity.platform.errors import ParityError, UsageError, one_line

DEFAULT_PATHS = ("onnx/ort",)
TEMP_PREFIX = "parity-check-onnx-"
_SET = re.compile(r"test_data_set_(0|[1-9]\d*)")


@dataclass(frozen=True)
class Case:
    """One ONNX file to check: ``name`` is its model name in the workspace (an identifier), ``label`` what is shown
    (a backend-test case folder's name for its ``model.onnx``, else the file's name), ``test_data`` the folder of
    its ``test_data_set_N`` (None: seeded random inputs, the float64 reference as golden), ``opset`` the opset it
    is converted to first (``parity init --opset``)."""

    name: str
    label: str
    model: Path
    test_data: Path | None = None
    opset: int | None = None


@dataclass
class CaseOutcome:
    """What became of one case: its results (one per path), or the one-line reason it was refused and at which
    step (``init``, ``golden build``); ``crashed``: the refusal was an exception of parity's own, not a refusal."""

    case: Case
    results: list[dict] = field(default_factory=list)
    error: str | None = None
    crashed: bool = False
    seconds: float = 0.0


@dataclass(frozen=True)
class Request:
    """How the cases are checked: the options ``parity check`` takes, and where."""

    patterns: tuple[str, ...] = DEFAULT_PATHS
    device: str = "cpu"
    precision: str = "fp32"
    threads: int | None = None  # None: parity.platform.env.default_threads()
    timeout_s: float | None = None  # None: scaled with each model's weights (run.watch)
    use_cache: bool = True
    diagnose: str | None = "failing"
    workspace: str | None = None  # None: a temporary folder, removed afterwards
    force: bool = False  # replace models/<case>.py that exist in the named workspace
    json_file: str | None = None
    junit_file: str | None = None


def has_test_data(folder: Path) -> bool:
    """Whether ``folder`` holds ``test_data_set_N`` folders (the ONNX test-data layout)."""
    try:
        return any(p.is_dir() and _SET.fullmatch(p.name) for p in folder.iterdir())
    except OSError:
        return False


def case_of(model: Path, label: str | None = None, opset: int | None = None, name: str | None = None) -> Case:
    """The case of one ONNX file: its test data is the ``test_data_set_N`` folders beside it when it is the folder's
    ``model.onnx`` or its only ONNX file (the layout of ONNX's backend tests and ONNX Runtime's test runner)."""
    model = Path(model)
    folder = model.parent
    label = label or (folder.name if model.name == "model.onnx" else model.name)
    alone = model.name == "model.onnx" or [p.name for p in folder.glob("*.onnx")] == [model.name]
    test_data = folder if alone and has_test_data(folder) else None
    return Case(name or model_name(label, opset), label, model, test_data, opset)


def model_name(label: str, opset: int | None = None) -> str:
    """A model name for a case: its label as an identifier (``test_add``; ``model.onnx`` -> ``model``), with
    ``_o<opset>`` where it is converted."""
    stem = unicodedata.normalize("NFC", label.removesuffix(".onnx"))
    name = "".join(c if f"a{c}".isidentifier() else "_" for c in stem)[:60]  # 模型 stays, as Python takes it
    if not name or not name.isidentifier() or name[0] == "_" or keyword.iskeyword(name):
        name = f"m_{name}"[:60]  # a name starting with a digit or _ is no model name (parity init refuses it)
    return name + (f"_o{opset}" if opset else "")


def find_cases(sources: Sequence[str | Path], opset: int | None = None) -> list[Case]:
    """The cases named on the command line: ONNX files, and folders searched for ONNX files (a backend-test case
    folder, or a folder of them, at any depth). A path that does not exist, a file that is no ``.onnx`` and a
    folder without an ONNX file are a ``UsageError``; model names are made unique (``_2``, ``_3``...)."""
    if not sources:
        raise UsageError("name at least one ONNX file or folder of them")
    found: dict[Path, None] = {}
    for source in sources:
        path = Path(source)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*.onnx") if p.is_file() and not _hidden(p.relative_to(path)))
            if not files:
                raise UsageError(f"{source}: no ONNX file (*.onnx) in this folder or below it")
        elif path.is_file():
            if path.suffix != ".onnx":
                raise UsageError(f"{source}: not an ONNX file (*.onnx)")
            files = [path]
        else:
            raise UsageError(f"{source}: no such file or folder")
        found.update(dict.fromkeys(p.resolve() for p in files))
    return unique([case_of(model, opset=opset) for model in found])


def unique(cases: Sequence[Case]) -> list[Case]:
    """``cases`` with model names made unique (``_2``, ``_3``...): two case folders may share a name."""
    named, taken = [], set()
    for case in cases:
        name, k = case.name, 1
        while name in taken:
            k += 1
            name = f"{case.name}_{k}"
        taken.add(name)
        named.append(Case(name, case.label, case.model, case.test_data, case.opset))
    return named


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


def _quiet(message: str) -> None:
    pass


def check(
    cases: Sequence[Case],
    request: Request,
    *,
    progress=_quiet,
    on_case: Callable[[CaseOutcome], None] | None = None,
    show: Callable[[dict], None] = lambda report: None,
    notice: Callable[[str], None] = _quiet,
) -> tuple[dict, int]:
    """Take every case in turn (init, golden build, check of the paths ``request.patterns`` select) in one session;
    returns the result document of them all and the exit code: 0 every path passed, 1 a case was refused or a
    path failed or errored, 2 nothing was checked (every path skipped). ``progress(message, step=k, steps=n)``
    hears each case as it starts, ``on_case`` each case once done, ``show`` the report before its files are
    written, ``notice`` each file written.

    The document is the usual result JSON, with ``cases`` (each case's model, files, seconds and refusal) and each
    refused case also in ``model_errors``. A ``--json`` or ``--junit-xml`` target that cannot be written is refused
    before any work; a ``--path`` that matches no ONNX path is a ``UsageError``.
    """
    from parity.model.workspace import Workspace
    from parity.pipeline import jobs, orchestrate, outcome
    from parity.pipeline.background import Background
    from parity.platform import precision as precision_lib
    from parity.platform.cache_dir import cache_root
    from parity.platform.env import default_threads, environment
    from parity.platform.safefs import owned_tempdir, sweep
    from parity.run import paths
    from parity.run.pool import WorkerPool

    jobs.check_targets(request.json_file, None, request.junit_file)
    device = precision_lib.parse_device(request.device)
    if not paths.select(tuple(request.patterns), ("onnx",), device, request.precision):
        raise UsageError(
            f"--path {', '.join(request.patterns)} matches no path of an ONNX file; its paths start "
            f"with onnx/ (e.g. onnx/ort, 'onnx/*')"
        )
    threads = request.threads or default_threads()
    if request.workspace:
        root = Path(request.workspace).resolve()
        if not root.parent.is_dir():
            raise UsageError(f"--workspace {request.workspace}: its parent folder does not exist")
    else:
        sweep(tempfile.gettempdir(), rf"^{TEMP_PREFIX}")  # what a killed session left behind
        root = owned_tempdir(tempfile.gettempdir(), TEMP_PREFIX)
    cases, outcomes = unique(cases), []
    try:
        (root / "models").mkdir(parents=True, exist_ok=True)
        ws = Workspace(root)
        options = orchestrate.Options(
            threads=threads,
            patterns=tuple(request.patterns),
            precision=request.precision,
            device=device,
            timeout_s=request.timeout_s,
            use_cache=request.use_cache,
            diagnose=request.diagnose,
        )
        run = orchestrate.Run(ws, options)  # its steps are a case's; progress hears the cases
        env_reader = Background(lambda: environment(threads))
        worker_env = precision_lib.worker_environment(device, request.precision)
        try:
            with WorkerPool(threads, cache_root() / "logs", request.timeout_s, worker_env, service=True) as pool:
                pool.prestart()
                for k, case in enumerate(cases, 1):
                    _progress(progress, f"{case.label}: init, golden build, check", k, len(cases))
                    outcomes.append(_check_case(run, pool, case, request, threads))
                    if on_case is not None:
                        on_case(outcomes[-1])
        finally:
            run.close()
        report = run.report(env_reader.result())
    finally:
        if not request.workspace:
            shutil.rmtree(root, ignore_errors=True)
    report["cases"] = [_case_entry(o) for o in outcomes]
    code = exit_code(report)
    try:
        show(report)
    finally:  # the files are every case's results: a table the terminal cannot show costs none of them
        jobs.write_results(report, request.json_file, None, notice, junit_file=request.junit_file)
    why = outcome.nothing_checked(report)
    if why:
        notice(f"error: {why}")
    return report, code


def _progress(progress, message: str, step: int, steps: int) -> None:
    from parity.pipeline.orchestrate import accepts_steps

    if accepts_steps(progress):
        progress(message, step=step, steps=steps)
    else:
        progress(message)


def _check_case(run, pool, case: Case, request: Request, threads: int) -> CaseOutcome:
    """One case: init and golden build in ``pool``, then ``run.check_in``; a refusal on the way is the case's."""
    from parity.golden import build as golden_build
    from parity.pipeline import scaffold
    from parity.platform.errors import TaskFailed

    started = time.perf_counter()
    result = CaseOutcome(case)
    step = "init"
    try:
        root = run.workspace.root
        init = scaffold.Request(
            name=case.name,
            kind="onnx",
            reference=scaffold.workspace_reference(str(case.model), root),
            test_data=(scaffold.workspace_reference(str(case.test_data), root) if case.test_data else None),
            opset=case.opset,
        )
        scaffold.init(root, init, request.force or not request.workspace, threads, pool=pool)
        step = "golden build"
        spec = run.workspace.load_spec(case.name, attach_golden=False)
        golden_build.build(run.workspace, spec, pool, progress=run.progress)
        step = "check"
        run.check_in(pool, [case.name])
    except (ParityError, TaskFailed) as error:
        result.error = f"{step}: {one_line(str(error), 600)}"
    except Exception as error:  # noqa: BLE001 - one case that breaks parity must not cost the others their results
        result.error = f"{step}: parity raised {one_line(f'{type(error).__name__}: {error}', 600)}"
        result.crashed = True
    if result.error:
        run.model_errors.append({"model": case.name, "reason": result.error})
    result.results = [r for r in run.results if r["model"] == case.name]
    result.seconds = time.perf_counter() - started
    return result


def _case_entry(o: CaseOutcome) -> dict:
    return {
        "name": o.case.name,
        "label": o.case.label,
        "model_file": str(o.case.model),
        "test_data": str(o.case.test_data) if o.case.test_data else None,
        "opset": o.case.opset,
        "seconds": round(o.seconds, 4),
        "error": o.error,
        "crashed": o.crashed,
        "paths": [r["path"] for r in o.results],
    }


def exit_code(report: dict) -> int:
    """0 when every case's paths are as expected, 1 when a case was refused or a path failed or errored, 2 when no
    path was checked at all (every one skipped)."""
    from parity.pipeline import outcome

    if outcome.nothing_checked(report):
        return 2
    if report["model_errors"] or any(outcome.is_unexpected(r) for r in report["results"]):
        return 1
    return 0
