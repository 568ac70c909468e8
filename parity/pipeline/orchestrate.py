"""The orchestrator: verify goldens, export (cached), check every path, time the passing ones; one path's export, check
and diagnosis are ``parity.pipeline.path_steps``.

It imports no ML framework: every export and check runs in a worker process of its group.
"""

from __future__ import annotations

import copy
import inspect
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from parity.golden import store as golden
from parity.pipeline import generation
from parity.pipeline.background import Background
from parity.pipeline.outcome import apply_expectation, skeleton
from parity.pipeline.path_steps import PathSteps
from parity.platform import precision as precision_lib
from parity.platform.cache_dir import cache_root
from parity.platform.env import environment
from parity.platform.errors import GoldenError, SpecError, TaskFailed, UsageError, one_line
from parity.platform.safefs import owned_tempdir, sweep
from parity.run import estimate, paths, watch
from parity.run.cache import ExportCache
from parity.run.pool import WorkerPool, running_first

if TYPE_CHECKING:  # the benchmark plan is imported only by a run that times
    from parity.bench.plan import BenchOptions

NOCACHE_PREFIX = "parity-nocache-"

RESULT_SCHEMA = "parity.result/2"


@dataclass
class Options:
    """What to check and how. ``timing`` (``parity.bench.plan.BenchOptions``) None means check only."""

    threads: int
    patterns: tuple[str, ...] = ()
    precision: str = "fp32"  # one of parity.platform.precision.PRECISIONS
    device: str = "cpu"  # "cpu" or "cuda:N" (parity.platform.precision.parse_device)
    timeout_s: float | None = None  # each task's wall-clock limit; None: scaled with the model's weights
    use_cache: bool = True
    timing: BenchOptions | None = None
    diagnose: str | None = "failing"  # diagnose layer by layer: "failing" paths, "all" selected paths, or None
    weight_perturbation: dict = field(default_factory=dict)  # (model, path) -> {param: delta}
    node_data: bool = False  # locate each diagnosis's graph for Model Explorer (parity.pipeline.node_data)


def _result_skeleton(model: str, path: paths.PathDef, spec_batch: int) -> dict:
    return skeleton(model, path.id, path.stages, path.device, path.precision, spec_batch)


