"""Shared helpers for exporters: the job description, unsupported-op detection, metadata."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from parity.interop.onnx_tensors import all_tensors as all_tensors  # exporters read them from here
from parity.interop.onnx_tensors import external_files as external_files
from parity.interop.onnx_tensors import file_bytes
from parity.platform.errors import ExportError

if TYPE_CHECKING:
    from parity.model.spec import ModelSpec

ONNX_FILE = "model.onnx"
T = TypeVar("T")
# protobuf cannot serialise a message of 2 GiB or more: a model whose tensors pass this (64 MiB below, for the graph
# itself) is written with its tensors in a data file beside it; ``$PARITY_ONNX_EXTERNAL_BYTES`` lowers the threshold
LARGE_BYTES = 2**31 - (64 << 20)
EXTERNAL_BYTES_ENV = "PARITY_ONNX_EXTERNAL_BYTES"


@dataclass
class ExportJob:
    """What an exporter gets: the spec, canonical weights, the previous artifact (if any)."""

    spec: ModelSpec
    weights: dict[str, np.ndarray]
    batch_size: int
    opset: int
    out_dir: Path
    parent_dir: Path | None = None
    parent_meta: dict[str, Any] | None = None
    golden_manifest: dict[str, Any] | None = None
    device: str = "cpu"  # steps that build for a device (a TensorRT engine) read these two
    precision: str = "fp32"
    inputs: dict[str, np.ndarray] | None = None  # the golden feeds at the batch size (canonical layout)
    # samples a quantizer calibrates on (canonical layout, every sample): never the eval split the gate measures
    calibration: dict[str, np.ndarray] | None = None
    path_id: str = ""  # the path being built (a quantizer reads the layers it keeps in float by it)

    def parent(self) -> tuple[Path, dict[str, Any]]:
        """The previous step's artifact folder and metadata; ``ExportError`` for a job without them (a step that
        converts an artifact, run as the first step)."""
        return Path(needed(self.parent_dir, "the previous step's artifact")), needed(self.parent_meta, "its metadata")


def needed(value: T | None, what: str) -> T:
    """``value``, or ``ExportError`` naming ``what`` the step needs and was not given."""
    if value is None:
        raise ExportError(f"this export step needs {what}, and the job has none")
    return value


def onnx_meta(spec: ModelSpec, input_names: list[str], output_names: list[str], input_layout: str) -> dict[str, Any]:
    """An ONNX artifact's metadata: its graph inputs in the spec's input order, its outputs in the spec's
    output order, and the layout a single image input takes."""
    return {
        "format": "onnx",
        "file": ONNX_FILE,
        "input_names": list(input_names),
        "output_names": list(output_names),
        "input_layout": input_layout,
        "canonical_layout": spec.model_inputs[0].layout if spec.model_inputs else "flat",
    }


def graph_input_names(model: Any) -> list[str]:
    """The graph's inputs that are not initializers, in graph order."""
    initializers = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in initializers]


def check_onnx_ops(model: Any, converter: str, converter_log: str = "") -> None:
    """Raise ``ExportError`` if the converter left ops that are not standard ONNX.

    Some converters (tf2onnx) log unsupported ops and still return a model; such a model is
    not a conversion, so parity treats it as a failed export with the op names.
    """
    import onnx

    unknown = sorted({node.op_type for node in model.graph.node if not onnx.defs.has(node.op_type, node.domain or "")})
    if unknown:
        detail = f" ({converter_log.strip().splitlines()[-1]})" if converter_log.strip() else ""
        raise ExportError(f"{converter} could not convert op(s) {', '.join(unknown)}{detail}")


def external_threshold() -> int:
    """The size in bytes past which an ONNX model's tensors go to a data file beside it: protobuf's limit less room
    for the graph, or ``$PARITY_ONNX_EXTERNAL_BYTES`` where set (a lower figure; an unusable one is refused)."""
    text = os.environ.get(EXTERNAL_BYTES_ENV, "").strip()
    if not text:
        return LARGE_BYTES
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= LARGE_BYTES:
        raise ExportError(f"${EXTERNAL_BYTES_ENV} must be a byte count from 0 to {LARGE_BYTES}, not {text!r}")
    return value


def tensor_bytes(model: Any) -> int:
    """The bytes of the tensors ``model`` holds in itself (initializers, in subgraphs too, and constants' values)."""
    from onnx import TensorProto

    return sum(len(t.raw_data) or t.ByteSize() for t in all_tensors(model) if t.data_location != TensorProto.EXTERNAL)


def save_onnx(model: Any, out_dir: Path, name: str = ONNX_FILE, threshold: int | None = None) -> Path:
    """``model`` written as the artifact's ONNX file: its tensors in ``<name>.data`` beside it where they pass
    ``threshold`` (default ``external_threshold``; protobuf's 2 GiB), the file alone otherwise (the full checker runs
    on every ONNX artifact after its export step: ``parity.exporters.onnx_names.check_exported``). Written with a data
    file, ``model``'s tensors are left referring to it without their bytes (onnx's save moves them; no copy is made)."""
    import onnx

    path = Path(out_dir) / name
    large = tensor_bytes(model) > (external_threshold() if threshold is None else threshold)
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=large,
        all_tensors_to_one_file=True,
        location=f"{name}.data" if large else None,
        size_threshold=1024,
    )
    return path


def large_file(path: Path) -> bool:
    """Whether the ONNX file at ``path`` with its data files passes ``external_threshold``: a model made from it
    (converted, quantized) is written with external data too."""
    return file_bytes(Path(path)) > external_threshold()


@contextmanager
def capture_logs(logger_name: str) -> Iterator[list[str]]:
    """Collect a library's ERROR log lines (converters report unsupported ops there)."""
    lines: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = _Collect(level=logging.ERROR)
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


def failed_tf_ops(log_lines: list[str]) -> list[str]:
    """Op types that tf2onnx says it failed to convert, from its log lines."""
    ops: set[str] = set()
    for line in log_lines:
        ops.update(re.findall(r'^op: "([^"]+)"', line, flags=re.MULTILINE))
        for counter in re.findall(r"Unsupported ops: Counter\((\{.*?\})\)", line):
            ops.update(re.findall(r"'([^']+)'", counter))
    return sorted(ops)
