"""Worker processes: one per group (source framework), each forked from a template of its group on Linux
(a process that imported the group's frameworks once and runs nothing), spawned elsewhere.

TensorFlow, PyTorch and JAX never share a process, their thread pools never compete while
timing (only one worker runs tasks at a time; templates only wait; a spare started ahead of need, while
the parent verifies goldens, only imports NumPy and parity and then waits for its group), and a crash or
hang in one task becomes that task's error instead of the run's end. A fresh worker costs a fork, so
every first result and every timed group can have one. A worker ends without the interpreter's teardown
once told to (seconds saved per TensorFlow worker). A worker dies with its parent (parent-death signal on
Linux, a watchdog on the parent's pid elsewhere), so a killed run leaves no process behind and nothing
writes after it. Worker output (framework logs) goes to one log folder per run under the cache, kept when
a task of the run failed and removed otherwise; old ones are pruned.
"""

from __future__ import annotations

import importlib
import importlib.util
import multiprocessing
import multiprocessing.connection
import os
import select
import shutil
import signal
import socket
import sys
import threading
import time
import traceback
import types
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from parity.platform.errors import GoldenError, ParityError, TaskFailed
from parity.platform.safefs import owned_tempdir, owner_alive
from parity.run import watch

if TYPE_CHECKING:
    from parity.run.service import Client, RemoteTemplate

__all__ = ["TaskFailed", "Template", "Worker", "WorkerPool"]  # TaskFailed: where callers have always found it

# worker log folders kept for failed runs: at most this many, none older than this
KEEP_LOG_RUNS = 20
KEEP_LOG_DAYS = 14
LOG_PREFIX = "run-"


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


