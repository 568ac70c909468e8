"""torch.onnx's export as parity runs it: the table of ATen -> ONNX functions kept by a worker changes no byte of
what it writes."""

from __future__ import annotations

import io
import os
import sys
from contextlib import redirect_stderr

import pytest


def test_exports_sharing_the_kept_table_write_the_same_bytes_and_build_it_once(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    from torch.onnx._internal.exporter import _registration

    from parity.exporters import torch_onnx

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.LayerNorm(8)).eval()
    example = (torch.randn(2, 4),)
    built = _registration.ONNXRegistry.__dict__["from_torchlib"]
    torch_onnx._REGISTRIES.clear()

    def export(name: str, kept: bool) -> bytes:
        path = tmp_path / name
        with redirect_stderr(io.StringIO()):
            if kept:
                with torch_onnx.kept_registry():
                    torch.onnx.export(model, example, str(path), dynamo=True, verbose=False)
            else:
                torch.onnx.export(model, example, str(path), dynamo=True, verbose=False)
        return path.read_bytes()

    fresh = export("fresh.onnx", kept=False)
    assert export("kept.onnx", kept=True) == fresh
    table = next(iter(torch_onnx._REGISTRIES.values()))
    assert export("again.onnx", kept=True) == fresh
    assert list(torch_onnx._REGISTRIES.values()) == [table]  # the second export read the same table
    assert _registration.ONNXRegistry.__dict__["from_torchlib"] is built  # torch's own, once the export is done


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="threads counted in /proc (Linux)")
def test_warming_a_template_imports_the_exporter_and_builds_its_table_without_starting_a_thread():
    """``warm`` runs in a template, which forks: it must leave no thread behind (``/proc/self/task`` counts the
    threads libraries start outside Python too)."""
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    from parity.exporters import torch_onnx

    threads = len(os.listdir("/proc/self/task"))
    torch_onnx._REGISTRIES.clear()
    torch_onnx.warm()
    assert len(os.listdir("/proc/self/task")) == threads
    assert set(torch_onnx.WARM_MODULES) <= set(sys.modules)
    assert len(torch_onnx._REGISTRIES) == 1
