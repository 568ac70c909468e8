"""torch -> ONNX with ``torch.onnx.export`` (the dynamo exporter, which needs onnxscript)."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import numpy as np

from parity.exporters.common import ONNX_FILE, ExportJob, check_onnx_ops, onnx_meta


def export(job: ExportJob) -> dict:
    import onnx
    import torch

    from parity.sources.torch import build_module

    spec = job.spec
    module = build_module(spec, job.weights, "float32")
    # traced on the golden inputs: their dtype (token ids stay integers) and values (an embedding's range)
    example = torch.from_numpy(np.ascontiguousarray(job.inputs, dtype=spec.input.dtype))
    path = job.out_dir / ONNX_FILE
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        torch.onnx.export(
            module, (example,), str(path), input_names=[spec.input.name], output_names=list(spec.outputs),
            opset_version=job.opset, dynamo=True, external_data=False, verbose=False,
        )
    check_onnx_ops(onnx.load(str(path)), "torch.onnx")
    return onnx_meta(spec, spec.input.name, list(spec.outputs), spec.input.layout)
