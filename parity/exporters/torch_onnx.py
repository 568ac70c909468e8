"""torch -> ONNX with ``torch.onnx.export`` (the dynamo exporter, which needs onnxscript)."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import numpy as np

from parity.exporters.common import ONNX_FILE, ExportJob, check_onnx_ops, graph_input_names, onnx_meta


def export(job: ExportJob) -> dict:
    import onnx
    import torch

    from parity.sources.torch import build_module

    spec = job.spec
    module = _Flat(build_module(spec, job.weights, "float32"), spec)
    # traced on the golden inputs: their dtype (token ids stay integers) and values (an embedding's range)
    example = tuple(torch.from_numpy(np.ascontiguousarray(job.inputs[i.name], dtype=_host(i.dtype)))
                    for i in spec.model_inputs)
    names = [i.name for i in spec.model_inputs]
    path = job.out_dir / ONNX_FILE
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        torch.onnx.export(
            module, example, str(path), input_names=names, output_names=list(spec.outputs),
            opset_version=job.opset, dynamo=True, external_data=False, verbose=False,
        )
    model = onnx.load(str(path))
    check_onnx_ops(model, "torch.onnx")
    return onnx_meta(spec, graph_input_names(model), [o.name for o in model.graph.output], spec.model_inputs[0].layout)


def _host(dtype: str) -> str:
    return "float32" if dtype.startswith(("float", "bfloat")) else dtype


def _Flat(module, spec):
    """``module`` taking its inputs positionally in the spec's order and returning the spec's outputs as a tuple
    (what the exporter names ``output_names``), whatever structure the module returns."""
    import torch

    from parity.model import outputs
    from parity.model.feeds import call_torch as call

    class Flat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = module  # onnx_taps.WRAPPED: the diagnosis drops this scope

        def forward(self, *args):
            returned = call(self.model, dict(zip([i.name for i in spec.model_inputs], args)))
            return tuple(outputs.named(spec.outputs, outputs.flatten(returned, torch.is_tensor)).values())

    return Flat().eval()
