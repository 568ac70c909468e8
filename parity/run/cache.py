"""Export cache keyed by content hash, verified on every lookup and safe to share between runs.

An entry is ``exports/<key>/`` with the exporter's files and ``meta.json`` (written last), which
records the sha256 of every file and is sealed by a digest. A lookup re-hashes the files: a
corrupted or truncated entry is reported, exported again and replaced, never reused. Runs that
share a cache take a lock per entry, so each export runs once; a replacement is exchanged in
atomically, so an entry is never deleted before its successor is in place. A converter's own
failure is cached too, keyed the same way, so an expected conversion error is not redone on
every run.

The cache is bounded: each run starts by removing the least recently used entries, these and the generation
exports' (a lookup that finds an entry marks it used), until the entries take at most ``PARITY_CACHE_MAX_BYTES``
(``MAX_BYTES_DEFAULT``: 20 GiB; a size such as ``50G``; ``0``: no bound), keeping any entry used in the last ``KEEP_USED_S`` (a run may still read it) and
any whose lock another run holds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity.model import manifest as manifest_lib
from parity.platform.cache_dir import cache_folder, file_lock
from parity.platform.safefs import owned_tempdir, replace_dir, sha256_file, sweep, write_json_atomic

MAX_BYTES_VARIABLE = "PARITY_CACHE_MAX_BYTES"
MAX_BYTES_DEFAULT = 20 << 30
KEEP_USED_S = 3600.0  # an entry used this recently is kept whatever the bound: a run may be reading it
META_FILE = "meta.json"
ENTRY_SCHEMA = "parity.cache-entry/1"
STAGING_PREFIX = ".staging-"


def content_key(parts: dict) -> str:
    """sha256 of the canonical JSON of ``parts`` (weights hash, model source, exporter versions, opset, options)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


@dataclass
class Entry:
    """A verified cache entry: an artifact (``dir`` and the exporter's ``meta``) or a cached ``error``."""

    dir: Path
    meta: dict | None = None
    error: str | None = None


def _file_hashes(folder: Path) -> dict[str, str]:
    return {
        path.relative_to(folder).as_posix(): sha256_file(path)
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != META_FILE
    }


def _problem(entry: Path, record) -> str | None:
    """What is wrong with an entry (its record, then every file's sha256), or None."""
    if (
        not isinstance(record, dict)
        or record.get("schema") != ENTRY_SCHEMA
        or not isinstance(record.get("files"), dict)
    ):
        return f"{META_FILE} is not a {ENTRY_SCHEMA} record"
    if record.get("digest") != manifest_lib.canonical_digest(record):
        return f"{META_FILE} digest mismatch"
    try:
        actual = _file_hashes(entry)
    except OSError as error:
        return f"unreadable file: {error}"
    for name in sorted(set(record["files"]) | set(actual)):
        if name not in actual:
            return f"{name} missing"
        if name not in record["files"]:
            return f"{name} not recorded"
        if actual[name] != record["files"][name]:
            return f"{name} sha256 mismatch"
    return None


