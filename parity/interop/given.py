"""Inputs and golden outputs given with a model: an ONNX test-data folder or Polygraphy JSON files, as arrays."""

from __future__ import annotations

from pathlib import Path

from parity.interop import onnx_test_data, polygraphy
from parity.interop.onnx_test_data import InteropError


def given_feeds(root, given: dict, graph_inputs: dict | None, graph_outputs: list | None):
    """Inputs (one ``{input name: array}`` per test-data set or Polygraphy iteration) and golden outputs (a list
    of arrays in output order per set; None when none were given) from an ONNX test-data folder or Polygraphy
    files."""
    root = Path(root)
    if given.get("test_data"):
        source = root / given["test_data"]
        sets = onnx_test_data.read_test_data(source)
    else:
        source = root / given["polygraphy_inputs"]
        feeds = polygraphy.read_inputs(source)
        outputs = (polygraphy.read_outputs(root / given["polygraphy_outputs"])
                   if given.get("polygraphy_outputs") else [{}] * len(feeds))
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
