"""A model whose factory loads its weights from a file: after the file changes, every run refuses the golden data
(which keeps no copy of the old weights to check against) until it is rebuilt, and no export made from the old
weights is reused; golden data that still keeps a copy is checked against it and the change said."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
from click.testing import CliRunner

from parity.cli import cli
from parity.model import manifest as manifest_lib
from tests.conftest import reseal

MODEL = """
    import numpy as np
    import torch
    from pathlib import Path

    def make():
        net = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh())
        arrays = np.load(Path(__file__).parent / "checkpoint.npz")
        net.load_state_dict({name: torch.from_numpy(arrays[name]) for name in arrays.files})
        return net
"""


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def write_checkpoint(root, seed: int) -> None:
    rng = np.random.default_rng(seed)
    np.savez(
        root / "checkpoint.npz",
        **{"0.weight": rng.normal(size=(4, 6)).astype(np.float32), "0.bias": rng.normal(size=4).astype(np.float32)},
    )


def check(root, *args):
    result = invoke(
        "check", "--workspace", root, "--model", "net", "--path", "torch", "--path", "torch/onnx/ort", *args
    )
    return result


def results_of(result) -> dict:
    report = json.loads(result.output[result.output.index("{") :])
    return {r["path"]: r for r in report["results"]}


@pytest.fixture
def checkpointed(tmp_path):
    (tmp_path / "mymodel.py").write_text(textwrap.dedent(MODEL))
    write_checkpoint(tmp_path, 0)
    result = invoke("init", "net", "--workspace", tmp_path, "--torch", tmp_path / "mymodel.py:make", "--input", "x=2x6")
    assert result.exit_code == 0, result.output
    result = invoke("golden", "build", "--workspace", tmp_path, "--model", "net")
    assert result.exit_code == 0, result.output
    return tmp_path


REFUSAL = (
    "the model's weights changed since its golden data was built, and the golden data keeps no copy of "
    "the old ones to check against; rebuild it with `parity golden build --model net`"
)


def test_a_retrained_checkpoint_is_refused_until_the_golden_data_is_rebuilt_and_then_exported_again(checkpointed):
    root = checkpointed
    manifest = manifest_lib.read(root / "golden" / "net" / "manifest.json")
    built_from = manifest["built_from"]
    assert built_from["code"] == {"mymodel.py": built_from["code"]["mymodel.py"]}  # the factory's file, by its path
    # the golden data keeps no copy of the weights: their shapes and dtypes, and their digest
    assert "weights.npz" not in manifest["files"] and not (root / "golden" / "net" / "weights.npz").exists()
    assert manifest["params"]["0.weight"] == {"trainable": True, "dtype": "float32", "shape": [4, 6]}

    result = check(root, "--json", "-")
    results = results_of(result)
    assert result.exit_code == 0 and all(r["golden_changed"] is None for r in results.values())
    assert results["torch/onnx/ort"]["export"]["cached"] is False

    write_checkpoint(root, 1)  # retrained: the factory now returns other weights, and nothing holds the old ones
    result = check(root)
    assert result.exit_code == 2  # stale golden data: refused before anything is exported or checked
    assert result.output.count(f"net: ERROR {REFUSAL}\n") == 1, result.output
    assert "verdict" not in result.output and "Traceback" not in result.output
    result = check(root, "--json", "-")
    report = json.loads(result.output[result.output.index("{") :])
    assert result.exit_code == 2 and report["results"] == []
    assert report["model_errors"] == [{"model": "net", "reason": REFUSAL}]

    result = invoke("golden", "build", "--workspace", root, "--model", "net")  # the change was intended
    assert result.exit_code == 0, result.output
    results = results_of(check(root, "--json", "-"))
    assert all(r["golden_changed"] is None and r["verdict"] == "pass" for r in results.values())
    export = results["torch/onnx/ort"]["export"]  # the export of the old weights is not reused
    assert export["cached"] is False and "weights changed" in export["rebuilt"]


def test_a_model_that_cannot_be_built_to_compare_its_weights_is_refused_not_checked(checkpointed):
    """Without a copy of the weights, a model whose weights cannot be read now is not checked against golden data
    that may describe other weights: refused in one line, nothing exported or checked."""
    root = checkpointed
    (root / "checkpoint.npz").unlink()
    result = check(root, "--json", "-")
    report = json.loads(result.output[result.output.index("{") :])
    assert result.exit_code == 2 and report["results"] == [], result.output
    [error] = report["model_errors"]
    assert error["reason"].startswith("the model could not be built to compare it with the one its golden data was")
    assert error["reason"].endswith("; nothing is checked") and "checkpoint.npz" in error["reason"]


def test_golden_data_that_keeps_a_copy_of_the_weights_is_checked_against_it_and_a_change_said(checkpointed):
    """Golden data built when it kept a copy of a user model's weights: the paths are built from that copy, as then,
    and a change of the model's weights is said on every result, not refused."""
    root = checkpointed
    with np.load(root / "checkpoint.npz") as stored:
        weights = {name: stored[name] for name in stored.files}
    reseal(root / "golden" / "net", "weights.npz", weights)
    write_checkpoint(root, 1)
    result = check(root, "--json", "-")
    results = results_of(result)
    assert result.exit_code == 0  # the verdict stands: built from the copy, the model the golden data describes
    for r in results.values():
        assert r["verdict"] == "pass" and r["golden_changed"]["weights"] is True and r["golden_changed"]["code"] == []
    result = check(root)
    warning = (
        "warning: net: the model's weights changed since its golden data was built; rebuild with "
        "`parity golden build --model net` if the change is intended"
    )
    assert result.exit_code == 0 and result.output.count(warning) == 1, result.output


