"""Inputs and golden outputs given with a model: an ONNX test-data folder or Polygraphy JSON files, as arrays; what a
user's ``.npz`` holds."""

from __future__ import annotations

from pathlib import Path

from parity.interop import onnx_test_data, polygraphy
from parity.interop.onnx_test_data import InteropError
from parity.platform.errors import UsageError


def given_feeds(root, given: dict, graph_inputs: dict | None, graph_outputs: list | None, kinds: dict | None = None):
    """Inputs (one ``{input name: array}`` per test-data set or Polygraphy iteration) and golden outputs (a list
    of arrays in output order per set; None when none were given) from an ONNX test-data folder or Polygraphy
    files. ``kinds`` (``onnx_test_data.graph_kinds``): a sequence's value is a list of arrays, an optional's an
    array, a list or None."""
    root = Path(root)
    if given.get("test_data"):
        source = root / given["test_data"]
        sets = onnx_test_data.read_test_data(source, kinds)
    else:
        source = root / given["polygraphy_inputs"]
        feeds = polygraphy.read_inputs(source)
        outputs = (
            polygraphy.read_outputs(root / given["polygraphy_outputs"])
            if given.get("polygraphy_outputs")
            else [{}] * len(feeds)
        )
        if len(outputs) != len(feeds):
            raise InteropError(f"{given['polygraphy_outputs']} has {len(outputs)} iterations for {len(feeds)} inputs")
        sets = [onnx_test_data.TestDataSet(source, feed, out) for feed, out in zip(feeds, outputs)]
    if graph_inputs is not None:
        feeds, outputs = onnx_test_data.match_graph(sets, graph_inputs, graph_outputs, str(source))
    else:
        feeds, outputs = [s.inputs for s in sets], [s.outputs for s in sets]
    if any(list(feed) != list(feeds[0]) for feed in feeds):
        raise InteropError(f"{source}: the sets name different inputs ({list(feeds[0])} and others)")
    golden_outputs = [list(out.values()) for out in outputs] if all(outputs) else None
    return feeds, golden_outputs


DATA_KEYS = ("labels", "y", "eval_labels")  # arrays of a user's .npz that are not inputs (nor eval_<input>)


def npz_facts(path: Path, names: list[str] | None) -> dict:
    """Shapes, dtypes and labels of a user's ``.npz`` (never unpickled), for the spec: each input under its name
    (``x`` too for a model with one input); ``names`` None: every array of the file that is not labels or eval data
    is an input, named as the file names it."""
    from parity.platform.safefs import read_npz

    arrays = read_npz(path, UsageError, ".npz")
    if names is None:
        names = [key for key in arrays if key not in DATA_KEYS and not key.startswith("eval_")]
        if not names:
            raise UsageError(
                f"{path} has no input arrays (it has {', '.join(arrays) or 'none'}): name each array "
                f"after the model input it feeds, or declare the inputs with --input NAME=BATCHxDIMx..."
            )
    empty = [key for key in arrays if key.startswith("eval_") and arrays[key].ndim and not arrays[key].shape[0]]
    if empty:
        raise UsageError(
            f"{path}: {empty[0]} has no rows (shape {arrays[empty[0]].shape}); give the eval split at least one "
            f"sample, or leave it out"
        )
    found = {}
    for name in names:
        key = name if name in arrays or len(names) > 1 else "x"
        if key not in arrays:
            alias = " or 'x'" if len(names) == 1 and name != "x" else ""
            raise UsageError(f"{path} has no array {name!r}{alias} (it has {', '.join(arrays) or 'none'})")
        found[name] = (tuple(arrays[key].shape), str(arrays[key].dtype))
    labels = arrays.get("labels", arrays.get("y"))
    return {
        "inputs": found,
        "labelled": labels is not None,
        "classes": int(labels.max()) + 1 if labels is not None and labels.size else 0,
    }
