"""``parity repro``: a failing path reduced to a few nodes that still fail on the whole input set, written as a bug
report whose repro.py exits 1 while the bug is present and 0 once fixed; bad input in one line each.

The reduction is tested on handmade graphs with one deliberately wrong node (the known values from the right graph),
and end to end on real divergences of the installed exporters and runtimes: a user's model written by the test
(nearest down-sampling by 0.6, where onnx.reference picks another source pixel than torch and ONNX Runtime) and
the LogSigmoid that torch.onnx exports as Log(Sigmoid(x)) (tests/converterbugs.py)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from parity.cli import cli
from tests.conftest import REPO

BUGS = REPO / "tests" / "converterbugs.py"

USER_MODELS = '''"""A user's models: a CNN that down-samples by 0.6 (nearest), and one that loses float32 digits."""


def make_downsample():
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)

    class Down(nn.Module):
        def forward(self, x):
            return F.interpolate(x, scale_factor=0.6, mode="nearest")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.down = Down()
            self.flat = nn.Flatten()
            self.head = nn.Linear(4 * 4 * 4, 3)

        def forward(self, x):
            return self.head(self.flat(self.down(self.conv(x))))

    return Net().eval()


def make_cancelling():
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Shift(nn.Module):
        def forward(self, x):
            return (x + 1e8) - 1e8

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)
            self.shift = Shift()
            self.head = nn.Linear(8, 3)

        def forward(self, x):
            return self.head(self.shift(self.proj(x)))

    return Net().eval()
