"""Graph names in the ONNX files parity writes: a model's output keys never collide with a tensor the graph already
names, and every export passes the full ONNX checker (an export it refuses is the converter's error)."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from parity.cli import cli
from parity.exporters.onnx_names import check_exported, name_graph
from parity.model.workspace import Workspace
from parity.platform.errors import ExportError
from tests.conftest import REPO, worker_pool


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def through(root: Path, name: str, source: str, reference: str, *init_args, paths=(), precision=None) -> dict:
    """``init``, ``golden build`` and ``check`` of a user model in ``root``: the results by path."""
    result = invoke("init", name, "--workspace", root, source, reference, *init_args)
    assert result.exit_code == 0, result.output
    result = invoke("golden", "build", "--workspace", root, "--model", name)
    assert result.exit_code == 0, result.output
    extra = [a for p in paths for a in ("--path", p)] + (["--precision", precision] if precision else [])
    result = invoke("check", "--workspace", root, "--model", name, "--json", root / "r.json", *extra)
    return {r["path"]: r for r in json.loads((root / "r.json").read_text())["results"]}


def exported_graphs(root: Path, model: str, path_ids, precision: str = "fp32") -> dict:
    """Path id -> the ONNX graph its last export step wrote (from the export cache: the checks made them), after
    the full checker; an export that failed gives its reason instead."""
    from parity.golden import store as golden
    from parity.pipeline import orchestrate
    from parity.run import paths

    workspace = Workspace(root)
    spec = workspace.load_spec(model)
    manifest = golden.verify(workspace.golden_dir(model), spec)
    run = orchestrate.Run(workspace, orchestrate.Options(threads=1))
    graphs = {}
    with worker_pool() as pool:
        for path_id in path_ids:
            path = paths.by_id(path_id, "cpu", precision)
            entry = run._export(pool, spec, manifest, path, len(path.exports) - 1)
            if "error" in entry:
                graphs[path_id] = entry["error"]
                continue
            file = Path(entry["dir"]) / entry["meta"]["file"]
            check_exported(file)
            graphs[path_id] = onnx.load(str(file)).graph
    return graphs


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """An empty folder, the current one, as a user's project would be."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def verdicts(results: dict) -> dict:
    return {path: (r["verdict"], r["reason"]) for path, r in results.items()}


EMBEDDING = """
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embedding = torch.nn.Embedding(10, 4)
            self.norm = torch.nn.LayerNorm(4)
            self.head = torch.nn.Linear(4, 2)

        def forward(self, ids):
            h = self.norm(self.embedding(ids))
            return {"score": self.head(h).mean(1), "embedding": h, "hidden": h}

    def make():
        return Encoder()
"""


def test_a_dict_key_named_like_an_inner_tensor_is_exported_and_runs_on_ort(workspace):
    """torch.onnx writes the embedding lookup as a tensor ``embedding``; the key ``embedding`` (a later tensor) and
    ``hidden`` (the same tensor again) must name the outputs without a second definition of either name."""
    (workspace / "enc.py").write_text(textwrap.dedent(EMBEDDING))
    results = through(
        workspace,
        "enc",
        "--torch",
        "enc.py:make",
        "--input",
        "ids=2x3:int64:10",
        paths=("torch", "torch/onnx/ort", "torch/onnx/onnxref"),
    )
    assert verdicts(results) == dict.fromkeys(("torch", "torch/onnx/ort", "torch/onnx/onnxref"), ("pass", None))
    graph = exported_graphs(workspace, "enc", ["torch/onnx/ort"])["torch/onnx/ort"]
    assert [o.name for o in graph.output] == ["score", "embedding", "hidden"]
    assert [i.name for i in graph.input if i.name not in {t.name for t in graph.initializer}] == ["ids"]


KERAS = """
    import keras

    def save(path):
        keras.utils.set_random_seed(0)
        x = keras.Input((3,), name="x")
        h = keras.layers.Dense(4, name="dense")(x)
        keras.Model(x, {"Identity_1:0": keras.layers.Dense(2, name="head")(h), "Identity_2:0": h}).save(path)
"""


