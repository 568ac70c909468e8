"""torch/export: the .pt2 torch.export.save writes, loaded by torch.export.load without unpickling anything but
tensors, run as its .module(); its gradients and training step against golden; the static fallback's reason."""

from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

from parity.check import closeness as compare
from parity.check import training
from parity.golden import store as golden
from parity.model import feeds
from parity.model.workspace import Workspace
from parity.run import tasks
from tests.check.test_check import run_check
from tests.conftest import mlp_variant

REPO = Path(__file__).resolve().parents[2]
EXPORTER = "parity.exporters.torch_export:export"


def export(root: Path, model: str, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    ws = Workspace(root)
    return tasks.export_step(str(root), model, EXPORTER, str(ws.golden_dir(model)), 17, str(out), None, None)


def runner_on(root: Path, model: str, out: Path, meta: dict):
    from parity.runtimes.torch_export import ExportedProgramRunner

    ws = Workspace(root)
    spec = ws.load_spec(model)
    return spec, golden.load(ws.golden_dir(model), spec), ExportedProgramRunner(spec, out, meta, spec.batch_size, 1)


def test_torch_export_passes_mlp_with_a_dynamic_batch(workspace_copy):
    """The path passes at the golden batch and at every verification shape: the batch axis stays dynamic."""
    _, results = run_check(workspace_copy(), ["torch/export"])
    result = results["torch/export"]
    assert result["verdict"] == "pass", result["reason"]
    assert result["runtime"]["dynamic_axes"] and result["runtime"]["torch"].startswith("2.")
    assert all(entry["ok"] for entry in result["shapes"]) and len(result["shapes"]) >= 2


@pytest.mark.parametrize("model", ["mlp", "cnn", "transformer"])
def test_exported_program_gradients_and_training_step_match_golden(model, tmp_path):
    """The loaded program's module differentiates as the source does: every parameter's and the input's gradient
    within the gradient tolerances, and one SGD step lands on the golden weights."""
    meta = export(REPO, model, tmp_path / "a")
    assert meta["format"] == "pt2" and (tmp_path / "a" / "model.pt2").is_file()
    assert meta["axes"]["dynamic"] and not meta["axes"]["static"]
    spec, verified, runner = runner_on(REPO, model, tmp_path / "a", meta)
    inputs = verified.arrays["inputs.npz"]
    x = feeds.from_arrays(spec, inputs)
    grads = runner.gradients(x, inputs["labels"])
    compared = compare.compare_named(grads, verified.arrays["gradients.npz"], spec.gradient_tolerances("fp32").for_name)
    assert all(stats["ok"] for stats in compared.values()), {k: v["tol_units"] for k, v in compared.items()}
    _, _, fresh = runner_on(REPO, model, tmp_path / "a", meta)
    step = training.check_step(
        fresh,
        x,
        inputs["labels"],
        0.1,
        verified.arrays["weights.npz"],
        verified.arrays["gradients.npz"],
        spec.gradient_tolerances("fp32"),
    )
    assert step["ok"], step["worst"]


def _rewrite(path: Path, edits: dict[str, bytes]) -> None:
    """The zip archive at ``path`` with members replaced or added."""
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    members.update(edits)
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


class _Touch:
    """A pickle that, when loaded, creates a file: what loading a hostile .pt2 would run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def test_a_pt2_holding_a_pickled_custom_object_is_refused(tmp_path):
    """A constant stored as an opaque object (which torch.export.load would ``pickle.loads``) is refused with one
    line before torch sees the file; its payload never runs."""
    from parity.runtimes.torch_export import PickledArtifact

    meta = export(REPO, "mlp", tmp_path / "a")
    path = tmp_path / "a" / "model.pt2"
    marker = tmp_path / "ran"
    with zipfile.ZipFile(path) as archive:
        config = next(n for n in archive.namelist() if n.endswith("_constants_config.json"))
    root = config.split("/")[0]
    entry = {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True, "tensor_meta": None}
    _rewrite(
        path,
        {
            config: json.dumps({"config": {"evil": entry}}).encode(),
            f"{root}/data/constants/opaque_obj_0": pickle.dumps(_Touch(marker)),
        },
    )
    with pytest.raises(PickledArtifact) as raised:
        runner_on(REPO, "mlp", tmp_path / "a", meta)
    message = str(raised.value)
    assert "\n" not in message and "opaque_obj_0" in message and "never loads pickles" in message
    assert not marker.exists()


def test_a_pickled_weight_is_refused_by_the_weights_only_load(tmp_path):
    """A weight stored as a pickle (torch.export.load calls ``torch.load(weights_only=False)`` on it) is loaded
    weights-only under parity, so its payload is refused; plain torch.export.load would have run it."""
    import torch

    from parity.runtimes.torch_export import PickledArtifact

    meta = export(REPO, "mlp", tmp_path / "a")
    path = tmp_path / "a" / "model.pt2"
    marker = tmp_path / "ran"
    with zipfile.ZipFile(path) as archive:
        config_name = next(n for n in archive.namelist() if n.endswith("_weights_config.json"))
        config = json.loads(archive.read(config_name))
    first = next(iter(config["config"]))
    config["config"][first]["use_pickle"] = True
    weight_file = config_name.rsplit("/", 1)[0] + "/" + config["config"][first]["path_name"]
    _rewrite(path, {config_name: json.dumps(config).encode(), weight_file: pickle.dumps(_Touch(marker))})
    with pytest.raises(PickledArtifact) as raised:
        runner_on(REPO, "mlp", tmp_path / "a", meta)
    assert "\n" not in str(raised.value) and "weights-only" in str(raised.value)
    assert not marker.exists()
    try:  # the same file without parity's guard: torch unpickles it (the payload only creates the marker)
        torch.export.load(str(path))
    except Exception:  # noqa: BLE001, S110 - the load fails after unpickling (a Path is not a tensor); the marker tells
        pass
    assert marker.exists()


def test_an_axis_the_model_specialises_is_exported_static_with_the_reason(workspace_copy, tmp_path):
    """A model that fixes its batch (a reshape to 64 rows) cannot be exported with a dynamic batch: the program is
    exported static and the record says why; the check then names the baked axis at the other shapes."""
    root = workspace_copy(
        mlp_variant({"def forward(self, x):\n": "def forward(self, x):\n            x = x.reshape(64, 64)\n"})
    )
    meta = export(root, "mlp", tmp_path / "a")
    axes = meta["axes"]
    assert not axes["dynamic"] and axes["static"] == {"x": {"0": {"axis": "batch", "size": 64}}}
    assert axes["reason"].startswith("torch.export could not export the dynamic axes") and "\n" not in axes["reason"]
    assert "batch" in axes["reason"]
    _, results = run_check(root, ["torch/export"])
    result = results["torch/export"]
    assert result["verdict"] == "fail" and "axis 'batch' of input 'x' (dimension 0) fixed at 64" in result["reason"]
    assert result["runtime"]["dynamic_axes"] is False and result["runtime"]["static_reason"] == axes["reason"]
    np.testing.assert_equal(len(result["shapes"]), 2)


def test_the_program_unflattened_into_its_modules_gives_the_layers_taps(tmp_path):
    """torch/export's diagnosis reads each layer from the program unflattened back into the model's module tree:
    every tap of the cnn agrees with the golden on a passing export, and is located at its module."""
    from parity.diagnose.collect import collect
    from parity.golden import store as golden
    from parity.model.workspace import Workspace
    from parity.run import paths

    meta = tasks.export_step(
        str(REPO), "cnn", paths.TORCH_EXPORT.target, str(REPO / "golden" / "cnn"), 18, str(tmp_path), None, None
    )
    observed = collect(
        str(REPO), "cnn", "torch/export", str(REPO / "golden" / "cnn"), "fp32", 1, str(tmp_path), meta, gradients=False
    )
    spec = Workspace(REPO).load_spec("cnn")
    reference = golden.load(REPO / "golden" / "cnn", spec).arrays["reference.npz"]
    assert set(observed["taps"]) == set(spec.taps)
    for tap, value in observed["taps"].items():
        assert observed["located"][tap] == {"found": "module", "tensor": f"model.{tap}"}
        np.testing.assert_allclose(value, reference[f"tap/{tap}"], rtol=1e-4, atol=1e-5)


def test_an_axis_bounded_by_the_model_is_exported_bounded_and_the_record_says_why(workspace_copy, tmp_path):
    """A model that slices a 70-row table by its batch (as a transformer slices its position table by its sequence)
    refuses an unbounded batch; the program is exported with the batch bounded to the sizes parity runs, passes at
    every shape, and the record says torch.export's refusal."""
    root = workspace_copy(
        mlp_variant(
            {
                "def forward(self, x):\n": "def forward(self, x):\n            "
                "x = x + self.logits.weight.new_zeros(70, 64)[: x.shape[0]]\n"
            }
        )
    )
    meta = export(root, "mlp", tmp_path / "a")
    axes = meta["axes"]
    assert axes["dynamic"] == {"x": {"0": "batch"}} and not axes["static"] and axes["reason"] is None
    assert axes["note"].startswith("dynamic axes exported bounded to the sizes parity runs (batch 1..64)")
    assert "torch.export refused them unbounded" in axes["note"]
    _, results = run_check(root, ["torch/export"])
    assert results["torch/export"]["verdict"] == "pass", results["torch/export"]["reason"]
