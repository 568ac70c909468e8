"""A user's model with input parity does not take yet, or golden data it must not trust: one line and exit 2.

Scalar (0-d) inputs, given outputs off the inputs' batch (both from ONNX's own backend test data), a
golden manifest whose tolerance factor does not follow from how its reference was made, and declared
input shapes too large to allocate. ONNX sources only (no torch), except where init must refuse before
any framework starts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from parity.cli import cli
from tests.conftest import REPO, reseal

onnx = pytest.importorskip("onnx")
helper, numpy_helper, TensorProto = onnx.helper, onnx.numpy_helper, onnx.TensorProto

MODELS = REPO / "tests" / "usermodels.py"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def refused(result, *fragments) -> str:
    """The one error line of a refused command (exit 2, no traceback), checked to hold every fragment."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if not line.startswith("  ")]  # "  ..." is progress
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def _save(graph, path: Path, opset: int = 18) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9  # what the installed ONNX Runtime reads
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def _tiny(path: Path) -> Path:
    weight = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(4, 2) / 8, "w")
    return _save(
        helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"])],
            "tiny",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
            [weight],
        ),
        path,
    )


def _init_and_build(root: Path, name: str = "tiny") -> Path:
    result = invoke("init", name, "--workspace", root, "--onnx", _tiny(root / "tiny.onnx"), "--input", "x=2x4")
    assert result.exit_code == 0, result.output
    result = invoke("golden", "build", "--workspace", root, "--model", name)
    assert result.exit_code == 0, result.output
    return root / "golden" / name


# --------------------------------------------------------------------------- scalar inputs (ONNX's hannwindow)


def _hann_window(root: Path) -> tuple[Path, Path]:
    """ONNX's ``test_hannwindow`` case: a scalar int32 window size in, the window out; and its test data."""
    from parity.interop import onnx_test_data as interop

    model = _save(
        helper.make_graph(
            [helper.make_node("HannWindow", ["x"], ["y"])],
            "hann",
            [helper.make_tensor_value_info("x", TensorProto.INT32, [])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
        ),
        root / "hann.onnx",
        opset=17,
    )
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(10, dtype=np.float32) / 10)
    interop.write_test_data(root / "hann-data", {"x": np.int32(10)}, {"y": window.astype(np.float32)})
    return model, root / "hann-data"


def test_a_scalar_onnx_input_is_taken_without_a_batch_axis(tmp_path):
    """A graph input the graph fixes whole (here a 0-d window size) has no batch axis: parity assumes none."""
    model, data = _hann_window(tmp_path)
    result = invoke("init", "hann", "--workspace", tmp_path, "--onnx", model, "--test-data", data)
    assert result.exit_code == 0, result.output
    assert (
        'InputSpec("x", (), layout="native", dtype="int32", batched=False)'
        in (tmp_path / "models" / "hann.py").read_text()
    )
    assert invoke("golden", "build", "--workspace", tmp_path, "--model", "hann").exit_code == 0
    result = invoke("check", "--workspace", tmp_path, "--model", "hann", "--path", "onnx/ort")
    assert result.exit_code == 0, result.output


def test_a_scalar_integer_input_without_data_asks_for_its_values(tmp_path):
    model, _ = _hann_window(tmp_path)
    result = invoke("init", "hann", "--workspace", tmp_path, "--onnx", model)
    refused(result, "input 'x' is int32 and no embedding reads it directly")


def test_scalar_array_in_an_inputs_file_is_refused_at_init(tmp_path):
    np.savez(tmp_path / "data.npz", x=np.float32(1.0))
    result = invoke(
        "init", "net", "--workspace", tmp_path, "--torch", f"{MODELS}:make_net", "--inputs", tmp_path / "data.npz"
    )
    refused(result, "input 'x'", "scalar (shape ())")


# --------------------------------------------------------------------------- outputs off the batch (ONNX's sequence_model7)


def test_outputs_without_a_batch_axis_are_taken_when_the_graph_has_none(tmp_path):
    import onnx.backend.test

    source = Path(onnx.backend.test.__file__).parent / "data" / "simple" / "test_sequence_model7"
    shutil.copytree(source, tmp_path / "seq7")  # X (2, 3, 4) in; SequenceAt gives out (3, 4)
    result = invoke(
        "init",
        "seq",
        "--workspace",
        tmp_path,
        "--onnx",
        tmp_path / "seq7" / "model.onnx",
        "--test-data",
        tmp_path / "seq7",
    )
    assert result.exit_code == 0, result.output
    result = invoke("golden", "build", "--workspace", tmp_path, "--model", "seq")
    assert result.exit_code == 0, result.output
    result = invoke("check", "--workspace", tmp_path, "--model", "seq", "--path", "onnx/ort")
    assert result.exit_code == 0, result.output


# --------------------------------------------------------------------------- the tolerance factor is derived, never read


def _check(root: Path, name: str = "tiny"):
    return invoke("check", "--workspace", root, "--model", name, "--path", "onnx/onnxref")


