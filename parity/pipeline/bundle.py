"""A workspace's models and golden data as a content-addressed bundle, for nodes that do not share its folder.

``pack`` reads the spec files and golden folders of the selected models into ``{"files": {path: bytes},
"sha256": {path: hex}, "digest": hex}`` (the digest names the content, so a bundle is materialised once per node
whatever run sends it). ``unpack`` writes it under a node's cache folder, verifying every file's sha256 on
arrival and the digest, into a temporary folder renamed into place only when all is right; a folder already
there is verified again before it is used. Golden data is verified once more by the run itself, as always.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from parity.platform.errors import ParityError


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _digest(hashes: dict[str, str]) -> str:
    return _sha("\n".join(f"{path} {h}" for path, h in sorted(hashes.items())).encode())


def pack(root: Path, models: list[str]) -> dict:
    files = {}
    for name in models:
        spec = root / "models" / f"{name}.py"
        files[f"models/{name}.py"] = spec.read_bytes()
        golden = root / "golden" / name
        for path in sorted(p for p in golden.rglob("*") if p.is_file()):
            files[path.relative_to(root).as_posix()] = path.read_bytes()
    hashes = {path: _sha(data) for path, data in files.items()}
    return {"files": files, "sha256": hashes, "digest": _digest(hashes)}


def _verify(folder: Path, hashes: dict[str, str]) -> str | None:
    for path, expected in hashes.items():
        try:
            actual = _sha((folder / path).read_bytes())
        except OSError as error:
            return f"{path}: {error.strerror or error}"
        if actual != expected:
            return f"{path}: sha256 {actual} != {expected}"
    return None


def unpack(bundle: dict, cache: Path) -> Path:
    """The bundle as a workspace folder under ``cache`` (``bundles/<digest>``), verified."""
    hashes = bundle["sha256"]
    if _digest(hashes) != bundle["digest"] or set(hashes) != set(bundle["files"]):
        raise ParityError("the workspace bundle does not match its own digest: refused")
    target = cache / "bundles" / bundle["digest"]
    if target.is_dir():
        problem = _verify(target, hashes)
        if problem is None:
            return target
        shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".bundle-", dir=target.parent))
    try:
        for path, data in bundle["files"].items():
            if path.startswith("/") or ".." in Path(path).parts:
                raise ParityError(f"the workspace bundle names a file outside it: {path!r}")
            if _sha(data) != hashes[path]:
                raise ParityError(f"the workspace bundle's {path} arrived with another sha256: refused")
            out = scratch / path
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
        try:
            os.replace(scratch, target)
        except OSError:  # another cell of this node materialised it first
            if _verify(target, hashes) is not None:
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target
