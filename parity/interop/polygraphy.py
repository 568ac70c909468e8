"""Polygraphy JSON inputs and run results, read and written.

Polygraphy JSON (``polygraphy run --save-inputs inputs.json --save-outputs outputs.json``): objects are
JSON dicts tagged ``"polygraphy_class": "<Class>"`` (Polygraphy 0.27-0.29 tagged them
``"__polygraphy_encoded_<Class>": "polygraphy_serialized_json_type"``). An array is
``{"array": base64(np.save bytes), "polygraphy_class": "ndarray"}`` (0.27-0.29: the latin-1 text of
``np.savez`` bytes). ``--save-inputs`` writes a JSON list of feed dicts ``{name: array}``;
``--save-outputs`` writes ``{"lst": [[runner, [IterationResult, ...]], ...], "polygraphy_class":
"RunResults"}``, an IterationResult being ``{"outputs": {name: {"values": array, "polygraphy_class":
"LazyArray"}}, "runtime": s, "runner_name": runner, ...}`` (``LazyNumpyArray`` before 0.49, plain
arrays before 0.28). Polygraphy before 0.27 pickled whole files, and torch tensors are torch.save
pickles: parity refuses both, it never unpickles anything.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np

from parity.interop.onnx_test_data import InteropError
from parity.platform.errors import one_line
from parity.platform.safefs import write_text_atomic

_LEGACY_PREFIX, _LEGACY_MARKER = "__polygraphy_encoded_", "polygraphy_serialized_json_type"
_NO_PICKLE = "parity never unpickles"
_RESAVE = (
    "re-save with Polygraphy 0.30 or later, which stores arrays with np.save "
    "(polygraphy run ... --save-inputs inputs.json --save-outputs outputs.json)"
)


def read_inputs(path) -> list[dict[str, np.ndarray]]:
    """The feed dicts of a ``--save-inputs`` file, one per iteration."""
    data = _load_json(path)
    if _cls(data) == "RunResults":
        raise InteropError(f"{path}: holds Polygraphy RunResults (--save-outputs), not inputs (--save-inputs)")
    if isinstance(data, dict) and _cls(data) is None:
        data = [data]  # Polygraphy also accepts a single feed dict
    if not isinstance(data, list) or not data:
        raise InteropError(f"{path}: not a Polygraphy input file (a JSON list of feed dicts)")
    return [_arrays(feed, f"{path}: iteration {i}") for i, feed in enumerate(data)]


def read_outputs(path, runner: str | None = None) -> list[dict[str, np.ndarray]]:
    """The outputs of ``runner`` (or of the only runner) in a ``--save-outputs`` file, one dict per iteration."""
    data = _load_json(path)
    entries = data.get("lst") if _cls(data) == "RunResults" else None
    if not isinstance(entries, list) or not all(
        isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and isinstance(e[1], list) for e in entries
    ):
        raise InteropError(f"{path}: not a Polygraphy RunResults file (polygraphy run --save-outputs)")
    runners = [name for name, _ in entries]
    if runner is None and len(entries) != 1:
        raise InteropError(f"{path}: holds {len(entries)} runners {runners}; say which one")
    chosen = [e for e in entries if runner is None or e[0] == runner]
    if not chosen:
        raise InteropError(f"{path}: no runner {runner!r}; it holds {runners}")
    name, iterations = chosen[0]  # Polygraphy too takes the first of duplicate names
    if not iterations:
        raise InteropError(f"{path}: runner {name!r} has no iterations")
    results = []
    for i, item in enumerate(iterations):
        where = f"{path}: runner {name!r}, iteration {i}"
        if _cls(item) != "IterationResult" or not isinstance(item.get("outputs"), dict):
            raise InteropError(f"{where}: not a Polygraphy IterationResult")
        results.append(_arrays(item["outputs"], where))
    return results


def write_inputs(path, feeds: list[dict[str, np.ndarray]]) -> None:
    """Write feed dicts as ``polygraphy run --save-inputs`` does (readable by ``--load-inputs``)."""
    write_text_atomic(
        Path(path), json.dumps([{n: _encode(a, path) for n, a in feed.items()} for feed in feeds], indent=4)
    )


def write_run_results(path, runner_name: str, iterations: list[dict[str, np.ndarray]]) -> None:
    """Write one runner's outputs as ``polygraphy run --save-outputs`` does (``RunResults.load`` reads it)."""
    results = [
        {
            "outputs": {
                name: {"values": _encode(array, path), "polygraphy_class": "LazyArray"}
                for name, array in outputs.items()
            },
            "runtime": None,
            "runner_name": runner_name,
            "polygraphy_class": "IterationResult",
        }
        for outputs in iterations
    ]
    write_text_atomic(
        Path(path), json.dumps({"lst": [[runner_name, results]], "polygraphy_class": "RunResults"}, indent=4)
    )


