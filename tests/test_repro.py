"""``parity repro``: a failing path reduced to a few nodes that still fail on the whole input set, written as a bug
report whose repro.py exits 1 while the bug is present and 0 once fixed; bad input in one line each."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from parity.cli import cli
from tests.conftest import REPO

BUGS = REPO / "tests" / "converterbugs.py"


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _script(folder):
    return subprocess.run([sys.executable, str(folder / "repro.py")], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def logsig(tmp_path_factory):
    root = tmp_path_factory.mktemp("repro")
    assert _invoke("init", "logsig", "--workspace", root, "--torch", f"{BUGS}:make_logsigmoid",
                   "--input", "x=2x8").exit_code == 0
    assert _invoke("golden", "build", "--workspace", root, "--model", "logsig").exit_code == 0
    return root


def test_repro_writes_a_runnable_report_of_a_handful_of_nodes_that_fails_until_fixed(logsig, tmp_path):
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    out = tmp_path / "bug"
    result = _invoke("repro", "--workspace", logsig, "--model", "logsig", "--path", "torch/onnx/ort", "--out", out)
    assert result.exit_code == 0, result.output
    assert "reduced to Sigmoid -> Log (5 nodes -> 2" in result.output
    model = onnx.load(str(out / "model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["Sigmoid", "Log"]
    readme = (out / "README.md").read_text()
    assert "## Environment" in readme and "onnxruntime" in readme and "float32 underflow" in readme
    assert "link: converter" in readme and "5 nodes -> 2" in readme
    script = _script(out)
    assert script.returncode == 1 and "the bug is present" in script.stdout
    # the script imports nothing of parity: only numpy, onnx and the runtime
    assert "parity" not in (out / "repro.py").read_text().replace("parity repro", "")
    # fixed: the expected output is what the runtime computes
    data = out / "test_data_set_0"
    feed = {}
    for file in sorted(data.glob("input_*.pb")):
        tensor = onnx.TensorProto()
        tensor.ParseFromString(file.read_bytes())
        feed[tensor.name] = numpy_helper.to_array(tensor)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    (data / "output_0.pb").write_bytes(numpy_helper.from_array(np.asarray(got), model.graph.output[0].name)
                                       .SerializeToString())
    assert _script(out).returncode == 0


def test_repro_bad_input_is_one_line_each(logsig, tmp_path):
    passing = _invoke("repro", "--workspace", logsig, "--model", "logsig", "--path", "torch", "--out", tmp_path / "a")
    assert passing.exit_code == 0 and "nothing to reduce: logsig torch passes" in passing.output
    assert not (tmp_path / "a").exists()
    skipped = _invoke("repro", "--workspace", logsig, "--model", "logsig", "--path", "torch/onnx/trt",
                      "--out", tmp_path / "b")
    assert skipped.exit_code == 2 and skipped.output.count("\n") == 1 and "does not run on cpu" in skipped.output
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("x")
    refused = _invoke("repro", "--workspace", logsig, "--model", "logsig", "--path", "torch/onnx/ort", "--out", full)
    assert refused.exit_code == 2 and "not an empty folder" in refused.output and "Traceback" not in refused.output
    assert (full / "keep.txt").exists()


def _chain(n_good: int, wrong_at: int):
    """A chain of n_good Tanh/Mul nodes where node ``wrong_at`` multiplies by 3 instead of 2 (the 'wrong' graph)
    and the same chain right (the 'known' graph)."""
    from onnx import TensorProto, helper, numpy_helper

    def build(factor_at):
        nodes, inits, last = [], [], "x"
        for i in range(n_good):
            if i % 2:
                inits.append(numpy_helper.from_array(np.array(factor_at(i), np.float32), f"c{i}"))
                nodes.append(helper.make_node("Mul", [last, f"c{i}"], [f"t{i}"], name=f"mul{i}"))
            else:
                nodes.append(helper.make_node("Tanh", [last], [f"t{i}"], name=f"tanh{i}"))
            last = f"t{i}"
        graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
                                  [helper.make_tensor_value_info(last, TensorProto.FLOAT, [4, 3])], initializer=inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        return model

    return build(lambda i: 3.0 if i == wrong_at else 2.0), build(lambda i: 2.0)


def test_reduce_finds_the_one_wrong_node_of_a_long_chain_on_every_sample():
    from parity.diagnose import onnx_graph
    from parity.diagnose.reduce import reduce
    from parity.model.spec import Tolerance

    wrong, right = _chain(16, wrong_at=9)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    known = {"x": x, **onnx_graph.run_tensors("ort", right, {"x": x}, onnx_graph.intermediate_names(right))}

    def run(model, feed):
        return onnx_graph.run_tensors("ort", model, feed, [model.graph.output[0].name])[model.graph.output[0].name]

    reduced = reduce(wrong, known, run, lambda tensor: Tolerance(1e-5, 1e-5))
    assert [n.name for n in reduced.model.graph.node] == ["mul9"] and reduced.output == "t9"
    assert reduced.nodes_before == 16 and reduced.nodes_after == 1 and reduced.checks < 16
    # a graph that computes the known values has nothing to reduce, and says so
    same = reduce(right, known, run, lambda tensor: Tolerance(1e-5, 1e-5))
    assert same.model is None and "does not fail" in same.reason and same.reproduced == 0
