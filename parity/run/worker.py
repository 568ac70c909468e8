"""Worker processes: one per group (source framework), started with spawn.

TensorFlow, PyTorch and JAX never share a process, their thread pools never compete while
timing (only one worker runs tasks at a time; a spare started ahead of need, while the parent
verifies goldens, only imports NumPy and parity and then waits for its group), and a crash or
hang in one task becomes that task's error instead of the run's end. A worker ends without the
interpreter's teardown once told to (seconds saved per TensorFlow worker). A worker dies with its
parent (parent-death signal on Linux, a watchdog on the parent's pid elsewhere), so a killed run
leaves no process behind and nothing writes after it. Worker output (framework logs) goes to one log folder per run under
the cache, kept when a task of the run failed and removed otherwise; old ones are pruned.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from parity.platform.errors import ParityError
from parity.platform.safefs import owned_tempdir, owner_alive

# worker log folders kept for failed runs: at most this many, none older than this
KEEP_LOG_RUNS = 20
KEEP_LOG_DAYS = 14
LOG_PREFIX = "run-"


class TaskFailed(Exception):
    """A task raised, crashed its worker, or ran past its timeout; the message is the reason.

    ``kind`` says which: ``raised`` (the task's own exception: deterministic, may be cached),
    ``startup`` (the worker's framework failed to import), ``died`` or ``timeout``.
    """

    def __init__(self, message: str, kind: str = "raised", log: str | None = None):
        super().__init__(message)
        self.kind = kind
        self.log = log  # the worker's log, with the task's traceback


def die_with_parent(parent_pid: int) -> None:
    """Make sure this worker ends when the process that started it ends, however it ends."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)

    def watchdog():
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watchdog, name="parent-watchdog", daemon=True).start()


def _thread_environment(threads: int, env: dict) -> None:
    """Same intra-op thread count for every framework and runtime, and the device's environment
    (``env``: name -> value, None to unset), set before anything imports a numerical library."""
    n = str(threads)
    os.environ.update({
        "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n,
        "TF_NUM_INTRAOP_THREADS": n, "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""),
                                            f"--xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'}",
                                            f"intra_op_parallelism_threads={threads}"])),
    })
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _import_frameworks(group: str, threads: int) -> None:
    """The group's frameworks, imported and held to the same thread count."""
    if "torch" in group.split("+"):
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
    if "tf" in group.split("+"):
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)


def reason_of(error: BaseException) -> str:
    """A one-paragraph reason: the library's own message, trimmed."""
    if isinstance(error, ParityError):
        text = str(error)
    else:
        text = f"{type(error).__name__}: {error}".strip()
    lines = [line for line in text.splitlines() if line.strip()]
    text = " ".join(lines[:4])
    return text if len(text) <= 600 else text[:597] + "..."


_STARTUP_SECONDS = 0.0


def startup_seconds() -> float:
    """Seconds this worker spent importing its frameworks before its first task (0 in other processes)."""
    return _STARTUP_SECONDS


def quick_exit(status: int) -> None:
    """End this process now, without the interpreter's teardown (seconds for a process that imported TensorFlow):
    output flushed and multiprocessing's own finalizers run (semaphores released), nothing else."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        from multiprocessing import util

        util._exit_function()
    finally:
        os._exit(status)


def _redirect_output(log_path: str) -> None:
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)


def _main(conn, group: str | None, threads: int, log_path: str, parent_pid: int, env: dict) -> None:
    """A worker's loop. ``group`` None: a spare, started ahead of need: it imports what every task needs, then
    waits for ``("group", group, log_path)`` before it imports that group's frameworks."""
    global _STARTUP_SECONDS
    die_with_parent(parent_pid)
    _redirect_output(log_path)
    _thread_environment(threads, env)
    if group is None:
        try:
            import parity.run.tasks  # noqa: F401 - numpy and parity's own modules, while the parent plans
            from parity.model import manifest

            manifest._validator()  # the golden manifest's schema checker, which every task's golden load needs
        except Exception:  # noqa: BLE001 - the task that needs it reports it
            traceback.print_exc()
        message = conn.recv()
        if message is None:
            quick_exit(0)
        _, group, log_path = message
        _redirect_output(log_path)
    from parity.run.paths import load_target

    started = time.perf_counter()
    try:
        _import_frameworks(group, threads)
    except Exception as error:  # a framework that fails to import: every task reports it
        startup_error = reason_of(error)
    else:
        startup_error = None
    _STARTUP_SECONDS = time.perf_counter() - started
    while True:
        try:
            message = conn.recv()
        except EOFError:
            break
        if message is None:  # every task's files are written: skip the interpreter's slow teardown
            quick_exit(0)
        target, kwargs = message
        if startup_error:
            conn.send(("startup", startup_error))
            continue
        try:
            conn.send(("ok", load_target(target)(**kwargs)))
        except BaseException as error:  # noqa: BLE001 - every failure becomes the task's reason
            traceback.print_exc()
            conn.send(("error", reason_of(error)))


