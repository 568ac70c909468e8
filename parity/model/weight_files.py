"""A torch model's weights read from its safetensors files, memory-mapped, into an architecture built without any.

A user declares the files beside the factory (``torch_factory(..., weights="folder")``, ``parity init --weights``):
the factory then builds the architecture with every parameter on the ``meta`` device (``accelerate``'s
``init_empty_weights``: no storage, no initialiser run; buffers are built as usual, since a non-persistent one, a
rotary table, is in no file), and each parameter and persistent buffer takes the file's tensor. ``safetensors`` maps
a file copy-on-write on the CPU: a tensor is pages of the file that the kernel reads when it is touched and may drop
again under memory pressure, so a model held this way costs no memory of its own until it is cast or written to, and
a write never reaches the file. This is how the float64 reference streams a model whose float32 weights do not fit in
memory (``parity.sources.torch_streamed``: one unit cast to float64 at a time, read from the mapping).

A tensor the file holds in the dtype the architecture built it in is mapped as it is. One in another dtype (a
bfloat16 checkpoint of a float32 architecture) is cast to the architecture's as it is loaded, as ``load_state_dict``
would, which holds it in memory: unless the caller keeps the file's dtypes (``keep_dtypes``, the streamed
reference, which casts each unit to float64 itself); ``built_dtypes`` then says what the model is, for its digest.

The files are a ``.safetensors`` file or a folder: its ``model.safetensors.index.json`` shards where it has one, else
every ``*.safetensors`` in it. Tied parameters (one tensor under several names, an LM head tied to its embedding)
take the file's tensor under any of their names, and stay tied. A name the model does not have, one the files lack,
a shape that differs or two files holding one name stop the build with a ``WeightFilesError`` naming them; a
non-persistent buffer the files hold (a rotary table an older checkpoint saved) is left as the architecture computes
it.
"""

from __future__ import annotations

import json
import weakref
from pathlib import Path

from parity.platform.errors import ParityError

INDEX = "model.safetensors.index.json"
_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> {name: dtype it was built in}


class WeightFilesError(ParityError):
    """Weight files that cannot be read, or that do not match the model built (a ``UserModelError`` once
    ``torch_factory`` raises it)."""


def files(path: Path) -> list[Path]:
    """The safetensors files of ``path`` (a file, or a folder with or without an index), in order."""
    if path.is_file():
        if path.suffix != ".safetensors":
            raise WeightFilesError(f"{path} is not a .safetensors file")
        return [path]
    if not path.is_dir():
        raise WeightFilesError(f"no weight file or folder {path}")
    index = path / INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise WeightFilesError(f"{index} is not a safetensors index ({type(error).__name__}: {error})") from None
        found = [path / name for name in shards]
        missing = [f.name for f in found if not f.is_file()]
        if missing:
            raise WeightFilesError(f"{index} names {', '.join(missing[:3])}, not in {path}")
        return found
    found = sorted(path.glob("*.safetensors"))
    if not found:
        raise WeightFilesError(f"{path} holds no .safetensors file")
    return found


def read(paths: list[Path]) -> dict:
    """Every tensor of ``paths`` by name, memory-mapped (``safetensors.safe_open`` on the CPU)."""
    from safetensors import SafetensorError, safe_open

    tensors: dict = {}
    where: dict[str, Path] = {}
    for path in paths:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as opened:
                for name in opened.keys():  # noqa: SIM118 - a safe_open handle is not iterable
                    if name in tensors:
                        raise WeightFilesError(f"{name!r} is in both {where[name]} and {path}")
                    tensors[name], where[name] = opened.get_tensor(name), path
        except (SafetensorError, OSError) as error:
            raise WeightFilesError(f"{path} is not a readable safetensors file ({error})") from None
    return tensors


def build(torch, factory, path: Path, keep_dtypes: bool = False):
    """The module ``factory()`` builds with its parameters on the meta device, holding the tensors of ``path``'s
    files (see the module docstring). The factory runs twice: once wholly on the meta device, where parameters the
    architecture ties are one tensor (``init_empty_weights`` makes each assigned parameter a new one), to read its ties,
    then under ``init_empty_weights``, for the module itself."""
    from accelerate import init_empty_weights

    try:
        with torch.device("meta"):
            groups = _groups(factory())
    except Exception:  # noqa: BLE001 - a factory that cannot build wholly on meta: the ties of the module itself
        groups = None
    with init_empty_weights(include_buffers=False):
        module = factory()
    load(torch, module, read(files(path)), str(path), keep_dtypes, groups or _groups(module))
    return module


