"""What the ONNX runtimes share: reading the artifact's metadata and converting layouts."""

from __future__ import annotations

from pathlib import Path

from parity.model import layouts
from parity.runtimes.base import Runner


class OnnxRunner(Runner):
    """Base for runtimes that execute an ONNX file produced by an exporter."""

    def __init__(self, spec, artifact_dir: Path, meta: dict, batch_size: int, threads: int, device: str = "cpu",
                 precision: str = "fp32"):
        super().__init__(spec, batch_size, "float32", device, precision)
        self.model_path = str(Path(artifact_dir) / meta["file"])
        self.input_name = meta["input_name"]
        self.output_names = meta["output_names"]
        self.layout = meta["input_layout"]
        self.threads = threads

    def feed(self, x):
        return {self.input_name: layouts.to_layout(x, self.spec.input.layout, self.layout)}
