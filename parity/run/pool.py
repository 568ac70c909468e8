"""The pool that runs a caller's tasks in worker processes: at most one live worker, forked from its group's
template (kept by this process or by the user's worker service) or spawned, with each task's time and memory bounds,
its progress lines and a refusal before a step whose memory does not fit. Worker output (framework logs) goes to one
log folder per run under the cache, kept when a task of the run failed and removed otherwise; old ones are pruned.
"""

from __future__ import annotations

import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from parity.platform.errors import TaskFailed
from parity.platform.safefs import owned_tempdir, owner_alive
from parity.run import watch
from parity.run.processes import _TEMPLATES, MAX_TEMPLATES, Template, Worker, environment_key, forks

if TYPE_CHECKING:
    from parity.run.service import Client

__all__ = ["WorkerPool"]

# worker log folders kept for failed runs: at most this many, none older than this
KEEP_LOG_RUNS = 20
KEEP_LOG_DAYS = 14
LOG_PREFIX = "run-"


HELD_AFTER_TASK_BYTES = 3 << 29  # 1.5 GiB: a worker's imports (~0.5 GB) and a model of ~1 GB it may keep for reuse


class WorkerPool:
    """At most one live worker: switching groups closes the previous one, so nothing competes (templates only
    wait). Workers are forked from their group's template where ``forks()``, else spawned.

    Logs go to ``logs_root/run-<owner>-<random>/worker-<group>.log``: kept if any task failed
    (messages point there), removed after a clean run.

    ``service``: fork workers from the user's worker service (``parity.run.service``), whose templates outlive this
    process, where it is enabled; from templates of this process where it cannot be reached.

    ``timeout_s``: each task's wall-clock limit; None: one scaled with the size of the model the caller works on
    (``for_model``). A task that makes no progress is killed sooner (``parity.run.watch``).
    """

    def __init__(
        self, threads: int, logs_root: Path, timeout_s: float | None, env: dict | None = None, service: bool = False
    ):
        from parity.platform.cache_dir import cache_folder

        self.threads, self.timeout_s, self.env = threads, timeout_s, env or {}
        from parity.platform.memory import limit_from_environment

        watch.stall_seconds()  # a bad PARITY_STALL_TIMEOUT or PARITY_MEMORY_LIMIT is said before anything starts
        limit_from_environment()
        self.weights_bytes: int | None = None  # of the model the caller works on (for_model)
        self.mapped = False  # that model is a torch model mapped from its weight files (for_model)
        self.on_progress = None  # hears tasks' progress lines (``reporting``)
        self.activation_bytes: int | None = None  # its reference's outputs and taps at the batch, float64 (for_model)
        self.last_peak_bytes: int | None = None  # the memory peak of the last task (``call``)
        self.peaks: dict[str, int] = {}  # task -> its largest memory peak (bytes) since the caller cleared it
        logs_root = cache_folder(Path(logs_root), "log folder")
        prune_logs(logs_root)
        self.log_dir = owned_tempdir(logs_root, LOG_PREFIX)
        self.failed = False
        self.forks = forks()
        self.current: Worker | None = None
        self.spare: Worker | Template | None = None
        self.service: Client | None = None  # the service's client, once prestart or the first worker opened it
        self.use_service = service and self.forks

    def prestart(self) -> None:
        """Start a process ahead of need, before its group is known: Python, NumPy and parity's modules load while
        the caller does its own work (e.g. verifying goldens); the first group that needs a new one adopts it (a
        spare template where workers fork, else a spare worker). Only while no worker is running, so a spare never
        competes with a task, and not where this process already has templates for these settings."""
        if self.spare is not None or self.current is not None:
            return
        if self._service() is not None:
            return
        if not self.forks:
            self.spare = Worker.spawn(None, self.threads, self.log_dir, self.env)
        elif not any(key[1:] == environment_key(self.threads, self.env) for key in _TEMPLATES):
            self.spare = Template(None, self.threads, self.log_dir / "template-spare.log", self.env)

    def current_group(self) -> str | None:
        """The group of the live worker, if one is running (a caller orders its tasks to start it again less)."""
        return self.current.group if self.current is not None and self.current.alive else None

    def _template(self, group: str, plain: bool = False) -> Template:
        """The group's template for this pool's settings: kept from before, the spare adopted, or started now.
        ``plain``: one that has run no step's ``warm``, kept beside the group's warmed one (a fresh worker has
        imported only its frameworks, as a new process would: its time to first result counts what it imports)."""
        key = (group, *environment_key(self.threads, self.env))
        kept = _TEMPLATES.get(key)
        if plain and kept is not None and kept.warmed:
            key = (f"{group} (plain)", *key[1:])
        template = _TEMPLATES.pop(key, None)
        if template is None or not template.alive:
            if template is not None:
                template.close()
            spare, self.spare = self.spare, None  # where workers fork, a spare is a template
            if isinstance(spare, Worker):
                raise TypeError("a spare worker where workers fork from templates")
            if spare is not None and spare.alive:
                spare.adopt(group, self.log_dir / f"template-{group}.log")
                template = spare
            else:
                if spare is not None:
                    spare.close()
                template = Template(group, self.threads, self.log_dir / f"template-{group}.log", self.env)
            idle = [k for k, t in _TEMPLATES.items() if t.in_use == 0]
            for old in idle[: max(len(_TEMPLATES) + 1 - MAX_TEMPLATES, 0)]:
                _TEMPLATES.pop(old).close()
        _TEMPLATES[key] = template  # most recently used last
        return template

    def _service(self):
        """The worker service's client (opened, and the service started, at the first call), or None where this
        pool does not use it or it is unavailable (then never asked again)."""
        if self.service is None and self.use_service:
            from parity.run import service

            self.use_service = service.enabled()
            if self.use_service:
                try:
                    self.service = service.Client(self.threads, self.env)
                except service.Unavailable as error:
                    self._drop_service(error)
        return self.service

    def _drop_service(self, reason) -> None:
        """Fork from templates of this process from now on (the service unreachable, silent, ended, or not serving
        this process), said at debug level."""
        import logging

        logging.getLogger(__name__).debug("workers forked here, not by the worker service: %s", reason)
        if self.service is not None:
            self.service.close()
        self.service, self.use_service = None, False

    def _start(self, group: str, warm: str = "", plain: bool = False) -> Worker:
        """A new worker of ``group``: forked from its template (``plain``: one that has run no step's ``warm``,
        else one made ready for ``warm``), the worker service's, or spawned."""
        client = self._service()
        if client is not None:
            from parity.run.service import Unavailable

            try:
                return Worker.fork(client.template(group), self.log_dir, self.limits().wall_s)
            except Unavailable as error:  # forked here from now on
                self._drop_service(error)
            except TaskFailed as error:  # the service's template died: not this task's doing
                if error.kind != "died":
                    raise
                self._drop_service(error)
        if self.forks:
            template = self._template(group, plain)
            if warm and not plain:
                template.warm(warm, self.limits().wall_s)
            return Worker.fork(template, self.log_dir, self.limits().wall_s)
        spare, self.spare = self.spare, None
        if isinstance(spare, Template):
            raise TypeError("a spare template where workers are spawned")
        if spare is not None and spare.alive:
            spare.adopt(group)
            return spare
        if spare is not None:
            spare.kill()
        return Worker.spawn(group, self.threads, self.log_dir, self.env)

    def extra(self, group: str) -> Worker:
        """A new worker of ``group`` that the caller holds, calls (``Worker.call``) and closes itself, beside this
        pool's own (which is closed first, so it does not sit idle): a benchmark keeps one per path it interleaves."""
        if self.current is not None:
            self.current.close()
            self.current = None
        try:
            return self._start(group, plain=True)
        except TaskFailed:
            self.failed = True
            raise

    def limits(self, timeout_s: float | None = None) -> watch.Limits:
        """A task's bounds now: ``timeout_s``, else the pool's, else scaled with the model's weights."""
        return watch.limits(timeout_s or self.timeout_s, self.weights_bytes)

    @contextmanager
    def for_model(self, weights_bytes: int | None, activation_bytes: int | None = None, mapped: bool = False):
        """Tasks in this block work on a model with ``weights_bytes`` of weights (and ``activation_bytes`` of float64
        outputs and taps at its batch; ``mapped``: a torch model mapped from its weight files): where no timeout was
        given, their wall-clock limit grows with it, and a step whose estimated memory does not fit is refused before
        it starts (None: the size already set stands)."""
        before = self.weights_bytes, self.activation_bytes, self.mapped
        if weights_bytes is not None:
            self.weights_bytes = weights_bytes
        if activation_bytes is not None:
            self.activation_bytes = activation_bytes
        self.mapped = mapped
        try:
            yield self
        finally:
            self.weights_bytes, self.activation_bytes, self.mapped = before

    def check_memory(self, group: str, task: str, kwargs: dict) -> None:
        """Refuse (``NotEnoughMemory``, one line) a task whose estimated peak (``parity.run.estimate``) for the model
        of this block does not fit in the memory available now; nothing where the model's size is not known."""
        from parity.platform.memory import available
        from parity.run import estimate

        step = estimate.step_of(task, kwargs)
        if step is None or not self.weights_bytes:
            return
        if group == "torch":
            step = estimate.torch_step(step, self.weights_bytes, self.mapped)
        need = estimate.peak(step, self.weights_bytes, self.activation_bytes or 0)
        here = available()
        if need > here.nbytes and self.current is not None and self.current.alive:
            # what the worker kept from earlier tasks (a model, a session) is memory this step may need: start afresh
            self.current.close()
            self.current = None
            here = available()
        estimate.refuse(str(kwargs.get("model") or "the model"), step, need, here)

    def retire_if_holding(self, limit: int = HELD_AFTER_TASK_BYTES) -> None:
        """Close the current worker when it still holds more than ``limit`` bytes once its task is done: what a task
        left behind (torch.onnx's traced program keeps the model's parameters) is not the next task's to carry."""
        from parity.platform.memory import tree_rss

        worker = self.current
        if worker is None or not worker.alive:
            return
        import psutil

        try:
            held = tree_rss(psutil.Process(worker.process.pid))
        except psutil.Error:
            return
        if held > limit:
            worker.close()
            self.current = None

    @contextmanager
    def reporting(self, on_progress):
        """Tasks in this block tell ``on_progress(line)`` what they are doing as they go (``report``)."""
        before, self.on_progress = self.on_progress, on_progress
        try:
            yield self
        finally:
            self.on_progress = before

    def call(
        self, group: str, task: str, timeout_s: float | None = None, fresh: bool = False, warm: str = "", **kwargs
    ):
        """Run ``task`` in the worker of ``group`` (``fresh``: in a new one, that has run nothing before and
        imported only its frameworks; ``warm``: the task's step's, ``Step.warm``)."""
        if self.current is not None and (fresh or self.current.group != group or not self.current.alive):
            self.current.close()
            self.current = None
        self.check_memory(group, task, kwargs)
        self.last_peak_bytes = None
        try:
            if self.current is None:
                self.current = self._start(group, warm, plain=fresh)
            worker = self.current
            worker.on_progress = self.on_progress
            try:
                return worker.call(task, kwargs, self.limits(timeout_s))
            finally:
                self.last_peak_bytes = worker.peak_bytes
                self.peaks[task] = max(self.peaks.get(task, 0), worker.peak_bytes)
        except TaskFailed as error:
            if self._lost_with_service(error):  # run again, once, in a worker of this pool's own
                return self.call(group, task, timeout_s, fresh, warm, **kwargs)
            self.failed = True
            if self.current is not None and not self.current.alive:
                self.current.kill()
                self.current = None
            raise

    def _lost_with_service(self, error: TaskFailed) -> bool:
        """Whether the live worker died with the worker service (the service, or the worker's template there,
        ended while the task ran), not of its task: then the service is dropped and the worker closed."""
        worker = self.current
        if worker is None or error.kind != "died" or not getattr(worker.template, "lost", False):
            return False
        worker.kill()
        self.current = None
        self._drop_service(f"it ended while a task ran ({error})")
        return True

    def close(self) -> None:
        for process in (self.current, self.spare):
            if process is not None:
                process.close()
        self.current = self.spare = None
        if self.service is not None:
            self.service.close()
            self.service = None
        if not self.failed:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def running_first(pool, items, group_of) -> list:
    """``items`` grouped by worker group (stable), the group of the worker ``pool`` has running first, so it is
    not started again."""
    current = pool.current_group()
    return sorted(items, key=lambda item: (group_of(item) != current, group_of(item)))


def prune_logs(logs_root: Path) -> None:
    """Remove log folders of finished runs beyond the newest ``KEEP_LOG_RUNS`` or older than ``KEEP_LOG_DAYS``."""

    def modified(folder: Path) -> float:
        try:
            return folder.stat().st_mtime
        except OSError:
            return 0.0

    try:
        finished = [p for p in logs_root.iterdir() if p.name.startswith(LOG_PREFIX) and owner_alive(p.name) is not True]
    except OSError:
        return
    finished.sort(key=modified, reverse=True)
    cutoff = time.time() - KEEP_LOG_DAYS * 86400
    for index, folder in enumerate(finished):
        if index >= KEEP_LOG_RUNS or modified(folder) < cutoff:
            shutil.rmtree(folder, ignore_errors=True)