@pytest.mark.slow
def test_keras_output_keys_named_like_the_converters_own_tensors(workspace):
    """tf2onnx calls a function's outputs ``Identity:0``, ``Identity_1:0``: keys that are those names, one place
    along, are given without two tensors sharing one."""
    (workspace / "k.py").write_text(textwrap.dedent(KERAS))
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", "import k; k.save('k.keras')"], cwd=workspace, check=True)
    results = through(
        workspace,
        "k",
        "--keras",
        workspace / "k.keras",
        "--input",
        "x=2x3",
        paths=("tf", "tf/onnx/ort", "tf/onnx/onnxref"),
    )
    assert verdicts(results) == dict.fromkeys(("tf", "tf/onnx/ort", "tf/onnx/onnxref"), ("pass", None))
    assert [o.name for o in exported_graphs(workspace, "k", ["tf/onnx/ort"])["tf/onnx/ort"].output] == [
        "Identity_1:0",
        "Identity_2:0",
    ]


JAX = """
    import numpy as np

    def save_params(path):
        np.savez(path, **{"dense/kernel": np.random.default_rng(0).normal(size=(3, 4)).astype("float32")})

    def apply(params, x):
        import jax.numpy as jnp

        h = jnp.tanh(x @ params["dense"]["kernel"])
        return {"logits": h * 2.0, "hidden": h, "features": h}
"""


@pytest.mark.slow
def test_jax_returning_one_array_under_two_keys(workspace):
    """jax2onnx refuses two names for one value; parity writes the second through an ``Identity``."""
    (workspace / "j.py").write_text(textwrap.dedent(JAX))
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", "import j; j.save_params('p.npz')"], cwd=workspace, check=True)
    results = through(
        workspace,
        "j",
        "--jax",
        "j.py:apply,p.npz",
        "--input",
        "x=2x3",
        paths=("jax", "jax/onnx/ort", "jax/onnx/onnxref"),
    )
    assert verdicts(results) == dict.fromkeys(("jax", "jax/onnx/ort", "jax/onnx/onnxref"), ("pass", None))
    assert [o.name for o in exported_graphs(workspace, "j", ["jax/onnx/ort"])["jax/onnx/ort"].output] == [
        "logits",
        "hidden",
        "features",
    ]


