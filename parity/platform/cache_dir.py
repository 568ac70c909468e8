"""Where parity keeps what it can make again (exports, engines, locks), and the named locks under it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from parity.platform.safefs import make_folder, require_file

HINT = "remove it or set PARITY_CACHE_DIR"


def cache_root() -> Path:
    """``$PARITY_CACHE_DIR``, else ``$XDG_CACHE_HOME/parity``, else ``~/.cache/parity``."""
    if os.environ.get("PARITY_CACHE_DIR"):
        return Path(os.environ["PARITY_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "parity"


def cache_folder(path: Path, what: str = "cache folder") -> Path:
    """The folder ``path`` under the cache, created if missing; a ``UsageError`` if it or a parent is not a folder."""
    return make_folder(path, what, HINT)


def file_lock(path: Path, timeout_s: float = -1):
    """A ``FileLock`` on ``path`` once its folder is a folder and the lock file is a file (or missing)."""
    from filelock import FileLock

    cache_folder(path.parent)
    return FileLock(str(require_file(path, "cache lock file", HINT)), timeout=timeout_s)


def named_lock(name: str, timeout_s: float = -1):
    """A file lock under the cache for ``name`` (any string: hashed into the lock file's name)."""
    return file_lock(cache_root() / "locks" / f"{hashlib.sha256(name.encode()).hexdigest()[:32]}.lock", timeout_s)


FULL_BYTES = 1 << 20  # a file system with less than this free is full: no export or log fits on it
NO_SPACE = ("No space left on device", "[Errno 28]", "Disk quota exceeded", "[Errno 122]")


def full_disk_note(log_path: Path) -> str | None:
    """Why a worker that died may have died: ``the disk holding <folder> is full`` for the first of the cache, the
    worker's log folder and the temporary folder whose file system has (almost) no space or inodes left, or a
    write that found no space where the log says so; None when neither is the case."""
    import tempfile

    for folder in dict.fromkeys([cache_root(), Path(log_path).parent, Path(tempfile.gettempdir())]):
        try:
            st = os.statvfs(folder)
        except OSError:
            continue
        if st.f_bavail * st.f_frsize < FULL_BYTES or (st.f_files and not st.f_favail):
            return f"the disk holding {folder} is full (no space left on device)"
    try:
        with open(log_path, "rb") as log:
            log.seek(max(0, os.fstat(log.fileno()).st_size - 65536))
            tail = log.read().decode("utf-8", "replace")
    except OSError:
        return None
    return "a write found no space left on device" if any(text in tail for text in NO_SPACE) else None
