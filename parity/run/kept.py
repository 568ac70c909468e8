"""What a worker keeps from one task to the next: a value that depends only on a model's definition and its verified
golden data (the float64 reference's tree, a native source's run on the fixed input set), built once and served to
the next task that asks for the same model, as the diagnosis of a second path of that model does.

A value is kept under a slot, one value per slot: asking for another key frees the value held before building the
new one, so a worker holds at most one model's values per slot. The key names what the value was built from: the
model's spec file (its path and sha256) and the golden manifest's digest (which covers its weights, inputs and
reference dtype), plus what the caller adds. The user's own modules are imported once per worker process whatever
is kept, so nothing here is staler than the model code the worker already runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from parity.model.manifest import canonical_digest
from parity.platform.safefs import sha256_file

_KEPT: dict[str, tuple[tuple, Any]] = {}


def model_key(spec, manifest: dict) -> tuple:
    """What a model's kept values are built from: its spec file and its golden data."""
    source = getattr(spec, "source_file", None)
    return (source, source and sha256_file(Path(source)), canonical_digest(manifest))


def kept(slot: str, key: tuple, build: Callable[[], Any]) -> Any:
    """The value of ``slot`` built for ``key``: the one held if it was built for the same key, else ``build()``'s
    (the value held before is freed first)."""
    held = _KEPT.get(slot)
    if held is not None and held[0] == key:
        return held[1]
    _KEPT.pop(slot, None)
    value = build()
    _KEPT[slot] = (key, value)
    return value


def forget(slot: str | None = None) -> None:
    """Drop every kept value, or ``slot``'s (a measurement of a first diagnosis, a test)."""
    if slot is None:
        _KEPT.clear()
    else:
        _KEPT.pop(slot, None)
