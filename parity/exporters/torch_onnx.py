"""torch -> ONNX with ``torch.onnx.export`` (the dynamo exporter, which needs onnxscript)."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, redirect_stderr, redirect_stdout

import numpy as np

from parity.exporters.axes import REASON_CHARS, onnx_axes
from parity.exporters.common import (
    ONNX_FILE,
    ExportJob,
    check_onnx_ops,
    external_threshold,
    graph_input_names,
    needed,
    onnx_meta,
)
from parity.exporters.onnx_names import name_graph
from parity.model.size import torch_weight_bytes
from parity.platform.errors import one_line


def export(job: ExportJob) -> dict:
    """Exported with the spec's named axes dynamic (``torch.export.Dim``, one per axis name, shared across the
    inputs). torch.onnx itself makes an axis the model specialises static and keeps the others dynamic; the
    record then carries torch.export's own message. Where the dynamic export raises, the export is static at
    the traced shape and the record carries the error.

    A module whose weights pass ``external_threshold`` (protobuf's 2 GiB) is written with its weights in
    ``model.onnx.data`` beside the graph, which is then named without loading them."""
    import onnx

    spec = job.spec
    module, example = traced_module(job)
    names = [i.name for i in spec.model_inputs]
    path = job.out_dir / ONNX_FILE
    external = torch_weight_bytes(module) > external_threshold()  # exported in float32
    dynamic = dynamic_shapes(spec)
    reason = None
    if dynamic is not None:
        try:
            _export(module, example, path, job.opset, dynamic, external)
        except Exception as error:  # noqa: BLE001 - exported static below; a static failure is the one raised
            reason = f"torch.onnx could not export the dynamic axes: {_torch_reason(error)}"
            dynamic = None
    if dynamic is None:
        _export(module, example, path, job.opset, None, external)
    # the graph without its weights: a data file beside it stays as torch.onnx wrote it, named by the graph
    model = onnx.load(str(path), load_external_data=False)
    # named here, not by torch.onnx, whose renaming leaves two definitions where a key names an inner tensor
    name_graph(model, names, list(spec.outputs))
    onnx.save_model(model, str(path))
    check_onnx_ops(model, "torch.onnx")
    layout = spec.model_inputs[0].layout
    axes = onnx_axes(spec, model, layout, reason)
    if axes["static"] and reason is None:  # torch.onnx specialised axes without an error: torch.export says why
        axes["reason"] = _specialised(module, example, dynamic) or axes["reason"]
    if axes["reason"]:
        axes["reason"] = one_line(axes["reason"], REASON_CHARS)
    return {**onnx_meta(spec, graph_input_names(model), [o.name for o in model.graph.output], layout), "axes": axes}


def traced_module(job: ExportJob):
    """``(module, example)``: the spec's float32 module with canonical weights, taking its inputs positionally in the
    spec's order and returning the spec's outputs as a tuple (``_Flat``), and the golden inputs it is traced on: their
    dtype (token ids stay integers) and values (an embedding's range)."""
    import torch

    from parity.sources.torch import build_module

    module = _Flat(build_module(job.spec, job.weights, "float32"), job.spec)
    inputs = needed(job.inputs, "the golden inputs it is traced on")
    example = tuple(
        torch.from_numpy(np.ascontiguousarray(inputs[i.name], dtype=_host(i.dtype))) for i in job.spec.model_inputs
    )
    return module, example


def dynamic_shapes(spec):
    """``dynamic_shapes`` for the ``_Flat`` module (whose ``forward(*args)`` takes the inputs as one varargs
    tuple, so the per-input entries are nested in it): ``{axis index: Dim}`` per input (None for an input
    without named axes), one ``Dim`` per axis name; None where no input has a named axis."""
    from torch.export import Dim

    dims: dict[str, object] = {}
    per_input = []
    for i in spec.model_inputs:
        axes = {k: dims.setdefault(axis, Dim(axis)) for k, axis in enumerate(i.axis_names) if axis}
        per_input.append(axes or None)
    return (tuple(per_input),) if dims else None


def _specialised(module, example, dynamic) -> str | None:
    """Why torch.export will not keep ``dynamic`` dynamic (its constraint violation), or None where it does.

    torch.onnx catches torch.export's constraint violations and exports again with the axes it names made
    static (``refine_dynamic_shapes_from_suggested_fixes``), so its export succeeds and the message is lost:
    it is asked again here, with the exporter's own settings, only when declared axes came out static."""
    import torch

    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()), size_oblivious():
            torch.export.export(module, example, dynamic_shapes=dynamic, strict=False)
    except Exception as error:  # noqa: BLE001 - the message is the point
        return f"torch.export specialised the dynamic axes ({_torch_reason(error)})"
    return None


def size_oblivious():
    """A context in which torch.export does not specialise sizes 0 and 1 of dynamic axes (as torch.onnx exports:
    ``torch.fx.experimental._config.backed_size_oblivious``); a torch without the switch exports as it does by
    default."""
    try:
        from torch.fx.experimental import _config

        return _config.patch(backed_size_oblivious=True)
    except Exception:  # noqa: BLE001 - no such switch in this torch
        return nullcontext()


def _torch_reason(error) -> str:
    """The innermost cause of a torch export error (torch.onnx wraps torch.export's), as ``Type: message``."""
    while error.__cause__ is not None and error.__cause__ is not error:
        error = error.__cause__
    return f"{type(error).__name__}: {_violations(error)}"


def _violations(error) -> str:
    """A constraint violation's message without its advice, stack and repeats: ``Constraints violated (batch)!
    - You marked batch as dynamic but your code specialized it to be a constant (4).``"""
    text = " ".join(str(getattr(error, "msg", None) or error).split())
    text = re.sub(
        r"For more information, run with TORCH_LOGS=\S* ?|(If you're using|User stack:).*?(?= - |$)", "", text
    )
    parts = [part.strip() for part in text.split(" - ")]
    return " - ".join(dict.fromkeys(part for part in parts if part))


def _export(module, example, path, opset, dynamic, external: bool) -> None:
    """torch.onnx's dynamo export to ``path``; ``external``: the weights in ``<path>.data`` (torch.onnx writes
    them there by itself past 2 GB)."""
    import torch

    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()), kept_registry():
        torch.onnx.export(
            module,
            example,
            str(path),
            opset_version=opset,
            dynamo=True,
            external_data=external,
            verbose=False,
            dynamic_shapes=dynamic,
        )


