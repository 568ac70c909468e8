"""The host audit of a benchmark: what on this machine makes timings vary, measured while they are taken.

Recorded: the CPU frequency governor of every CPU and whether boost (turbo) is on, the CPU time other processes
used while parity timed (sampled by a thread of the orchestrator, which otherwise only waits for its workers),
swap in use and swapping during the run, the CPUs this process may run on, and the thread settings every runtime
got. Each finding that can make timings vary is a warning naming what to change (pyperf's ``system tune`` is the
anchor). Linux reads ``/sys``; elsewhere what cannot be read is recorded as unknown, never guessed.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

CPU_ROOT = Path("/sys/devices/system/cpu")
OTHER_LOAD_WARNING = 0.1  # CPU cores other processes may use on average during timing before it is a warning
TUNE = "`python -m pyperf system tune` does this"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def frequency_settings(root: Path = CPU_ROOT) -> dict:
    """``{"governors": {name: cpus}, "boost": True | False | None}`` from ``/sys`` (empty / None where absent)."""
    governors = Counter(g for g in (_read(p) for p in sorted(root.glob("cpu[0-9]*/cpufreq/scaling_governor"))) if g)
    boost = _read(root / "cpufreq" / "boost")
    no_turbo = _read(root / "intel_pstate" / "no_turbo")
    on = boost == "1" if boost is not None else (no_turbo == "0" if no_turbo is not None else None)
    return {"governors": dict(governors), "boost": on}


class HostMonitor:
    """``with HostMonitor(threads) as monitor: ...`` samples, every ``interval_s``, the machine's busy CPU time and
    that of this process and its descendants; ``monitor.audit()`` is the record and its warnings."""

    def __init__(self, threads: int, interval_s: float = 0.5, cpu_root: Path = CPU_ROOT):
        self.threads, self.interval_s, self.cpu_root = threads, interval_s, cpu_root
        self.others: list[float] = []  # CPU cores used by other processes, per interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def _busy_and_own() -> tuple[float, dict[int, float]]:
        import psutil

        t = psutil.cpu_times()
        busy = sum(t) - t.idle - getattr(t, "iowait", 0.0)
        own = {}
        me = psutil.Process()
        for process in [me, *me.children(recursive=True)]:
            try:
                c = process.cpu_times()
                own[process.pid] = c.user + c.system
            except psutil.Error:
                continue
        return busy, own

    def _sample(self) -> None:
        busy, own = self._busy_and_own()
        last = time.monotonic()
        while not self._stop.wait(self.interval_s):
            now_busy, now_own = self._busy_and_own()
            now = time.monotonic()
            # processes alive at both ends: what a worker used before it ended in between is not counted as ours,
            # so a short interval can read high; the average and the median interval are reported, not the peak
            ours = sum(max(now_own[pid] - own.get(pid, 0.0), 0.0) for pid in now_own)
            self.others.append(max(now_busy - busy - ours, 0.0) / max(now - last, 1e-9))
            busy, own, last = now_busy, now_own, now

    def __enter__(self):
        import psutil

        self._swap_before = psutil.swap_memory()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)

    def audit(self, thread_settings: dict | None = None) -> dict:
        """The record (``frequency``, ``other_load_cores``, ``swap``, ``cpus``, ``threads``) and its ``warnings``."""
        import psutil

        frequency = frequency_settings(self.cpu_root)
        swap = psutil.swap_memory()
        swapped = (swap.sin - self._swap_before.sin) + (swap.sout - self._swap_before.sout)
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        ordered = sorted(self.others)
        load = (
            {"mean": sum(ordered) / len(ordered), "median": ordered[len(ordered) // 2], "samples": len(ordered)}
            if ordered
            else None
        )
        record: dict[str, Any] = {
            "frequency": frequency,
            "other_load_cores": load,
            "cpus": cpus,
            "swap": {"used_mb": swap.used / 2**20, "swapped_mb_during_run": swapped / 2**20},
            "threads": {
                "intra_op": self.threads,
                **(thread_settings or {}),
                **{k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ},
            },
        }
        warnings = []
        slow = {g: n for g, n in frequency["governors"].items() if g != "performance"}
        if slow:
            warnings.append(
                f"CPU frequency governor {', '.join(f'{g!r} on {n} CPU(s)' for g, n in slow.items())}: "
                f"set 'performance' for stable timings ({TUNE})"
            )
        if frequency["boost"]:
            warnings.append(f"CPU boost (turbo) is on: clocks follow temperature and load; turn it off ({TUNE})")
        if load and load["median"] > OTHER_LOAD_WARNING:
            warnings.append(
                f"other processes used {load['median']:.2f} CPU cores (median of {load['samples']} "
                f"samples) while parity timed: stop them, or give parity CPUs of its own"
            )
        if swapped > 0:
            warnings.append(f"the machine swapped {swapped / 2**20:.0f} MiB while parity timed: free memory first")
        if cpus and self.threads > cpus:
            warnings.append(f"{self.threads} intra-op threads on {cpus} CPU(s): use --threads {cpus} or fewer")
        record["warnings"] = warnings
        return record
