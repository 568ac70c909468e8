"""A user's own model, end to end: init -> golden build -> check / run, from the command line and pytest."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from parity.cli import cli
from tests.conftest import REPO

MODELS = REPO / "tests" / "usermodels.py"


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def init(root, name, *args):
    result = invoke("init", name, "--workspace", str(root), *args)
    assert result.exit_code == 0, result.output
    return result


def build(root, name):
    result = invoke("golden", "build", "--workspace", str(root), "--model", name)
    assert result.exit_code == 0, result.output
    return json.loads((root / "golden" / name / "manifest.json").read_text())


def check(root, name, *args):
    result = invoke("check", "--workspace", str(root), "--model", name, "--json", "-", *args)
    return result.exit_code, json.loads(result.output[result.output.index("{") :])


def by_path(report):
    return {r["path"]: r for r in report["results"]}


def test_torch_model_from_a_file_init_build_check_with_a_broken_export_named(tmp_path):
    rng = np.random.default_rng(1)
    np.savez(
        tmp_path / "data.npz", x=rng.standard_normal((6, 3, 8, 8)).astype(np.float32), labels=rng.integers(0, 4, 6)
    )
    init(
        tmp_path,
        "good",
        "--torch",
        f"{MODELS}:make_net",
        "--inputs",
        str(tmp_path / "data.npz"),
        "--input",
        "x=3x3x8x8",
    )
    init(tmp_path, "broken", "--torch", f"{MODELS}:make_broken_export_net", "--input", "x=2x3x8x8")
    spec_text = (tmp_path / "models" / "good.py").read_text()
    assert 'taps=("conv", "bn", "act", "pool", "flat", "head")' in spec_text and 'loss="cross_entropy"' in spec_text

    manifest = build(tmp_path, "good")
    assert manifest["reference"]["dtype"] == "float64" and manifest["reference"]["tolerance_factor"] == 1
    # no copy of the model's weights: their names, shapes and dtypes, and their digest
    assert "weights.npz" not in manifest["files"] and not (tmp_path / "golden" / "good" / "weights.npz").exists()
    assert manifest["params"]["conv.weight"] == {"trainable": True, "dtype": "float32", "shape": [8, 3, 3, 3]}
    assert len(manifest["built_from"]["weights_sha256"]) == 64
    assert (
        set(manifest["params"]) >= {"conv.weight", "bn.running_mean"}
        and not manifest["params"]["bn.running_var"]["trainable"]
    )
    assert manifest["data"]["eval"] == 6 and set(manifest["metrics"]) == {"accuracy", "macro_f1", "top3_accuracy"}
    code, report = check(tmp_path, "good", "--path", "torch")  # its exports: the assert_parity test
    assert code == 0
    torch_result = by_path(report)["torch"]
    assert torch_result["verdict"] == "pass" and len(torch_result["gradients"]) == 7  # 6 parameters and the input
    assert torch_result["metrics"]["ok"]

    build(tmp_path, "broken")
    code, report = check(tmp_path, "broken", "--path", "torch", "--path", "torch/onnx/ort")
    assert code == 1
    results = by_path(report)
    assert results["torch"]["verdict"] == "pass" and results["torch/onnx/ort"]["verdict"] == "fail"
    diagnosis = results["torch/onnx/ort"]["diagnosis"]
    assert diagnosis["first_divergent_tap"] == "act"
    assert diagnosis["links"]["enters_at"] == "converter"


def test_onnx_file_with_testdata_from_export_testdata_and_polygraphy_files(tmp_path):
    from parity.interop import onnx_test_data as interop
    from parity.interop import polygraphy

    init(tmp_path, "net", "--torch", f"{MODELS}:make_net", "--input", "x=2x3x8x8")
    build(tmp_path, "net")
    folder = tmp_path / "exported"
    result = invoke("export-testdata", "--workspace", str(tmp_path), "--model", "net", "--out", str(folder))
    assert result.exit_code == 0, result.output
    _export_onnx(folder / "model.onnx")
    (given,) = interop.read_test_data(folder)
    assert given.inputs["x"].shape == (2, 3, 8, 8) and given.outputs["output"].dtype == np.float32

    init(tmp_path, "from_testdata", "--onnx", str(folder / "model.onnx"), "--test-data", str(folder))
    manifest = build(tmp_path, "from_testdata")
    assert manifest["reference"]["outputs_from"].startswith("ONNX test data")
    assert manifest["reference"]["given_vs_reference_max_abs"] < 1e-5
    code, report = check(tmp_path, "from_testdata")
    assert code == 0 and {r["path"]: r["verdict"] for r in report["results"]} == {
        "onnx/ort": "pass",
        "onnx/ort-noopt": "pass",
        "onnx/onnxref": "pass",
        "onnx/openvino": "pass",
    }

    # the same inputs and outputs as Polygraphy would have saved them
    polygraphy.write_inputs(tmp_path / "inputs.json", [given.inputs])
    polygraphy.write_run_results(tmp_path / "outputs.json", "onnxrt-runner-N0", [given.outputs])
    init(
        tmp_path,
        "from_polygraphy",
        "--onnx",
        str(folder / "model.onnx"),
        "--polygraphy-inputs",
        str(tmp_path / "inputs.json"),
        "--polygraphy-outputs",
        str(tmp_path / "outputs.json"),
    )
    manifest = build(tmp_path, "from_polygraphy")
    assert manifest["reference"]["outputs_from"].startswith("Polygraphy")
    code, report = check(tmp_path, "from_polygraphy", "--path", "onnx/ort")
    assert code == 0, report


def _export_onnx(path):
    import torch

    from tests import usermodels

    torch.onnx.export(
        usermodels.make_net(),
        (torch.zeros(2, 3, 8, 8),),
        str(path),
        input_names=["x"],
        output_names=["output"],
        dynamo=True,
        external_data=False,
        verbose=False,
    )


@pytest.mark.slow  # five TensorFlow imports: about 30 s
def test_keras_model_saved_as_keras_file(tmp_path):
    import subprocess
    import sys

    script = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); from tests.usermodels import make_keras_model; "
        f"make_keras_model().save({str(tmp_path / 'user.keras')!r})"
    )
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True)
    init(tmp_path, "kmodel", "--keras", str(tmp_path / "user.keras"), "--input", "image=2x8x8x3")
    assert 'taps=("conv", "bn", "relu", "pool", "head")' in (tmp_path / "models" / "kmodel.py").read_text()
    manifest = build(tmp_path, "kmodel")
    assert manifest["reference"]["dtype"] == "float64", manifest["reference"]
    code, report = check(tmp_path, "kmodel", "--path", "tf", "--path", "tf/onnx/ort")
    assert code == 0 and all(r["verdict"] == "pass" for r in report["results"])


@pytest.mark.slow  # a second proof of a user's model through init, golden build and run (the Keras one is slow too);
# the fast set keeps test_torch_model_from_a_file_init_build_check_with_a_broken_export_named, a JAX function's init and
# golden build test_tree_jax.py's workspace, and run's timing test_check.py::test_gate_times_passing_paths_only
def test_jax_apply_function_with_its_params_file(tmp_path):
    from tests import usermodels

    usermodels.save_jax_params(tmp_path / "params.npz")
    init(tmp_path, "jmlp", "--jax", f"{MODELS}:jax_apply,{tmp_path / 'params.npz'}", "--input", "x=4x5")
    assert 'taps=("dense1",)' in (tmp_path / "models" / "jmlp.py").read_text()
    manifest = build(tmp_path, "jmlp")
    assert manifest["reference"]["dtype"] == "float64" and set(manifest["params"]) == {
        "dense1/kernel",
        "dense1/bias",
        "out/kernel",
        "out/bias",
    }
    assert "weights.npz" not in manifest["files"]
    result = invoke(
        "run",
        "--workspace",
        str(tmp_path),
        "--model",
        "jmlp",
        "--path",
        "jax",
        "--path",
        "jax/onnx/ort",
        "--budget",
        "0.1",
        "--json",
        "-",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{") :])
    for r in report["results"]:  # checked, then timed: batches and the first result in a fresh worker
        assert r["verdict"] == "pass" and r["timing"]["batches"]["4"]["verdict"] == "pass"
        assert "verdict" not in r["timing"]["first_result"], r["timing"]["first_result"]


def test_float32_only_model_falls_back_with_the_reason_and_wider_tolerances(tmp_path):
    init(tmp_path, "f32", "--torch", f"{MODELS}:make_float32_only_net", "--input", "x=4x6")
    manifest = build(tmp_path, "f32")
    reference = manifest["reference"]
    assert reference["dtype"] == "float32" and "float64" in reference["reason"]
    assert reference["tolerance_factor"] == 10
    assert manifest["tolerances"]["fp32"]["default"] == {"atol": pytest.approx(1e-3), "rtol": pytest.approx(1e-3)}
    code, report = check(tmp_path, "f32", "--path", "torch")
    assert code == 0 and report["results"][0]["verdict"] == "pass"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--torch", f"{MODELS}:make_failing_factory", "--input", "x=1x3x8x8"], "checkpoint weights.pt not found"),
        (["--torch", f"{MODELS}:make_net", "--input", "x=1x5x8x8"], "does not run on input 'x' of shape (1, 5, 8, 8)"),
        (["--torch", f"{MODELS}:no_such_function", "--input", "x=1x3x8x8"], "has no 'no_such_function'"),
        (["--torch", f"{MODELS}:make_net", "--input", "x=1by3"], "is not NAME=BATCHxDIMx"),
        (["--torch", f"{MODELS}:make_net", "--onnx", "m.onnx", "--input", "x=1x3"], "exactly one of"),
    ],
)
def test_init_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    result = invoke("init", "bad", "--workspace", str(tmp_path), *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "models" / "bad.py").exists()


def test_init_refuses_an_existing_spec_without_force(tmp_path):
    init(tmp_path, "net", "--torch", f"{MODELS}:make_net", "--input", "x=1x3x8x8")
    before = (tmp_path / "models" / "net.py").read_text()
    result = invoke(
        "init", "net", "--workspace", str(tmp_path), "--torch", f"{MODELS}:make_net", "--input", "x=2x3x8x8"
    )
    assert result.exit_code == 2 and "--force" in result.output
    assert (tmp_path / "models" / "net.py").read_text() == before
    init(tmp_path, "net", "--torch", f"{MODELS}:make_net", "--input", "x=2x3x8x8", "--force")
    assert "batch_size=2" in (tmp_path / "models" / "net.py").read_text()


def test_bad_onnx_files_and_mismatched_test_data(tmp_path):
    from parity.interop import onnx_test_data as interop

    (tmp_path / "garbage.onnx").write_bytes(b"not a model at all")
    result = invoke("init", "bad", "--workspace", str(tmp_path), "--onnx", str(tmp_path / "garbage.onnx"))
    assert result.exit_code == 2 and "not an ONNX model" in result.output

    model = _tiny_onnx(tmp_path / "tiny.onnx")
    interop.write_test_data(tmp_path / "data", {"x": np.zeros((1, 5), np.float32)}, {"y": np.zeros((1, 2), np.float32)})
    result = invoke(
        "init", "tiny", "--workspace", str(tmp_path), "--onnx", str(model), "--test-data", str(tmp_path / "data")
    )
    assert result.exit_code == 2 and "input 'x' has shape (1, 5)" in result.output

    init(tmp_path, "tiny", "--onnx", str(model), "--input", "x=2x4")
    build(tmp_path, "tiny")
    model.write_bytes(model.read_bytes()[:-9])  # the source file changed (here: broken) after its golden build
    code = invoke("check", "--workspace", str(tmp_path), "--model", "tiny")
    assert code.exit_code == 2 and "changed since the golden data was built" in code.output


def _tiny_onnx(path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(4, 2) / 8, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        [weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def test_assert_parity_passes_on_a_good_model_and_names_the_tap_on_a_broken_one():
    from parity.testing import assert_parity
    from tests import usermodels

    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    report = assert_parity(usermodels.make_net, x, paths=["torch/onnx/ort"], atol=1e-4, rtol=1e-4)
    assert [r["verdict"] for r in report["results"]] == ["pass"]
    with pytest.raises(AssertionError) as failure:
        assert_parity(usermodels.make_broken_export_net, x, paths=["torch/onnx/ort"])
    message = str(failure.value)
    assert "torch/onnx/ort" in message and "FAIL" in message and "first divergent tap: act" in message
    with pytest.raises(ValueError, match="module-level function"):
        assert_parity(lambda: None, x)


@pytest.mark.slow
def test_resnet18_sized_model_init_build_run(tmp_path):
    """A model of realistic size (ResNet-18, 11.2 M parameters, 224x224): init -> golden build -> run."""
    init(tmp_path, "resnet18", "--torch", f"{MODELS}:make_resnet18", "--input", "x=1x3x224x224")
    manifest = build(tmp_path, "resnet18")
    assert manifest["reference"]["dtype"] == "float64"
    assert manifest["params"]["fc.weight"]["shape"] == [10, 512] and "weights.npz" not in manifest["files"]
    result = invoke(
        "run",
        "--workspace",
        str(tmp_path),
        "--model",
        "resnet18",
        "--path",
        "torch",
        "--path",
        "torch/onnx/ort",
        "--budget",
        "0.5",
        "--json",
        "-",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{") :])
    assert all(r["verdict"] == "pass" and r["timing"]["batches"]["1"]["verdict"] == "pass" for r in report["results"])
