"""torch -> an ExportedProgram with ``torch.export.export``, saved as the ``.pt2`` file users ship."""

from __future__ import annotations

import inspect
import io
import tempfile
from contextlib import nullcontext, redirect_stderr, redirect_stdout
from pathlib import Path

from parity.exporters.axes import REASON_CHARS, axes_record
from parity.exporters.common import ExportJob, needed
from parity.exporters.torch_onnx import _torch_reason, dynamic_shapes, size_oblivious, traced_module
from parity.platform.errors import one_line
from parity.platform.safefs import write_bytes_atomic

PT2_FILE = "model.pt2"


def export(job: ExportJob) -> dict:
    """The spec's module exported with its named axes dynamic (one ``torch.export.Dim`` per axis name) and saved
    with ``torch.export.save``. Where the dynamic export raises, the program is exported static at the golden
    batch and ``meta["axes"]["reason"]`` carries torch.export's own message."""
    program, axes = exported_program(job)
    save_program(program, job.out_dir)
    return program_meta(job.spec, axes)


def save_program(program, out_dir) -> None:
    """``program`` saved with ``torch.export.save`` as ``out_dir/model.pt2``, atomically."""
    import torch

    with tempfile.TemporaryDirectory(dir=out_dir) as scratch:  # torch.export.save writes in place: not atomic
        staged = Path(scratch) / PT2_FILE
        torch.export.save(program, str(staged))
        write_bytes_atomic(Path(out_dir) / PT2_FILE, staged.read_bytes())


def program_meta(spec, axes: dict) -> dict:
    """A ``.pt2`` artifact's metadata: its file, the spec's inputs and outputs in order, layouts, the axes record."""
    return {
        "format": "pt2",
        "file": PT2_FILE,
        "input_names": [i.name for i in spec.model_inputs],
        "output_names": list(spec.outputs),
        "input_layout": _layout(spec),
        "canonical_layout": _layout(spec),
        "axes": axes,
    }


def exported_program(job: ExportJob, dims="declared", reason: str | None = None, traced=None):
    """``(program, axes record)``: the spec's float32 module (inputs positional in the spec's order, outputs a
    tuple in the spec's order) exported on the golden inputs, its axes dynamic as far as torch.export takes them.

    ``dims="declared"`` tries the spec's named axes unbounded, then as torch.onnx exports them (sizes 0 and 1 not
    specialised: ``size_oblivious``), then bounded to the sizes parity runs (a sequence that cannot pass a position
    table); given ``dims`` (``dynamic_shapes``) are tried as they are; None exports static, with
    ``reason`` saying why. Each refusal is said in the record (``note`` for the way that worked, ``reason`` where
    the program came out static). ``traced``: ``(module, example)`` to export instead of the spec's module (a
    program's ``.module()`` after a rewrite, which takes its inputs one per argument)."""
    spec = job.spec
    module, example = traced_module(job) if traced is None else traced
    if dims == "declared":
        declared = dynamic_shapes(spec)
        attempts = (
            []
            if declared is None
            else [
                ("unbounded", declared, nullcontext),
                ("unbounded, sizes 0 and 1 not specialised (as torch.onnx exports)", declared, size_oblivious),
            ]
        )
        if declared is not None:
            bounds = axis_bounds(job)
            shown = ", ".join(f"{axis} 1..{max(upper, 2)}" for axis, upper in bounds.items())
            attempts.append((f"bounded to the sizes parity runs ({shown})", bounded_shapes(spec, bounds), nullcontext))
    else:
        attempts = [] if dims is None else [("as given", dims, nullcontext)]
    refused, program, how, note = [], None, None, None
    for how, dynamic, context in attempts:
        try:
            with context():
                program = _export(module, example, dynamic)
            break
        except Exception as error:  # noqa: BLE001 - the next way, then static; a static failure is the one raised
            refused.append((how, _torch_reason(error)))
    tried = f"{'; '.join(h for h, _ in refused)}; the first refusal: {refused[0][1]}" if refused else ""
    if program is None:
        program = _export(module, example, None)
        reason = f"torch.export could not export the dynamic axes (tried {tried})" if refused else reason
    elif refused:
        note = f"dynamic axes exported {how}; torch.export refused them {tried}"
    axes = axes_record(spec, input_shapes(spec, program), None, reason)
    for key, text in (("reason", axes["reason"]), ("note", note)):
        if text:
            axes[key] = one_line(text, REASON_CHARS)
    return program, axes


def axis_bounds(job: ExportJob) -> dict[str, int]:
    """Each named axis's upper bound: the largest size parity runs it at (the traced inputs, the batch sizes the
    spec is checked and timed at, the golden verification shapes)."""
    spec = job.spec
    bounds: dict[str, int] = {}
    for i in spec.model_inputs:
        for k, axis in enumerate(i.axis_names):
            if axis:
                traced = needed(job.inputs, "the golden inputs it is traced on")[i.name]
                bounds[axis] = max(bounds.get(axis, 1), int(traced.shape[k]))
    if "batch" in bounds:
        bounds["batch"] = max(bounds["batch"], job.batch_size, spec.batch_size, *spec.bench_batch_sizes)
    for shape in (job.golden_manifest or {}).get("shapes") or ():
        for axis, size in shape.items():
            if axis in bounds:
                bounds[axis] = max(bounds[axis], int(size))
    return bounds


def bounded_shapes(spec, bounds: dict[str, int]):
    """``torch_onnx.dynamic_shapes`` with each axis bounded: ``Dim(axis, min=1, max=bound)``; None without axes."""
    from torch.export import Dim

    dims = {axis: Dim(axis, min=1, max=max(upper, 2)) for axis, upper in bounds.items()}
    per_input = [{k: dims[axis] for k, axis in enumerate(i.axis_names) if axis} or None for i in spec.model_inputs]
    return (tuple(per_input),) if dims else None


def input_shapes(spec, program) -> dict[str, list[int | None] | None]:
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

    takes_varargs = any(p.kind is p.VAR_POSITIONAL for p in inspect.signature(module.forward).parameters.values())
    if dynamic is not None and not takes_varargs:  # ``_Flat`` nests the inputs' shapes in its one varargs tuple
        dynamic = dynamic[0]
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        return torch.export.export(module, example, dynamic_shapes=dynamic, strict=False)


def _layout(spec) -> str:
    return spec.model_inputs[0].layout if spec.model_inputs else "flat"
