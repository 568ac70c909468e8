"""What a timed path costs besides time: the worker's peak resident memory over each timed block (above its idle
state), the artifact's size on disk, and on the CPU the energy of each call where RAPL can be read.

Peak memory: Linux keeps a process's resident high-water mark (``VmHWM``) and resets it to the current resident size
when ``5`` is written to ``/proc/self/clear_refs``; a block resets it, runs, and reads it. Where either cannot be done
(another OS, a kernel without the reset), the peak is not measured and the reason says so: ``ru_maxrss`` never
goes down, so it would give every later series the peak of an earlier one.

Energy: the RAPL package counters (``/sys/class/powercap/intel-rapl:N/energy_uj``) summed over the packages, read
before and after a block; the counter wraps at ``max_energy_range_uj``. It is the whole package's energy (other
processes included) and needs read access, which Linux gives root only since 2020 (CVE-2020-8694).
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc/self")
POWERCAP = Path("/sys/class/powercap")
# a change of peak memory is one only past both: allocators round and keep freed pages, so a few MB is not one
MEMORY_CHANGE = 0.10
MEMORY_FLOOR_MB = 8.0


def memory_change(before_mb, after_mb) -> str | None:
    """``"more memory"`` / ``"less memory"`` where a series' peak moved past ``MEMORY_CHANGE`` and
    ``MEMORY_FLOOR_MB``, None where it did not or either is unknown."""
    if before_mb is None or after_mb is None:
        return None
    if abs(after_mb - before_mb) <= max(MEMORY_CHANGE * before_mb, MEMORY_FLOOR_MB):
        return None
    return "more memory" if after_mb > before_mb else "less memory"


def reset_peak(proc: Path = PROC) -> str | None:
    """Reset this process's resident high-water mark to its current resident size; why not, or None."""
    try:
        (proc / "clear_refs").write_text("5")
    except OSError as error:
        return f"the resident peak cannot be reset here ({proc / 'clear_refs'}: {error.strerror or error})"
    return None


def peak_mb(proc: Path = PROC) -> float | None:
    """This process's resident high-water mark (``VmHWM``) in MiB, or None where the kernel does not report it."""
    try:
        for line in (proc / "status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        return None
    return None


def resident_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def rapl_domains(root: Path = POWERCAP) -> tuple[list[Path], str | None]:
    """The RAPL package domains whose energy counter this process can read, or ``([], why not)``."""
    if not root.is_dir():
        return [], f"no RAPL power capping interface here ({root} does not exist)"
    domains = sorted(d for d in root.glob("intel-rapl:*") if d.name.count(":") == 1 and (d / "energy_uj").exists())
    if not domains:
        return [], f"no RAPL package domain under {root}"
    unreadable = [d for d in domains if not os.access(d / "energy_uj", os.R_OK)]
    if unreadable:
        return [], (
            f"{unreadable[0] / 'energy_uj'} is not readable by this user (root only since Linux 5.10, CVE-2020-8694)"
        )
    return domains, None


def read_energy(domains: list[Path]) -> list[tuple[int, int]]:
    """``(energy_uj, max_energy_range_uj)`` of each domain now."""
    readings = []
    for d in domains:
        top = d / "max_energy_range_uj"
        readings.append((int((d / "energy_uj").read_text()), int(top.read_text()) if top.exists() else 2**32))
    return readings


def joules_between(before: list[tuple[int, int]], after: list[tuple[int, int]]) -> float:
    """Joules the domains used between two readings, each counter's wrap-around undone."""
    total = 0
    for (start, top), (end, _) in zip(before, after):
        total += end - start if end >= start else end + top - start
    return total / 1e6


class BlockMeter:
    """Around one timed block: ``start()`` resets the resident peak and reads the energy counters, ``stop(calls)``
    returns ``{"peak_rss_mb", "joules", "calls"}`` (each None where it cannot be measured) and the reasons why not."""

    def __init__(self):
        self.domains, self.energy_reason = rapl_domains()
        self._energy = None
        self.peak_reason = None

    def start(self) -> None:
        self.peak_reason = reset_peak()
        self._energy = read_energy(self.domains) if self.domains else None

    def stop(self, calls: int) -> dict:
        peak = None if self.peak_reason else peak_mb()
        joules = joules_between(self._energy, read_energy(self.domains)) if self._energy is not None else None
        return {
            "peak_rss_mb": peak,
            "joules": joules,
            "calls": calls,
            "reasons": {
                k: v
                for k, v in (("memory", self.peak_reason if peak is None else None), ("energy", self.energy_reason))
                if v
            },
        }


def summary(blocks: list[dict]) -> dict:
    """A series' footprint from its blocks' meters (each with its worker's ``idle_rss_mb``): the highest peak above
    its worker's idle resident size, and the joules per inference over every metered call (or why either is
    missing)."""
    metered = [b for b in blocks if b.get("peak_rss_mb") is not None and b.get("idle_rss_mb") is not None]
    above = [b["peak_rss_mb"] - b["idle_rss_mb"] for b in metered]
    reasons = {k: v for b in blocks for k, v in (b.get("reasons") or {}).items()}
    memory = (
        {"peak_rss_mb": max(*above, 0.0), "block_peaks_mb": above, "idle_rss_mb": metered[0]["idle_rss_mb"]}
        if above
        else {"peak_rss_mb": None, "reason": reasons.get("memory", "the worker's idle size was not measured")}
    )
    joules = [b["joules"] for b in blocks if b.get("joules") is not None]
    calls = sum(b["calls"] for b in blocks if b.get("joules") is not None)
    energy = (
        {
            "joules_per_inference": sum(joules) / calls,
            "calls": calls,
            "source": "RAPL package counters",
            "scope": "the whole CPU package, other processes included",
        }
        if joules and calls
        else {"joules_per_inference": None, "reason": reasons.get("energy", "not measured")}
    )
    return {"memory": memory, "energy": energy}


def size_mb(folder: str | Path | None) -> float | None:
    """The size of an artifact folder's files in MiB (None for no folder: a native path has no artifact)."""
    if folder is None:
        return None
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file()) / 2**20