class Worker:
    """A spawned process that runs ``module:function`` tasks for one group."""

    def __init__(self, group: str | None, threads: int, log_dir: Path, env: dict | None = None):
        """``group`` None: a spare that waits for ``adopt(group)``."""
        context = multiprocessing.get_context("spawn")
        self.group = group
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self.log_path = log_dir / f"worker-{group or 'spare'}.log"
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_main, args=(child, group, threads, str(self.log_path), os.getpid(),
                                                                 env or {}),
                                       daemon=True)
        self.process.start()
        child.close()

    def adopt(self, group: str) -> None:
        """Make a spare the worker of ``group`` (it imports the group's frameworks now)."""
        self.group, self.log_path = group, self.log_dir / f"worker-{group}.log"
        self.conn.send(("group", group, str(self.log_path)))

    def call(self, target: str, kwargs: dict, timeout_s: float):
        self.conn.send((target, kwargs))
        if not self.conn.poll(timeout_s):
            self.kill()
            raise TaskFailed(f"timed out after {timeout_s:g} s (worker {self.group} killed; log {self.log_path})",
                             "timeout", str(self.log_path))
        try:
            status, payload = self.conn.recv()
        except (EOFError, ConnectionError):
            self.process.join(5)
            raise TaskFailed(
                f"worker process {self.group} died (exit code {self.process.exitcode}); see {self.log_path}", "died",
                str(self.log_path)) from None
        if status != "ok":
            raise TaskFailed(payload, "raised" if status == "error" else status, str(self.log_path))
        return payload

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self.process.join(30)
        self.kill()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.conn.close()


class WorkerPool:
    """At most one live worker: switching groups closes the previous one, so nothing competes.

    Logs go to ``logs_root/run-<owner>-<random>/worker-<group>.log``: kept if any task failed
    (messages point there), removed after a clean run.
    """

    def __init__(self, threads: int, logs_root: Path, timeout_s: float, env: dict | None = None):
        from parity.platform.cache_dir import cache_folder

        self.threads, self.timeout_s, self.env = threads, timeout_s, env or {}
        logs_root = cache_folder(Path(logs_root), "log folder")
        prune_logs(logs_root)
        self.log_dir = owned_tempdir(logs_root, LOG_PREFIX)
        self.failed = False
        self.current: Worker | None = None
        self.spare: Worker | None = None

    def prestart(self) -> None:
        """Start a worker ahead of need, before its group is known: Python, NumPy and parity's modules load while
        the caller does its own work (e.g. verifying goldens); the first ``call`` adopts it. Only while no worker
        is running, so a spare never competes with a task."""
        if self.spare is None and self.current is None:
            self.spare = Worker(None, self.threads, self.log_dir, self.env)

    def current_group(self) -> str | None:
        """The group of the live worker, if one is running (a caller orders its tasks to start it again less)."""
        return self.current.group if self.current is not None and self.current.alive else None

    def call(self, group: str, task: str, timeout_s: float | None = None, fresh: bool = False, **kwargs):
        """Run ``task`` in the worker of ``group`` (``fresh``: in a newly started one)."""
        if self.current is not None and (fresh or self.current.group != group or not self.current.alive):
            self.current.close()
            self.current = None
        if self.current is None:
            spare, self.spare = self.spare, None
            if spare is not None and spare.alive:
                spare.adopt(group)
                self.current = spare
            else:
                if spare is not None:
                    spare.kill()
                self.current = Worker(group, self.threads, self.log_dir, self.env)
        try:
            return self.current.call(task, kwargs, timeout_s or self.timeout_s)
        except TaskFailed:
            self.failed = True
            if not self.current.alive:
                self.current = None
            raise

    def close(self) -> None:
        for worker in (self.current, self.spare):
            if worker is not None:
                worker.close()
        self.current = self.spare = None
        if not self.failed:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def running_first(pool, items, group_of, then=lambda group: ()) -> list:
    """``items`` grouped by worker group (stable), the group of the worker ``pool`` has running first, so it is
    not started again; ``then(group)`` orders the other groups before their names do."""
    current = pool.current_group()
    return sorted(items, key=lambda item: (group_of(item) != current, then(group_of(item)), group_of(item)))


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