def test_a_resealed_tolerance_factor_is_refused_not_a_pass(tmp_path):
    golden_dir = _init_and_build(tmp_path)
    reference = {k: v + 0.01 for k, v in np.load(golden_dir / "reference.npz").items()}
    reseal(golden_dir, "reference.npz", reference)  # golden outputs moved: a FAIL
    result = _check(tmp_path)
    assert result.exit_code == 1 and "FAIL" in result.stdout, result.output

    reseal(golden_dir, edit=lambda m: m["reference"].update(tolerance_factor=1e9))  # digest recomputed
    result = _check(tmp_path)
    assert result.exit_code in (1, 2) and " pass " not in result.stdout and "FAIL" not in result.stdout, result.output
    (line,) = [line for line in result.output.splitlines() if "tolerance_factor" in line]
    for fragment in (
        f"{golden_dir / 'manifest.json'}: reference.tolerance_factor is 1e+09",
        "float64 reference",
        "gives 1;",
        "parity golden build --model tiny",
    ):
        assert fragment in line, line
    assert line.startswith("tiny: ERROR")

    result = invoke("golden", "build", "--workspace", tmp_path, "--model", "tiny")  # the hint works
    assert result.exit_code == 0, result.output
    assert json.loads((golden_dir / "manifest.json").read_text())["reference"]["tolerance_factor"] == 1
    assert _check(tmp_path).exit_code == 0


@pytest.mark.parametrize(
    "edit, recorded, derived",
    [
        (lambda r: r.update(dtype="float32", tolerance_factor=1), "1", "10"),  # a float32 reference is widened
        # given outputs widen the atol by their measured distance, never by a factor
        (
            lambda r: r.update(
                outputs_from="ONNX test data in data", given_vs_reference_max_abs=1e-7, tolerance_factor=10
            ),
            "10",
            "1",
        ),
        (lambda r: r.update(tolerance_factor=10), "10", "1"),  # narrower is a disagreement too
    ],
    ids=["float32-reference", "given-outputs", "float64-widened"],
)
def test_the_factor_must_follow_from_the_recorded_reference(tmp_path, edit, recorded, derived):
    from parity.model.manifest import read
    from parity.model.user import checked_tolerance_factor
    from parity.platform.errors import GoldenError

    golden_dir = _init_and_build(tmp_path)
    manifest = read(golden_dir / "manifest.json")
    assert checked_tolerance_factor(manifest, golden_dir / "manifest.json") == 1
    edit(manifest["reference"])
    with pytest.raises(GoldenError, match=f"tolerance_factor is {recorded}, but .* gives {derived};"):
        checked_tolerance_factor(manifest, golden_dir / "manifest.json")


# --------------------------------------------------------------------------- declared shapes too large to allocate


def test_golden_build_refuses_a_huge_declared_shape_before_allocating(tmp_path):
    _init_and_build(tmp_path)
    spec_file = tmp_path / "models" / "tiny.py"
    text = spec_file.read_text()
    assert 'InputSpec("x", (4,)' in text and "batch_size=2," in text
    # 64 x 10^12 samples: drawn in float64, more than a 47-bit address space holds, so no machine allocates them
    spec_file.write_text(
        text.replace('InputSpec("x", (4,)', 'InputSpec("x", (1000000, 1000000)').replace(
            "batch_size=2,", "batch_size=64,"
        )
    )
    result = invoke("golden", "build", "--workspace", tmp_path, "--model", "tiny")
    line = refused(
        result,
        "tiny: golden build failed",
        "inputs and eval inputs of shape (64, 1000000, 1000000) float32",
        "would take 931.3 TiB",
        "parity refuses golden data over",
    )
    assert "GiB" in line.split("over")[1] and "available" in line


def test_init_refuses_a_huge_input_before_the_model_runs(tmp_path):
    result = invoke(
        "init", "net", "--workspace", tmp_path, "--torch", f"{MODELS}:make_net", "--input", "x=100000x100000x1000"
    )
    refused(result, "input 'x' of shape (100000, 100000, 1000) float32 would take 72.8 TiB", "refuses golden data over")
    assert not (tmp_path / "models" / "net.py").exists()


def test_the_worker_refuses_a_huge_sample_before_drawing_it(tmp_path):
    from parity.model.inspect import inspect_model
    from parity.model.user import UserModelError

    with pytest.raises(UserModelError, match=r"input 'x' of shape \(100000, 100000, 1000\) float32 would take"):
        inspect_model(
            "torch",
            f"{MODELS}:make_net",
            str(tmp_path),
            [{"name": "x", "shape": [100000, 100000, 1000], "dtype": "float32", "values": None}],
        )


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_thread_count_from_the_environment_that_is_not_one_or_more_is_refused(tmp_path, monkeypatch, value):
    from parity.platform.env import default_threads
    from parity.platform.errors import UsageError

    monkeypatch.setenv("PARITY_THREADS", value)
    result = invoke("check", "--model", "mlp", "--workspace", tmp_path)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"Invalid value for '--threads': PARITY_THREADS='{value}': give a thread count of 1 or more" in result.output
    with pytest.raises(UsageError, match=f"PARITY_THREADS='{value}': give a thread count of 1 or more"):
        default_threads()  # what init and the Python API read
    monkeypatch.setenv("PARITY_THREADS", "3")
    assert default_threads() == 3
