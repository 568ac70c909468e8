"""``torch/executorch``: the static-cache program of ``torch/export`` lowered to ExecuTorch with XNNPACK, as parity's
forward path lowers a model (``parity.exporters.torch_executorch``), and run by the ExecuTorch runtime.

The ``.pte`` keeps the cache as mutable buffers that persist between calls of one loaded method; they are written
with their initial zeros (``InitializedMutableBufferPass``) so that positions no call has written yet hold zeros,
not whatever the memory held. Calls, rows and the checks that apply are those of
``parity.generation.export_decoder.StaticCacheDecoder``: batch 1, a padded batch one row at a time.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from parity.generation.export_decoder import StaticCacheDecoder, export_program
from parity.platform.errors import Unavailable, UsageError, one_line

PTE_FILE = "model.pte"
# the wrapper's buffers: the cache's keys and values and each layer's filled length
CACHE_BUFFERS = ("key_cache", "value_cache", "cumulative_length")


def lower(program) -> tuple[bytes, dict]:
    """``(pte bytes, delegation counts)`` of ``program`` lowered with the XNNPACK partitioner."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    from parity.exporters.torch_executorch import delegation_counts

    edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    delegation = delegation_counts(edge.exported_program().graph_module)
    config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(list(CACHE_BUFFERS))])
    return bytes(edge.to_executorch(config).buffer), delegation


def export(source: dict, out_dir: str) -> dict:
    """The lowered program written to ``out_dir/model.pte``; its meta, or ``{"unavailable": reason}`` where
    torch.export or the lowering does not take the model."""
    import importlib.util

    from parity.platform.safefs import write_bytes_atomic

    if importlib.util.find_spec("executorch") is None:
        return {"unavailable": "executorch is not installed"}
    try:
        program, meta = export_program(source)
    except Unavailable as error:
        return {"unavailable": str(error)}
    started = time.perf_counter()
    try:
        buffer, delegation = lower(program)
    except Exception as error:  # noqa: BLE001 - the lowering's own message is the reason the path cannot run
        return {"unavailable": one_line(f"ExecuTorch lowering failed: {type(error).__name__}: {error}", 300)}
    write_bytes_atomic(Path(out_dir) / PTE_FILE, buffer)
    return {
        **meta,
        "lower_s": round(time.perf_counter() - started, 3),
        "format": "pte",
        "file": PTE_FILE,
        "delegation": delegation,
    }


class ExecuTorchDecoder(StaticCacheDecoder):
    """The ``.pte`` loaded by ``executorch.runtime`` (its ``forward`` method, loaded once: the cache lives in it)."""

    def __init__(self, pte_file, meta: dict):
        import torch

        from parity.runtimes.executorch import quiet_stderr

        super().__init__(meta["max_cache_len"])
        self.torch = torch
        with quiet_stderr():
            from executorch.runtime import Runtime

            self.method = Runtime.get().load_program(str(pte_file)).load_method("forward")

    def call(self, ids, start):
        from parity.runtimes.executorch import _named

        torch = self.torch
        ids = np.asarray(ids, np.int64)
        try:
            out = self.method.execute(
                [torch.from_numpy(ids[None].copy()), torch.arange(start, start + ids.size, dtype=torch.long)]
            )[0]
        except RuntimeError as error:
            raise RuntimeError(_named(error)) from None
        return out[0].numpy().astype(np.float64)


def open_decoder(artifact_dir, meta: dict, threads: int):
    """The ``torch/executorch`` decoder (``parity.generation.paths``): the ``.pte`` of ``export`` in ``artifact_dir`` (XNNPACK sizes its own
    thread pool: ``threads`` is not applied)."""
    import importlib.util

    if importlib.util.find_spec("executorch") is None:
        raise Unavailable("executorch is not installed")
    if not artifact_dir or "max_cache_len" not in meta:
        raise UsageError("the torch/executorch path needs its .pte folder and meta")
    return ExecuTorchDecoder(Path(artifact_dir) / meta.get("file", PTE_FILE), meta)