def _onnx_file(path: Path) -> None:
    """``y = relu(x @ w) + b``, whose ``MatMul`` node is called ``head`` and whose inner tensor is called
    ``head_cast_to_y``: the name the float16 conversion gives the cast it puts before the output ``y``."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["head_cast_to_y"], name="mm"),
        helper.make_node("Relu", ["head_cast_to_y"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "b"], ["y"], name="head"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        [
            numpy_helper.from_array(rng.normal(size=(3, 2)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.normal(size=(2,)).astype(np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    onnx.save_model(model, str(path))


def test_an_onnx_file_whose_output_name_the_float16_conversion_would_reuse(workspace):
    """The float16 conversion names the cast before output ``y`` ``<node>_cast_to_y``; a file that already has a
    tensor of that name converts, passes the checker and runs on ONNX Runtime."""
    _onnx_file(workspace / "f.onnx")
    results = through(
        workspace,
        "f",
        "--onnx",
        workspace / "f.onnx",
        "--input",
        "x=2x3",
        paths=("onnx/ort", "onnx/onnxref"),
        precision="fp16",
    )
    assert {p: v for p, (v, _) in verdicts(results).items()} == {"onnx/ort": "pass", "onnx/onnxref": "pass"}, verdicts(
        results
    )
    graph = exported_graphs(workspace, "f", ["onnx/ort"], "fp16")["onnx/ort"]
    assert [o.name for o in graph.output] == ["y"]


def test_renaming_moves_the_inner_tensor_and_copies_inputs_and_shared_outputs():
    """The renaming itself, on small graphs: an output named like an inner tensor, a swap of two outputs' names, a
    graph input passed through as an output, and a name given twice (refused)."""
    from onnx import TensorProto, helper

    def graph(outputs):
        nodes = [helper.make_node("Relu", ["in_0"], ["a"]), helper.make_node("Neg", ["a"], ["b"])]
        return helper.make_model(
            helper.make_graph(
                nodes,
                "g",
                [helper.make_tensor_value_info("in_0", TensorProto.FLOAT, [2])],
                [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2]) for name in outputs],
            )
        )

    def run(model):
        from onnx.reference import ReferenceEvaluator

        onnx.checker.check_model(model, full_check=True)
        x = np.array([-1.0, 2.0], np.float32)
        return dict(zip([o.name for o in model.graph.output], ReferenceEvaluator(model).run(None, {"x": x})))

    model = graph(["b"])
    name_graph(model, ["x"], ["a"])  # the output takes the inner tensor's name
    assert run(model)["a"].tolist() == [-0.0, -2.0]
    model = graph(["a", "b"])
    name_graph(model, ["x"], ["b", "a"])  # swapped
    assert {k: v.tolist() for k, v in run(model).items()} == {"b": [0.0, 2.0], "a": [-0.0, -2.0]}
    model = graph(["in_0", "b", "b"])
    name_graph(model, ["x"], ["echo", "first", "second"])  # an input passed through, one tensor twice
    assert {k: v.tolist() for k, v in run(model).items()} == {
        "echo": [-1.0, 2.0],
        "first": [-0.0, -2.0],
        "second": [-0.0, -2.0],
    }
    with pytest.raises(ExportError, match="input and an output 'x'"):
        name_graph(graph(["b"]), ["x"], ["x"])


def test_a_graph_the_checker_refuses_is_an_export_error_with_its_message(workspace):
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])]
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        )
    )
    onnx.save_model(model, str(workspace / "m.onnx"))
    with pytest.raises(ExportError, match=r"fails the ONNX checker: .*y"):
        check_exported(workspace / "m.onnx")


ZOO = ("mlp", "cnn", "transformer")
ZOO_EXPORTS = ("torch/onnx/ort", "tf/onnx/ort", "jax/onnx/ort")


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("model", ["mlp", *(pytest.param(m, marks=pytest.mark.slow) for m in ZOO[1:])])
def test_every_zoo_export_passes_the_full_checker(model, precision):
    """Every ONNX file the zoo's paths export (torch.onnx, tf2onnx, jax2onnx; the float16 conversion of each) passes
    ``onnx.checker.check_model(full_check=True)`` and names its outputs by the spec; only a converter limit the
    spec declares (Keras' gelu as ``Erfc`` in tf2onnx) leaves a path without an export."""
    spec = Workspace(REPO).load_spec(model)
    for path_id, graph in exported_graphs(REPO, model, ZOO_EXPORTS, precision).items():
        if isinstance(graph, str):
            assert "checker" not in graph and spec.expected_error(path_id), (path_id, graph)
            continue
        assert [o.name for o in graph.output] == list(spec.outputs), path_id


REAL = {
    "bert": (
        "make_bert",
        "--input",
        "input_ids=2,sequence:int64",
        "--input",
        "attention_mask=2,sequence:int64",
        "--input",
        "token_type_ids=2,sequence:int64",
        "--axis",
        "sequence=16",
    ),
    "gpt2": ("make_gpt2", "--input", "input_ids=2x16:int64", "--input", "attention_mask=2x16:int64"),
    "resnet": ("make_hf_resnet18", "--input", "pixel_values=2x3x64x64"),
    "mobilenet": ("make_hf_mobilenet_v2", "--input", "pixel_values=2x3x96x96"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REAL))
def test_every_real_model_export_passes_the_full_checker(workspace, name):
    """The real architectures of ``tests/realmodels.py`` through torch.onnx and its float16 conversion: each export
    passes the full checker with the outputs named by the model's keys."""
    shutil.copy(REPO / "tests" / "realmodels.py", workspace / "realmodels.py")
    factory, *init_args = REAL[name]
    through(workspace, name, "--torch", f"realmodels.py:{factory}", *init_args, paths=("torch/onnx/ort",))
    spec = Workspace(workspace).load_spec(name)
    for precision in ("fp32", "fp16"):
        (graph,) = exported_graphs(workspace, name, ["torch/onnx/ort"], precision).values()
        assert not isinstance(graph, str), (precision, graph)
        assert [o.name for o in graph.output] == list(spec.outputs), precision


def test_an_output_that_inner_nodes_read_stays_float16_inside_the_float16_graph():
    """onnxconverter-common casts a graph output back to float32 under the output's own name, so a node that reads
    the output (BERT's pooler reads ``last_hidden_state``) got float32 in a float16 graph: the checker and ONNX
    Runtime refused the file. The output gets an ``Identity`` of its own before the conversion."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from parity.exporters.onnx_fp16 import convert

    weight = numpy_helper.from_array(np.eye(3, dtype=np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["hidden"], name="mm"),
            helper.make_node("Gather", ["hidden", "zero"], ["first"], name="select", axis=1),
            helper.make_node("Gemm", ["first", "w"], ["pooled"], name="pool"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [
            helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [2, 3]),
        ],
        [weight, numpy_helper.from_array(np.array([2, 0, 1], dtype=np.int64), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    model = onnx.shape_inference.infer_shapes(model)
    converted = convert(model)
    onnx.checker.check_model(converted, full_check=True)
    assert [o.name for o in converted.graph.output] == ["hidden", "pooled"]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    hidden, pooled = ort.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    np.testing.assert_allclose(hidden, x, rtol=1e-3)
    np.testing.assert_allclose(pooled, x[:, [2, 0, 1]], rtol=1e-3)
