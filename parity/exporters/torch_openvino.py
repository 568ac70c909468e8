"""torch -> OpenVINO IR with ``openvino.convert_model`` (its PyTorch frontend), saved as ``model.xml`` + ``model.bin``
with float32 weights."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

from parity.exporters.axes import REASON_CHARS, axes_record, declared_dynamic, short_reason
from parity.exporters.common import ExportJob
from parity.exporters.torch_onnx import traced_module
from parity.platform.errors import ExportError, one_line

IR_FILE = "model.xml"  # its weights in model.bin beside it


def export(job: ExportJob) -> dict:
    """The spec's module converted with the golden inputs as its example and the spec's named axes dynamic (``-1`` in
    each input's partial shape); where the dynamic conversion raises, converted at the example's static shapes and the
    axes record carries OpenVINO's message. Inputs and outputs are named as the spec names them, so a runtime feeds
    and reads them by name. Saved with ``compress_to_fp16=False``: ``save_model`` would otherwise store the weights
    as float16, and the IR would no longer be the float32 model the path claims to run."""
    import openvino as ov

    spec = job.spec
    module, example = traced_module(job)
    dynamic = declared_dynamic(spec)
    reason = None
    try:
        model = _convert(
            ov,
            module,
            example,
            [
                [-1 if k in dynamic[i.name] else size for k, size in enumerate(x.shape)]
                for i, x in zip(spec.model_inputs, example)
            ],
        )
    except Exception as error:  # noqa: BLE001 - converted static below; a static failure is the one raised
        reason = f"openvino.convert_model could not convert the dynamic axes: {short_reason(error)}"
        model = _convert(ov, module, example, [list(x.shape) for x in example])
    input_names, output_names = [i.name for i in spec.model_inputs], list(spec.outputs)
    _name(model.inputs, input_names, "inputs")
    _name(model.outputs, output_names, "outputs")
    ov.save_model(model, str(job.out_dir / IR_FILE), compress_to_fp16=False)
    shapes = {
        name: [None if d.is_dynamic else d.get_length() for d in port.get_partial_shape()]
        for name, port in zip(input_names, model.inputs)
    }
    axes = axes_record(spec, shapes, reason=reason)
    if axes["static"] and reason is None:
        axes["reason"] = "openvino.convert_model made the declared axes static"
    if axes["reason"]:
        axes["reason"] = one_line(axes["reason"], REASON_CHARS)
    layout = spec.model_inputs[0].layout if spec.model_inputs else "flat"
    return {
        "format": "openvino",
        "file": IR_FILE,
        "input_names": input_names,
        "output_names": output_names,
        "input_layout": layout,
        "canonical_layout": layout,
        "axes": axes,
        "openvino": ov.__version__,
        "weights_dtype": "float32",
    }


def _convert(ov, module, example, shapes):
    """``convert_model`` of ``module`` traced on ``example``, its inputs at ``shapes`` (-1: dynamic); the
    converter's own prints (its tracer's warnings) kept out of the worker's output."""
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        return ov.convert_model(module, example_input=example, input=[ov.PartialShape(s) for s in shapes] or None)


def _name(ports, names: list[str], what: str) -> None:
    """Each port's tensor named as the spec names it (the converter's names, ``args`` or none, replaced)."""
    if len(ports) != len(names):
        raise ExportError(
            f"openvino.convert_model made a model with {len(ports)} {what}; the spec names "
            f"{len(names)} ({', '.join(names)})"
        )
    for port, name in zip(ports, names):
        port.get_tensor().set_names({name})
