"""A workspace: a folder with ``models/`` (one reference model per file) and ``golden/``."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from parity.errors import SpecError, UsageError

BUILTIN_ROOT = Path(__file__).resolve().parent.parent


def resolve_root(workspace: str | None) -> Path:
    """``--workspace`` if given; else the current folder if it has ``models/``; else the built-in zoo."""
    if workspace:
        root = Path(workspace).resolve()
        if not (root / "models").is_dir():
            raise UsageError(f"workspace {root} has no models/ folder")
        return root
    here = Path(os.getcwd())
    if (here / "models").is_dir():
        return here
    if (BUILTIN_ROOT / "models").is_dir():
        return BUILTIN_ROOT
    raise UsageError(f"no models/ folder in {here}; pass --workspace DIR")


class Workspace:
    """Finds model files and golden folders; loads specs by importing model files."""

    def __init__(self, root: str | Path | None = None):
        self.root = resolve_root(str(root) if root else None)
        self.models_dir = self.root / "models"

    def model_names(self) -> list[str]:
        return sorted(p.stem for p in self.models_dir.glob("*.py") if not p.stem.startswith("_"))

    def model_file(self, name: str) -> Path:
        return self.models_dir / f"{name}.py"

    def golden_dir(self, name: str) -> Path:
        return self.root / "golden" / name

    def select(self, names) -> list[str]:
        """The requested model names (all if none), checked against what exists."""
        known = self.model_names()
        if not names:
            return known
        unknown = [n for n in names if n not in known]
        if unknown:
            raise UsageError(f"unknown model {', '.join(map(repr, unknown))}; models in {self.models_dir}: {', '.join(known) or 'none'}")
        return list(dict.fromkeys(names))

    def load_spec(self, name: str):
        """Import ``models/<name>.py`` and return its ``SPEC``; any failure is a ``SpecError`` naming the model."""
        from parity.spec import ModelSpec

        path = self.model_file(name)
        if not path.is_file():
            raise UsageError(f"unknown model {name!r}; models in {self.models_dir}: {', '.join(self.model_names())}")
        module_name = f"parity_models_{abs(hash(str(path)))}_{name}"
        try:
            module_spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_name] = module
            module_spec.loader.exec_module(module)
            spec = getattr(module, "SPEC", None)
            if not isinstance(spec, ModelSpec):
                raise SpecError("defines no SPEC = ModelSpec(...)")
            if spec.name != name:
                raise SpecError(f"SPEC.name is {spec.name!r}, the file is {name}.py")
            spec.validate()
        except Exception as error:
            sys.modules.pop(module_name, None)
            raise SpecError(f"model {name!r} ({path}) cannot be loaded: {type(error).__name__}: {error}") from None
        spec.source_file = str(path)
        return spec
