"""Export cache keyed by content hash; every write is atomic (build in a temp dir, then rename)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

META_FILE = "meta.json"


def cache_root() -> Path:
    """``$PARITY_CACHE_DIR``, else ``$XDG_CACHE_HOME/parity``, else ``~/.cache/parity``."""
    if os.environ.get("PARITY_CACHE_DIR"):
        return Path(os.environ["PARITY_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "parity"


def content_key(parts: dict) -> str:
    """sha256 of the canonical JSON of ``parts`` (weights hash, model source, exporter versions, opset, options)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class ExportCache:
    """Artifacts under ``root/exports/<key>/`` with a ``meta.json`` written last."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def lookup(self, key: str) -> tuple[Path, dict] | None:
        entry = self.root / "exports" / key
        try:
            return entry, json.loads((entry / META_FILE).read_text())
        except (OSError, ValueError):
            return None

    def staging_dir(self) -> Path:
        (self.root / "exports").mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=".staging-", dir=self.root / "exports"))

    def commit(self, key: str, staging: Path, meta: dict) -> Path:
        """Write meta into ``staging`` and rename it into place (a concurrent winner is kept)."""
        write_json_atomic(staging / META_FILE, meta)
        entry = self.root / "exports" / key
        if entry.exists():
            shutil.rmtree(entry)
        try:
            os.rename(staging, entry)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
        return entry


def write_json_atomic(path: Path, data) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