def _encode(array, path) -> dict:
    buffer = io.BytesIO()
    try:
        np.save(buffer, np.asarray(array), allow_pickle=False)
    except ValueError as error:
        raise InteropError(f"{path}: {one_line(error, 120)} (object arrays cannot be saved without pickling)") from None
    return {"array": base64.b64encode(buffer.getvalue()).decode(), "polygraphy_class": "ndarray"}


def _load_json(path):
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise InteropError(f"{path}: cannot be read ({error.strerror or error})") from None
    if raw[:1] == b"\x80":
        raise InteropError(f"{path}: a pickle file (Polygraphy before 0.27 pickled its data); {_NO_PICKLE}: {_RESAVE}")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise InteropError(f"{path}: not a JSON file ({one_line(error, 100)})") from None


def _cls(obj) -> str | None:
    """The Polygraphy class an encoded object is tagged with, current or legacy tag; None if untagged."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("polygraphy_class"), str):
        return obj["polygraphy_class"]
    return next(
        (k[len(_LEGACY_PREFIX) :] for k, v in obj.items() if k.startswith(_LEGACY_PREFIX) and v == _LEGACY_MARKER), None
    )


def _arrays(obj, where: str) -> dict[str, np.ndarray]:
    if not isinstance(obj, dict) or _cls(obj) is not None or not obj:
        raise InteropError(f"{where}: expected a non-empty dict of named arrays")
    return {name: _array(value, f"{where}, {name!r}") for name, value in obj.items()}


def _array(obj, where: str) -> np.ndarray:
    kind = _cls(obj)
    if kind in ("LazyArray", "LazyNumpyArray"):
        return _array(obj.get("values"), where)
    if kind == "Tensor":
        raise InteropError(
            f"{where}: a torch.Tensor stored with torch.save, a pickle; {_NO_PICKLE}: "
            "save NumPy arrays, which Polygraphy stores with np.save"
        )
    if kind != "ndarray" or not isinstance(obj.get("array"), str):
        raise InteropError(f"{where}: not a Polygraphy-encoded array")
    try:
        raw = base64.b64decode(obj["array"], validate=True)
    except ValueError:  # Polygraphy 0.27-0.29: np.savez bytes as latin-1 text
        raw = obj["array"].encode("latin-1", "replace")
    if raw[:1] == b"\x80":
        raise InteropError(f"{where}: the array is a pickle; {_NO_PICKLE}: {_RESAVE}")
    if not raw.startswith((b"\x93NUMPY", b"PK\x03\x04")):
        raise InteropError(f"{where}: the array is neither .npy nor .npz data")
    try:
        loaded = np.load(io.BytesIO(raw), allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                loaded = loaded[loaded.files[0]]
        return loaded
    except Exception as error:  # noqa: BLE001 - numpy and zipfile errors on untrusted bytes
        if "allow_pickle" in str(error):
            raise InteropError(
                f"{where}: an object array, which only a pickle holds; {_NO_PICKLE}: "
                "save numeric arrays (np.save with allow_pickle=False, as Polygraphy does)"
            ) from None
        raise InteropError(f"{where}: corrupt array data ({one_line(error, 100)})") from None
