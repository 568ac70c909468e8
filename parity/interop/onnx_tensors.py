"""The tensors an ONNX model holds and the data files beside it that keep them (external data): what the exporters
write with (``parity.exporters.common``) and what a model's size is read from (``parity.model.size``). Imports onnx
inside."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any


def all_tensors(model: Any) -> Iterator[Any]:
    """Every TensorProto ``model`` holds: initializers and tensor attributes (a Constant's value), in subgraphs and
    local functions too."""
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        for node in function.node:
            yield from _node_tensors(node)


def external_files(path: Path) -> list[str]:
    """The data files the ONNX file at ``path`` keeps its tensors in (relative to its folder), each once."""
    import onnx
    from onnx import TensorProto

    bare = onnx.load(str(path), load_external_data=False)
    return list(
        dict.fromkeys(
            entry.value
            for tensor in all_tensors(bare)
            if tensor.data_location == TensorProto.EXTERNAL
            for entry in tensor.external_data
            if entry.key == "location"
        )
    )


def file_bytes(path: Path) -> int:
    """The bytes of the ONNX file at ``path`` and of the data files it keeps tensors in (those that exist)."""
    path = Path(path)
    data = (path.parent / name for name in external_files(path))
    return path.stat().st_size + sum(file.stat().st_size for file in data if file.is_file())


def _graph_tensors(graph: Any) -> Iterator[Any]:
    yield from graph.initializer
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: Any) -> Iterator[Any]:
    for attribute in node.attribute:
        if attribute.HasField("t"):
            yield attribute.t
        yield from attribute.tensors
        if attribute.HasField("g"):
            yield from _graph_tensors(attribute.g)
        for graph in attribute.graphs:
            yield from _graph_tensors(graph)
