"""The generation paths, one record each: the stages a path goes through (its result row's ``stages``), the decoder
that runs it (``module:function``, ``(artifact_dir, meta, threads) -> Decoder``), the worker task that exports it
(``(source, out_dir) -> meta``; paths of one export ``kind`` share one export) and the packages that export depends
on (part of the export cache's key). ``parity.model.generation_spec.PATHS`` lists the same ids in check order.
"""

from __future__ import annotations

from dataclasses import dataclass

from parity.run.paths import TORCH_ONNX


@dataclass(frozen=True)
class GenerationPath:
    stages: tuple[str, ...]
    decoder: str
    export: str | None = None
    kind: str | None = None
    packages: tuple[str, ...] = ()
    warm: str = ""  # what a template runs before its second worker for the export (``parity.run.paths.Step.warm``)


ONNX_EXPORT = "parity.generation.onnx_export:export_task"
ONNX_PACKAGES = ("torch", "transformers", "onnx", "onnxscript")
ONNX_WARM = TORCH_ONNX.warm  # the same exporter as the torch.onnx step's
STATIC = "torch.export (static cache, batch 1)"
PATHS = {
    "torch": GenerationPath(("torch",), "parity.generation.torch_decoder:open_decoder"),
    "torch/onnx/ort": GenerationPath(
        ("torch", "torch.onnx (flat key/value cache)", "ort"),
        "parity.generation.ort_decoder:open_decoder",
        ONNX_EXPORT,
        "onnx",
        ONNX_PACKAGES,
        ONNX_WARM,
    ),
    "torch/onnx/openvino": GenerationPath(
        ("torch", "torch.onnx (flat key/value cache)", "openvino (stateful)"),
        "parity.generation.openvino_decoder:open_decoder",
        ONNX_EXPORT,
        "onnx",
        ONNX_PACKAGES,
        ONNX_WARM,
    ),
    "torch/genai": GenerationPath(
        ("torch folder", "onnxruntime-genai builder", "onnxruntime-genai"),
        "parity.generation.genai_decoder:open_decoder",
        "parity.generation.genai_decoder:export_task",
        "genai",
        ("onnxruntime-genai", "transformers", "torch"),
    ),
    "torch/export": GenerationPath(
        ("torch", STATIC, "torch (ExportedProgram)"),
        "parity.generation.export_decoder:open_decoder",
        "parity.generation.export_decoder:export",
        "pt2",
        ("torch", "transformers"),
    ),
    "torch/executorch": GenerationPath(
        ("torch", STATIC, "executorch (xnnpack)"),
        "parity.generation.executorch_decoder:open_decoder",
        "parity.generation.executorch_decoder:export",
        "pte",
        ("torch", "transformers", "executorch"),
    ),
}


def decoder(path_id: str, artifact_dir, meta: dict, threads: int):
    """The Decoder of ``path_id`` on its export (``meta`` with the model's ``source``)."""
    from parity.platform.errors import UsageError
    from parity.run.paths import load_target

    if path_id not in PATHS:
        raise UsageError(f"unknown generation path {path_id!r}; known: {', '.join(PATHS)}")
    return load_target(PATHS[path_id].decoder)(artifact_dir, meta, threads)
