"""Inside a worker process: its start (tied to its parent, output to its log, thread settings, the group's
frameworks imported once), its loop serving ``module:function`` tasks, the progress a task reports, and a template's
loop that forks workers from itself. The parent's side (``Template``, ``Worker``) is ``parity.run.processes``; the
pool that runs tasks in them is ``parity.run.pool``.

One worker per group (source framework), each forked from a template of its group on Linux (a process that imported
the group's frameworks once and runs nothing), spawned elsewhere. A worker ends without the interpreter's teardown
once told to (seconds saved per TensorFlow worker). A worker dies with its parent (parent-death signal on Linux, a
watchdog on the parent's pid elsewhere), so a killed run leaves no process behind and nothing writes after it.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import multiprocessing.connection
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback

from parity.platform.errors import GoldenError, ParityError, TaskFailed

__all__ = [
    "TaskFailed",
    "process_origin",
    "report",
    "startup_seconds",
]  # TaskFailed: where callers have always found it


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


def started_environment(threads: int, env: dict, base) -> dict[str, str]:
    """The environment a worker of ``threads`` starts with, from ``base`` (its parent's): the same intra-op thread
    count for every framework and runtime, and the device's environment (``env``: name -> value, None to unset)."""
    n = str(threads)
    started = dict(base)
    started.update(
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
            "XLA_PYTHON_CLIENT_PREALLOCATE": base.get("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),
            "XLA_FLAGS": " ".join(
                filter(
                    None,
                    [
                        base.get("XLA_FLAGS", ""),
                        f"--xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'}",
                        f"intra_op_parallelism_threads={threads}",
                    ],
                )
            ),
        }
    )
    for name, value in env.items():
        if value is None:
            started.pop(name, None)
        else:
            started[name] = str(value)
    return started


def _thread_environment(threads: int, env: dict) -> None:
    """This process's environment made ``started_environment``'s, before anything imports a numerical library."""
    started = started_environment(threads, env, os.environ)
    for name in [name for name in os.environ if name not in started]:
        del os.environ[name]
    os.environ.update(started)


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
    output flushed, multiprocessing's own finalizers run (semaphores released) and TensorFlow's generated sources
    removed (``_remove_generated_sources``), nothing else."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        _remove_generated_sources()
        from multiprocessing import util

        util._exit_function()  # type: ignore[attr-defined]  # private, so absent from typeshed's stubs
    finally:
        os._exit(status)


def _remove_generated_sources() -> None:
    """The temporary files TensorFlow's autograph wrote this process's converted functions to (``tf.function``): it
    removes them at the interpreter's exit, which ``quick_exit`` skips, and they would stay in the temporary folder."""
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name.startswith("__autograph_generated_file") and isinstance(path, str):
            try:
                os.remove(path)
            except OSError:
                pass


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
RUN_TIME_PREFIX = "PARITY_"  # parity's own variables: read when a task runs, never while a template imports
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
        before = resident_bytes()
        try:
            answer = ("ok", load_target(target)(**kwargs))
        except BaseException as error:  # noqa: BLE001 - every failure becomes the task's reason
            traceback.print_exc()
            answer = ("golden" if isinstance(error, GoldenError) else "error", reason_of(error))
        if resident_bytes() - before > RELEASE_AFTER_BYTES:  # what the task built (a model, a session) is gone
            release_memory()  # before the answer: the next task's peak is its own, not the sum of both
        conn.send(answer)
        del answer
    quick_exit(0)


# a task that left the worker this much larger has what it built freed before it answers; below it a collection is
# not worth its cost (a full ``gc.collect`` in a worker holding TensorFlow or JAX takes tens of milliseconds, and the
# benchmark's timed blocks are tasks of a few milliseconds each)
RELEASE_AFTER_BYTES = 32 << 20


def resident_bytes() -> int:
    """This process's resident memory now (0 where it cannot be read)."""
    import psutil

    try:
        return int(psutil.Process().memory_info().rss)
    except psutil.Error:
        return 0


def release_memory() -> None:
    """Free what the last task left unreachable (cycles included) and hand the C allocator's free pages back to
    the system (glibc's ``malloc_trim``; nothing elsewhere)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _main(conn, group: str | None, threads: int, log_path: str, parent_pid: int, env: dict) -> None:
    """A spawned worker. ``group`` None: a spare, started ahead of need, that waits for ``("group", group,
    log_path)`` before it imports that group's frameworks."""
    _serve(conn, _start(conn, group, threads, log_path, parent_pid, env))


def _warm(target: str) -> str | None:
    """In a template: ``target`` (a step's ``warm``, ``module:function``) run, what it imported and built frozen
    like the frameworks' import; the reason it failed, or None (a worker's task then meets the failure itself)."""
    from parity.run.paths import load_target

    try:
        load_target(target)()
    except Exception as error:  # noqa: BLE001 - said to the pool; the task that needs it reports it in full
        return reason_of(error)
    finally:
        gc.collect()
        gc.freeze()
    return None


def _template_main(conn, group: str | None, threads: int, log_path: str, parent_pid: int, env: dict) -> None:
    """A template: started like a worker, it runs no task; it forks a worker from itself for each ``("fork",
    log_path, cwd, sys_path, client, environ)`` (the worker's end of its pipe follows as a passed descriptor;
    ``client``: the pid the worker ends with where that is not the template's parent, else None; ``environ``: the
    ``PARITY_*`` variables the worker runs with, None: the template's) and answers its pid,
    and answers ``("status", pid, wait)`` with the exit code of a worker that ended (None while it runs),
    ``("imports",)`` with the files it had imported once its frameworks were (``imported_files``), and ``("warm",
    target)`` by running a step's ``warm`` (``_warm``)."""
    global _FORKED
    startup_error = _start(conn, group, threads, log_path, parent_pid, env)
    imported = imported_files()
    gc.collect()
    gc.freeze()  # what the imports built is never collected again: a worker's collections scan its own objects only
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
        if message[0] == "warm":
            conn.send(_warm(message[1]))
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
        _, log, cwd, sys_path, client, environ = message
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
                if environ is not None:
                    for name in [name for name in os.environ if name.startswith(RUN_TIME_PREFIX)]:
                        del os.environ[name]
                    os.environ.update(environ)
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
