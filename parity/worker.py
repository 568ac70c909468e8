"""Worker processes: one per group (source framework), started with spawn.

TensorFlow, PyTorch and JAX never share a process, their thread pools never compete while
timing (only one worker is alive at a time), and a crash or hang in one task becomes that
task's error instead of the run's end. Worker output (framework logs) goes to a log file.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
from pathlib import Path

from parity.errors import ParityError


class TaskFailed(Exception):
    """A task raised, crashed its worker, or ran past its timeout; the message is the reason."""


def _align_threads(group: str, threads: int) -> None:
    """Same intra-op thread count for every framework and runtime (set before they import)."""
    n = str(threads)
    os.environ.update({
        "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n,
        "TF_NUM_INTRAOP_THREADS": n, "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""),
                                            f"--xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'}",
                                            f"intra_op_parallelism_threads={threads}"])),
    })
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


def _main(conn, group: str, threads: int, log_path: str) -> None:
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    from parity.paths import load_target

    try:
        _align_threads(group, threads)
    except Exception as error:  # a framework that fails to import: every task reports it
        startup_error = reason_of(error)
    else:
        startup_error = None
    while True:
        try:
            message = conn.recv()
        except EOFError:
            break
        if message is None:
            break
        target, kwargs = message
        if startup_error:
            conn.send(("error", startup_error))
            continue
        try:
            conn.send(("ok", load_target(target)(**kwargs)))
        except BaseException as error:  # noqa: BLE001 - every failure becomes the task's reason
            traceback.print_exc()
            conn.send(("error", reason_of(error)))


class Worker:
    """A spawned process that runs ``module:function`` tasks for one group."""

    def __init__(self, group: str, threads: int, log_dir: Path):
        context = multiprocessing.get_context("spawn")
        self.group = group
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"worker-{group}.log"
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_main, args=(child, group, threads, str(self.log_path)), daemon=True)
        self.process.start()
        child.close()

    def call(self, target: str, kwargs: dict, timeout_s: float):
        self.conn.send((target, kwargs))
        if not self.conn.poll(timeout_s):
            self.kill()
            raise TaskFailed(f"timed out after {timeout_s:g} s (worker {self.group} killed)")
        try:
            status, payload = self.conn.recv()
        except (EOFError, ConnectionError):
            self.process.join(5)
            raise TaskFailed(
                f"worker process {self.group} died (exit code {self.process.exitcode}); see {self.log_path}"
            ) from None
        if status == "error":
            raise TaskFailed(payload)
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
    """At most one live worker: switching groups closes the previous one, so nothing competes."""

    def __init__(self, threads: int, log_dir: Path, timeout_s: float):
        self.threads, self.log_dir, self.timeout_s = threads, Path(log_dir), timeout_s
        self.current: Worker | None = None

    def call(self, group: str, task: str, timeout_s: float | None = None, **kwargs):
        if self.current is not None and (self.current.group != group or not self.current.alive):
            self.current.close()
            self.current = None
        if self.current is None:
            self.current = Worker(group, self.threads, self.log_dir)
        try:
            return self.current.call(task, kwargs, timeout_s or self.timeout_s)
        except TaskFailed:
            if not self.current.alive:
                self.current = None
            raise

    def close(self) -> None:
        if self.current is not None:
            self.current.close()
            self.current = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
