"""How long a worker's task may run: it is killed when it makes no progress, or past its wall-clock limit.

Progress is what the parent sees of the worker from outside (``psutil``: ``/proc/<pid>`` on Linux): CPU time
used by any of its threads, or data it read or wrote. A task that sleeps, deadlocks or waits on something that
never comes uses neither, and is killed once it has gone ``PARITY_STALL_TIMEOUT`` seconds (default 120) without
either; a task that computes, however slowly on a busy machine, goes on. The wall-clock limit bounds a task
that keeps computing and never ends (a busy loop): the ``--timeout`` a user gives, else one scaled with the
size of the model's weights (a 135M-parameter model's export takes minutes on a busy 2-core machine, a toy's
seconds). Nothing here runs in the worker, so a worker busy in native code, holding the GIL, is seen as well.
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass

from parity.platform.errors import UsageError

STALL_VARIABLE = "PARITY_STALL_TIMEOUT"
DEFAULT_STALL_S = 120.0
# the wall-clock limit when none is given: a base, and more per GB of (float32) weights; an export of a
# 135M-parameter Llama (0.54 GB) took 93 s on a busy 2-core machine, and this allows it 1,550 s
BASE_WALL_S = 900.0
WALL_S_PER_GB = 1200.0
SAMPLE_S = 1.0  # how often the worker's counters are read while its task runs
MEMORY_SAMPLE_S = 0.25  # how often its memory is read (an allocation of GBs takes a second or more)
MEMBERS_S = 1.0  # how often the processes below it are looked for (every process of the machine is read)
# the share of the available memory kept free when parity stops a worker itself (the kernel stops it at none)
MEMORY_MARGIN = 0.03
MIN_MARGIN_BYTES = 128 << 20
# what counts as progress since the last progress: CPU seconds (a small share of the bound, so the odd wake-up
# of an idle thread does not count) or bytes read or written
MIN_CPU_SHARE = 0.02
MAX_MIN_CPU_S = 1.0
MIN_IO_BYTES = 1 << 20


@dataclass(frozen=True)
class Limits:
    """A task's bounds: ``wall_s`` in all, ``stall_s`` without progress; ``basis`` says where ``wall_s`` came
    from (a user's option, or the model's size), for the message of a task that runs past it."""

    wall_s: float
    stall_s: float
    basis: str = "the limit given"


def stall_seconds() -> float:
    """The no-progress bound: ``PARITY_STALL_TIMEOUT`` seconds, default 120."""
    text = os.environ.get(STALL_VARIABLE, "").strip()
    if not text:
        return DEFAULT_STALL_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{STALL_VARIABLE}={text!r}: give the seconds a task may go without progress (e.g. 300)")
    return value


def limits(timeout_s: float | None, weights_bytes: int | None = None) -> Limits:
    """The bounds of one task: ``timeout_s`` where the user gave one, else scaled with ``weights_bytes``."""
    stall = stall_seconds()
    if timeout_s is not None:
        return Limits(float(timeout_s), stall)
    size = max(int(weights_bytes or 0), 0)
    wall = BASE_WALL_S + WALL_S_PER_GB * size / 1e9
    basis = "the default limit" + (f" for the model's {_size(size)} of weights" if size else "")
    return Limits(float(round(wall)), stall, basis)


def weights_bytes(manifest: dict) -> int:
    """The size of a model's weights, as its golden manifest describes them (``weights.npz``'s arrays, or a user
    model's ``params``; read without NumPy, which a cached check's main process never imports: a dtype's width from
    the bits its name ends in)."""
    from parity.golden.weights import described

    total = 0
    for entry in described(manifest).values():
        bits = re.search(r"(\d+)\D*$", str(entry.get("dtype", "")))
        itemsize = max(int(bits[1]) // 8, 1) if bits else 1 if entry.get("dtype") == "bool" else 4
        total += math.prod(entry.get("shape") or ()) * itemsize
    return total


def _size(nbytes: int) -> str:
    if nbytes >= 1e9:
        return f"{nbytes / 1e9:.2f} GB"
    return f"{nbytes / 1e6:.0f} MB" if nbytes >= 1e6 else f"{max(nbytes / 1e3, 1):.0f} kB"


class Progress:
    """The CPU time and I/O of process ``pid`` (threads and waited-for children included), as far as this
    platform shows them; ``advanced`` says whether they moved enough since the last progress."""

    def __init__(self, pid: int, stall_s: float):
        import psutil

        self.min_cpu = min(MAX_MIN_CPU_S, MIN_CPU_SHARE * stall_s)
        try:
            self.process: psutil.Process | None = psutil.Process(pid)
        except psutil.Error:
            self.process = None
        self.last = self._counters()

    def _counters(self) -> tuple[float, int] | None:
        """CPU seconds and bytes read and written; None where the process cannot be read (gone, not ours)."""
        import psutil

        if self.process is None:
            return None
        try:
            with self.process.oneshot():
                cpu = self.process.cpu_times()
                try:
                    io = self.process.io_counters()
                    moved = getattr(io, "read_chars", io.read_bytes) + getattr(io, "write_chars", io.write_bytes)
                except (AttributeError, NotImplementedError, psutil.AccessDenied):  # macOS has no I/O counters
                    moved = 0
        except psutil.Error:
            return None
        return cpu.user + cpu.system + cpu.children_user + cpu.children_system, moved

    def advanced(self) -> bool:
        """Whether the process used ``min_cpu`` seconds of CPU or moved a MiB since the last progress. A process
        that cannot be read counts as progressing: only the wall-clock limit bounds it."""
        now = self._counters()
        if now is None or self.last is None:
            self.last = now
            return True
        if now[0] - self.last[0] >= self.min_cpu or now[1] - self.last[1] >= MIN_IO_BYTES:
            self.last = now
            return True
        return False


class MemoryWatch:
    """The memory of worker ``pid`` (its children included) while one task runs: ``peak`` resident bytes seen, and
    whether its own memory (``held``: resident less the pages of files, which the kernel drops again under pressure,
    such as weights mapped from their safetensors files) passed ``ceiling`` (``exceeded``): what the worker held at the
    task's start (``held_start``) and what was ``available`` then (``PARITY_MEMORY_LIMIT`` where it is set, else less a
    margin, so that parity stops it before the kernel does)."""

    def __init__(self, pid: int, available, group: str | None = None):
        import psutil

        from parity.platform.memory import LIMIT_VARIABLE, members_memory, tree_members

        self.pid, self.available, self.group, self.exceeded = pid, available, group or "", False
        try:
            self.process: psutil.Process | None = psutil.Process(pid)
        except psutil.Error:
            self.process = None
        self.members = tree_members(self.process) if self.process is not None else []
        self.members_read = time.monotonic()
        self.peak, self.held_start = members_memory(self.members)
        self.held = self.held_start
        margin = (
            0 if available.source == LIMIT_VARIABLE else max(int(available.nbytes * MEMORY_MARGIN), MIN_MARGIN_BYTES)
        )
        self.ceiling = self.held_start + max(available.nbytes - margin, 0)
        _reset_high_water_mark(pid)

    def sample(self) -> bool:
        """Read the worker's memory now (the processes below it found again every ``MEMBERS_S``); True once its own
        memory is past the ceiling."""
        from parity.platform.memory import members_memory, tree_members

        if self.process is None:
            return False
        if time.monotonic() - self.members_read >= MEMBERS_S:
            self.members, self.members_read = tree_members(self.process), time.monotonic()
        resident, held = members_memory(self.members)
        self.peak, self.held = max(self.peak, resident), max(self.held, held)
        self.exceeded = self.exceeded or self.held > self.ceiling
        return self.exceeded

    def finish(self) -> int:
        """The task's peak once it has ended (the kernel's high-water mark of the worker where it shows it, which
        catches what happened between two samples); bytes."""
        self.peak = max(self.peak, _high_water_mark(self.pid))
        return self.peak

    def overdue(self) -> tuple[str, str]:
        """Why the worker was killed and what lets it go further."""
        from parity.platform.memory import LIMIT_VARIABLE, gb

        reason = (
            f"out of memory: the {self.group} worker reached {gb(self.held)}, {gb(self.held - self.held_start)} more "
            f"than at its task's start, past the {self.available.describe()}"
        )
        return reason, f"a smaller batch, the streamed reference or more memory; {LIMIT_VARIABLE}=SIZE overrides"

    def killed(self) -> str:
        """What a worker that died of SIGKILL that parity did not send most likely met."""
        from parity.platform.memory import gb

        return (
            f"the {self.group} worker was killed by the kernel (SIGKILL), most likely out of memory: its peak was "
            f"{gb(self.peak)} with {self.available.describe()}"
        )


def _reset_high_water_mark(pid: int) -> None:
    """Start the kernel's peak-RSS count of ``pid`` again from its RSS now (Linux: ``clear_refs``)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass


