"""torch/compile and torch/compile-autotune: the torch module compiled by TorchInductor, checked like the source
(outputs, shapes, gradients), with its graphs, recompilations and graph breaks recorded; taps read from compiled
graphs; a drift put into one layer diagnosed at that layer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from parity.golden import store as golden
from parity.model import feeds
from parity.model.workspace import Workspace
from tests.check.test_check import run_check

REPO = Path(__file__).resolve().parents[2]


def test_compiled_mlp_passes_with_gradients_and_its_recompilations_counted(workspace_copy):
    """The check runs the model at the golden batch, then at batches 1 and 3, then differentiates: each new shape
    and the grad mode recompile, and the record says so, with torch's own reasons; gradients match golden."""
    _, results = run_check(workspace_copy(), ["torch/compile"])
    result = results["torch/compile"]
    assert result["verdict"] == "pass", result["reason"]
    assert result["gradients"] and all(stats["ok"] for stats in result["gradients"].values())
    record = result["runtime"]
    assert record["mode"] == "default" and record["graph_breaks"] == 0
    assert record["recompilations"] >= 2 and record["graphs_compiled"] == record["recompilations"] + 1
    assert any("size mismatch" in reason for reason in record["recompile_reasons"])
    assert any(graph["grad"] for graph in record["graphs"]) and any(graph["dynamic"] for graph in record["graphs"])
    seen = {tuple(entry["input_shapes"][0]) for entry in record["shapes_seen"]}
    assert {(64, 64), (1, 64), (3, 64)} <= seen
    assert result["numerics"]["torch_compile"]["backend"] == "inductor"


@pytest.mark.slow  # torch/compile is opt-in because it compiles for seconds per shape
def test_compiled_taps_come_from_compiled_graphs_and_match_golden():
    """Taps are read through hooks compiled into a copy of the module (a hook added to an already compiled module
    never fires): every tap is reported, within tolerance of the float64 golden."""
    from parity.sources.torch_compile import TAPS_NOTE, CompiledTorch

    ws = Workspace(REPO)
    spec = ws.load_spec("mlp")
    verified = golden.load(ws.golden_dir("mlp"), spec)
    runner = CompiledTorch(spec, verified.arrays["weights.npz"], spec.batch_size)
    x = feeds.from_arrays(spec, verified.arrays["inputs.npz"])
    runner.run(x)  # compiled first without hooks, as a check does
    taps = runner.taps(x)
    reference = verified.arrays["reference.npz"]
    for tap in spec.taps:
        np.testing.assert_allclose(taps[tap], reference[f"tap/{tap}"], atol=1e-5, rtol=1e-5, err_msg=tap)
    assert runner.tap_locations["dense2"] == {"found": "compiled", "reason": TAPS_NOTE}
    assert runner.runtime_record()["taps"] == TAPS_NOTE


@pytest.mark.slow
def test_a_drift_in_one_layer_of_the_compiled_module_is_diagnosed_there(workspace_copy):
    """A weight of dense2 perturbed in the compiled path only: the path fails, and the diagnosis names dense2 as
    the first divergent tap (the layers before it agree)."""
    delta = np.zeros((64, 32), np.float32)
    delta[3, 5] = 0.05
    _, results = run_check(
        workspace_copy(), ["torch/compile"], weight_perturbation={("mlp", "torch/compile"): {"dense2/kernel": delta}}
    )
    result = results["torch/compile"]
    assert result["verdict"] == "fail" and "output logits" in result["reason"]
    diagnosis = result["diagnosis"]
    assert diagnosis["first_divergent_tap"] == "dense2", diagnosis
    rows = {row["tap"]: row for row in diagnosis["taps"]}
    assert rows["dense1"]["stats"]["ok"] and rows["relu1"]["stats"]["ok"]


@pytest.mark.slow
def test_max_autotune_passes_mlp(workspace_copy):
    """torch/compile-autotune: inductor's max-autotune (no CUDA graphs) mode, checked the same way."""
    _, results = run_check(workspace_copy(), ["torch/compile-autotune"])
    result = results["torch/compile-autotune"]
    assert result["verdict"] == "pass", result["reason"]
    assert result["runtime"]["mode"] == "max-autotune-no-cudagraphs" and result["runtime"]["recompilations"] >= 1


@pytest.mark.slow
@pytest.mark.parametrize("model", ["cnn", "transformer"])
def test_compiled_zoo_passes_with_gradients(model):
    from parity.pipeline import orchestrate

    report = orchestrate.check(Workspace(REPO), [model], orchestrate.Options(threads=1, patterns=("torch/compile",)))
    result = report["results"][0]
    assert result["verdict"] == "pass", result["reason"]
    assert result["gradients"] and all(stats["ok"] for stats in result["gradients"].values())
    assert result["runtime"]["recompilations"] >= 1
