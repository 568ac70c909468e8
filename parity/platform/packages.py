"""The distributions installed on ``sys.path`` and their versions, read once per install and kept in the cache
folder (``importlib.metadata`` reads them all in a tenth of a second, on every run otherwise)."""

from __future__ import annotations

import os
import re
import sys


def normalized(name: str) -> str:
    """A distribution's name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


_INSTALLED: dict[str, str] | None = None
KEEP_INSTALLED = 32  # tables kept in the cache folder, the newest


def path_stamps() -> list:
    """``sys.path``, each folder that holds installed distributions with its modification time (an install, upgrade
    or removal adds or removes a ``.dist-info`` folder there); the others (a script's folder, a source tree) by name
    only, since every file written there changes theirs."""
    stamps = []
    for entry in sys.path:
        try:
            with os.scandir(entry or ".") as found:
                installs = any(item.name.endswith((".dist-info", ".egg-info")) for item in found)
            stamps.append([entry, os.stat(entry or ".").st_mtime_ns if installs else None])
        except OSError:  # a zip file, a folder that is gone
            stamps.append([entry, None])
    return stamps


def installed() -> dict[str, str]:
    """Every distribution on ``sys.path`` (normalized name -> version; the first found wins, as imports do).

    Reading them all takes a tenth of a second, so the table is kept in the cache folder under a key over the
    interpreter and ``path_stamps()``, and read back only as a JSON object of strings."""
    global _INSTALLED
    if _INSTALLED is not None:
        return _INSTALLED
    import hashlib
    import json

    from parity.platform.cache_dir import cache_root

    key = hashlib.sha256(json.dumps([sys.executable, sys.version, path_stamps()]).encode()).hexdigest()[:32]
    path = cache_root() / "installed" / f"{key}.json"
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(table, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in table.items()):
            _INSTALLED = table
            return table
    except (OSError, ValueError):
        pass
    from importlib import metadata

    table = {}
    for dist in metadata.distributions():
        name, version = dist.metadata["Name"], dist.version
        if isinstance(name, str) and isinstance(version, str):
            table.setdefault(normalized(name), version)
    try:
        from parity.platform.safefs import write_json_atomic

        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, table)
        kept = sorted(path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in kept[KEEP_INSTALLED:]:
            old.unlink(missing_ok=True)
    except OSError:  # a read-only cache: read every time
        pass
    _INSTALLED = table
    return table
