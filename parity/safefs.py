"""Crash-safe file system helpers: atomic writes, owned scratch folders, directory exchange.

Every folder parity writes before it is complete (a golden build, a cache staging folder, a
``--no-cache`` scratch) is *owned*: its name carries the owner's process id and start time, so
the next run can tell a folder whose owner was killed from one still in use, and removes it.
A finished folder replaces its predecessor by an atomic exchange of the two, so a reader sees
the old or the new one, never a gap or a half-written mix.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psutil

from parity.errors import UsageError

# name suffix of an owned folder: <pid>-<start time in 1/100 s>-<tempfile's 8 random characters>
_OWNER = re.compile(r"(?P<pid>\d+)-(?P<start>\d+)-[a-z0-9_]{8}$")
# folders left by versions of parity that did not record their owner are stale after this long
LEGACY_STALE_S = 3600.0


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json_atomic(path: Path, data) -> None:
    """Write ``data`` as JSON to a temporary file beside ``path``, fsync, then rename over it."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to a temporary file beside ``path``, fsync, then rename over it."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync, then rename over it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def check_writable(path: str | Path, what: str) -> Path:
    """Fail now, before any work, if ``path`` could not be written later (``--json`` targets)."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{what} {path} is a folder; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        raise UsageError(f"{what} {path} cannot be written: {error.strerror or error}") from None
    return path


def _start_ticks(process: psutil.Process) -> int:
    return round(process.create_time() * 100)


def owner_tag() -> str:
    """``<pid>-<start time>`` of this process: unique for its lifetime, never reused after it."""
    return f"{os.getpid()}-{_start_ticks(psutil.Process())}"


def owned_tempdir(parent: str | Path, prefix: str) -> Path:
    """A new folder ``<parent>/<prefix><owner>-<random>`` that ``sweep`` removes once this process is gone."""
    Path(parent).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{owner_tag()}-", dir=parent))


def owner_alive(name: str) -> bool | None:
    """Whether the process that owns the folder ``name`` still runs; None if the name has no owner tag."""
    match = _OWNER.search(name)
    if match is None:
        return None
    try:
        process = psutil.Process(int(match["pid"]))
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(_start_ticks(process) - int(match["start"])) <= 1
    except psutil.Error:
        return False


def sweep(parent: str | Path, pattern: str) -> list[Path]:
    """Remove folders in ``parent`` whose names match the regex ``pattern`` and whose owner is gone.

    A matching name without an owner tag (written by an older parity) is removed once it is
    older than ``LEGACY_STALE_S``. Returns what was removed.
    """
    parent = Path(parent)
    removed = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if not re.match(pattern, entry.name):
            continue
        alive = owner_alive(entry.name)
        if alive is None:
            try:
                alive = time.time() - entry.lstat().st_mtime < LEGACY_STALE_S
            except OSError:
                continue
        if not alive:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def _exchange(first: Path, second: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2(RENAME_EXCHANGE)``, macOS ``renamex_np(RENAME_SWAP)``).

    Returns False where the platform or file system cannot do it.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if sys.platform.startswith("linux") and hasattr(libc, "renameat2"):
            at_fdcwd, rename_exchange = -100, 2
            status = libc.renameat2(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second), rename_exchange)
        elif sys.platform == "darwin" and hasattr(libc, "renamex_np"):
            status = libc.renamex_np(os.fsencode(first), os.fsencode(second), 0x2)
        else:
            return False
    except OSError:
        return False
    if status == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(second))


def replace_dir(new: Path, target: Path) -> None:
    """Put the finished folder ``new`` at ``target``; the previous ``target`` (if any) ends up at ``new``.

    Readers of ``target`` see the old folder or the new one, never neither: an existing target is
    exchanged atomically. The caller removes ``new`` afterwards if it still exists (it then holds
    the old contents). Only on a file system without an atomic exchange is there a moment
    without ``target``; the old folder then waits in an owned folder that ``sweep`` knows.
    """
    os.chmod(new, 0o755)
    if not target.exists():
        try:
            os.rename(new, target)
            return
        except OSError as error:
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    if _exchange(new, target):
        return
    aside = owned_tempdir(target.parent, f".{target.name}.old-")
    os.rename(target, aside)
    os.rename(new, target)
    shutil.rmtree(aside, ignore_errors=True)
