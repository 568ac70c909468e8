"""ONNX models past protobuf's 2 GiB keep their tensors in a data file beside the graph: written by every exporter,
read by every runtime, kept and verified by the export cache, cut into a self-contained reproducer. Proven on small
models with ``$PARITY_ONNX_EXTERNAL_BYTES`` lowered to 0, so every tensor over 1 KiB goes to the data file."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from parity.cli import cli
from tests.conftest import REPO

USER_MODELS = REPO / "tests" / "usermodels.py"
BUGS = REPO / "tests" / "converterbugs.py"


FACTORY = """
def make_mlp():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).eval()
"""


def _invoke(root, *args):
    return CliRunner().invoke(cli, [*map(str, args), "--workspace", str(root)], catch_exceptions=False)


@pytest.fixture
def external(tmp_path, monkeypatch):
    """A workspace under ``tmp_path`` with its own export cache (whose entries the test reads), every ONNX model
    written with external data."""
    monkeypatch.setenv("PARITY_ONNX_EXTERNAL_BYTES", "0")
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "ws"
    root.mkdir()
    return root


def _check(root, model, *paths, precision="fp32"):
    args = [arg for path in paths for arg in ("--path", path)]
    result = _invoke(root, "check", "--model", model, "--precision", precision, "--json", root / "r.json", *args)
    return result, {r["path"]: r for r in json.loads((root / "r.json").read_text())["results"]}


def _entries_with_data(root) -> list:
    return sorted(p.parent for p in (root.parent / "cache" / "exports").glob("*/model.onnx.data"))


@pytest.mark.slow  # a second proof of a model with external data on every ONNX runtime and in the export cache;
# the fast set keeps it in test_a_user_onnx_file_with_external_data_is_kept_with_it_as_the_artifact (its data file is
# in the entry's checksummed files: test_cache.py::test_truncated_export_is_detected_discarded_and_rebuilt), and
# test_diagnose_external.py::test_a_torch_model_exported_with_external_data_is_diagnosed_to_its_faulty_leaf_and_reproduced
def test_a_torch_model_exported_with_external_data_passes_on_every_onnx_runtime_and_its_cache_entry_verifies_the_data(
    external,
):
    (external / "mlp.py").write_text(FACTORY)
    made = _invoke(external, "init", "net", "--torch", f"{external / 'mlp.py'}:make_mlp", "--input", "x=2x32")
    assert made.exit_code == 0, made.output
    assert _invoke(external, "golden", "build", "--model", "net").exit_code == 0
    paths = ("torch/onnx/ort", "torch/onnx/onnxref", "torch/onnx/openvino", "torch/onnx/ort-int8dyn")
    result, by_path = _check(external, "net", *paths)
    verdicts = {path: r["verdict"] for path, r in by_path.items()}
    assert {p: verdicts[p] for p in paths[:3]} == dict.fromkeys(paths[:3], "pass"), result.output
    # int8 from a float model with external data: quantized and run (its gate cannot decide on 2 samples)
    assert by_path["torch/onnx/ort-int8dyn"]["outputs"], by_path["torch/onnx/ort-int8dyn"]["reason"]
    assert by_path["torch/onnx/ort-int8dyn"]["verdict"] in ("pass", "fail")
    result, by_path = _check(external, "net", "torch/onnx/ort", precision="fp16")
    assert by_path["torch/onnx/ort"]["verdict"] == "pass", result.output

    entries = _entries_with_data(external)
    import onnx

    records = {entry: json.loads((entry / "meta.json").read_text()) for entry in entries}
    kinds = {("float16" in r["artifact"]) + 2 * ("quantization" in r["artifact"]) for r in records.values()}
    assert kinds == {0, 1, 2}, records  # the float export, its float16 conversion, its int8 quantization
    torch_entry = next(
        e for e, r in records.items() if "float16" not in r["artifact"] and "quantization" not in r["artifact"]
    )
    assert all(set(r["files"]) == {"model.onnx", "model.onnx.data"} for r in records.values())
    bare = onnx.load(str(torch_entry / "model.onnx"), load_external_data=False)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in bare.graph.initializer)
    assert [i.name for i in bare.graph.input] == ["x"]  # named without loading the weights

    # a changed data file is never used: the entry is reported and exported again
    for entry in entries:
        data = entry / "model.onnx.data"
        raw = data.read_bytes()
        data.write_bytes(raw[:-1] + bytes([raw[-1] ^ 0x40]))
    result, by_path = _check(external, "net", "torch/onnx/ort", "torch/onnx/openvino")
    assert "model.onnx.data sha256 mismatch); exporting again" in result.output, result.output
    assert {r["verdict"] for r in by_path.values()} == {"pass"}
    # a missing one too
    (torch_entry / "model.onnx.data").unlink()
    result, by_path = _check(external, "net", "torch/onnx/ort")
    assert "model.onnx.data missing); exporting again" in result.output, result.output
    assert by_path["torch/onnx/ort"]["verdict"] == "pass"
    assert (torch_entry / "model.onnx.data").is_file()


def test_a_user_onnx_file_with_external_data_is_kept_with_it_as_the_artifact(external):
    import onnx
    import torch

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).eval()
    plain = external / "plain.onnx"
    torch.onnx.export(
        mlp,
        (torch.zeros(2, 32),),
        str(plain),
        input_names=["x"],
        output_names=["y"],
        dynamo=True,
    )
    (external / "m").mkdir()
    onnx.save_model(
        onnx.load(str(plain)),
        str(external / "m" / "net.onnx"),
        save_as_external_data=True,
        location="net.bin",
        size_threshold=0,
    )
    made = _invoke(external, "init", "net", "--onnx", external / "m" / "net.onnx")
    assert made.exit_code == 0, made.output
    assert _invoke(external, "golden", "build", "--model", "net").exit_code == 0
    result, by_path = _check(external, "net", "onnx/ort", "onnx/onnxref", "onnx/openvino")
    assert {p: r["verdict"] for p, r in by_path.items()} == dict.fromkeys(by_path, "pass"), result.output
    (entry,) = _entries_with_data(external)
    assert set(json.loads((entry / "meta.json").read_text())["files"]) == {"model.onnx", "model.onnx.data"}


@pytest.mark.slow  # a second proof of a self-contained reproducer of a model with external data; the fast set keeps
# test_diagnose_external.py::test_a_torch_model_exported_with_external_data_is_diagnosed_to_its_faulty_leaf_and_reproduced
def test_a_repro_of_a_model_with_external_data_is_one_self_contained_file(external, tmp_path):
    import onnx

    assert _invoke(external, "init", "logsig", "--torch", f"{BUGS}:make_logsigmoid", "--input", "x=2x8").exit_code == 0
    assert _invoke(external, "golden", "build", "--model", "logsig").exit_code == 0
    out = tmp_path / "bug"
    result = _invoke(external, "repro", "--model", "logsig", "--path", "torch/onnx/ort", "--out", out)
    assert result.exit_code == 0, result.output
    assert _entries_with_data(external), "the export kept its weights beside the graph"
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "model.onnx", "repro.py", "test_data_set_0"]
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert not [t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    script = subprocess.run([sys.executable, str(out / "repro.py")], capture_output=True, text=True, timeout=120)
    assert script.returncode == 1 and "the bug is present" in script.stdout, script.stdout + script.stderr


def test_a_cut_of_a_graph_loaded_without_its_data_reads_the_weights_it_keeps(tmp_path):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from parity.diagnose.graph.reduce import subgraph

    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal((16, 16)).astype(np.float32) for _ in range(2))
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="first"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("MatMul", ["r", "w2"], ["y"], name="second"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])],
        initializer=[numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0)
    bare = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    x = rng.standard_normal((2, 16)).astype(np.float32)
    r = np.maximum(x @ w1, 0)
    with pytest.raises(ValueError, match="'w2' lies in external data"):
        subgraph(bare, "y", {"r"}, {"x": x, "r": r, "y": r @ w2})
    cut, feed = subgraph(bare, "y", {"r"}, {"x": x, "r": r, "y": r @ w2}, base_dir=tmp_path)
    assert [t.name for t in cut.graph.initializer] == ["w2"]
    assert cut.graph.initializer[0].data_location == TensorProto.DEFAULT and not cut.graph.initializer[0].external_data
    assert bare.graph.initializer[1].data_location == TensorProto.EXTERNAL  # the model it was cut from is unchanged
    (got,) = ort.InferenceSession(cut.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    np.testing.assert_allclose(got, r @ w2, rtol=1e-5, atol=1e-5)
    (tmp_path / "m.data").write_bytes(b"")
    with pytest.raises(ValueError, match="'w2': its external data cannot be read"):
        subgraph(bare, "y", {"r"}, {"x": x, "r": r, "y": r @ w2}, base_dir=tmp_path)


def test_the_external_data_threshold_and_the_float16_conversion_past_it(tmp_path, monkeypatch):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from parity.exporters import common, onnx_fp16
    from parity.platform.errors import ExportError

    rng = np.random.default_rng(1)
    w = rng.standard_normal((32, 32)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Softmax", ["h"], ["y"], axis=-1)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = rng.standard_normal((2, 32)).astype(np.float32)

    monkeypatch.delenv(common.EXTERNAL_BYTES_ENV, raising=False)
    assert common.external_threshold() == common.LARGE_BYTES
    common.save_onnx(model, tmp_path)
    assert not (tmp_path / "model.onnx.data").exists() and common.external_files(tmp_path / "model.onnx") == []
    inline = onnx_fp16.convert(model)

    monkeypatch.setenv(common.EXTERNAL_BYTES_ENV, "0")
    assert common.large_file(tmp_path / "model.onnx")
    (tmp_path / "big").mkdir()
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    big = common.save_onnx(copy, tmp_path / "big", "big.onnx")
    assert common.external_files(big) == ["big.onnx.data"] and (big.parent / "big.onnx.data").stat().st_size >= w.nbytes
    # the converter's shape inference runs on the graph with its weights set aside: the same float16 model
    converted = onnx_fp16.convert(model)
    assert [(n.op_type, list(n.input)) for n in converted.graph.node] == [
        (n.op_type, list(n.input)) for n in inline.graph.node
    ]
    assert converted.graph.initializer[0].raw_data == inline.graph.initializer[0].raw_data
    assert model.graph.initializer[0].data_location == TensorProto.DEFAULT  # the weights are back where they were

    def run(m):
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]

    np.testing.assert_array_equal(run(converted), run(inline))

    for bad in ("lots", "-1", str(2**40)):
        monkeypatch.setenv(common.EXTERNAL_BYTES_ENV, bad)
        with pytest.raises(ExportError, match="PARITY_ONNX_EXTERNAL_BYTES must be a byte count"):
            common.external_threshold()
