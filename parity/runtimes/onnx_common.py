"""What the ONNX runtimes share: reading the artifact's metadata and converting layouts."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from parity.model import layouts, values
from parity.runtimes.base import Runner


class OnnxRunner(Runner):
    """Base for runtimes that execute an ONNX file produced by an exporter."""

    def __init__(self, spec, artifact_dir: Path, meta: dict, batch_size: int, threads: int, device: str = "cpu",
                 precision: str = "fp32"):
        super().__init__(spec, batch_size, "float32", device, precision)
        self.model_path = str(Path(artifact_dir) / meta["file"])
        self.meta = meta
        self.input_names = meta["input_names"]
        self.output_names = meta["output_names"]
        self.layout = meta["input_layout"]
        self.threads = threads

    def feed(self, x: dict) -> dict:
        return onnx_feed(self.spec, self.meta, x)


def onnx_feed(spec, meta: dict, feeds: dict) -> dict:
    """Feeds by the graph's input names (``meta["input_names"]``, in the spec's order); a single input in the
    artifact's layout; floating inputs in their declared dtype (float16, float64), else float32 (a bfloat16
    input, and the float32 inputs an exporter's float16 graph keeps)."""
    result = {}
    for i, graph_name in zip(spec.model_inputs, meta["input_names"]):
        value = feeds[i.name]
        if len(spec.model_inputs) == 1:
            value = layouts.to_layout(value, i.layout, meta["input_layout"])
        if value.dtype.kind == "f":
            value = value.astype(i.dtype if i.dtype in ("float16", "float64") else np.float32)
        result[graph_name] = values.runtime_feed(value)
    return result
