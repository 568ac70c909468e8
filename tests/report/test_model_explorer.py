"""A diagnosis's drift as Google Model Explorer node data (``parity.report.model_explorer``): on a real diagnosis of a
nested torch model whose ``blocks.5.norm`` departs in the export only, the node ids of ``drift.json`` are those
Model Explorer's ONNX adapter gives the exported graph, ``modules.json`` colours the nodes the descent located for each
module, the package's own dataclasses read the files, each folder replaces the last run's at once, and a folder that
cannot be written costs the run none of its other files. On ``tf/litert`` the keys are the ``.tflite`` file's tensor
names, which the built-in TFLite adapter matches."""

from __future__ import annotations

import dataclasses
import json
import os

import dacite
import onnx
import pytest
from click.testing import CliRunner
from model_explorer import node_data_builder as ndb
from model_explorer_onnx.main import ONNXAdapter
from onnx import TensorProto, helper

from parity.cli import cli
from parity.pipeline import node_data
from parity.report import model_explorer
from parity.run import paths
from tests.conftest import REPO
from tests.diagnose.tree import test_tree_litert as litert

NESTED = REPO / "tests" / "nestedmodels.py"
litert_workspace = litert.workspace  # the Keras models of the LiteRT tree's tests, built through init and golden build


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
    earlier = root / "out" / "d.model-explorer" / "stack" / "torch_onnx_ort"  # an earlier run's folder
    earlier.mkdir(parents=True)
    (earlier / "stale.json").write_text("{}")
    args = ["--workspace", root, "--model", "stack", "--path", "torch/onnx/ort", "--path", "torch"]
    result = _invoke("diagnose", *args, "--json", out, "--report", report)
    assert result.exit_code == 1, result.output
    assert "open in Model Explorer: model-explorer " in result.output
    results = {r["path"]: r for r in json.loads(out.read_text())["results"]}
    return results, root / "out" / "d.model-explorer", report, root


def _rows(diagnosis: dict) -> list[dict]:
    levels = diagnosis["tree"]["levels"]
    return [*diagnosis["taps"], *(row for level in levels for row in level["rows"])]


def _last_row(diagnosis: dict, module: str) -> dict:
    return [r for r in _rows(diagnosis) if r["tap"] == module][-1]


def _parsed(data: dict) -> ndb.GraphNodeData:
    """``data`` read by the package's own dataclasses (every field known, every type right), and written back by
    them to the same JSON."""
    graph = dacite.from_dict(ndb.GraphNodeData, data, config=dacite.Config(strict=True))
    written = json.loads(graph.to_json_string())  # the fields left out written with their defaults
    assert {key: written[key] for key in data} == data
    return graph


def test_drift_is_keyed_by_the_node_ids_model_explorer_gives_the_exported_graph(diagnosed):
    results, folder, _, _ = diagnosed
    result = results["torch/onnx/ort"]
    diagnosis, written = result["diagnosis"], folder / "stack" / "torch_onnx_ort"
    assert diagnosis["model_explorer"]["folder"] == str(written)
    # the earlier run's folder replaced whole; the graph linked from the export cache (one file system here)
    assert sorted(p.name for p in written.iterdir()) == ["drift.json", "model.onnx", "modules.json"]
    assert os.path.samefile(written / "model.onnx", diagnosis["graph"]["file"])
    assert diagnosis["model_explorer"]["graph"] == "linked"
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


def test_modules_colour_the_nodes_the_descent_located_for_each_module(diagnosed):
    results, folder, _, _ = diagnosed
    diagnosis = results["torch/onnx/ort"]["diagnosis"]
    written = folder / "stack" / "torch_onnx_ort"
    main = ONNXAdapter().convert(str(written / "model.onnx"), {})["graphs"][0]
    data = json.loads((written / "modules.json").read_text())
    assert list(data) == [main.id]
    values = {k: r.value for k, r in _parsed(data[main.id]).results.items()}
    assert values and set(values) <= {node.id for node in main.nodes}  # every key a node Model Explorer shows
    leaf = _last_row(diagnosis, "blocks.5.norm")
    assert leaf["nodes"] and all(values[name] > 1.0 for name, _ in leaf["nodes"])  # the departing leaf: red
    assert values[leaf["nodes"][0][0]] == pytest.approx(leaf["stats"]["tol_units"], rel=1e-12)
    clean = _last_row(diagnosis, "blocks.4")  # a block before it: its nodes within tolerance
    assert clean["nodes"] and all(values[name] <= 1.0 for name, _ in clean["nodes"])
    # the native path has no graph Model Explorer reads: no folder, nothing promised in its JSON
    assert not (folder / "stack" / "torch").exists() and "model_explorer" not in (results["torch"]["diagnosis"] or {})


def test_check_reads_no_graph_node_ids_without_node_data(diagnosed):
    _, _, _, root = diagnosed
    out = root / "check.json"
    result = _invoke("check", "--workspace", root, "--model", "stack", "--path", "torch/onnx/ort", "--json", out)
    assert result.exit_code == 1, result.output
    diagnosis = json.loads(out.read_text())["results"][0]["diagnosis"]
    assert diagnosis["tree"]["levels"] and "graph" not in diagnosis and "model_explorer" not in diagnosis