'''


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _script(folder):
    return subprocess.run([sys.executable, str(folder / "repro.py")], capture_output=True, text=True, timeout=120)


def _fix(folder, runtime="ort"):
    """Overwrite the expected output with what the runtime computes: the bug 'fixed'."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(str(folder / "model.onnx"))
    data = folder / "test_data_set_0"
    feed = {t.name: numpy_helper.to_array(t) for t in (onnx.load_tensor(str(f)) for f in data.glob("input_*.pb"))}
    if runtime == "onnxref":
        got = ReferenceEvaluator(model).run(None, feed)[0]
    else:
        got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    (data / "output_0.pb").write_bytes(
        numpy_helper.from_array(np.asarray(got), model.graph.output[0].name).SerializeToString()
    )


# --------------------------------------------------------------------------- the reduction on handmade graphs


def _model(nodes, inits, output, opset=17):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, [4, 3])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _chain(n: int, factor_at):
    """n Tanh / Mul nodes in a chain; node i multiplies by ``factor_at(i)`` (right: 2)."""
    from onnx import helper, numpy_helper

    nodes, inits, last = [], [], "x"
    for i in range(n):
        if i % 2:
            inits.append(numpy_helper.from_array(np.array(factor_at(i), np.float32), f"c{i}"))
            nodes.append(helper.make_node("Mul", [last, f"c{i}"], [f"t{i}"], name=f"mul{i}"))
        else:
            nodes.append(helper.make_node("Tanh", [last], [f"t{i}"], name=f"tanh{i}"))
        last = f"t{i}"
    return _model(nodes, inits, last)


def _known(right, x, names=None):
    from parity.diagnose.graph import onnx_graph

    names = names or onnx_graph.intermediate_names(right)
    return {"x": x, **onnx_graph.run_tensors("ort", right, {"x": x}, names)}


def test_reduce_finds_the_one_wrong_node_of_a_long_chain_and_its_report_fails_until_fixed(tmp_path):
    import onnx

    from parity.diagnose.graph.reduce import reduce, summary
    from parity.diagnose.repro import write_report
    from parity.model.spec import Tolerance

    wrong, right = _chain(16, lambda i: 3.0 if i == 9 else 2.0), _chain(16, lambda i: 2.0)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)  # 4 samples, all judged at once
    reduced = reduce(wrong, {"x": x}, "ort", _known(right, x), Tolerance(1e-5, 1e-5))
    assert [n.name for n in reduced.model.graph.node] == ["mul9"] and reduced.output == "t9"
    assert [i.name for i in reduced.model.graph.initializer] == ["c9"] and list(reduced.inputs) == ["t8"]
    onnx.checker.check_model(reduced.model, full_check=True)
    assert reduced.nodes_before == 16 and reduced.nodes_after == 1
    assert reduced.checks < 16 and reduced.reproduced >= 2 and reduced.seconds > 0  # bisected, not one by one
    assert "ort fails on 't9'" in summary(reduced) and "16 nodes -> 1" in summary(reduced)

    out = write_report(tmp_path / "bug", reduced, Tolerance(1e-5, 1e-5))
    script = _script(out)
    assert script.returncode == 1 and "the bug is present" in script.stdout, script.stdout + script.stderr
    assert "tolerance units" in script.stdout and "ORT_ENABLE_ALL" in (out / "repro.py").read_text()
    readme = (out / "README.md").read_text()
    assert readme.index("## Environment") < readme.index("## What diverges") and "onnxruntime" in readme
    assert "16 nodes -> 1" in readme and "Mul mul9" in readme
    _fix(out)
    fixed = _script(out)
    assert fixed.returncode == 0 and "fixed" in fixed.stdout, fixed.stdout + fixed.stderr


def test_reduce_cuts_away_a_node_no_boundary_covers_where_only_some_tensors_are_known():
    """Known values at a few tensors only (as for a converter fault): the boundaries between the graph inputs and
    the failing output all cross an unknown tensor, so the bisection keeps five nodes; node removal then cuts the
    Sigmoid away at its known output."""
    from onnx import helper, numpy_helper

    from parity.diagnose.graph.reduce import reduce
    from parity.model.spec import Tolerance

    def build(factor):
        nodes = [
            helper.make_node("Tanh", ["x"], ["a"], name="tanh"),
            helper.make_node("Neg", ["x"], ["u"], name="neg"),
            helper.make_node("Abs", ["u"], ["w"], name="abs"),
            helper.make_node("Sigmoid", ["a"], ["b"], name="sig"),
            helper.make_node("Mul", ["b", "c"], ["m"], name="mul"),
            helper.make_node("Add", ["m", "w"], ["out"], name="add"),
        ]
        return _model(nodes, [numpy_helper.from_array(np.array(factor, np.float32), "c")], "out")

    x = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    known = _known(build(2.0), x, ["a", "b", "out"])
    reduced = reduce(build(3.0), {"x": x}, "onnxref", known, Tolerance(1e-5, 1e-5))
    assert [n.name for n in reduced.model.graph.node] == ["neg", "abs", "mul", "add"]
    assert sorted(reduced.inputs) == ["b", "x"] and reduced.output == "out"
    assert any("node removal: 1 node" in step for step in reduced.steps)


def test_reduce_of_a_graph_that_does_not_fail_says_so_and_reduces_nothing():
    from parity.diagnose.graph.reduce import reduce
    from parity.model.spec import Tolerance

    right = _chain(12, lambda i: 2.0)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    same = reduce(right, {"x": x}, "ort", _known(right, x), Tolerance(1e-5, 1e-5))
    assert same.model is None and same.reproduced == 0 and same.checks == 1
    assert "does not fail on ort" in same.reason and "reproduced in 0 of 1" in same.reason


# --------------------------------------------------------------------------- end to end, real divergences


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    root = tmp_path_factory.mktemp("repro-user")
    (root / "mymodels.py").write_text(USER_MODELS)
    for name, factory, shape in (("down", "make_downsample", "2x3x7x7"), ("cancel", "make_cancelling", "2x8")):
        made = _invoke(
            "init", name, "--workspace", root, "--torch", f"{root / 'mymodels.py'}:{factory}", "--input", f"x={shape}"
        )
        assert made.exit_code == 0, made.output
        assert _invoke("golden", "build", "--workspace", root, "--model", name).exit_code == 0
    return root


def test_repro_of_a_real_runtime_divergence_is_one_resize_that_fails_until_fixed(user, tmp_path):
    import onnx

    out = tmp_path / "bug"
    result = _invoke("repro", "--workspace", user, "--model", "down", "--path", "torch/onnx/onnxref", "--out", out)
    assert result.exit_code == 0, result.output
    assert "reduced to Resize (4 nodes -> 1" in result.output
    model = onnx.load(str(out / "model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["Resize"]
    readme = (out / "README.md").read_text()
    assert "link: runtime" in readme and "right values from: ort-noopt" in readme and "(Resize)" in readme
    assert "onnx.reference.ReferenceEvaluator" in readme and "4 nodes -> 1" in readme
    script = _script(out)
    assert script.returncode == 1 and "the bug is present" in script.stdout
    assert "parity" not in (out / "repro.py").read_text().replace("parity repro", "")  # numpy, onnx, the runtime
    _fix(out, "onnxref")
    assert _script(out).returncode == 0
    # the same path passes on ONNX Runtime: nothing to reduce
    passing = _invoke(
        "repro", "--workspace", user, "--model", "down", "--path", "torch/onnx/ort", "--out", tmp_path / "a"
    )
    assert passing.exit_code == 0 and "nothing to reduce: down torch/onnx/ort passes" in passing.output
    assert not (tmp_path / "a").exists()


def test_repro_bad_input_is_one_line_each(user, tmp_path):
    def one_line(result, code, text):
        assert result.exit_code == code and text in result.output, result.output
        said = [line for line in result.output.splitlines() if not line.startswith("  ")]  # progress is indented
        assert len(said) == 1 and "Traceback" not in result.output, result.output

    native = _invoke("repro", "--workspace", user, "--model", "cancel", "--path", "torch", "--out", tmp_path / "n")
    one_line(native, 2, "is a native path; its diagnosis names the definition link and there is no ONNX graph")
    exported = _invoke(
        "repro", "--workspace", user, "--model", "cancel", "--path", "torch/onnx/ort", "--out", tmp_path / "e"
    )
    one_line(exported, 2, "drift enters at the definition, not in the exported graph")
    skipped = _invoke(
        "repro", "--workspace", user, "--model", "cancel", "--path", "torch/onnx/trt", "--out", tmp_path / "s"
    )
    one_line(skipped, 2, "does not run on cpu")
    gpu = _invoke(
        "repro",
        "--workspace",
        user,
        "--model",
        "cancel",
        "--path",
        "torch/onnx/ort",
        "--device",
        "cuda",
        "--out",
        tmp_path / "g",
    )
    one_line(gpu, 2, "reduces graphs on the CPU runtimes")
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("x")
    refused = _invoke("repro", "--workspace", user, "--model", "down", "--path", "torch/onnx/onnxref", "--out", full)
    one_line(refused, 2, "not an empty folder")
    assert (full / "keep.txt").exists()
    assert not any((tmp_path / name).exists() for name in "nesg")


def test_repro_of_a_converter_fault_starts_from_the_golden_taps(tmp_path):
    """LogSigmoid exported as Log(Sigmoid(x)): -inf where torch is finite; the right values are the source's
    float64 golden at the mapped taps, so the report runs from the tap before the activation."""
    import onnx

    root = tmp_path / "ws"
    assert (
        _invoke(
            "init", "logsig", "--workspace", root, "--torch", f"{BUGS}:make_logsigmoid", "--input", "x=2x8"
        ).exit_code
        == 0
    )
    assert _invoke("golden", "build", "--workspace", root, "--model", "logsig").exit_code == 0
    out = tmp_path / "bug"
    result = _invoke("repro", "--workspace", root, "--model", "logsig", "--path", "torch/onnx/ort", "--out", out)
    assert result.exit_code == 0, result.output
    assert "reduced to Sigmoid -> Log (5 nodes -> 2" in result.output
    assert [n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node] == ["Sigmoid", "Log"]
    readme = (out / "README.md").read_text()
    assert "link: converter" in readme and "right values from: source" in readme and "float32 underflow" in readme
    assert _script(out).returncode == 1
    again = _invoke(
        "repro", "--workspace", root, "--model", "logsig", "--path", "torch/onnx/ort", "--out", out, "--force"
    )
    assert again.exit_code == 0 and (out / "repro.py").exists()
    _fix(out)
    assert _script(out).returncode == 0
