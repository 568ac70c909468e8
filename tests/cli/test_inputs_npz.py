"""``parity init --inputs data.npz`` without ``--input``: the inputs' names, shapes and dtypes are the file's, checked
against the model's own inputs (torch ``forward``, an ONNX graph's inputs), refused in one line when they differ."""

from __future__ import annotations

import textwrap

import numpy as np
from click.testing import CliRunner

from parity.cli import cli

MODEL = """
    import torch

    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 3)

        def forward(self, input_ids, attention_mask, scale=1.0):
            hidden = self.embed(input_ids) * attention_mask.unsqueeze(-1).float()
            return self.head(hidden.mean(dim=1)) * scale

    def make():
        torch.manual_seed(0)
        return Tagger()
"""


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def token_data(path, **names):
    rng = np.random.default_rng(0)
    arrays = {"input_ids": rng.integers(0, 10, size=(4, 7)), "attention_mask": np.ones((4, 7), dtype=np.int64)}
    np.savez(path, **{names.get(key, key): value for key, value in arrays.items()})


def torch_init(root, data: str):
    (root / "tagger.py").write_text(textwrap.dedent(MODEL))
    return invoke("init", "tagger", "--workspace", root, "--torch", root / "tagger.py:make", "--inputs", root / data)


def test_inputs_named_after_forwards_parameters_come_from_the_file(tmp_path):
    token_data(tmp_path / "data.npz")
    result = torch_init(tmp_path, "data.npz")
    assert result.exit_code == 0, result.output
    spec = (tmp_path / "models" / "tagger.py").read_text()
    assert 'InputSpec("input_ids", (7,), layout="native", dtype="int64")' in spec
    assert 'InputSpec("attention_mask", (7,), layout="native", dtype="int64")' in spec and "batch_size=4" in spec
    assert invoke("golden", "build", "--workspace", tmp_path, "--model", "tagger").exit_code == 0
    result = invoke("check", "--workspace", tmp_path, "--model", "tagger", "--path", "torch")
    assert result.exit_code == 0, result.output


def test_arrays_named_otherwise_are_refused_naming_both(tmp_path):
    token_data(tmp_path / "data.npz", attention_mask="mask")
    result = torch_init(tmp_path, "data.npz")
    assert result.exit_code == 2
    message = result.output.strip()
    assert "\n" not in message and "Traceback" not in message
    assert "has input arrays input_ids, mask; forward of" in message
    assert "takes input_ids, attention_mask, scale (attention_mask required)" in message


def onnx_model(path):
    import onnx
    from onnx import TensorProto, helper

    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 3]) for name in ("a", "b")]
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["sum"])],
        "add",
        inputs,
        [helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["batch", 3])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


def test_an_onnx_graphs_inputs_take_their_shapes_from_the_file(tmp_path):
    onnx_model(tmp_path / "add.onnx")
    rng = np.random.default_rng(0)
    np.savez(
        tmp_path / "data.npz",
        b=rng.normal(size=(5, 3)).astype(np.float32),
        a=rng.normal(size=(5, 3)).astype(np.float32),
    )
    result = invoke(
        "init", "add", "--workspace", tmp_path, "--onnx", tmp_path / "add.onnx", "--inputs", tmp_path / "data.npz"
    )
    assert result.exit_code == 0, result.output
    spec = (tmp_path / "models" / "add.py").read_text()
    assert spec.index('InputSpec("a", (3,)') < spec.index('InputSpec("b", (3,)')  # the graph's order
    assert "batch_size=5" in spec
    assert invoke("golden", "build", "--workspace", tmp_path, "--model", "add").exit_code == 0
    result = invoke("check", "--workspace", tmp_path, "--model", "add", "--path", "onnx/ort")
    assert result.exit_code == 0 and "warning" not in result.output, result.output

    np.savez(tmp_path / "other.npz", a=np.zeros((5, 3), np.float32), c=np.zeros((5, 3), np.float32))
    result = invoke(
        "init", "add2", "--workspace", tmp_path, "--onnx", tmp_path / "add.onnx", "--inputs", tmp_path / "other.npz"
    )
    assert result.exit_code == 2
    assert "has input arrays a, c; the graph's inputs are a, b" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_declared_input_the_file_lacks_is_named_once(tmp_path):
    (tmp_path / "net.py").write_text("import torch\n\ndef make():\n    return torch.nn.Linear(6, 2)\n")
    np.savez(tmp_path / "data.npz", features=np.zeros((4, 6), np.float32))
    result = invoke(
        "init",
        "net",
        "--workspace",
        tmp_path,
        "--torch",
        tmp_path / "net.py:make",
        "--inputs",
        tmp_path / "data.npz",
        "--input",
        "x=4x6",
    )
    assert result.exit_code == 2
    assert "has no array 'x' (it has features)" in result.output and "or x" not in result.output
