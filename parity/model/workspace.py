"""A workspace: a folder with ``models/`` (one reference model per file) and ``golden/``."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from parity.platform.errors import SpecError, UsageError, one_line

BUILTIN_ROOT = Path(__file__).resolve().parents[2]


def resolve_root(workspace: str | None) -> tuple[Path, bool]:
    """``--workspace`` if given; else the current folder if it has ``models/``; else the built-in zoo.

    Returns the root and whether it is the built-in zoo reached by that fallback (never silent:
    ``Workspace.fallback_note`` says so).
    """
    if workspace:
        root = Path(workspace).resolve()
        if not (root / "models").is_dir():
            raise UsageError(f"workspace {root} has no models/ folder")
        return root, False
    here = Path(os.getcwd())
    if (here / "models").is_dir():
        return here, False
    if (BUILTIN_ROOT / "models").is_dir():
        return BUILTIN_ROOT, True
    raise UsageError(f"no models/ folder in {here}; pass --workspace DIR")


class Workspace:
    """Finds model files and golden folders; loads specs by importing model files."""

    def __init__(self, root: str | Path | None = None):
        self.root, self.is_fallback = resolve_root(str(root) if root else None)
        self.models_dir = self.root / "models"

    @property
    def fallback_note(self) -> str | None:
        """A line to show when the built-in zoo is used because the current folder is no workspace."""
        if not self.is_fallback:
            return None
        return (
            f"no models/ in {os.getcwd()}: using the built-in zoo at {self.root} "
            f"(pass --workspace DIR to choose a workspace)"
        )

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
            raise UsageError(
                f"unknown model {', '.join(map(repr, unknown))}; models in {self.models_dir}: {', '.join(known) or 'none'}"
            )
        return list(dict.fromkeys(names))

    def load_spec(self, name: str, attach_golden: bool = True):
        """Import ``models/<name>.py`` and return its ``SPEC``; any failure is a ``SpecError`` naming the model.

        A user model (``weights_from_model``) is completed from its golden manifest unless ``attach_golden``
        is False (``parity.model.user.attach_golden``)."""
        from parity.model.generation_spec import GenerationSpec
        from parity.model.spec import ModelSpec

        path = self.model_file(name)
        if not path.is_file():
            raise UsageError(f"unknown model {name!r}; models in {self.models_dir}: {', '.join(self.model_names())}")
        module_name = f"parity_models_{abs(hash(str(path)))}_{name}"
        try:
            module_spec = importlib.util.spec_from_file_location(module_name, path)
            if module_spec is None or module_spec.loader is None:  # a .py file always has both
                raise SpecError("cannot be imported")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_name] = module
            module_spec.loader.exec_module(module)
            spec = getattr(module, "SPEC", None)
            if isinstance(spec, GenerationSpec):  # a language model checked as it generates (parity.generation)
                if spec.name != name:
                    raise SpecError(f"SPEC.name is {spec.name!r}, the file is {name}.py")
                spec.validate()
                spec.source_file = str(path)
                return spec
            if not isinstance(spec, ModelSpec):
                raise SpecError("defines no SPEC = ModelSpec(...) or GenerationSpec(...)")
            if spec.name != name:
                raise SpecError(f"SPEC.name is {spec.name!r}, the file is {name}.py")
            spec.validate()
            if spec.weights_from_model and attach_golden:
                from parity.model import user as usermodel

                usermodel.attach_golden(spec, self.golden_dir(name))
        except (Exception, SystemExit) as error:  # noqa: BLE001 - a model file that fails or exits at import
            sys.modules.pop(module_name, None)
            detail = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            raise SpecError(f"model {name!r} ({path}) cannot be loaded: {one_line(detail, 400)}") from None
        spec.source_file = str(path)
        return spec
