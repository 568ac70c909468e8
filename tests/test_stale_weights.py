"""A model whose factory loads its weights from a file: after the file changes, every run says that the golden data
describes another model, and no export made from the old weights is reused."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
from click.testing import CliRunner

from parity.cli import cli
from parity.model import manifest as manifest_lib

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


def test_a_retrained_checkpoint_is_exported_again_and_said_on_every_run(checkpointed):
    root = checkpointed
    built_from = manifest_lib.read(root / "golden" / "net" / "manifest.json")["built_from"]
    assert built_from["code"] == {"mymodel.py": built_from["code"]["mymodel.py"]}  # the factory's file, by its path

    result = check(root, "--json", "-")
    results = results_of(result)
    assert result.exit_code == 0 and all(r["golden_changed"] is None for r in results.values())
    assert results["torch/onnx/ort"]["export"]["cached"] is False

    write_checkpoint(root, 1)  # retrained: the factory now returns other weights
    result = check(root, "--json", "-")
    results = results_of(result)
    assert result.exit_code == 0  # the verdict stands: it is about the model the golden data describes
    for r in results.values():
        assert r["golden_changed"]["weights"] is True and r["golden_changed"]["code"] == []
    export = results["torch/onnx/ort"]["export"]
    assert export["cached"] is False and "weights changed" in export["rebuilt"]

    result = check(root)  # in the terminal too, on every run, as one line
    assert result.exit_code == 0
    warning = (
        "warning: net: the model's weights changed since its golden data was built; rebuild with "
        "`parity golden build --model net` if the change is intended"
    )
    assert result.output.count(warning) == 1, result.output

    result = invoke("golden", "build", "--workspace", root, "--model", "net")  # the change was intended
    assert result.exit_code == 0, result.output
    results = results_of(check(root, "--json", "-"))
    assert all(r["golden_changed"] is None for r in results.values())


def test_an_edit_of_the_factorys_code_is_said_too(checkpointed):
    root = checkpointed
    edited = textwrap.dedent(MODEL).replace("torch.nn.Tanh()", "torch.nn.Tanh(), torch.nn.ReLU()")
    (root / "mymodel.py").write_text(edited)
    result = check(root, "--json", "-")
    changed = results_of(result)["torch"]["golden_changed"]
    assert changed["weights"] is False and changed["code"] == ["mymodel.py"]
    assert changed["message"].startswith("the model's code changed since its golden data was built (mymodel.py); ")


@pytest.mark.slow  # TensorFlow's import and a Keras golden build: half a minute
def test_a_keras_file_saved_again_with_other_weights_is_said(tmp_path):
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

    save(1)  # trained again: the same architecture, other weights
    result = invoke("check", "--workspace", tmp_path, "--model", "kmodel", "--path", "tf", "--json", "-")
    changed = results_of(result)["tf"]["golden_changed"]
    assert result.exit_code == 0 and changed["weights"] is True and changed["code"] == []
