"""The descent into an ONNX file's own tree when the file is the source: a nested torch model exported by torch.onnx
(dynamo), whose scores ONNX Runtime's optimiser fuses into an overflowing MatMul (a real runtime divergence, see
tests/converterbugs.py), is descended through init -> golden build -> check to the scope where the drift begins;
the unoptimised path shows no divergence at any level. The tree is read from torch.onnx's metadata, else from
``/``-scoped node names, else the nodes' outputs of a flat graph."""

from __future__ import annotations

import json

import onnx
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from parity.cli import cli
from parity.diagnose.graph import onnx_graph, onnx_taps
from parity.diagnose.tree import onnx_tree


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _nested():
    """embed -> blocks.0, blocks.1 (a ModuleList never called) -> attn (proj, gain 1e20, scores scaled by 1e-20 each
    side) -> head: ONNX Runtime's MatMulScaleFusion folds both scales into the MatMul, whose unscaled product
    overflows float32."""
    from tests.converterbugs import _modules

    _, Scale, Scores, _ = _modules()
    torch.manual_seed(0)

    class Mix(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.act = nn.Linear(16, 16), nn.Tanh()

        def forward(self, x):
            return x + self.act(self.fc(x))

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj, self.gain, self.scores = nn.Linear(16, 16), Scale(1e20, 16), Scores()

        def forward(self, x):
            return self.scores(self.gain(self.proj(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.blocks = nn.Linear(16, 16), nn.ModuleList([Mix(), Mix()])
            self.attn, self.head = Attn(), nn.Linear(25, 3)

        def forward(self, x):
            x = self.embed(x)
            for block in self.blocks:
                x = block(x)
            return self.head(self.attn(x).flatten(1))

    return Net().eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The nested model as torch.onnx (dynamo) writes it."""
    path = tmp_path_factory.mktemp("onnxtree") / "nested.onnx"
    torch.onnx.export(_nested(), (torch.randn(2, 5, 16),), dynamo=True, verbose=False).save(str(path))
    return path


def _named(model):
    """The file as the legacy exporter names its nodes (``/attn/scores/MatMul``), without torch.onnx's metadata."""
    for index, node in enumerate(model.graph.node):
        scopes = onnx_taps.torch_module_paths(node)
        parts = [scope.removeprefix(f"{outer}.") for outer, scope in zip(["", *scopes], scopes)]
        node.name = "/" + "/".join([*parts, f"{node.op_type}_{index}"])
        del node.metadata_props[:]
    return model


def _flat(model):
    """The file with neither metadata nor scoped node names."""
    for index, node in enumerate(model.graph.node):
        node.name = f"n{index}"
        del node.metadata_props[:]
    return model


def _diagnosed(root, path) -> tuple[dict, str]:
    result = _invoke("diagnose", "--workspace", root, "--model", "nested", "--path", path, "--json", root / "d.json")
    return json.loads((root / "d.json").read_text())["results"][0]["diagnosis"], result.output


@pytest.fixture(scope="module")
def root(tmp_path_factory, exported):
    root = tmp_path_factory.mktemp("onnxsource")
    assert _invoke("init", "nested", "--workspace", root, "--onnx", exported).exit_code == 0
    assert _invoke("golden", "build", "--workspace", root, "--model", "nested").exit_code == 0
    return root


def test_an_optimiser_overflow_in_an_onnx_source_is_descended_to_the_scope_where_it_begins(root, exported):
    result = _invoke(
        "check",
        "--workspace",
        root,
        "--model",
        "nested",
        "--path",
        "onnx/ort",
        "--path",
        "onnx/ort-noopt",
        "--json",
        "-",
    )
    verdicts = {r["path"]: r for r in json.loads(result.output[result.output.index("{") :])["results"]}
    assert verdicts["onnx/ort-noopt"]["verdict"] == "pass" and verdicts["onnx/ort"]["verdict"] == "fail"
    diagnosis = verdicts["onnx/ort"]["diagnosis"]
    tree = diagnosis["tree"]
    assert tree["descended"], tree
    assert diagnosis["first_divergent_path"] == ["attn", "attn.scores"] and tree["verdict"] == "leaf"
    top = tree["levels"][0]
    assert [r["tap"] for r in top["rows"]] == ["embed", "blocks.0", "blocks.1", "attn", "head"]
    assert all(r["stats"]["ok"] for r in top["rows"][:3]) and top["rows"][3]["input"]["ok"]
    leaf = tree["leaf"]
    assert leaf["class"] == "scope" and {op for _, op in leaf["nodes"]} == {"Mul", "Transpose", "MatMul"}
    assert leaf["input_tensor"] == "mul"  # attn.gain's output, which the scores read


def test_a_passing_onnx_source_path_departs_at_no_level(root):
    diagnosis, _ = _diagnosed(root, "onnx/ort-noopt")
    tree = diagnosis["tree"]
    assert tree["descended"] and diagnosis["first_divergent_path"] == [] and tree["verdict"] == "not_found"
    assert [r["tap"] for r in tree["levels"][0]["rows"]] == ["embed", "blocks.0", "blocks.1", "attn", "head"]
    assert all(level["first_divergent"] is None for level in tree["levels"])


def test_scopes_are_read_from_node_names_without_metadata_and_a_flat_graph_has_its_node_outputs(exported):
    model = onnx.load(str(exported))
    graph = onnx_graph._Graph(model)
    assert onnx_tree.scope_kind(graph) == onnx_tree.METADATA
    assert [(p, leaf) for p, _, leaf in onnx_tree.children(graph, onnx_tree.METADATA, "attn")] == [
        ("attn.proj", True),
        ("attn.gain", True),
        ("attn.scores", True),
    ]

    named = onnx_graph._Graph(_named(onnx.load(str(exported))))
    assert onnx_tree.scope_kind(named) == onnx_tree.NAMES
    top = onnx_tree.children(named, onnx_tree.NAMES, "")
    assert [(p, leaf) for p, _, leaf in top] == [
        ("embed", True),
        ("blocks.0", False),
        ("blocks.1", False),
        ("attn", False),
        ("head", True),
    ]
    inner = {p: nodes for p, nodes, _ in onnx_tree.children(named, onnx_tree.NAMES, "attn")}
    assert list(inner) == ["attn/proj", "attn/gain", "attn/scores"]
    assert onnx_tree.boundary(named, onnx_tree.NAMES, "attn/scores", inner["attn/scores"]) == "matmul"
    assert onnx_tree.input_of(model, named, inner["attn/scores"]) == "mul"
    # the path's side finds the same tensors in its copy of the file
    mapped, _ = onnx_tree.locate(model, named, ["attn/gain", "attn/scores", "attn/nothing"])
    assert mapped["attn/scores"]["tensor"] == "matmul" and mapped["attn/gain"]["tensor"] == "mul"
    assert mapped["attn/nothing"]["how"] == "unmapped" and "no scope" in mapped["attn/nothing"]["reason"]

    flat = onnx_graph._Graph(_flat(onnx.load(str(exported))))
    assert onnx_tree.scope_kind(flat) == onnx_tree.FLAT
    leaves = onnx_tree.children(flat, onnx_tree.FLAT, "")
    assert [p for p, _, _ in leaves] == flat.names and all(leaf for _, _, leaf in leaves)
    assert [flat.nodes[nodes[0]].op_type for p, nodes, _ in leaves if p == "matmul"] == ["MatMul"]
    assert onnx_tree.children(flat, onnx_tree.FLAT, "matmul") == []


@pytest.mark.parametrize("rewrite, trail", [(_named, ["attn", "attn/scores"]), (_flat, ["matmul"])])
def test_an_onnx_source_without_metadata_is_descended_by_its_names_else_its_node_outputs(
    tmp_path, exported, rewrite, trail
):
    path = tmp_path / "rewritten.onnx"
    onnx.save(rewrite(onnx.load(str(exported))), str(path))
    assert _invoke("init", "nested", "--workspace", tmp_path / "ws", "--onnx", path).exit_code == 0
    assert _invoke("golden", "build", "--workspace", tmp_path / "ws", "--model", "nested").exit_code == 0
    diagnosis, _ = _diagnosed(tmp_path / "ws", "onnx/ort")
    assert diagnosis["first_divergent_path"] == trail, diagnosis["tree"]
    rows = diagnosis["tree"]["levels"][-1]["rows"]
    assert all(r["stats"]["ok"] for r in rows[: [r["tap"] for r in rows].index(trail[-1])])
    assert diagnosis["tree"]["leaf"]["class"] == ("MatMul" if rewrite is _flat else "scope")
