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
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from parity.platform.errors import ParityError, UsageError, one_line

if TYPE_CHECKING:  # imported where they are used: most callers of this module need neither
    import numpy as np
    import psutil

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


def umask() -> int:
    """This process's umask, read without changing it (``/proc/self/status`` on Linux; elsewhere set and put back at
    once, as ``os.umask`` alone can tell it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_json_atomic(path: Path, data) -> None:
    """Write ``data`` as JSON to a temporary file beside ``path``, fsync, then rename over it."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to a temporary file beside ``path``, fsync, then rename over it."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync, then rename over it.

    A symlink is followed: the file it resolves to is replaced, next to itself, and the link stays.
    A FIFO or character device (``/dev/stdout``, ``/dev/null``) is written through, never replaced.
    """
    if writes_through(path):
        _write_through(Path(path), data)
        return
    path = resolve_target(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp made it 0600: the mode open() would give it
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def resolve_target(path: str | Path) -> Path:
    """Where a write to ``path`` lands: every symlink followed, to a file that may not exist yet."""
    return Path(os.path.realpath(path))


def _via_descriptor(path: str | Path) -> bool:
    """Whether ``path``'s symlinks lead through a process's descriptor folder (``/dev/stdout``, ``/dev/fd/1``)."""
    current = os.path.abspath(path)
    for _ in range(40):
        parent = os.path.realpath(os.path.dirname(current))
        if re.fullmatch(r"/proc/[^/]+/fd", parent):
            return True
        full = os.path.join(parent, os.path.basename(current))
        if not os.path.islink(full):
            return False
        current = os.path.join(parent, os.readlink(full))
    return False


def writes_through(path: str | Path) -> bool:
    """Whether ``path`` is a FIFO, a character device or an open descriptor: written to, never replaced."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or _via_descriptor(path)


def _write_through(path: Path, data: bytes) -> None:
    """Append ``data`` to an existing stream (what a shell redirection already opened is kept)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _kind(mode: int) -> str | None:
    """What a file that is neither a regular file nor a folder is, or None."""
    for test, name in (
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
    ):
        if test(mode):
            return name
    return None


def describe(path: str | Path) -> str:
    """What is at ``path``, for a message: "a file", "a folder", "a broken symlink", "a socket", "nothing"..."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a broken symlink" if os.path.islink(path) else "nothing"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a file" if stat.S_ISREG(mode) else f"a {_kind(mode)}"


def make_folder(path: str | Path, what: str, hint: str) -> Path:
    """Create the folder ``path`` and its parents where missing.

    Raises a one-line ``UsageError`` naming the first of them that is not a folder (``what`` it is for,
    then ``hint``: what to do about it), or saying why it cannot be created.
    """
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError as error:
        for folder in [*reversed(path.parents), path]:
            if os.path.lexists(folder) and not folder.is_dir():
                raise UsageError(f"{what} {folder} is {describe(folder)}, not a folder; {hint}") from None
        raise UsageError(f"{what} {path} cannot be created: {error.strerror or error}; {hint}") from None


def require_file(path: str | Path, what: str, hint: str) -> Path:
    """``path`` if it is missing or a regular file (through symlinks); else a one-line ``UsageError``."""
    path = Path(path)
    if os.path.lexists(path) and not path.is_file():
        raise UsageError(f"{what} {path} is {describe(path)}, not a file; {hint}")
    return path


def check_writable(path: str | Path, what: str, make_parents: bool = True) -> Path:
    """Fail now, before any work, if ``path`` could not be written later (``--json`` targets).

    A stream (FIFO, character device, ``/dev/stdout``) only has to be writable; any other target is
    checked where its symlinks lead. A missing folder is created, or with ``make_parents=False`` refused.
    """
    path = Path(path)
    if writes_through(path):
        if not os.access(path, os.W_OK):
            raise UsageError(f"{what} {path} cannot be written: permission denied")
        return path
    try:
        real = resolve_target(path)
        mode = os.stat(real).st_mode if os.path.lexists(real) else None
    except OSError as error:
        raise UsageError(f"{what} {path} cannot be written: {error.strerror or error}") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise UsageError(f"{what} {path} is a folder; give a file name")
    if mode is not None and _kind(mode):
        raise UsageError(f"{what} {path} is a {_kind(mode)}; give a file name")
    if os.path.lexists(real.parent) and not real.parent.is_dir():
        raise UsageError(f"{what} {path} cannot be written: {real.parent} is not a folder")
    if not make_parents and not os.path.lexists(real.parent):
        raise UsageError(f"{what}: folder {real.parent} does not exist")
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=f".{real.name}.", dir=real.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        raise UsageError(f"{what} {path} cannot be written: {error.strerror or error}") from None
    return path


def check_folder_target(path: str | Path, what: str) -> Path:
    """Where a folder written at ``path`` will land, every symlink followed (a link is kept, its target written),
    refused now, before any work, in one line when it could not be made there: it or a folder above it is a file
    (or another non-folder), or the nearest folder that exists above it cannot be written to."""
    real = resolve_target(path)  # a symlink loop resolves to the looping link: "a broken symlink, not a folder"
    for folder in [*reversed(real.parents), real]:
        if os.path.lexists(folder) and not folder.is_dir():
            if folder == real:
                raise UsageError(f"{what} {path} is {describe(folder)}, not a folder; give a folder")
            raise UsageError(f"{what} {path} cannot be made: {folder} is {describe(folder)}, not a folder")
    existing = next(folder for folder in [real, *real.parents] if folder.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {path} cannot be written: permission denied in {existing}")
    return real


def _start_ticks(process: psutil.Process) -> int:
    return round(process.create_time() * 100)


def owner_tag() -> str:
    """``<pid>-<start time>`` of this process: unique for its lifetime, never reused after it."""
    import psutil

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
    import psutil

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
    removed: list[Path] = []
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
    os.chmod(new, 0o777 & ~umask())  # mkdtemp made it 0700: the mode mkdir would give it
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


def read_npz(path: Path, error_type=ParityError, what: str = "file") -> dict[str, np.ndarray]:
    """Every array of an ``.npz``, never unpickled; any problem raises ``error_type`` naming the file."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as data:
            return {key: data[key] for key in data.files}
    except Exception as error:  # noqa: BLE001 - zipfile, numpy and OS errors alike: the file is unusable
        raise error_type(f"{path}: unreadable {what} ({one_line(f'{type(error).__name__}: {error}', 300)})") from None
