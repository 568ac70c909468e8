"""The size of a user model's weights before its golden data exists, read without holding them where it can be: a
torch model built on the ``meta`` device (shapes and dtypes, no storage), a JAX params file's and a Keras file's
arrays from their zip directory, an ONNX file by its size and its external data files' (``interop.onnx_tensors``).
What the step estimates (``parity.run.estimate``) start from; runs in a worker of the model's framework.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from parity.interop.onnx_tensors import file_bytes


def _zip_bytes(path: Path) -> int:
    """The uncompressed bytes of a zip file's members (``.npz``, ``.keras``)."""
    with zipfile.ZipFile(path) as archive:
        return sum(member.file_size for member in archive.infolist())


def _torch_bytes(spec) -> int | None:
    import torch

    from parity.model.weight_files import build_mapped

    try:
        with torch.device("meta"):
            module = build_mapped(spec)  # a model mapped from its files: their tensors, not read
    except Exception:  # noqa: BLE001 - a factory that cannot build on the meta device: its size is not known before
        return None
    return torch_weight_bytes(module)


def torch_weight_bytes(module) -> int:
    """The bytes of a torch module's floating parameters and buffers as float32 (4 bytes an element whatever dtype
    they are held in: every memory figure is a multiple of the float32 weights), each tensor once (tied weights,
    a module reached twice). The streamed reference's threshold and units, the step estimates and torch.onnx's
    external-data threshold all read this."""
    seen = {id(t): t.numel() for t in (*module.parameters(), *module.buffers()) if t.is_floating_point()}
    return 4 * sum(seen.values())


def weights_bytes(workspace: str, model: str) -> int | None:
    """Worker task: the bytes of the model's floating weights as its builder makes them, None where they cannot be
    known without building it for real (a Keras factory, a torch factory that cannot build on the meta device)."""
    from parity.model.workspace import Workspace

    spec = Workspace(workspace).load_spec(model, attach_golden=False)
    framework = spec.frameworks[0]
    if spec.onnx_model is not None:
        return file_bytes(Path(spec.onnx_model_path))
    if framework == "torch":
        return _torch_bytes(spec)
    if framework == "jax":
        return _zip_bytes(Path(spec.jax_apply.params_path))
    files = [Path(f) for f in getattr(spec.keras_model, "source_files", ()) if str(f).endswith(".keras")]
    return _zip_bytes(files[0]) if files else None
