"""A diagnosis's drift as Google Model Explorer node data (``parity.report.model_explorer``): on a real diagnosis of a
nested torch model whose ``blocks.5.norm`` departs in the export only, the node ids of ``drift.json`` are those
Model Explorer's ONNX adapter gives the exported graph, the values are the diagnosis's drift, the package's own
dataclasses read the files, and the passing path's file has no red node."""

from __future__ import annotations

import dataclasses
import json

import dacite
import onnx
import pytest
from click.testing import CliRunner
from model_explorer import node_data_builder as ndb
from model_explorer_onnx.main import ONNXAdapter
from onnx import TensorProto, helper

from parity.cli import cli
from parity.report import model_explorer
from tests.conftest import REPO

NESTED = REPO / "tests" / "nestedmodels.py"


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory):
    """The residual stack through init and golden build, then ``diagnose`` of torch/onnx/ort (failing) and torch
    (passing) with --json and --report: the result JSON by path, and the folders."""
    root = tmp_path_factory.mktemp("explorer")
    made = _invoke(
        "init", "stack", "--workspace", root, "--torch", f"{NESTED}:make_residual_stack", "--input", "x=2x16"
    )
    assert made.exit_code == 0, made.output
    assert _invoke("golden", "build", "--workspace", root, "--model", "stack").exit_code == 0
    out, report = root / "out" / "d.json", root / "report"
    out.parent.mkdir()
    args = ["--workspace", root, "--model", "stack", "--path", "torch/onnx/ort", "--path", "torch"]
    result = _invoke("diagnose", *args, "--json", out, "--report", report)
    assert result.exit_code == 1, result.output
    assert "open in Model Explorer: model-explorer " in result.output
    results = {r["path"]: r for r in json.loads(out.read_text())["results"]}
    return results, root / "out" / "d.model-explorer", report


def _rows(diagnosis: dict) -> list[dict]:
    levels = diagnosis["tree"]["levels"]
    return [*diagnosis["taps"], *(row for level in levels for row in level["rows"])]


def _parsed(data: dict) -> ndb.GraphNodeData:
    """``data`` read by the package's own dataclasses (every field known, every type right), and written back by
    them to the same JSON."""
    graph = dacite.from_dict(ndb.GraphNodeData, data, config=dacite.Config(strict=True))
    written = json.loads(graph.to_json_string())  # the fields left out written with their defaults
    assert {key: written[key] for key in data} == data
    return graph


def test_drift_is_keyed_by_the_node_ids_model_explorer_gives_the_exported_graph(diagnosed):
    results, folder, _ = diagnosed
    result = results["torch/onnx/ort"]
    diagnosis, written = result["diagnosis"], folder / "stack" / "torch_onnx_ort"
    assert diagnosis["model_explorer"]["folder"] == str(written)
    assert diagnosis["first_divergent_path"][-1] == "blocks.5.norm"
    data = json.loads((written / "drift.json").read_text())
    graphs = ONNXAdapter().convert(str(written / "model.onnx"), {})["graphs"]
    main = graphs[0]
    assert list(data) == [main.id]  # one graph, by the adapter's own id
    results_by_node = data[main.id]["results"]
    ids = {node.id for node in main.nodes}
    assert results_by_node and set(results_by_node) <= ids
    # each compared tensor's producer carries that row's drift (a tensor compared again deeper: the deeper row's)
    producers = {o: n.name for n in onnx.load(str(written / "model.onnx")).graph.node for o in n.output}
    expected = {}
    for row in _rows(diagnosis):
        if row.get("tensor") and row["stats"] is not None and row["stats"].get("tol_units") is not None:
            expected[producers[row["tensor"]]] = row["stats"]["tol_units"]
    for name, stats in result["outputs"].items():
        expected[f"[value] {name}"] = stats["tol_units"]
    assert {k: v["value"] for k, v in results_by_node.items()} == pytest.approx(expected, rel=1e-12)
    # the leaf's node is red, and every node compared before it (its parents' earlier children) is not
    leaf = next(r for r in diagnosis["tree"]["levels"][-1]["rows"] if r["tap"] == "blocks.5.norm")
    assert results_by_node[producers[leaf["tensor"]]]["value"] > 1.0
    first = diagnosis["tree"]["levels"][0]
    before = [r for r in first["rows"][: [r["tap"] for r in first["rows"]].index("blocks")] if r.get("tensor")]
    assert before and all(results_by_node[producers[r["tensor"]]]["value"] <= 1.0 for r in before)
    graph = _parsed(data[main.id])
    model = ndb.ModelNodeData(graphsData={main.id: graph})
    assert json.loads(model.to_json_string())[main.id]["results"] == data[main.id]["results"]
    colours = [(t.value, t.bgColor) for t in graph.thresholds]
    assert [v for v, _ in colours] == [0.5, 1.0, model_explorer.LARGEST] and len({c for _, c in colours}) == 3


