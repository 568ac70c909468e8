"""Shared fixtures: a private copy of the built-in workspace, and one export cache per session."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session", autouse=True)
def export_cache(tmp_path_factory):
    """All tests share one export cache, outside the repository and the user's own cache."""
    cache = tmp_path_factory.mktemp("parity-cache")
    old = os.environ.get("PARITY_CACHE_DIR")
    os.environ["PARITY_CACHE_DIR"] = str(cache)
    yield cache
    if old is None:
        os.environ.pop("PARITY_CACHE_DIR", None)
    else:
        os.environ["PARITY_CACHE_DIR"] = old


@pytest.fixture
def workspace_copy(tmp_path):
    """A workspace with the built-in mlp model and its golden data, safe to tamper with."""

    def make(model_source: str | None = None, name: str = "mlp") -> Path:
        root = tmp_path / "ws"
        (root / "models").mkdir(parents=True, exist_ok=True)
        (root / "golden").mkdir(exist_ok=True)
        source = model_source if model_source is not None else (REPO / "models" / "mlp.py").read_text()
        (root / "models" / f"{name}.py").write_text(source)
        if not (root / "golden" / name).exists():
            shutil.copytree(REPO / "golden" / "mlp", root / "golden" / name)
        return root

    return make


def mlp_variant(replace: dict[str, str]) -> str:
    """The built-in mlp model source with text replacements (each must apply)."""
    source = (REPO / "models" / "mlp.py").read_text()
    for old, new in replace.items():
        assert old in source, old
        source = source.replace(old, new)
    return source
