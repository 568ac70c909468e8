"""Export cache keyed by content hash, verified on every lookup and safe to share between runs.

An entry is ``exports/<key>/`` with the exporter's files and ``meta.json`` (written last), which
records the sha256 of every file and is sealed by a digest. A lookup re-hashes the files: a
corrupted or truncated entry is reported, exported again and replaced, never reused. Runs that
share a cache take a lock per entry, so each export runs once; a replacement is exchanged in
atomically, so an entry is never deleted before its successor is in place. A converter's own
failure is cached too, keyed the same way, so an expected conversion error is not redone on
every run.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from parity.model import manifest as manifest_lib
from parity.platform.cache_dir import cache_folder, file_lock
from parity.platform.safefs import owned_tempdir, replace_dir, sha256_file, sweep, write_json_atomic

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
