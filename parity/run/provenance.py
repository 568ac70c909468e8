"""What a cached artifact came from, and why it had to be made again.

An export is keyed by everything known before it runs: the spec file, the files its builders name
(a ``.keras`` file, a JAX params file, a model factory's ``file.py``), the golden weights, the weights a user
model's builder holds now (``parity.model.identity``: a factory's checkpoint), parity's own
code, the exporter's and runtime's versions and options, the precision. The code a builder imports
is only known once it has run: the worker records every Python source it loaded from outside the
installed packages (``code_files``) and the cache entry keeps their sha256, re-checked on every lookup
(as ccache's manifests do for headers). A changed file makes the entry stale: it is exported again
and the run says which file changed. A *slot* (model, chain, depth, batch, precision, device) remembers
the key parts of its last export, so a miss can say what changed since: weights, versions, code.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from pathlib import Path

from parity.model.identity import user_file
from parity.platform.safefs import sha256_file, write_json_atomic

PARITY_DIR = Path(__file__).resolve().parents[1]
SLOTS = "slots"
SLOT_SCHEMA = "parity.export-slot/1"


def loaded_code_files() -> dict[str, str]:
    """sha256 of every module source loaded in this process from outside the installed packages."""
    found = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        # "__" names are generated code (TensorFlow's autograph writes a new one per run), not the user's
        if not path or name.startswith("__") or not os.path.isfile(path):
            continue
        if user_file(path):  # not installed, not parity's own (keyed by parity_digest)
            found[os.path.realpath(path)] = sha256_file(Path(path))
    return dict(sorted(found.items()))


@functools.cache
def parity_digest() -> str:
    """sha256 over parity's own Python sources: a changed exporter or runner is a different export."""
    digest = hashlib.sha256()
    for path in sorted(PARITY_DIR.rglob("*.py")):
        digest.update(path.relative_to(PARITY_DIR).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def builder_files(spec) -> dict[str, str]:
    """sha256 of the files the spec's builders name (``source_files`` on a builder), by resolved path."""
    files = {}
    for builder in (spec.torch_module, spec.keras_model, spec.jax_apply):
        for path in getattr(builder, "source_files", ()):
            path = Path(path)
            files[str(path.resolve())] = sha256_file(path) if path.is_file() else "missing"
    return dict(sorted(files.items()))


def changed_files(recorded: dict[str, str]) -> list[str]:
    """The recorded files whose content is not what it was (or that are gone)."""
    changed = []
    for path, digest in recorded.items():
        try:
            now = sha256_file(Path(path))
        except OSError:
            now = None
        if now != digest:
            changed.append(path)
    return changed


def short_names(paths, root: Path) -> str:
    """Paths relative to ``root`` where they lie under it, joined for a message."""
    names = []
    for path in paths:
        try:
            names.append(Path(path).resolve().relative_to(Path(root).resolve()).as_posix())
        except ValueError:
            names.append(str(path))
    shown = ", ".join(names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


# key parts grouped by what a user changes, in the order a reason names them
_GROUPS = (
    ("model code changed", ("builder_files",)),
    ("model spec changed", ("model_file_sha256", "opset")),
    ("weights changed", ("weights_sha256", "source_sha256", "model_weights_sha256")),
    ("parity changed", ("parity", "parity_code")),
    ("versions changed", ("steps",)),
    ("the export it is made from was made again", ("parent",)),
    ("the int8 calibration data or quantizer settings changed", ("quantizer",)),
)


def why_changed(before: dict, now: dict, root: Path) -> str:
    """What differs between two slots' key parts, in words (``model code changed (mymodels.py)``)."""
    reasons = []
    for label, keys in _GROUPS:
        if all(before.get(k) == now.get(k) for k in keys):
            continue
        if label == "model code changed":
            old, new = before.get("builder_files") or {}, now.get("builder_files") or {}
            label += f" ({short_names([p for p in {**old, **new} if old.get(p) != new.get(p)], root)})"
        elif label == "versions changed":
            label += _version_changes(before.get("steps") or [], now.get("steps") or [])
        reasons.append(label)
    return "; ".join(reasons) or "options changed"


def _version_changes(before: list, now: list) -> str:
    old = {p: v for step in before for p, v in step.get("versions", {}).items()}
    new = {p: v for step in now for p, v in step.get("versions", {}).items()}
    moved = [f"{p} {old.get(p)} -> {new.get(p)}" for p in new if old.get(p) != new.get(p)]
    return f" ({', '.join(moved)})" if moved else ""


def slot_id(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def read_slot(root: Path, slot: str) -> dict | None:
    """The key parts of the slot's last export, or None (never recorded, unreadable: a plain miss)."""
    try:
        record = json.loads((Path(root) / SLOTS / f"{slot}.json").read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return record.get("parts") if isinstance(record, dict) and record.get("schema") == SLOT_SCHEMA else None


def write_slot(root: Path, slot: str, parts: dict) -> None:
    from parity.platform.cache_dir import cache_folder

    folder = cache_folder(Path(root) / SLOTS)
    write_json_atomic(folder / f"{slot}.json", {"schema": SLOT_SCHEMA, "parts": parts})
