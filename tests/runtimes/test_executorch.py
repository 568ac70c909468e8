"""torch/executorch: the program lowered to XNNPACK, written as a .pte and run by ExecuTorch's runtime; the
delegation it records, its bounded dynamic axes, and ExecuTorch's console noise kept out of parity's output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from parity.golden import store as golden
from parity.model import feeds
from parity.model.workspace import Workspace
from parity.run import tasks

REPO = Path(__file__).resolve().parents[2]
EXPORTER = "parity.exporters.torch_executorch:export"


@pytest.mark.slow  # torch/executorch is opt-in because lowering takes seconds
def test_executorch_passes_mlp_quietly_with_its_delegation_recorded_and_names_a_batch_beyond_its_bound(tmp_path, capfd):
    """Every layer of the mlp runs in one XNNPACK delegate; the batch is dynamic up to the largest batch parity runs,
    so the verification shapes pass too. Loading prints none of ExecuTorch's cpuinfo lines; a batch past the
    exported bound is refused naming the axis and the bound, not only ExecuTorch's error code."""
    from parity.runtimes.executorch import ExecuTorchRunner

    ws = Workspace(REPO)
    spec = ws.load_spec("mlp")
    meta = tasks.export_step(str(REPO), "mlp", EXPORTER, str(ws.golden_dir("mlp")), 17, str(tmp_path), None, None)
    assert meta["format"] == "pte" and (tmp_path / "model.pte").is_file()
    result = tasks.check_path(
        str(REPO), "mlp", "torch/executorch", str(ws.golden_dir("mlp")), "fp32", 1, str(tmp_path), meta
    )
    assert result["verdict"] == "pass", result["reason"]
    record = result["runtime"]
    assert record["delegation"]["backend"] == "XnnpackBackend"
    assert record["delegation"]["delegated_subgraphs"] == 1 and record["delegation"]["delegated_nodes"] == 5
    assert record["delegation"]["portable_nodes"] == 0 and record["delegation"]["portable_ops"] == {}
    assert record["dynamic_axes"] and record["bounds"] == {"batch": [1, 64]}
    assert all(entry["ok"] for entry in result["shapes"])

    capfd.readouterr()
    runner = ExecuTorchRunner(spec, tmp_path, meta, spec.batch_size, 1)
    assert "cpuinfo" not in capfd.readouterr().err
    verified = golden.load(ws.golden_dir("mlp"), spec)
    outputs = runner.run(feeds.from_arrays(spec, verified.arrays["inputs.npz"]))
    np.testing.assert_allclose(outputs["logits"], verified.arrays["reference.npz"]["logits"], atol=1e-5, rtol=1e-5)
    with pytest.raises(
        RuntimeError, match=r"error 0x1\d \(\w+.*\); axis 'batch' of input 'x' is 65, the program takes 1 to 64"
    ):
        runner.run({"x": np.zeros((65, 64), np.float32)})
    assert runner.runtime_record()["delegation"] == meta["delegation"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["cnn", "transformer"])
def test_executorch_passes_the_zoo(model, tmp_path):
    """cnn and transformer lowered and run: passes, with most operators in XNNPACK delegates and the rest named."""
    from parity.pipeline import orchestrate

    report = orchestrate.check(Workspace(REPO), [model], orchestrate.Options(threads=1, patterns=("torch/executorch",)))
    result = report["results"][0]
    assert result["verdict"] == "pass", result["reason"]
    delegation = result["runtime"]["delegation"]
    assert delegation["delegated_nodes"] > delegation["portable_nodes"] >= 0
    assert sum(delegation["portable_ops"].values()) == delegation["portable_nodes"]