def accepts_steps(progress) -> bool:
    """Whether ``progress`` can be called as ``progress(message, step=k, steps=n)``."""
    try:
        parameters = inspect.signature(progress).parameters.values()
    except (TypeError, ValueError):  # no signature to read (some builtins): one argument only
        return False
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return True
    names = {
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    return {"step", "steps"} <= names


class Run(PathSteps):
    """One check or run over models and paths (see ``check``)."""

    def __init__(self, workspace, options: Options, progress=lambda message: None, on_checked=None):
        self.workspace = workspace
        self.options = options
        self._progress = progress
        self._with_steps = accepts_steps(progress)
        self.on_checked = on_checked
        self.stage_seconds: dict[str, float] = {}
        self.results: list[dict] = []
        self.model_errors: list[dict] = []
        self.refused: set[str] = set()  # models whose golden arrays a worker refused (the plan checks files only)
        # what killed runs left behind: --no-cache scratch, cache staging, golden build scratch
        sweep(tempfile.gettempdir(), rf"^{NOCACHE_PREFIX}")
        sweep(workspace.root / "golden", golden.SCRATCH_PATTERN)
        shared_cache = ExportCache(cache_root(), notice=progress)
        shared_cache.sweep()
        shared_cache.prune(also=(generation.export_kind(),))  # the least recently used exports past the bound
        self._scratch = None if options.use_cache else owned_tempdir(tempfile.gettempdir(), NOCACHE_PREFIX)
        self.cache = ExportCache(self._scratch or cache_root(), notice=self.progress)
        self.exports: dict[str, dict] = {}  # chain key -> {"dir", "meta", "cached"} or {"error", "cached"}
        self.specs: dict = {}
        self.weights: dict[str, int] = {}  # model -> bytes of its weights (a task's default wall-clock limit)
        self.activations: dict[str, int] = {}  # model -> float64 bytes of its reference's outputs and taps
        self.check_outputs: dict[tuple, dict] = {}
        self.identities: dict[str, dict | None] = {}  # user model -> its weights digest and code now (model_identity)
        self.calibrations: dict[str, dict] = {}  # model -> the digest of its int8 calibration rows (int8_key)
        self.host: dict | None = None  # the host audit of a timed run
        self.generating: list[tuple] = []  # (spec, manifest, path ids) of language models checked as they generate
        self.generation_artifacts: dict[tuple, tuple] = {}  # (model, path) -> (spec, manifest, its export or None)

    def progress(self, message: str, step: int | None = None, steps: int | None = None) -> None:
        """Tell the caller's ``progress`` what starts now; ``step`` of ``steps`` only where it takes them."""
        if self._with_steps and step is not None:
            self._progress(message, step=step, steps=steps)
        else:
            self._progress(message)

    def _stage(self, name: str, started: float) -> None:
        """Add the seconds since ``started`` to stage ``name``."""
        self.stage_seconds[name] = self.stage_seconds.get(name, 0.0) + time.perf_counter() - started

    def _plan(self, model_names):
        plan = []
        matched = False
        for name in model_names:
            try:  # a model that cannot be loaded, or whose golden data does not verify, is that model's error
                spec = self.workspace.load_spec(name)
                if generation.is_generation(spec):  # its own golden data and paths (``parity.pipeline.generation``)
                    chosen = generation.selected(spec, self.options.patterns)
                    manifest = generation.generation_golden.verify(
                        self.workspace.golden_dir(name), spec, self.workspace.root
                    )
                    self.generating.append((spec, manifest, chosen))
                    matched = matched or bool(chosen)
                    continue
                manifest = golden.verified_manifest(self.workspace.golden_dir(name), spec)  # arrays: in the worker
            except (SpecError, GoldenError) as error:
                self.model_errors.append({"model": name, "reason": str(error)})
                continue
            self._check_batch_sizes(spec, manifest)
            self.specs[name] = spec
            self.weights[name] = watch.weights_bytes(manifest)
            self.activations[name] = estimate.activation_bytes(manifest)
            selected = paths.select(self.options.patterns, spec.frameworks, self.options.device, self.options.precision)
            matched = matched or bool(selected)
            for path in selected:
                plan.append((spec, manifest, path))
        if self.options.patterns and not matched and not self.model_errors:
            raise UsageError(f"--path {', '.join(self.options.patterns)} matches no path of the selected models")
        return plan

    def _check_batch_sizes(self, spec, manifest) -> None:
        """Every batch size to time must fit the eval split it is verified on (an input error, before any work)."""
        if self.options.timing is None:
            return
        from parity.model import feeds

        available = (
            manifest["files"]["eval.npz"]["arrays"][feeds.key(spec, spec.model_inputs[0].name)]["shape"][0]
            if spec.model_inputs
            else 1
        )  # a graph without inputs runs once, whole
        for batch in self.options.timing.batch_sizes or spec.timed_batch_sizes:
            if batch > available:
                raise UsageError(
                    f"batch size {batch} cannot be verified for model {spec.name!r}: its eval split has "
                    f"{available} samples (each batch size is checked against them before it is timed)"
                )

    def _batches(self, spec) -> list:
        """The batch sizes a path of ``spec`` is exported at: the spec's (None), then a timed run's others."""
        timed = (self.options.timing.batch_sizes or spec.timed_batch_sizes) if self.options.timing is not None else ()
        return [None] + [batch for batch in dict.fromkeys(timed) if batch != spec.batch_size]

    def execute(self, model_names, pool: WorkerPool | None = None) -> dict:
        """The whole run; in ``pool`` where the caller started one for these options (closed here, as our own)."""
        # the environment manifest (package versions, CPU, GPU) is read while the workers start and check
        env_reader = Background(lambda: environment(self.options.threads))
        try:
            worker_env = precision_lib.worker_environment(self.options.device, self.options.precision)
            pool = pool or WorkerPool(self.options.threads, cache_root() / "logs", self.options.timeout_s, worker_env)
            with pool:
                pool.prestart()  # its Python and imports load while the goldens are verified here
                order = self.check_in(pool, model_names)
                if self.on_checked is not None:
                    self.on_checked(copy.deepcopy(self.report(env_reader.result())))  # as it is now
                if self.options.timing is not None:
                    from parity.bench import plan as benchmark
                    from parity.platform.host import HostMonitor

                    started = time.perf_counter()
                    with HostMonitor(self.options.threads) as monitor:
                        benchmark.bench(self, pool, order, self.options.timing)
                        generation.time_paths(self, pool, self.options.timing)
                    self.host = monitor.audit({"worker_environment": worker_env})
                    self._stage("bench", started)
        finally:
            self.close()
        return self.report(env_reader.result())

    def check_in(self, pool, model_names) -> list:
        """Verify, export, check and diagnose the selected paths of ``model_names`` in ``pool`` (a ``WorkerPool``
        the caller holds, so that many calls share its workers), appending to ``self.results``; returns the
        checked ``(spec, manifest, path, result)`` in the order they ran (what a timed run times)."""
        started = time.perf_counter()
        plan = self._plan(model_names)
        self._stage("verify", started)
        pending = []
        for spec, manifest, path in plan:
            result = _result_skeleton(spec.name, path, spec.batch_size)
            result["reference_fallback"] = golden.reference_fallback(manifest)  # a float32 reference, said per path
            self.results.append(result)
            reason = paths.unavailable_reason(path)
            if reason:
                result.update(verdict="skip", reason=reason)
            else:
                pending.append((spec, manifest, path, result))
        started = time.perf_counter()
        self._identify(pool, pending)
        self._stage("verify", started)  # that the golden data still describes the model
        # exports, shallow first and grouped by worker so each framework starts once per depth (the worker
        # already running first, so a group is not started again at the next depth or for the checks)
        # a timed run's other batch sizes too (static batch per artifact), while each group's worker is up:
        # they are verified again at that batch before they are timed
        started = time.perf_counter()
        exports = [
            (item, depth, batch)
            for item in pending
            for depth in range(len(item[2].exports))
            for batch in self._batches(item[0])
        ]
        done = 0
        for depth in range(max((len(p.exports) for _, _, p, _ in pending), default=0)):
            todo = [item for item in pending if len(item[2].exports) > depth]
            for spec, manifest, path, _ in running_first(
                pool, todo, lambda item, depth=depth: item[2].exports[depth].group
            ):
                for batch in self._batches(spec):
                    done += 1
                    self._guarded(
                        spec, self._export, pool, spec, manifest, path, depth, batch, at_step=(done, len(exports))
                    )
        if exports:
            self._stage("export", started)
        # every check and diagnosis of every model before any timing, one worker per group
        started = time.perf_counter()
        order = _check_order(pool, pending)
        for k, (spec, manifest, path, result) in enumerate(order, 1):
            checking = time.perf_counter()
            self._guarded(spec, self._check, pool, spec, manifest, path, result, step=(k, len(order)))
            result["check_s"] = round(time.perf_counter() - checking, 4)
        self._stage("check", started)
        self._floors(pool, order)
        if self.options.diagnose:
            started = time.perf_counter()
            for spec, manifest, path, result in order:
                self._guarded(spec, self._diagnose, pool, spec, manifest, path, result)
            self._stage("diagnose", started)
        self._generate(pool)
        if self.refused:  # such a model is an input error, as one refused by the plan: no verdict of its paths stands
            self.results = [r for r in self.results if r["model"] not in self.refused]
            order = [item for item in order if item[0].name not in self.refused]
        for result in self.results:
            if result["model"] in model_names and result["model"] in self.specs:  # a generation row expects nothing
                apply_expectation(self.specs[result["model"]], result)
        return order

    def _generate(self, pool) -> None:
        """Each language model's generation paths, step by step against its golden (CPU, float32)."""
        started = time.perf_counter()
        for spec, manifest, chosen in self.generating:
            runs = self.options.device == "cpu" and self.options.precision == "fp32"  # else each path a skip
            try:
                moved = generation.changed(self.workspace, pool, spec, manifest) if chosen and runs else None
            except TaskFailed as error:  # the model cannot be read now: the model's error
                self.model_errors.append({"model": spec.name, "reason": one_line(str(error), 400)})
                continue
            for path_id in chosen:
                if moved is not None:
                    row = generation.row(spec, manifest, path_id)
                    reason = f"the model changed since its golden data was built: run parity golden build --model {spec.name}"
                    row.update(verdict="error", golden_changed={**moved, "message": reason}, reason=reason)
                elif self.options.device != "cpu" or self.options.precision != "fp32":
                    row = generation.row(spec, manifest, path_id)
                    row.update(verdict="skip", reason="generation paths are checked on the CPU in float32")
                else:
                    row, artifact = generation.check(
                        self.workspace,
                        pool,
                        spec,
                        manifest,
                        path_id,
                        self.options.threads,
                        self.progress,
                        (self._scratch or cache_root()) / "generation-exports",
                    )
                    self.generation_artifacts[(spec.name, path_id)] = (spec, manifest, artifact)
                    if self.options.diagnose and row["verdict"] == "fail":
                        generation.diagnose(
                            self.workspace, pool, spec, row, artifact, self.options.threads, self.progress
                        )
                self.results.append(row)
        if self.generating:
            self._stage("generate", started)

    def sized(self, pool, spec):
        """``pool``'s tasks, in this block, work on ``spec``'s model: where no timeout was given, their wall-clock
        limit grows with its weights."""
        from parity.model import weight_files

        return pool.for_model(
            self.weights.get(spec.name), self.activations.get(spec.name), mapped=weight_files.mapped(spec)
        )

    def _guarded(self, spec, call, pool, *args, **kwargs) -> None:
        """``call(pool, *args, **kwargs)`` unless a worker has refused ``spec``'s golden arrays; a refusal now (a
        golden file whose arrays do not match its verified manifest) is the model's error, said once."""
        if spec.name in self.refused:
            return
        try:
            with self.sized(pool, spec):
                call(pool, *args, **kwargs)
        except TaskFailed as error:
            if error.kind != "golden":
                raise
            self.refused.add(spec.name)
            self.model_errors.append({"model": spec.name, "reason": str(error)})

    def _floors(self, pool, order) -> None:
        """Each checked fp32 path against the float32 noise floor of its source (``parity.check.noise_floor``) into
        ``result["noise_floor"]``: the source path's result in this run, or a check of it made for the floor alone
        (not a result of the run)."""
        from parity.check import noise_floor

        measured: dict[tuple, dict] = {}
        for spec, manifest, path, result in order:
            if spec.name in self.refused or not noise_floor.judged(result, path):
                continue
            source = paths.by_id(path.definition, path.device if path.definition in paths.NATIVE else "cpu", "fp32")
            key = (spec.name, source.id, source.device)
            if key not in measured:
                found = next(
                    (
                        r
                        for s, _, p, r in order
                        if s.name == spec.name and (p.id, p.device, p.precision) == (source.id, source.device, "fp32")
                    ),
                    None,
                )
                if found is None:
                    found = _result_skeleton(spec.name, source, spec.batch_size)
                    self.progress(f"{spec.name}: the float32 noise floor ({source.id})")
                    self._guarded(spec, self._check, pool, spec, manifest, source, found)
                measured[key] = found
            if measured[key].get("verdict") in ("pass", "fail"):
                judged = noise_floor.judge(result, measured[key], source.id)
                if judged is not None:
                    result["noise_floor"] = judged

    def close(self) -> None:
        """Remove the scratch export folder of a ``--no-cache`` run (the run's results stay)."""
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def report(self, env: dict) -> dict:
        """The result document of every model checked so far, with ``env`` (``parity.platform.env.environment``)."""
        report = {
            "schema": RESULT_SCHEMA,
            "env": env,
            "results": self.results,
            "model_errors": self.model_errors,
            "stage_seconds": {name: round(seconds, 3) for name, seconds in self.stage_seconds.items()},
        }
        if self.host is not None:
            report["host"] = self.host
        return report


def _check_order(pool, pending) -> list:
    """``pending`` grouped by worker group, the group of the worker already running (from the exports) first."""
    return running_first(pool, pending, lambda item: item[2].runtime.group)


def check(
    workspace,
    model_names,
    options: Options,
    progress=lambda message: None,
    on_checked=None,
    pool: WorkerPool | None = None,
) -> dict:
    """Verify goldens, export, check every selected path, diagnose failing ones; time passing paths when
    ``options.timing``.

    ``progress(message)`` hears each step as it starts (``progress(message, step=k, steps=n)`` where it accepts
    those keywords and the number of steps is known). ``on_checked(report)``, when given, is called once after
    every check and diagnosis of every model and before any timing, with the report as it is then (the final
    report's shape, ``timing`` still None). ``report["stage_seconds"]`` says how long each stage that ran took
    (``verify``, ``export``, ``check``, ``diagnose``, ``bench``; a timed run's exports at its extra batch sizes
    count as ``export``). ``pool``: a ``WorkerPool`` for these options that the caller started early (its spare
    loading while the caller works), closed by the run; None: the run starts its own.
    """
    try:
        run = Run(workspace, options, progress, on_checked)
    except BaseException:  # the caller's pool is ours to close, even when the run cannot start
        if pool is not None:
            pool.close()
        raise
    return run.execute(model_names, pool)