_REGISTRIES: dict = {}  # this worker's tables of ATen -> ONNX functions, by the arguments they were built with


@contextmanager
def kept_registry() -> Iterator[None]:
    """A context in which torch.onnx's table of ATen -> ONNX functions is built once per worker and opset: each
    export builds it afresh (``ONNXRegistry.from_torchlib``, 0.27 s of a 0.42 s export of a small model), and an
    export given no ``custom_translation_table`` (parity never gives one) only reads it. A torch without that
    classmethod exports as it does."""
    try:
        from torch.onnx._internal.exporter import _registration

        build = _registration.ONNXRegistry.__dict__["from_torchlib"]
    except (ImportError, KeyError):
        yield
        return

    def kept(cls, *args, **kwargs):
        key = (cls, args, tuple(sorted(kwargs.items())))
        if key not in _REGISTRIES:
            _REGISTRIES[key] = build.__func__(cls, *args, **kwargs)
        return _REGISTRIES[key]

    _registration.ONNXRegistry.from_torchlib = classmethod(kept)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        _registration.ONNXRegistry.from_torchlib = build  # type: ignore[method-assign]


# what a worker's first torch.onnx export imports (torch.export, dynamo, the exporter and its function library)
WARM_MODULES = (
    "torch.export",
    "torch._dynamo",
    "torch.onnx._internal.exporter._core",
    "onnxscript",
    "onnxscript.function_libs.torch_lib",
    "torch._functorch._aot_autograd",
    "torch._export.passes",
    "torch._inductor.codegen",
    "networkx",
)


def warm() -> None:
    """What a worker's first export would import and build, done by its group's template (``Step.warm``) so that
    the workers forked after it start with it: the exporter's modules and the ATen table of the default opset
    (``kept_registry``). 1.7 s once, where each worker's first export took 1.8 s longer than its next. It imports
    and builds Python objects only: no thread is started and nothing runs (a template forks)."""
    import importlib

    for name in WARM_MODULES:
        importlib.import_module(name)
    from torch.onnx._internal.exporter import _constants, _registration

    with kept_registry():
        _registration.ONNXRegistry.from_torchlib(opset_version=_constants.TORCHLIB_OPSET)


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