def declared(spec) -> Path | None:
    """The safetensors file or folder a torch spec maps its weights from (``torch_factory(..., weights=)``), or None."""
    return getattr(getattr(spec, "torch_module", None), "weight_files", None)  # a generation spec has none


def mapped(spec) -> bool:
    """Whether ``spec``'s model is mapped from its weight files (what its steps' memory is estimated for)."""
    return declared(spec) is not None


def build_mapped(spec):
    """``spec``'s torch module, a declared model's tensors left in their files' dtypes (``keep_dtypes``): for a step
    that reads each weight once, or casts each unit itself, with no copy of the model in memory."""
    return spec.torch_module(keep_dtypes=True) if declared(spec) else spec.torch_module()


def built_dtypes(module) -> dict[str, str] | None:
    """``{name: dtype}`` of the tensors a ``keep_dtypes`` build holds in another dtype than the architecture's; None
    for any other module."""
    return _BUILT.get(module)


def as_built(tensor, dtype: str | None):
    """``tensor`` as the architecture holds it: cast to ``dtype`` (its ``built_dtypes`` entry: a copy), else itself."""
    if dtype is None:
        return tensor
    import torch

    return tensor.to(getattr(torch, dtype))


def _groups(module) -> list[list[str]]:
    """The ``state_dict`` names of each parameter and persistent buffer of ``module``, grouped by tensor (tied names
    together)."""
    state = set(module.state_dict(keep_vars=True))
    groups: dict[int, list[str]] = {}
    for prefix, owner in module.named_modules(remove_duplicate=False):
        for kind in ("_parameters", "_buffers"):
            for attribute, value in getattr(owner, kind).items():
                full = f"{prefix}.{attribute}" if prefix else attribute
                if value is not None and full in state and full not in groups.get(id(value), ()):
                    groups.setdefault(id(value), []).append(full)
    return list(groups.values())


def load(torch, module, tensors: dict, where: str, keep_dtypes: bool, groups: list[list[str]]) -> None:
    """``module``'s parameters and persistent buffers set to ``tensors`` (by ``state_dict`` name), the names of each
    of ``groups`` one tensor; every name checked both ways and every shape."""
    computed = {name for name, _ in module.named_buffers()}  # a non-persistent buffer an older checkpoint holds
    unexpected = sorted(set(tensors) - {name for group in groups for name in group} - computed)
    if unexpected:
        raise WeightFilesError(f"{where} holds {_listed(unexpected)}, which the model does not have")
    missing: list[str] = []
    kept: dict[str, str] = {}
    for names in groups:
        slots = [_slot(module, name) for name in names]
        owner, kind, attribute = slots[0]
        built = getattr(owner, kind)[attribute]
        found = next((name for name in names if name in tensors), None)
        if found is None:  # a parameter is on the meta device; a buffer keeps what the architecture built
            missing.extend(names if built.is_meta else ())
            continue
        value = tensors[found]
        if tuple(value.shape) != tuple(built.shape):
            raise WeightFilesError(
                f"{where}: {found!r} is {list(value.shape)} in the file and {list(built.shape)} in the model"
            )
        for other in names:
            if other != found and other in tensors and not torch.equal(tensors[other], value):
                raise WeightFilesError(f"{where}: {found!r} and {other!r} are one tensor of the model, two in the file")
        if value.is_floating_point() and value.dtype != built.dtype:
            if keep_dtypes:
                kept.update(dict.fromkeys(names, str(built.dtype).removeprefix("torch.")))
            else:
                value = value.to(built.dtype)
        if kind == "_parameters":
            value = torch.nn.Parameter(value, requires_grad=built.requires_grad)
        for owner, kind, attribute in slots:
            getattr(owner, kind)[attribute] = value
    if missing:
        raise WeightFilesError(f"{where} lacks {_listed(sorted(missing))}, which the model has")
    if kept:
        _BUILT[module] = kept


def _slot(module, name: str) -> tuple:
    """``(owner module, "_parameters" | "_buffers", attribute)`` of the state name ``name``."""
    prefix, _, attribute = name.rpartition(".")
    owner = module.get_submodule(prefix)
    return owner, "_parameters" if attribute in owner._parameters else "_buffers", attribute


def _listed(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:4])
    return f"{shown} and {len(names) - 4} more" if len(names) > 4 else shown
