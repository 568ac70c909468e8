"""The parent's side of worker processes: ``Template`` (a process that imported one group's frameworks and forks
workers from itself), ``Worker`` (a process running one group's tasks, forked from its template or spawned), and the
templates this process keeps. What runs inside them is ``parity.run.worker``; the pool is ``parity.run.pool``.

TensorFlow, PyTorch and JAX never share a process, their thread pools never compete while timing (only one worker
runs tasks at a time; templates only wait), and a crash or hang in one task becomes that task's error instead of the
run's end. A fresh worker costs a fork, so every first result and every timed group can have one.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time
import types
from pathlib import Path
from typing import TYPE_CHECKING

from parity.platform.errors import ParityError, TaskFailed
from parity.run import watch
from parity.run.worker import PROGRESS, RUN_TIME_PREFIX, _main, _template_main, started_environment

if TYPE_CHECKING:
    from parity.run.service import RemoteTemplate

__all__ = ["Template", "Worker"]


def _no_space(log_path: Path) -> str:
    """``the disk holding <folder> is full; `` where a full disk may be why a worker died (its log is then empty)."""
    from parity.platform.cache_dir import full_disk_note

    note = full_disk_note(log_path)
    return f"{note}; " if note else ""


def _spawn(main, group: str | None, threads: int, log_path: Path, env: dict):
    """A new interpreter running ``main`` (a worker's or a template's): the parent's end of its pipe, its process.

    The child does not run this process's ``__main__`` file again, as multiprocessing otherwise does for a script:
    for the ``parity`` console script that is the whole CLI's imports (click and every command), for a user's script
    calling ``assert_parity`` the script itself. A worker needs nothing from it: its tasks are named
    ``module:function`` and its arguments are plain data."""
    context = multiprocessing.get_context("spawn")
    conn, child = context.Pipe()
    process = context.Process(target=main, args=(child, group, threads, str(log_path), os.getpid(), env), daemon=True)
    main_module = sys.modules.get("__main__")
    with _SPAWN_LOCK:
        sys.modules["__main__"] = types.ModuleType("__main__")  # no __file__ and no __spec__: nothing to run again
        try:
            process.start()  # the child's preparation data (what it runs first) is read here
        finally:
            if main_module is not None:
                sys.modules["__main__"] = main_module
    child.close()
    return conn, process


_SPAWN_LOCK = threading.Lock()


class Template:
    """A spawned process that has imported one group's frameworks (and NumPy and parity) and runs nothing: each
    worker of the group is forked from it, so a fresh worker costs a fork, not a framework import (seconds for
    TensorFlow). Linux only. ``group`` None: a spare that waits for ``adopt(group)``."""

    def __init__(self, group: str | None, threads: int, log_path: Path, env: dict):
        self.group, self.in_use, self.lock = group, 0, threading.Lock()
        self.conn, self.process = _spawn(_template_main, group, threads, log_path, env)
        self.imported: dict | None = None  # the files it imported (path -> [size, mtime_ns]), once a service asked
        self.warmed: set[str] = set()  # the steps' ``warm`` it has run
        self.wanted: set[str] = set()  # those it has forked a worker for

    def adopt(self, group: str, log_path: Path) -> None:
        self.group = group
        self.conn.send(("group", group, str(log_path)))

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def _ask(self, message, timeout_s: float | None = None, fd: int | None = None):
        with self.lock:
            try:
                self.conn.send(message)
                if fd is not None:
                    with socket.fromfd(self.conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as control:
                        socket.send_fds(control, [b"w"], [fd])
                if timeout_s is not None and not self.conn.poll(timeout_s):
                    raise TaskFailed(
                        f"timed out after {timeout_s:g} s starting the {self.group} worker (its "
                        "frameworks' import did not finish)",
                        "timeout",
                    )
                return self.conn.recv()
            except BaseException:  # an answer may still be on its way (an interrupt, a timeout): never ask again
                self.close()
                raise

    def fork(self, log_path: Path, timeout_s: float) -> tuple[int, multiprocessing.connection.Connection]:
        """A new worker: its pid and the parent's end of its pipe."""
        ours, theirs = multiprocessing.Pipe()
        try:
            pid = self.fork_onto(
                theirs.fileno(), str(log_path), os.getcwd(), list(sys.path), None, timeout_s, run_time_environment()
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return pid, ours

    def fork_onto(
        self,
        fd: int,
        log: str,
        cwd: str,
        sys_path: list,
        client: int | None,
        timeout_s: float,
        environ: dict[str, str] | None = None,
    ) -> int:
        """A new worker that serves its tasks on descriptor ``fd`` (a copy is passed; the caller closes its own),
        runs in ``cwd`` with ``sys_path`` and parity's own variables as ``environ`` gives them (None: the
        template's) and writes to ``log``, ending with ``client`` too (a pid, or None); its pid."""
        try:
            pid = self._ask(("fork", log, cwd, sys_path, client, environ), timeout_s, fd)
            if not isinstance(pid, int) or pid <= 0:
                self.close()
                raise OSError(f"the template answered {pid!r} for a pid")
        except (EOFError, OSError):
            self.process.join(5)
            raise TaskFailed(
                f"the {self.group} worker's template died (exit code {self.process.exitcode})", "died"
            ) from None
        return pid

    def warm(self, target: str, timeout_s: float) -> None:
        """Ready for a worker of a step whose ``warm`` is ``target``: the second such worker on, the template runs
        ``target`` first (once), so that this worker and every later one start with what it imports; the first
        imports it itself, as a process that forks a single worker would never use it. A failure is the task's
        to meet, not said here."""
        if target in self.warmed:
            return
        if target in self.wanted:
            self._ask(("warm", target), timeout_s)
            self.warmed.add(target)
        self.wanted.add(target)

    def imports(self) -> dict[str, list[int]]:
        """The files this template had imported once its frameworks were (``imported_files``)."""
        return self._ask(("imports",))

    def exit_code(self, pid: int, wait: bool = False) -> int | None:
        """The exit code of a worker forked from here (negative: the signal that ended it); None while it runs."""
        try:
            return self._ask(("status", pid, wait))
        except (EOFError, OSError):  # the template is gone, and its workers died with it
            return -signal.SIGKILL

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.process.join(1)  # it ends at once once it is waiting; one still importing is killed
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.conn.close()


class _Forked:
    """A worker forked from a template, seen like a ``multiprocessing.Process``: its exit code comes from the
    template (its parent)."""

    def __init__(self, template: Template | RemoteTemplate, pid: int):
        self.template, self.pid = template, pid
        self._exitcode: int | None = None

    @property
    def exitcode(self) -> int | None:
        if self._exitcode is None:
            self._exitcode = self.template.exit_code(self.pid)
        return self._exitcode

    def is_alive(self) -> bool:
        return self.exitcode is None

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._exitcode = self.template.exit_code(self.pid, wait=True)


# templates of this process, kept across runs (a test session or a notebook pays each import once) and ended
# with it: (group, *environment_key) -> Template, least recently used first
_TEMPLATES: dict[tuple, Template] = {}
# a run of every path uses seven groups (torch, tf, jax, jax+tf, onnx, openvino, litert): all of them are kept,
# and one more; an idle template holds 0.05-0.35 GB of memory of its own (the rest is shared libraries)
MAX_TEMPLATES = 8
START_METHOD_VARIABLE = "PARITY_WORKER_START"


def forks() -> bool:
    """Whether workers are forked from templates: on Linux, unless ``PARITY_WORKER_START=spawn`` asks for a new
    interpreter per worker (what every other platform gets: fork after a framework import is only safe to count
    on under Linux)."""
    method = os.environ.get(START_METHOD_VARIABLE, "fork" if sys.platform.startswith("linux") else "spawn")
    if method not in ("fork", "spawn"):
        raise ParityError(f"{START_METHOD_VARIABLE}={method!r}: use fork or spawn")
    return method == "fork" and sys.platform.startswith("linux")


def run_time_environment() -> dict[str, str]:
    """This process's ``PARITY_*`` variables, which a worker forked here is given (``Template.fork``): a template
    started under other values (another cache folder, memory limit, store) serves it all the same."""
    return {k: v for k, v in os.environ.items() if k.startswith(RUN_TIME_PREFIX)}


def environment_key(threads: int, env: dict) -> tuple:
    """What a template's imports depend on: the thread count and the environment it starts with
    (``worker.started_environment``), pytest's per-test variable and the variables a forked worker is given
    (``run_time_environment``) aside."""
    base = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST" and not k.startswith(RUN_TIME_PREFIX)}
    return threads, tuple(sorted(started_environment(threads, env, base).items()))


def close_templates() -> None:
    """End every template of this process (workers forked from them end with them)."""
    while _TEMPLATES:
        _TEMPLATES.popitem()[1].close()


class Worker:
    """A process that runs ``module:function`` tasks for one group: forked from the group's template, or spawned
    where workers do not fork (there a spare, started before its group is known, is a spawned worker too)."""

    def __init__(
        self, group: str | None, log_path: Path, conn, process, template: Template | RemoteTemplate | None = None
    ):
        self.group, self.log_path, self.conn, self.process, self.template = group, log_path, conn, process, template
        self.on_progress = None  # hears the progress lines of a task (``report``)
        self._received = None  # a task's answer read while waiting for it
        self.peak_bytes = 0  # the last task's peak memory (``call``)
        if template is not None:
            template.in_use += 1

    @classmethod
    def spawn(cls, group: str | None, threads: int, log_dir: Path, env: dict) -> Worker:
        """``group`` None: a spare that waits for ``adopt(group)``."""
        log_path = log_dir / f"worker-{group or 'spare'}.log"
        return cls(group, log_path, *_spawn(_main, group, threads, log_path, env))

    @classmethod
    def fork(cls, template: Template | RemoteTemplate, log_dir: Path, timeout_s: float) -> Worker:
        log_path = log_dir / f"worker-{template.group}.log"
        pid, conn = template.fork(log_path, timeout_s)
        return cls(template.group, log_path, conn, _Forked(template, pid), template)

    def adopt(self, group: str) -> None:
        """Make a spare the worker of ``group`` (it imports the group's frameworks now)."""
        self.group, self.log_path = group, self.log_path.with_name(f"worker-{group}.log")
        self.conn.send(("group", group, str(self.log_path)))

    def call(self, target: str, kwargs: dict, limits: watch.Limits):
        """The task's result; killed (``TaskFailed``, kind ``timeout``) once it makes no progress for
        ``limits.stall_s`` or runs past ``limits.wall_s``, and (kind ``oom``) once its memory passes what was
        available at its start (``watch.MemoryWatch``). ``peak_bytes``: the task's peak memory, afterwards."""
        from parity.platform.memory import available

        here = available()  # read before the task is sent: a bad PARITY_MEMORY_LIMIT leaves no answer in the pipe
        self.conn.send((target, kwargs))
        memory = watch.MemoryWatch(self.process.pid, here, self.group)
        try:
            overdue = self._wait(limits, memory)
        finally:
            self.peak_bytes = memory.peak
        if overdue is not None:
            self.kill()
            reason, hint = overdue
            raise TaskFailed(
                f"{reason} (worker {self.group} killed; {hint}; log {self.log_path})",
                "oom" if memory.exceeded else "timeout",
                str(self.log_path),
            )
        try:
            status, payload = self._received if self._received is not None else self.conn.recv()
            self._received = None
        except (EOFError, ConnectionError):
            self.process.join(5)
            if self.process.exitcode == -signal.SIGKILL and self._template_standing():
                raise TaskFailed(f"{memory.killed()}; see {self.log_path}", "oom", str(self.log_path)) from None
            raise TaskFailed(
                f"worker process {self.group} died (exit code {self.process.exitcode}); "
                f"{_no_space(self.log_path)}see {self.log_path}",
                "died",
                str(self.log_path),
            ) from None
        finally:
            self.peak_bytes = memory.finish() if self.process.exitcode is None else memory.peak
        if status != "ok":
            raise TaskFailed(payload, "raised" if status == "error" else status, str(self.log_path))
        return payload

    def _wait(self, limits: watch.Limits, memory) -> tuple[str, str] | None:
        """``watch.wait`` until the task's result is there: each progress line the task sends before it (``report``)
        goes to ``on_progress``, and the waiting goes on within the task's limits."""
        started = time.monotonic()
        while True:
            overdue = watch.wait(self.conn, self.process.pid, limits, memory, started)
            if overdue is not None or not self.conn.poll():
                return overdue
            try:
                message = self.conn.recv()
            except (EOFError, ConnectionError):
                return None  # the caller's recv says the worker died
            if not (isinstance(message, tuple) and message[0] == PROGRESS):
                self._received = message
                return None
            if self.on_progress is not None:
                self.on_progress(message[1])

    def _template_standing(self) -> bool:
        """Whether the template this worker was forked from still stands (a worker dies of SIGKILL with it too), or
        the worker was spawned (none)."""
        template = self.template
        return template is None or (template.alive and not getattr(template, "lost", False))

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
        if self.template is not None:
            self.template.in_use -= 1
            self.template = None