def test_modules_are_keyed_by_the_models_own_paths_and_the_passing_path_has_no_red_one(diagnosed):
    results, folder, _ = diagnosed
    failing = json.loads((folder / "stack" / "torch_onnx_ort" / "modules.json").read_text())
    graph = _parsed(failing)
    values = {k: r.value for k, r in graph.results.items()}
    for path in ("blocks", "blocks.5", "blocks.5.norm"):
        row = [r for r in _rows(results["torch/onnx/ort"]["diagnosis"]) if r["tap"] == path][-1]
        assert values[path] == pytest.approx(row["stats"]["tol_units"], rel=1e-12) and values[path] > 1.0
    assert values["blocks.4"] <= 1.0
    passing = folder / "stack" / "torch"
    assert sorted(p.name for p in passing.iterdir()) == ["modules.json"]  # no ONNX graph on the native path
    clean = _parsed(json.loads((passing / "modules.json").read_text()))
    assert clean.results and all(r.value <= 1.0 for r in clean.results.values())
    assert {"proj", "blocks", "head"} <= set(clean.results)  # the tree's top level, where a passing descent stops


def test_the_html_report_links_the_folder_with_the_command_that_opens_it(diagnosed):
    results, _, report = diagnosed
    page = (report / "index.html").read_text()
    assert 'href="../out/d.model-explorer/stack/torch_onnx_ort/"' in page
    command = results["torch/onnx/ort"]["diagnosis"]["model_explorer"]["command"]
    assert "--node_data_paths=" in command and command in page


def test_unnamed_nodes_and_graphs_get_the_adapters_ids(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="first"), helper.make_node("Neg", ["y"], ["z"])]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "", [value("x", TensorProto.FLOAT, [2])], [value("z", TensorProto.FLOAT, [2])])
    graph.ClearField("name")
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    found = model_explorer.graph_ids(str(path), ["y", "z"])
    shown = ONNXAdapter().convert(str(path), {})["graphs"][0]
    assert found["name"] == shown.id == "<main>"
    assert set(found["nodes"].values()) <= {n.id for n in shown.nodes}
    assert found["nodes"] == {"y": "first", "z": "node"} and found["outputs"] == ["z"]


def test_a_model_explorer_target_that_is_a_file_is_refused_before_any_work(workspace_copy, tmp_path):
    root = workspace_copy()
    blocker = tmp_path / "taken"
    blocker.write_text("")
    result = _invoke("diagnose", "--workspace", root, "--path", "torch", "--model-explorer", blocker)
    assert result.exit_code == 2 and "--model-explorer" in result.output and "Traceback" not in result.output


def test_non_finite_drift_is_red_and_valid_json():
    diagnosis = {
        "path": "p",
        "taps": [
            {"tap": "a", "tensor": "t", "stats": {"ok": False, "nonfinite": 3, "size": 4}},
            {"tap": "b", "tensor": None, "stats": None},
        ],
        "tree": {"levels": []},
        "graph": {"name": "g", "nodes": {"t": "n"}, "outputs": {}},
    }
    data = json.loads(json.dumps(model_explorer.node_data(diagnosis), allow_nan=False))
    assert data["g"]["results"] == {"n": {"value": model_explorer.LARGEST}}
    assert dataclasses.asdict(_parsed(data["g"]))["results"]["n"]["value"] > 1.0
