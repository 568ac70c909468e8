"""The memory available to parity, and what a process tree holds.

Available is the smaller of this process's cgroup allowance (cgroup v2 ``memory.max`` minus ``memory.current``, v1
``memory.limit_in_bytes`` minus ``memory.usage_in_bytes``; the reclaimable page cache, ``inactive_file``, counts as
free in both) and the kernel's ``MemAvailable`` (``/proc/meminfo``). ``PARITY_MEMORY_LIMIT`` (``12G``, ``800M``,
``16GiB``, bytes) replaces both: a user caps parity below what the machine has, or lets a step that the estimate
refuses go ahead. No framework is imported here (``parity --help`` stays instant); ``psutil`` only where a process
is read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from parity.platform.errors import UsageError

LIMIT_VARIABLE = "PARITY_MEMORY_LIMIT"
CGROUP_ROOT = Path("/sys/fs/cgroup")
MEMINFO = Path("/proc/meminfo")
UNLIMITED = 1 << 60  # cgroup v1 writes a page-rounded 2**63 for "no limit"
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Available:
    """``nbytes`` of memory available and where the figure comes from (``source``)."""

    nbytes: int
    source: str

    def describe(self) -> str:
        return f"{gb(self.nbytes)} available ({self.source})"


def gb(nbytes: float) -> str:
    """``12.3 GB`` (decimal gigabytes), ``850 MB`` below one."""
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.0f} MB"


def parse_size(text: str, what: str = LIMIT_VARIABLE) -> int:
    """Bytes of ``text``: a number with an optional unit, K/M/G/T (powers of 1000) or KiB/MiB/GiB/TiB (of 1024),
    ``B`` optional (``12G``, ``800MB``, ``1.5GiB``, ``7e9``); ``UsageError`` naming ``what`` otherwise."""
    found = _SIZE.match(str(text))
    if found is None or float(found[1]) <= 0:
        raise UsageError(f"{what}={text!r}: give a size in bytes with an optional unit, e.g. 12G, 800M or 16GiB")
    number, unit, binary = float(found[1]), found[2].lower(), found[3]
    if binary and not unit:
        raise UsageError(f"{what}={text!r}: give a size in bytes with an optional unit, e.g. 12G, 800M or 16GiB")
    scale = 1024 ** ("kmgt".index(unit) + 1) if binary else _UNITS[unit]
    return int(number * scale)


def limit_from_environment() -> int | None:
    """``PARITY_MEMORY_LIMIT`` in bytes, or None where it is not set."""
    text = os.environ.get(LIMIT_VARIABLE, "").strip()
    return parse_size(text) if text else None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0


def cgroup_available(folder: Path) -> int | None:
    """What the cgroup whose files are in ``folder`` still allows (its limit less its usage, its reclaimable page
    cache counted free), v2 or v1 files; None where it sets no limit or the files are not there."""
    folder = Path(folder)
    if (folder / "memory.max").exists():  # cgroup v2
        limit, usage = _read_int(folder / "memory.max"), _read_int(folder / "memory.current")
        cache = _stat(folder / "memory.stat", "inactive_file")
    else:  # cgroup v1
        limit, usage = _read_int(folder / "memory.limit_in_bytes"), _read_int(folder / "memory.usage_in_bytes")
        cache = _stat(folder / "memory.stat", "total_inactive_file")
    if limit is None or limit >= UNLIMITED:
        return None
    return max(limit - max((usage or 0) - cache, 0), 0)


def _cgroup_folders(root: Path = CGROUP_ROOT) -> list[Path]:
    """The memory cgroup folders of this process, its own first, then each one above it (a limit may be set on
    any)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    folders: list[Path] = []
    for line in lines:
        _, controllers, relative = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            base = root
        elif "memory" in controllers.split(","):
            base = root / "memory"
        else:
            continue
        folder = base / relative.lstrip("/")
        while True:
            folders.append(folder)
            if folder == base or folder.parent == folder:
                break
            folder = folder.parent
    return folders


def meminfo_available(path: Path = MEMINFO) -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes; None where the file is not there (not Linux)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def available() -> Available:
    """The memory parity may use now: ``PARITY_MEMORY_LIMIT`` where it is set, else the smaller of the cgroup's
    allowance and ``MemAvailable`` (``psutil``'s figure where neither can be read)."""
    limit = limit_from_environment()
    if limit is not None:
        return Available(limit, LIMIT_VARIABLE)
    found = [(n, "cgroup limit") for n in map(cgroup_available, _cgroup_folders()) if n is not None]
    meminfo = meminfo_available()
    if meminfo is not None:
        found.append((meminfo, "MemAvailable"))
    if not found:
        import psutil

        return Available(int(psutil.virtual_memory().available), "available memory")
    return Available(*min(found))


def tree_rss(process) -> int:
    """The resident memory of ``process`` (a ``psutil.Process``) and every process below it, in bytes; 0 where it
    is gone."""
    return members_rss(tree_members(process))


def tree_members(process) -> list:
    """``process`` and every process below it (psutil reads every process of the machine to find them: a caller
    that samples often reads them less often than their memory); empty where it is gone."""
    import psutil

    try:
        return [process, *process.children(recursive=True)]
    except psutil.Error:
        return []


def members_rss(members: list) -> int:
    """The resident memory of ``members`` (``psutil.Process``) still running, in bytes."""
    return members_memory(members)[0]


def members_memory(members: list) -> tuple[int, int]:
    """``(resident, own)`` bytes of ``members`` (``psutil.Process``) still running: ``own`` leaves out the resident
    pages of files (``shared``: a library's code, a model's weights mapped from its safetensors files), which the
    kernel drops again under memory pressure rather than run out of memory."""
    import psutil

    resident = own = 0
    for member in members:
        try:
            info = member.memory_info()
        except psutil.Error:
            continue
        resident += info.rss
        own += info.rss - getattr(info, "shared", 0)
    return resident, own