def test_a_node_data_folder_that_cannot_be_written_keeps_the_json_and_the_report(diagnosed):
    _, _, _, root = diagnosed
    explorer, out, report = root / "blocked", root / "blocked.json", root / "blocked-report"
    explorer.mkdir()
    (explorer / "stack").write_text("")  # the model's folder cannot be made: a file holds its name
    args = ["--workspace", root, "--model", "stack", "--path", "torch/onnx/ort", "--json", out, "--report", report]
    result = _invoke("diagnose", *args, "--model-explorer", explorer)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--model-explorer could not be written after the run: " in result.output
    diagnosis = json.loads(out.read_text())["results"][0]["diagnosis"]
    assert diagnosis["tree"]["levels"] and "could not be written" in diagnosis["model_explorer"]["error"]
    assert "could not be written" in (report / "index.html").read_text()


def test_a_graph_that_cannot_be_read_leaves_the_diagnosis_with_a_note():
    class FullDisk:  # the orchestrator's export cache, failing as a full disk does
        def _export(self, *args):
            raise OSError(28, "No space left on device")

    diagnosis = {"path": "torch/onnx/ort", "taps": [{"tap": "a", "tensor": "t", "stats": {"tol_units": 2.0}}]}
    node_data.locate(FullDisk(), None, None, None, paths.by_id("torch/onnx/ort"), diagnosis)
    assert "graph" not in diagnosis and diagnosis["taps"][0]["stats"] == {"tol_units": 2.0}
    assert diagnosis["notes"] == [
        "the exported graph's node ids could not be read: OSError: [Errno 28] No space left on device"
    ]


def test_the_html_report_links_the_folder_with_the_command_that_opens_it(diagnosed):
    results, _, report, _ = diagnosed
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
    found = model_explorer.graph_ids(str(path), ["y", "z"], ["first"])
    shown = ONNXAdapter().convert(str(path), {})["graphs"][0]
    assert found["name"] == shown.id == "<main>"
    assert set(found["nodes"].values()) <= {n.id for n in shown.nodes}
    assert found["nodes"] == {"y": "first", "z": "node"} and found["outputs"] == ["z"]
    assert found["ids"] == {"first": "first"}


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
        "graph": {"format": "onnx", "name": "g", "nodes": {"t": "n"}, "outputs": {}},
    }
    data = json.loads(json.dumps(model_explorer.node_data(diagnosis), allow_nan=False))
    assert data["g"]["results"] == {"n": {"value": model_explorer.LARGEST}}
    assert dataclasses.asdict(_parsed(data["g"]))["results"]["n"]["value"] > 1.0


@pytest.mark.slow  # about 20 s: two Keras models built, exported and diagnosed
def test_a_litert_diagnosis_is_drawn_on_its_tflite_file_keyed_by_tensor_name(litert_workspace, tmp_path):
    from model_explorer.builtin_tflite_flatbuffer_adapter import BuiltinTfliteFlatbufferAdapter

    explorer, out = tmp_path / "explorer", tmp_path / "d.json"
    args = ["--workspace", litert_workspace.root, "--model", litert.FAULTY, "--path", "tf/litert", "--json", out]
    result = _invoke("diagnose", *args, "--model-explorer", explorer)
    assert result.exit_code == 1, result.output
    diagnosis = json.loads(out.read_text())["results"][0]["diagnosis"]
    written = explorer / litert.FAULTY / "tf_litert"
    assert sorted(p.name for p in written.iterdir()) == ["drift.json", "model.tflite", "modules.json"]
    assert "--extensions" not in diagnosis["model_explorer"]["command"]  # the built-in adapter reads .tflite
    graphs = BuiltinTfliteFlatbufferAdapter().convert(str(written / "model.tflite"), {})["graphCollections"]
    nodes = [n for graph in graphs[0].graphs for n in graph["nodes"]]
    names = {a["value"] for n in nodes for m in n["outputsMetadata"] for a in m["attrs"] if a["key"] == "tensor_name"}
    drift = {k: r.value for k, r in _parsed(json.loads((written / "drift.json").read_text())).results.items()}
    modules = {k: r.value for k, r in _parsed(json.loads((written / "modules.json").read_text())).results.items()}
    assert drift and set(drift) <= names and modules and set(modules) <= names  # each key a node's tensor_name
    leaf = _last_row(diagnosis, litert.LEAF)
    assert drift[leaf["tensor"]] == pytest.approx(leaf["stats"]["tol_units"], rel=1e-12) and drift[leaf["tensor"]] > 1
    assert all(modules[name] > 1.0 for name, _ in leaf["nodes"])
    proj = _last_row(diagnosis, "proj")  # before the leaf: within tolerance
    assert drift[proj["tensor"]] <= 1.0 and all(modules[name] <= 1.0 for name, _ in proj["nodes"])