def _high_water_mark(pid: int) -> int:
    """The kernel's peak RSS of ``pid`` (``VmHWM``) in bytes, 0 where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def wait(
    conn, pid: int, bounds: Limits, memory: MemoryWatch | None = None, started: float | None = None
) -> tuple[str, str] | None:
    """Wait until ``conn`` (the worker's pipe) is readable: None then, else why the task is overdue and what
    raises the bound it ran past (the caller kills worker ``pid``). ``memory``: the worker's memory, sampled as it
    runs; past its ceiling the task is overdue too (``memory.exceeded``). ``started``: when the task began
    (``time.monotonic``; default now), for a wait that goes on after the task said something."""
    started = time.monotonic() if started is None else started
    progress = Progress(pid, bounds.stall_s)
    last = started
    while True:
        now = time.monotonic()
        left = min(started + bounds.wall_s, last + bounds.stall_s) - now
        if conn.poll(max(min(left, SAMPLE_S if memory is None else MEMORY_SAMPLE_S), 0)):
            return None
        now = time.monotonic()
        if memory is not None and memory.sample():
            return memory.overdue()
        if progress.advanced():
            last = now
        if now - started >= bounds.wall_s:
            return f"timed out after {bounds.wall_s:g} s, {bounds.basis}", "raise with --timeout"
        if now - last >= bounds.stall_s:
            return (
                f"timed out: no progress for {bounds.stall_s:g} s (no CPU time used, no data read or written)",
                f"raise with {STALL_VARIABLE}=SECONDS",
            )
