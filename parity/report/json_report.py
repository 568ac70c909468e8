"""The result JSON (schema ``parity.result/1``), written atomically and always valid JSON."""

from __future__ import annotations

import math
from pathlib import Path

from parity.platform.safefs import write_json_atomic


def sanitize(value):
    """Non-finite floats become None (strict JSON has no NaN or Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): sanitize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitize(v) for v in value]
    return value


def write(report: dict, path: str | Path) -> None:
    """``report`` as strict JSON at ``path``: replaced atomically (a symlink's target, the link kept), or
    written through to a FIFO or device such as ``/dev/stdout``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, sanitize(report))