class ExportCache:
    """Artifacts under ``root/exports/<key>/``; ``notice`` hears about entries that had to be discarded."""

    def __init__(self, root: Path, notice=lambda message: None):
        self.root = Path(root)
        self.exports = self.root / "exports"
        self.notice = notice

    def sweep(self) -> list[Path]:
        """Remove staging folders of runs that were killed (first making sure ``exports`` is a folder)."""
        return sweep(cache_folder(self.exports), rf"^{STAGING_PREFIX}")

    def lock(self, key: str, timeout_s: float):
        """The per-entry lock: hold it from lookup to commit, so concurrent runs export once."""
        return file_lock(self.exports / f"{key}.lock", timeout_s)

    def lookup(self, key: str) -> Entry | None:
        """The entry for ``key`` if it exists and verifies; a damaged entry is reported and ignored."""
        entry = self.exports / key
        if not entry.exists():
            return None
        record, problem = self._verified_record(entry)
        if record is not None:  # it verified
            mark_used(entry)
            return Entry(entry, meta=record.get("artifact"), error=record.get("error"))
        self.notice(f"cache entry {entry} is damaged ({problem}); exporting again")
        return None

    @staticmethod
    def _verified_record(entry: Path) -> tuple[dict | None, str | None]:
        """The entry's ``meta.json`` record once it and every file's sha256 check out, or what is wrong."""
        try:
            record = json.loads((entry / META_FILE).read_text())
        except (OSError, ValueError, RecursionError) as error:
            return None, f"{META_FILE} unreadable: {type(error).__name__}"
        problem = _problem(entry, record)
        return (record, None) if problem is None else (None, problem)

    def staging_dir(self) -> Path:
        return owned_tempdir(self.exports, STAGING_PREFIX)

    def commit(self, key: str, staging: Path, meta: dict) -> Entry:
        """Record ``staging``'s files and exchange it into place (hold ``lock(key)``)."""
        record = {"schema": ENTRY_SCHEMA, "files": _file_hashes(staging), "artifact": meta}
        return self._publish(key, staging, record)

    def commit_error(self, key: str, reason: str, meta: dict | None = None) -> Entry:
        """Cache a converter's failure under ``key`` with what it came from (``meta``; hold ``lock(key)``)."""
        record = {"schema": ENTRY_SCHEMA, "files": {}, "error": reason, "artifact": meta}
        return self._publish(key, self.staging_dir(), record)

    def _publish(self, key: str, staging: Path, record: dict) -> Entry:
        entry = self.exports / key
        try:
            write_json_atomic(staging / META_FILE, manifest_lib.seal(record))
            replace_dir(staging, entry)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return Entry(entry, meta=record.get("artifact"), error=record.get("error"))

    def prune(
        self, max_bytes: int | None = None, keep_used_s: float = KEEP_USED_S, also: tuple[Kind, ...] = ()
    ) -> list[Path]:
        """Remove the least recently used entries, of this cache and of the kinds ``also`` names (the generation
        exports), until they take at most ``max_bytes`` together (default: ``max_bytes_allowed()``; 0: no bound),
        never one used in the last ``keep_used_s`` or one whose lock is held. Returns what was removed."""
        limit = max_bytes_allowed() if max_bytes is None else max_bytes
        own = Kind(self.exports, META_FILE, lambda entry: self.lock(entry.name, timeout_s=0))
        kinds = [kind for kind in (own, *also) if kind.folder.is_dir()]
        if not limit or not kinds:
            return []
        entries = [
            (_last_used(entry, kind.meta), _size(entry), entry, kind)
            for kind in kinds
            for entry in _entries(kind.folder)
        ]
        total = sum(size for _, size, _, _ in entries)
        removed = []
        for used, size, entry, kind in sorted(entries, key=lambda item: item[0]):
            if total <= limit or time.time() - used < keep_used_s:
                break
            try:
                with kind.lock(entry):
                    shutil.rmtree(entry, ignore_errors=True)
            except TimeoutError:  # another run is exporting or reading it now
                continue
            if kind is own:
                (self.exports / f"{entry.name}.lock").unlink(missing_ok=True)
            total -= size
            removed.append(entry)
        if removed:
            self.notice(
                f"export cache over {limit / 2**30:.1f} GiB: removed {len(removed)} least recently used entries"
            )
        return removed


@dataclass(frozen=True)
class Kind:
    """A kind of entry the bound of the cache counts: the folder its entries lie in, the file in each whose time
    says when it was last used, and ``lock(entry)``, its lock taken without waiting (``TimeoutError`` while held)."""

    folder: Path
    meta: str
    lock: Callable[[Path], Any]


def max_bytes_allowed() -> int:
    """``PARITY_CACHE_MAX_BYTES`` as bytes (``MAX_BYTES_DEFAULT`` where unset; 0: no bound)."""
    from parity.platform.memory import parse_size

    text = os.environ.get(MAX_BYTES_VARIABLE, "").strip()
    if text == "0":
        return 0
    return parse_size(text, MAX_BYTES_VARIABLE) if text else MAX_BYTES_DEFAULT


def _entries(exports: Path) -> list[Path]:
    return [p for p in exports.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")]


def mark_used(entry: Path, meta: str = META_FILE) -> None:
    """Say that ``entry`` was used now (the bound removes the least recently used first)."""
    try:
        os.utime(entry / meta)
    except OSError:  # a read-only cache is still read
        pass


def _last_used(entry: Path, meta: str) -> float:
    try:
        return (entry / meta).stat().st_mtime
    except OSError:
        return 0.0


def _size(entry: Path) -> int:
    total = 0
    for path in entry.rglob("*"):
        try:
            total += path.lstat().st_size if path.is_file() else 0
        except OSError:
            continue
    return total
