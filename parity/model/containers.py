"""Sequence and optional values of an ONNX graph, held as plain arrays (NumPy only).

Golden data never holds object arrays or pickles, so a sequence ``s`` is held as its elements ``s/0``, ``s/1``, ...
(each a normal array, in the npz files as any named input or output) and its *structure* beside them:
``{"kind": "sequence", "length": n}``; an optional ``o`` as ``{"kind": "optional", "present": bool}`` and, when
present, its tensor under ``o`` or its sequence's elements under ``o/0``, ... (``"value"``: that sequence's
structure). A spec declares each sequence or optional input and output of its graph in ``containers``
(``{"inputs": {name: structure}, "outputs": {name: {"kind": ...}}}``): an input's structure is the data's, and its
elements are the spec's inputs; an output's length or presence is the golden data's (the manifest's
``containers``). Runtimes are fed lists and None, and their lists and None are split back into elements here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from parity.interop.onnx_test_data import OPTIONAL, SEQUENCE, graph_kind  # noqa: F401 - one vocabulary

if TYPE_CHECKING:
    import numpy as np


def element(name: str, index: int) -> str:
    """The key of element ``index`` of sequence ``name``."""
    return f"{name}/{index}"


def unwrap(value, kind: str):
    """A runtime's value for a slot of ``kind`` as a list (sequence), None (absent optional) or an array:
    ``onnx.reference`` hands an ``Optional`` op's result over wrapped in a one-item list."""
    if (
        kind.startswith(OPTIONAL)
        and isinstance(value, list)
        and len(value) == 1
        and (kind == OPTIONAL or value[0] is None or isinstance(value[0], list))
    ):
        return value[0]
    return value


def flatten(name: str, value, kind: str) -> tuple[dict[str, np.ndarray], dict]:
    """``(arrays, structure)`` of a value of graph kind ``kind``: its elements by key and its structure."""
    import numpy as np

    value = unwrap(value, kind)
    if kind == SEQUENCE:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name!r} is a sequence; the value is a {type(value).__name__}")
        return (
            {element(name, k): np.asarray(item) for k, item in enumerate(value)},
            {"kind": SEQUENCE, "length": len(value)},
        )
    if value is None:
        return {}, {"kind": OPTIONAL, "present": False}
    if kind == OPTIONAL:
        return {name: np.asarray(value)}, {"kind": OPTIONAL, "present": True}
    arrays, inner = flatten(name, value, SEQUENCE)
    return arrays, {"kind": OPTIONAL, "present": True, "value": inner}


def keys(name: str, structure: dict) -> list[str]:
    """The element keys a value of ``structure`` is held under, in order."""
    if structure["kind"] == SEQUENCE:
        return [element(name, k) for k in range(structure["length"])]
    if not structure["present"]:
        return []
    return keys(name, structure["value"]) if "value" in structure else [name]


def assemble(name: str, arrays: dict, structure: dict):
    """The value a runtime is fed for a slot of ``structure``: a list of arrays, None (absent) or an array."""
    if structure["kind"] == SEQUENCE:
        return [arrays[key] for key in keys(name, structure)]
    if not structure["present"]:
        return None
    return assemble(name, arrays, structure["value"]) if "value" in structure else arrays[name]


def kind_of(structure: dict) -> str:
    """The graph kind (``graph_kind``) a structure is a value of."""
    if structure["kind"] == SEQUENCE:
        return SEQUENCE
    return f"{OPTIONAL} {SEQUENCE}" if "value" in structure else OPTIONAL


def describe(structure: dict) -> str:
    """A structure in words: ``a sequence of 3``, ``absent``, ``present``."""
    if structure["kind"] == SEQUENCE:
        return f"a sequence of {structure['length']}"
    if not structure["present"]:
        return "absent"
    return f"present ({describe(structure['value'])})" if "value" in structure else "present"


def flat_outputs(names, returned, kinds: dict) -> tuple[dict, dict]:
    """A graph's outputs (values in ``names`` order) as ``(arrays by key, structures by output name)``: a tensor
    under its name, a sequence or optional output (``kinds``: output name -> graph kind) split into elements."""
    arrays, structures = {}, {}
    for name, value in zip(names, returned):
        if name in kinds:
            elements, structures[name] = flatten(name, value, kinds[name])
            arrays.update(elements)
        else:
            arrays[name] = value
    return arrays, structures


def output_keys(outputs, structures: dict) -> list[str]:
    """Every golden key of a model's outputs, in output order: a tensor's name, each element of a sequence or a
    present optional."""
    result: list[str] = []
    for name in outputs:
        result += keys(name, structures[name]) if name in structures else [name]
    return result


def compare_structures(actual: dict, golden: dict) -> dict:
    """A failing entry (``{"ok": False, "reason": ...}``) for every output whose length or presence differs from
    the golden one's (a value that has the golden's structure is compared element by element elsewhere)."""
    result = {}
    for name, want in golden.items():
        got = actual.get(name)
        if got != want:
            result[name] = {
                "ok": False,
                "reason": f"{describe(got) if got else 'missing'} where the golden output is {describe(want)}",
            }
    return result


def output_kinds(spec) -> dict[str, str]:
    """Output name -> graph kind of a spec's sequence and optional outputs (none for most models)."""
    return {name: declared["kind"] for name, declared in (spec.containers.get("outputs") or {}).items()}


def graph_feeds(spec, feeds: dict) -> dict:
    """Feeds by the graph's input names: a tensor as it is, a sequence as the list of its elements, an optional as
    its value or None (absent), from feeds keyed as the spec's inputs (the elements)."""
    declared = spec.containers.get("inputs") or {}
    held = {key for name, structure in declared.items() for key in keys(name, structure)}
    result = {name: value for name, value in feeds.items() if name not in held}
    result.update({name: assemble(name, feeds, structure) for name, structure in declared.items()})
    return result


def eval_key(spec, axes: dict, structures: dict) -> str | None:
    """The golden key the eval split is checked on (``batch_axes.eval_output``); for a graph with sequences or
    optionals (taken whole: its eval split is its inputs) the first output key, None where it has none."""
    from parity.model import batch_axes

    if not spec.containers:
        return batch_axes.eval_output(spec, axes)
    return next(iter(output_keys(spec.outputs, structures)), None)
