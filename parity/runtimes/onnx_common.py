"""What the ONNX runtimes share: reading the artifact's metadata and converting layouts."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from parity.model import containers, layouts, values
from parity.runtimes.base import Runner


class OnnxRunner(Runner):
    """Base for runtimes that execute an ONNX file produced by an exporter."""

    def __init__(
        self,
        spec,
        artifact_dir: Path,
        meta: dict,
        batch_size: int,
        threads: int,
        device: str = "cpu",
        precision: str = "fp32",
    ):
        super().__init__(spec, batch_size, "float32", device, precision)
        self.model_path = str(Path(artifact_dir) / meta["file"])
        self.meta = meta
        self.input_names = meta["input_names"]
        self.output_names = meta["output_names"]
        self.layout = meta["input_layout"]
        self.threads = threads

    # graph inputs the graph declares bfloat16, float8, int4 ...: name -> dtype (a runner sets its own, never mutates)
    graph_dtypes: dict[str, str] = {}  # noqa: RUF012

    def feed(self, x: dict) -> dict:
        return onnx_feed(self.spec, self.meta, x, self.graph_dtypes)


def onnx_feed(spec, meta: dict, feeds: dict, graph_dtypes: dict[str, str] | None = None) -> dict:
    """Feeds by the graph's input names (``meta["input_names"]``, in the spec's order); a single input in the
    artifact's layout; floating inputs in their declared dtype (float16, float64), else float32 (a bfloat16
    input, and the float32 inputs an exporter's float16 graph keeps). An input the graph itself declares in a
    dtype NumPy holds through ml_dtypes (``graph_dtypes``: bfloat16, float8, int4, uint4, float4) is fed in it."""
    result = {}
    for i, graph_name in zip(spec.model_inputs, meta["input_names"]):
        value = feeds[i.name]
        if len(spec.model_inputs) == 1:
            value = layouts.to_layout(value, i.layout, meta["input_layout"])
        if graph_dtypes and graph_name in graph_dtypes:
            value = values.as_low_precision(value, graph_dtypes[graph_name])
        elif value.dtype.kind == "f" and values.low_precision_name(value) is None:
            value = value.astype(i.dtype if i.dtype in ("float16", "float64") else np.float32)
        result[graph_name] = values.runtime_feed(value)
    # a sequence is fed as the list of its elements, an optional as its value or None (absent)
    return containers.graph_feeds(spec, result) if spec.containers else result


def low_precision_types(names, type_protos) -> dict[str, str]:
    """``{name: dtype}`` of the tensors among ``names`` whose ONNX ``type_protos`` declare an element type NumPy
    holds through ml_dtypes (``values.ONNX_ELEMENT_TYPES``)."""
    by_element = {element: name for name, element in values.ONNX_ELEMENT_TYPES.items()}
    return {
        name: by_element[proto.tensor_type.elem_type]
        for name, proto in zip(names, type_protos)
        if proto.WhichOneof("value") == "tensor_type" and proto.tensor_type.elem_type in by_element
    }