def test_an_edit_of_the_factorys_code_is_said_too(checkpointed):
    root = checkpointed
    edited = textwrap.dedent(MODEL).replace("torch.nn.Tanh()", "torch.nn.Tanh(), torch.nn.ReLU()")
    (root / "mymodel.py").write_text(edited)
    result = check(root, "--json", "-")
    changed = results_of(result)["torch"]["golden_changed"]
    assert changed["weights"] is False and changed["code"] == ["mymodel.py"]
    assert changed["message"].startswith("the model's code changed since its golden data was built (mymodel.py); ")


@pytest.mark.slow  # TensorFlow's import and a Keras golden build: half a minute
def test_a_keras_file_saved_again_with_other_weights_is_refused(tmp_path):
    import keras

    def save(seed: int) -> None:
        keras.utils.set_random_seed(seed)
        inputs = keras.Input((6,), name="x")
        model = keras.Model(inputs, keras.layers.Dense(3, name="dense")(inputs))
        model.save(tmp_path / "model.keras")

    save(0)
    result = invoke("init", "kmodel", "--workspace", tmp_path, "--keras", tmp_path / "model.keras", "--input", "x=2x6")
    assert result.exit_code == 0, result.output
    assert invoke("golden", "build", "--workspace", tmp_path, "--model", "kmodel").exit_code == 0
    assert manifest_lib.read(tmp_path / "golden" / "kmodel" / "manifest.json")["built_from"]["code"] == {}

    assert "weights.npz" not in manifest_lib.read(tmp_path / "golden" / "kmodel" / "manifest.json")["files"]
    result = invoke("check", "--workspace", tmp_path, "--model", "kmodel", "--path", "tf", "--path", "tf/onnx/ort")
    assert result.exit_code == 0 and result.output.count("pass") >= 2, result.output

    save(1)  # trained again: the same architecture, other weights
    result = invoke("check", "--workspace", tmp_path, "--model", "kmodel", "--path", "tf")
    assert result.exit_code == 2 and result.output.count(f"kmodel: ERROR {REFUSAL.replace('net', 'kmodel')}") == 1, (
        result.output
    )


# slow: the same refusal for a second framework (a jax golden build and a jax2onnx export); the fast set keeps
# test_a_retrained_checkpoint_is_refused_until_the_golden_data_is_rebuilt_and_then_exported_again
@pytest.mark.slow
def test_a_jax_params_file_with_other_weights_is_refused(tmp_path):
    from tests import usermodels
    from tests.conftest import REPO

    usermodels.save_jax_params(tmp_path / "params.npz")
    apply = f"{REPO / 'tests' / 'usermodels.py'}:jax_apply,{tmp_path / 'params.npz'}"
    assert invoke("init", "jmlp", "--workspace", tmp_path, "--jax", apply, "--input", "x=4x5").exit_code == 0
    assert invoke("golden", "build", "--workspace", tmp_path, "--model", "jmlp").exit_code == 0
    assert "weights.npz" not in manifest_lib.read(tmp_path / "golden" / "jmlp" / "manifest.json")["files"]
    result = invoke("check", "--workspace", tmp_path, "--model", "jmlp", "--path", "jax", "--path", "jax/onnx/ort")
    assert result.exit_code == 0, result.output

    with np.load(tmp_path / "params.npz") as stored:
        params = {name: stored[name] for name in stored.files}
    params["out/bias"] = params["out/bias"] + np.float32(0.5)  # one weight changed
    np.savez(tmp_path / "params.npz", **params)
    result = invoke("check", "--workspace", tmp_path, "--model", "jmlp", "--path", "jax")
    assert result.exit_code == 2 and result.output.count(f"jmlp: ERROR {REFUSAL.replace('net', 'jmlp')}") == 1, (
        result.output
    )