def die_with(pid: int) -> None:
    """Make sure this process ends when process ``pid`` (a client that is not its parent) ends."""
    try:
        handle = os.pidfd_open(pid)  # Linux 5.3: readable once the process has ended
    except (AttributeError, OSError):
        handle = None
        if not pid_running(pid):
            os._exit(1)

    def watchdog():
        if handle is not None:
            select.select([handle], [], [])
        else:
            while pid_running(pid):
                time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watchdog, name="client-watchdog", daemon=True).start()


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` runs (one of another user's that took the pid since does not count)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _thread_environment(threads: int, env: dict) -> None:
    """Same intra-op thread count for every framework and runtime, and the device's environment
    (``env``: name -> value, None to unset), set before anything imports a numerical library."""
    n = str(threads)
    os.environ.update(
        {
            "OMP_NUM_THREADS": n,
            "MKL_NUM_THREADS": n,
            "OPENBLAS_NUM_THREADS": n,
            "TF_NUM_INTRAOP_THREADS": n,
            "TF_NUM_INTEROP_THREADS": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "JAX_PLATFORMS": "cpu",
            # JAX takes 75 % of a GPU's memory at its first use: a JAX worker that lives on (a template, a timed series)
            # would leave the next worker of any framework out of memory; a user's own setting stands
            "XLA_PYTHON_CLIENT_PREALLOCATE": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),
            "XLA_FLAGS": " ".join(
                filter(
                    None,
                    [
                        os.environ.get("XLA_FLAGS", ""),
                        f"--xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'}",
                        f"intra_op_parallelism_threads={threads}",
                    ],
                )
            ),
        }
    )
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
    if "jax" in group.split("+"):
        import jax  # noqa: F401 - no backend is started here (that is the first task's)
    if group == "onnx":
        import onnxruntime  # noqa: F401 - no session (and no device) is created here
    runtime = {"openvino": "openvino", "litert": "ai_edge_litert.interpreter"}.get(group)
    if runtime and importlib.util.find_spec(runtime.partition(".")[0]) is not None:  # missing: the path is a skip
        importlib.import_module(runtime)


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
_FORKED = False  # forked from a template (which imported the frameworks)


def startup_seconds() -> float:
    """Seconds this worker spent importing its frameworks before its first task (0 in other processes)."""
    return _STARTUP_SECONDS


def process_origin() -> str:
    """How this worker started, for a first result's record."""
    return "forked from its group's template (framework import timed there)" if _FORKED else "spawned"


def quick_exit(status: int) -> None:
    """End this process now, without the interpreter's teardown (seconds for a process that imported TensorFlow):
    output flushed and multiprocessing's own finalizers run (semaphores released), nothing else."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        from multiprocessing import util

        util._exit_function()  # type: ignore[attr-defined]  # private, so absent from typeshed's stubs
    finally:
        os._exit(status)


def _no_space(log_path: Path) -> str:
    """``the disk holding <folder> is full; `` where a full disk may be why a worker died (its log is then empty)."""
    from parity.platform.cache_dir import full_disk_note

    note = full_disk_note(log_path)
    return f"{note}; " if note else ""


def _redirect_output(log_path: str) -> None:
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)


def _wait_for_group(conn) -> str:
    """A spare's wait: NumPy and parity's own modules load now, while the parent plans; then its group and log."""
    try:  # not jsonschema: the parent has validated the golden manifests, whose verdicts are kept in the cache
        import parity.run.tasks  # noqa: F401 - numpy and parity's own modules
    except Exception:  # noqa: BLE001 - the task that needs it reports it
        traceback.print_exc()
    message = conn.recv()
    if message is None:
        quick_exit(0)
    _, group, log_path = message
    _redirect_output(log_path)
    return group


def _start(conn, group: str | None, threads: int, log_path: str, parent_pid: int, env: dict) -> str | None:
    """A new process's start: tied to its parent, output to its log, thread settings, then (a spare: once its
    group is known) the group's frameworks imported. The reason they failed to import, or None."""
    global _STARTUP_SECONDS
    die_with_parent(parent_pid)
    _redirect_output(log_path)
    _thread_environment(threads, env)
    if group is None:
        group = _wait_for_group(conn)
    import parity.run.paths  # noqa: F401 - what every task's target is loaded with

    started = time.perf_counter()
    try:
        _import_frameworks(group, threads)
    except Exception as error:  # noqa: BLE001 - a framework that fails to import: every task reports it
        return reason_of(error)
    finally:
        _STARTUP_SECONDS = time.perf_counter() - started
    return None


PROGRESS = "progress"  # a task's message before its result: ``(PROGRESS, line)`` (``report``)
_TASK_CONN = None  # in a worker: the pipe its tasks answer on


def report(line: str) -> None:
    """In a worker's task: tell the caller what the task is doing now (the run's progress, ``WorkerPool.reporting``);
    anywhere else, nothing."""
    if _TASK_CONN is not None:
        _TASK_CONN.send((PROGRESS, line))


def _serve(conn, startup_error: str | None) -> None:
    """A worker's loop: ``(target, kwargs)`` tasks until told to stop; ends the process."""
    from parity.run.paths import load_target

    global _TASK_CONN
    _TASK_CONN = conn

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
            conn.send(("golden" if isinstance(error, GoldenError) else "error", reason_of(error)))
    quick_exit(0)


def _main(conn, group: str | None, threads: int, log_path: str, parent_pid: int, env: dict) -> None:
    """A spawned worker. ``group`` None: a spare, started ahead of need, that waits for ``("group", group,
    log_path)`` before it imports that group's frameworks."""
    _serve(conn, _start(conn, group, threads, log_path, parent_pid, env))


def _template_main(conn, group: str | None, threads: int, log_path: str, parent_pid: int, env: dict) -> None:
    """A template: started like a worker, it runs no task; it forks a worker from itself for each ``("fork",
    log_path, cwd, sys_path, client)`` (the worker's end of its pipe follows as a passed descriptor; ``client``: the
    pid the worker ends with where that is not the template's parent, else None) and answers its pid,
    and answers ``("status", pid, wait)`` with the exit code of a worker that ended (None while it runs), and
    ``("imports",)`` with the files it had imported once its frameworks were (``imported_files``)."""
    global _FORKED
    startup_error = _start(conn, group, threads, log_path, parent_pid, env)
    imported = imported_files()
    ended: dict[int, int] = {}
    while True:
        try:
            message = conn.recv()
        except EOFError:
            quick_exit(0)
        if message is None:
            quick_exit(0)
        if message[0] == "imports":
            conn.send(imported)
            continue
        if message[0] == "status":
            _, pid, wait = message
            if pid not in ended:
                try:
                    done, status = os.waitpid(pid, 0 if wait else os.WNOHANG)
                except ChildProcessError:
                    done, status = pid, 0
                if done:
                    ended[pid] = os.waitstatus_to_exitcode(status)
            conn.send(ended.get(pid))
            continue
        _, log, cwd, sys_path, client = message
        with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as control:
            _, (fd,), _, _ = socket.recv_fds(control, 1, 1)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the worker: never returns
            _FORKED = True
            try:
                conn.close()  # only the parent and the template hold the template's pipe
                die_with_parent(os.getppid())
                if client is not None:
                    die_with(client)
                _redirect_output(log)
                os.chdir(cwd)
                if client is not None:  # the service's environment is its first client's, PWD aside
                    os.environ["PWD"] = cwd
                sys.path[:] = sys_path
                _serve(multiprocessing.connection.Connection(fd), startup_error)
            finally:
                quick_exit(1)
        os.close(fd)
        ended.pop(pid, None)  # a pid the kernel gave again: not the worker that ended before
        conn.send(pid)


def imported_files() -> dict[str, list[int]]:
    """The files of this process's imported modules: path -> [size, modification time in ns]."""
    found: dict[str, list[int]] = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str):
            continue
        path = os.path.abspath(path)
        if path not in found:
            try:
                info = os.stat(path)
            except OSError:
                continue
            found[path] = [info.st_size, info.st_mtime_ns]
    return found


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
            pid = self.fork_onto(theirs.fileno(), str(log_path), os.getcwd(), list(sys.path), None, timeout_s)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return pid, ours

    def fork_onto(self, fd: int, log: str, cwd: str, sys_path: list, client: int | None, timeout_s: float) -> int:
        """A new worker that serves its tasks on descriptor ``fd`` (a copy is passed; the caller closes its own),
        runs in ``cwd`` with ``sys_path`` and writes to ``log``, ending with ``client`` too (a pid, or None);
        its pid."""
        try:
            pid = self._ask(("fork", log, cwd, sys_path, client), timeout_s, fd)
            if not isinstance(pid, int) or pid <= 0:
                self.close()
                raise OSError(f"the template answered {pid!r} for a pid")
        except (EOFError, OSError):
            self.process.join(5)
            raise TaskFailed(
                f"the {self.group} worker's template died (exit code {self.process.exitcode})", "died"
            ) from None
        return pid

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
# with it: (group, threads, worker environment, this process's environment) -> Template, least recently used first
_TEMPLATES: dict[tuple, Template] = {}
MAX_TEMPLATES = 6
START_METHOD_VARIABLE = "PARITY_WORKER_START"


def forks() -> bool:
    """Whether workers are forked from templates: on Linux, unless ``PARITY_WORKER_START=spawn`` asks for a new
    interpreter per worker (what every other platform gets: fork after a framework import is only safe to count
    on under Linux)."""
    method = os.environ.get(START_METHOD_VARIABLE, "fork" if sys.platform.startswith("linux") else "spawn")
    if method not in ("fork", "spawn"):
        raise ParityError(f"{START_METHOD_VARIABLE}={method!r}: use fork or spawn")
    return method == "fork" and sys.platform.startswith("linux")


def environment_key(threads: int, env: dict) -> tuple:
    """What a template's imports depend on: thread count and environment (pytest's per-test variable aside)."""
    outer = sorted((k, v) for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST")
    return threads, tuple(sorted((k, str(v)) for k, v in env.items())), tuple(outer)


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

        self.conn.send((target, kwargs))
        memory = watch.MemoryWatch(self.process.pid, available(), self.group)
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
        watch.stall_seconds()  # a bad PARITY_STALL_TIMEOUT is said before anything starts
        self.weights_bytes: int | None = None  # of the model the caller works on (for_model)
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

    def _template(self, group: str) -> Template:
        """The group's template for this pool's settings: kept from before, the spare adopted, or started now."""
        key = (group, *environment_key(self.threads, self.env))
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

    def _start(self, group: str) -> Worker:
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
            return Worker.fork(self._template(group), self.log_dir, self.limits().wall_s)
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
            return self._start(group)
        except TaskFailed:
            self.failed = True
            raise

    def limits(self, timeout_s: float | None = None) -> watch.Limits:
        """A task's bounds now: ``timeout_s``, else the pool's, else scaled with the model's weights."""
        return watch.limits(timeout_s or self.timeout_s, self.weights_bytes)

    @contextmanager
    def for_model(self, weights_bytes: int | None, activation_bytes: int | None = None):
        """Tasks in this block work on a model with ``weights_bytes`` of weights (and ``activation_bytes`` of float64
        outputs and taps at its batch): where no timeout was given, their wall-clock limit grows with it, and a step
        whose estimated memory does not fit is refused before it starts (None: the size already set stands)."""
        before = self.weights_bytes, self.activation_bytes
        if weights_bytes is not None:
            self.weights_bytes = weights_bytes
        if activation_bytes is not None:
            self.activation_bytes = activation_bytes
        try:
            yield self
        finally:
            self.weights_bytes, self.activation_bytes = before

    def check_memory(self, group: str, task: str, kwargs: dict) -> None:
        """Refuse (``NotEnoughMemory``, one line) a task whose estimated peak (``parity.run.estimate``) for the model
        of this block does not fit in the memory available now; nothing where the model's size is not known."""
        from parity.platform.memory import available
        from parity.run import estimate

        step = estimate.step_of(task, kwargs)
        if step is None or not self.weights_bytes:
            return
        if step == "reference" and group == "torch" and estimate.reference_mode(self.weights_bytes) == "streamed":
            step = "streamed"
        need = estimate.peak(step, self.weights_bytes, self.activation_bytes or 0)
        estimate.refuse(str(kwargs.get("model") or "the model"), step, need, available())

    @contextmanager
    def reporting(self, on_progress):
        """Tasks in this block tell ``on_progress(line)`` what they are doing as they go (``report``)."""
        before, self.on_progress = self.on_progress, on_progress
        try:
            yield self
        finally:
            self.on_progress = before

    def call(self, group: str, task: str, timeout_s: float | None = None, fresh: bool = False, **kwargs):
        """Run ``task`` in the worker of ``group`` (``fresh``: in a new one, that has run nothing before)."""
        if self.current is not None and (fresh or self.current.group != group or not self.current.alive):
            self.current.close()
            self.current = None
        self.check_memory(group, task, kwargs)
        self.last_peak_bytes = None
        try:
            if self.current is None:
                self.current = self._start(group)
            worker = self.current
            worker.on_progress = self.on_progress
            try:
                return worker.call(task, kwargs, self.limits(timeout_s))
            finally:
                self.last_peak_bytes = worker.peak_bytes
                self.peaks[task] = max(self.peaks.get(task, 0), worker.peak_bytes)
        except TaskFailed as error:
            if self._lost_with_service(error):  # run again, once, in a worker of this pool's own
                return self.call(group, task, timeout_s, fresh, **kwargs)
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
