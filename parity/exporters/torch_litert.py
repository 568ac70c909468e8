"""torch -> LiteRT with litert-torch (formerly ai-edge-torch): the spec's module traced by ``torch.export`` and
lowered to a ``.tflite`` flatbuffer by ``litert_torch.convert(module, sample_args)``, at float32 (no quantization).

Written against litert-torch's documented API: ``litert_torch.convert(module, sample_args, dynamic_shapes=...)``
returns a model whose ``export(path)`` writes the flatbuffer, with one signature (``serving_default``) whose inputs
are ``args_0``, ``args_1`` ... in the module's argument order and whose outputs are ``output_0``, ``output_1`` ...
for a returned tuple. pip refuses litert-torch beside parity's pinned stack (``parity.run.install_names.WONT_INSTALL``),
so this exporter is unverified there.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from parity.exporters.axes import REASON_CHARS, axes_record
from parity.exporters.common import ExportJob
from parity.platform.errors import ExportError, one_line
from parity.platform.safefs import write_bytes_atomic

TFLITE_FILE = "model.tflite"
SIGNATURE = "serving_default"  # litert_torch.model.DEFAULT_SIGNATURE_NAME
TAPS_REASON = (
    "litert-torch names the .tflite tensors by torch.export's graph nodes, which parity does not map to "
    "layers: outputs are compared (diagnose torch/onnx/ort to read the layers)"
)


def export(job: ExportJob) -> dict:
    """The spec's float32 module (inputs positional in the spec's order, outputs a tuple in the spec's order),
    converted with its named axes dynamic (one ``torch.export.Dim`` per axis name), or static at the golden batch
    where that raises (``meta["axes"]["reason"]`` has the converter's message); written to ``out_dir/model.tflite``."""
    import litert_torch
    import torch

    from parity.exporters.torch_onnx import _torch_reason, dynamic_shapes, traced_module

    spec = job.spec
    module, example = traced_module(job)  # _Flat returns the module in eval mode
    dynamic, reason, edge_model = dynamic_shapes(spec), None, None
    if dynamic is not None:
        try:
            edge_model = _convert(litert_torch, torch, module, example, dynamic)
        except Exception as error:  # noqa: BLE001 - converted static below; a static failure is the one raised
            reason = one_line(f"litert-torch could not convert the dynamic axes: {_torch_reason(error)}", REASON_CHARS)
    if edge_model is None:
        try:
            edge_model = _convert(litert_torch, torch, module, example, None)
        except Exception as error:  # noqa: BLE001 - any converter failure is the export's error, in its own words
            raise ExportError(f"litert-torch could not convert the module: {_torch_reason(error)}") from None
    with tempfile.TemporaryDirectory(dir=job.out_dir) as scratch:  # ``export`` writes in place: not atomic
        staged = Path(scratch) / TFLITE_FILE
        edge_model.export(str(staged))
        data = staged.read_bytes()
    write_bytes_atomic(Path(job.out_dir) / TFLITE_FILE, data)
    return litert_meta(spec, data, reason)


def _convert(litert_torch, torch, module, example: tuple, dynamic):
    with torch.no_grad():
        return litert_torch.convert(module, example, dynamic_shapes=dynamic)


def litert_meta(spec, data: bytes, reason: str | None) -> dict:
    """The artifact's metadata from its ``serving_default`` signature, read with LiteRT's interpreter (a
    dependency of litert-torch): the tensors behind ``args_<k>`` (the spec's k-th input) and ``output_<k>`` (its
    k-th output), and the axes as the inputs' ``shape_signature`` has them (-1 dynamic)."""
    from ai_edge_litert import interpreter as litert

    interpreter = litert.Interpreter(model_content=data)
    signatures = interpreter.get_signature_list()
    if SIGNATURE not in signatures:
        raise ExportError(
            f"the .tflite model litert-torch wrote has no {SIGNATURE!r} signature (it has "
            f"{', '.join(signatures) or 'none'})"
        )
    runner = interpreter.get_signature_runner(SIGNATURE)
    inputs, outputs = _numbered(runner.get_input_details(), "args"), _numbered(runner.get_output_details(), "output")
    if len(inputs) != len(spec.model_inputs) or len(outputs) != len(spec.outputs):
        raise ExportError(
            f"the .tflite signature has {len(inputs)} input(s) and {len(outputs)} output(s); the spec "
            f"has {len(spec.model_inputs)} and {len(spec.outputs)}"
        )
    shapes = {
        i.name: [None if int(d) < 0 else int(d) for d in detail["shape_signature"]]
        for i, (_, detail) in zip(spec.model_inputs, inputs)
    }
    layout = spec.model_inputs[0].layout if spec.model_inputs else "flat"
    return {
        "format": "tflite",
        "file": TFLITE_FILE,
        "input_names": [detail["name"] for _, detail in inputs],
        "output_names": [detail["name"] for _, detail in outputs],
        "signature": {
            "name": SIGNATURE,
            "inputs": dict(zip([i.name for i in spec.model_inputs], [key for key, _ in inputs])),
            "outputs": dict(zip(spec.outputs, [key for key, _ in outputs])),
        },
        "input_layout": layout,
        "canonical_layout": layout,
        "axes": axes_record(spec, shapes, None, reason),
        "taps_reason": TAPS_REASON,
        "converter": {"name": "litert-torch", "quantization": None},
    }


def _numbered(details: dict, prefix: str) -> list[tuple[str, dict]]:
    """A signature's ``{"<prefix>_<k>": detail}`` in k order (``output_10`` after ``output_9``)."""
    keyed = []
    for key, detail in details.items():
        match = re.fullmatch(rf"{prefix}_(\d+)", key)
        if match is None:
            raise ExportError(f"the .tflite signature names {key!r}; litert-torch names them {prefix}_<k>")
        keyed.append((int(match[1]), key, detail))
    return [(key, detail) for _, key, detail in sorted(keyed)]
