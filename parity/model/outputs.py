"""Model outputs by name: any returned structure flattened to ``name -> tensor`` the same way in every framework.

A tensor alone is ``output``; a mapping (a dict, a Hugging Face ``ModelOutput``) names its items by key; a
dataclass by field; a tuple or list by position (``out.0``, ``out.1`` at the top level); nested names join
with ``.`` (``out.0.boxes``). ``None`` items are left out, as ``ModelOutput`` leaves them out. A leaf that is
not a tensor (a string, a number) and two leaves with one name are refused (``OutputError``), naming them.
NumPy only: each framework passes its own ``is_tensor``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from parity.platform.errors import ParityError

SINGLE = "output"  # the name of a model's only output when it returns a bare tensor
SEQUENCE = "out"  # the prefix of a top-level tuple's items


class OutputError(ParityError):
    """A model output that cannot be named: a leaf that is not a tensor, or two leaves with one name."""


def flatten(value, is_tensor) -> list[tuple[str, object]]:
    """``[(name, tensor), ...]`` in the order the structure holds them."""
    if is_tensor(value):
        return [(SINGLE, value)]
    leaves: list[tuple[str, object]] = []
    _walk(value, SEQUENCE if isinstance(value, (tuple, list)) else "", is_tensor, leaves)
    names = [name for name, _ in leaves]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise OutputError(f"two model outputs flatten to the name {twice[0]!r}: give them distinct keys")
    return leaves


def _walk(value, prefix: str, is_tensor, leaves: list) -> None:
    def join(key) -> str:
        return f"{prefix}.{key}" if prefix else str(key)

    if value is None:
        return
    if is_tensor(value):
        leaves.append((prefix, value))
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _walk(item, join(key), is_tensor, leaves)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for item in dataclasses.fields(value):
            _walk(getattr(value, item.name), join(item.name), is_tensor, leaves)
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            _walk(item, join(index), is_tensor, leaves)
    else:
        raise OutputError(f"model output {prefix or SINGLE!r} is a {type(value).__name__}, not a tensor")


def positional(names: list[str]) -> bool:
    """Whether ``names`` are the names of a bare tensor or a flat top-level tuple (``output``, ``out.<i>``)."""
    return names == [SINGLE] or names == [f"{SEQUENCE}.{i}" for i in range(len(names))]


def named(declared, leaves: list[tuple[str, object]]) -> dict[str, object]:
    """The leaves by the spec's output names: by name where the structure names them, in order where the model
    returns a bare tensor or a flat tuple of as many tensors as the spec declares."""
    names = [name for name, _ in leaves]
    by_name = dict(leaves)
    if set(declared) <= set(by_name):
        return {name: by_name[name] for name in declared}
    if positional(names) and len(names) == len(declared):
        return {name: value for name, (_, value) in zip(declared, leaves)}
    missing = [name for name in declared if name not in by_name]
    raise OutputError(
        f"the model returns outputs {', '.join(names) or 'none'}; the spec declares "
        f"{', '.join(missing)} too (declare outputs=({', '.join(map(repr, names))},))"
    )


def first(declared, value, is_tensor):
    """The spec's first output of a returned structure (what the loss is taken of)."""
    return named(declared, flatten(value, is_tensor))[declared[0]]
