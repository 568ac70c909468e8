"""torch -> an ExportedProgram with ``torch.export.export``, saved as the ``.pt2`` file users ship."""

from __future__ import annotations

import io
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np

from parity.exporters.axes import REASON_CHARS, axes_record
from parity.exporters.common import ExportJob
from parity.exporters.torch_onnx import _Flat, _host, _torch_reason, dynamic_shapes
from parity.platform.errors import one_line
from parity.platform.safefs import write_bytes_atomic

PT2_FILE = "model.pt2"


def export(job: ExportJob) -> dict:
    """The spec's module exported with its named axes dynamic (one ``torch.export.Dim`` per axis name) and saved
    with ``torch.export.save``. Where the dynamic export raises, the program is exported static at the golden
    batch and ``meta["axes"]["reason"]`` carries torch.export's own message."""
    import torch

    spec = job.spec
    program, axes = exported_program(job)
    with tempfile.TemporaryDirectory(dir=job.out_dir) as scratch:  # torch.export.save writes in place: not atomic
        staged = Path(scratch) / PT2_FILE
        torch.export.save(program, str(staged))
        write_bytes_atomic(Path(job.out_dir) / PT2_FILE, staged.read_bytes())
    return {"format": "pt2", "file": PT2_FILE, "input_names": [i.name for i in spec.model_inputs],
            "output_names": list(spec.outputs), "input_layout": _layout(spec), "canonical_layout": _layout(spec),
            "axes": axes}


def exported_program(job: ExportJob, dims="declared", reason: str | None = None):
    """``(program, axes record)``: the spec's float32 module (inputs positional in the spec's order, outputs a
    tuple in the spec's order) exported on the golden inputs with ``dims`` dynamic (``"declared"``: the spec's
    named axes, unbounded; None: static, ``reason`` saying why), or static where that raises (the record says
    why)."""
    import torch

    from parity.sources.torch import build_module

    spec = job.spec
    module = _Flat(build_module(spec, job.weights, "float32"), spec)
    # traced on the golden inputs: their dtype (token ids stay integers) and values (an embedding's range)
    example = tuple(torch.from_numpy(np.ascontiguousarray(job.inputs[i.name], dtype=_host(i.dtype)))
                    for i in spec.model_inputs)
    dynamic = dynamic_shapes(spec) if dims == "declared" else dims
    if dynamic is not None:
        try:
            program = _export(module, example, dynamic)
        except Exception as error:  # noqa: BLE001 - exported static below; a static failure is the one raised
            reason = f"torch.export could not export the dynamic axes: {_torch_reason(error)}"
            dynamic = None
    if dynamic is None:
        program = _export(module, example, None)
    axes = axes_record(spec, input_shapes(spec, program), None, reason)
    if axes["reason"]:
        axes["reason"] = one_line(axes["reason"], REASON_CHARS)
    return program, axes


def input_shapes(spec, program) -> dict[str, list[int | None]]:
    """Spec input name -> the exported program's input dims (an int, or None where the dim is symbolic)."""
    import torch

    user_inputs = set(program.graph_signature.user_inputs)
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in user_inputs]
    shapes = {}
    for i, node in zip(spec.model_inputs, placeholders):
        value = node.meta.get("val")
        shape = getattr(value, "shape", None)
        shapes[i.name] = None if shape is None else [None if isinstance(d, torch.SymInt) else int(d) for d in shape]
    return shapes


def _export(module, example, dynamic):
    import torch

    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        return torch.export.export(module, example, dynamic_shapes=dynamic, strict=False)


def _layout(spec) -> str:
    return spec.model_inputs[0].layout if spec.model_inputs else "flat"
