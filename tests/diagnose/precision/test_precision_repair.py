"""Precision repair: a float16 path that fails where its float32 twin passes gets the smallest set of nodes to keep
in float32 (or the converter option) that makes it pass, tested, in the toolchain's form.

The models are real: torch modules a user would write, taken through init, golden build and check, and their
repaired float16 models written by the float16 exporter and checked again as parity checks any path.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from parity.cli import cli
from tests.conftest import REPO, worker_pool

BUGS = REPO / "tests" / "converterbugs.py"

# activations beyond float16's range (65504): ONNX Runtime's CPU provider computes these ops in float32 and hides
# the overflow, onnx.reference computes in float16 as the model says (as a GPU does), so the onnxref path fails
NETS = '''
def make_exp_sum():
    """A softmax written as exp / sum over scores up to ~15: exp overflows float16 (e^11.1 > 65504)."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 16)
            self.head = nn.Linear(16, 3)
            with torch.no_grad():
                self.proj.weight.mul_(14.0)

        def forward(self, x):
            e = torch.exp(self.proj(x))
            return self.head(e / e.sum(-1, keepdim=True))

    return Net().eval()


def make_wide_norm():
    """A second Linear whose activations reach ~1e5 before a LayerNorm brings them back to ~1."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj1 = nn.Linear(8, 32)
            self.proj2 = nn.Linear(32, 16)
            self.norm = nn.LayerNorm(16)
            self.head = nn.Linear(16, 3)
            with torch.no_grad():
                self.proj1.weight.mul_(100.0)
                self.proj2.weight.mul_(2000.0)

        def forward(self, x):
            return self.head(self.norm(self.proj2(torch.relu(self.proj1(x)))))

    return Net().eval()
'''


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _checked(root, name, source, path_id):
    """init, golden build, check at fp32 and fp16: the fp16 path fails where fp32 passes; its fp16 result."""
    assert _invoke("init", name, "--workspace", root, "--torch", source, "--input", "x=4x8").exit_code == 0
    assert _invoke("golden", "build", "--workspace", root, "--model", name).exit_code == 0
    checks = {}
    for precision in ("fp32", "fp16"):
        result = _invoke(
            "check", "--workspace", root, "--model", name, "--path", path_id, "--precision", precision, "--json", "-"
        )
        checks[precision] = json.loads(result.output[result.output.index("{") :])["results"][0]
    assert checks["fp32"]["verdict"] == "pass" and checks["fp16"]["verdict"] == "fail", checks["fp16"]["reason"]
    return checks["fp16"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp16")
    (root / "nets.py").write_text(NETS)
    return root


@pytest.fixture(scope="module")
def pool():

    with worker_pool() as workers:
        yield workers


def _parent(root, name, path_id, pool):
    """The workspace, spec and the float32 export the fp16 path is converted from (from the export cache)."""
    from parity.golden import store as golden
    from parity.model.workspace import Workspace
    from parity.pipeline import orchestrate
    from parity.run import paths

    ws = Workspace(root)
    spec = ws.load_spec(name)
    path = paths.by_id(path_id, "cpu", "fp16")
    run = orchestrate.Run(ws, orchestrate.Options(threads=1))
    parent = run._export(pool, spec, golden.verify(ws.golden_dir(name), spec), path, len(path.exports) - 2)
    assert "error" not in parent, parent
    return ws, spec, parent


def _verdict_with(ws, spec, parent, path_id, block, pool, out_dir) -> tuple[str, dict]:
    """The verdict of parity's own check of the path on the float16 exporter's model with ``block`` in float32."""
    from parity.exporters import onnx_fp16
    from parity.exporters.common import ExportJob

    out_dir.mkdir()
    job = ExportJob(
        spec=spec,
        weights={},
        batch_size=spec.batch_size,
        opset=spec.opset,
        out_dir=out_dir,
        parent_dir=Path(parent["dir"]),
        parent_meta=parent["meta"],
        precision="fp16",
    )
    meta = onnx_fp16.export(job, node_block_list=block)
    result = pool.call(
        "onnx",
        "parity.run.tasks:check_path",
        workspace=str(ws.root),
        model=spec.name,
        path_id=path_id,
        golden_dir=str(ws.golden_dir(spec.name)),
        precision="fp16",
        threads=1,
        artifact_dir=str(out_dir),
        artifact_meta=meta,
    )
    return result["verdict"], meta


@pytest.mark.parametrize(
    "name, ops",
    [
        # slow: the second overflow repaired end to end; the fast set keeps wide_norm
        pytest.param("exp_sum", {"Exp", "ReduceSum", "Div"}, marks=pytest.mark.slow),
        ("wide_norm", {"Gemm", "LayerNormalization"}),
    ],
)
def test_an_overflow_is_repaired_by_a_minimal_list_and_the_exported_repair_passes(root, pool, name, ops, tmp_path):
    path_id = "torch/onnx/onnxref"
    checked = _checked(root, name, f"{root / 'nets.py'}:make_{name}", path_id)
    assert "NaN or Inf" in checked["reason"]
    ws, spec, parent = _parent(root, name, path_id, pool)
    repair = pool.call(
        "onnx",
        "parity.diagnose.precision.float16_repair:repair_for_diagnosis",
        workspace=str(ws.root),
        model=name,
        golden_dir=str(ws.golden_dir(name)),
        precision="fp16",
        threads=1,
        artifact_dir=parent["dir"],
        artifact_meta=parent["meta"],
        path_id=path_id,
    )
    block = repair["node_block_list"]
    assert repair["passes"] and repair["minimal"] and set(repair["op_types"]) == ops and 1 <= len(block) <= 3
    assert repair["runtime"] == "onnxref" and repair["path"] == path_id and repair["runs"] <= 20
    assert not math.isfinite(repair["before"]["tol_units"]) and repair["after"]["tol_units"] <= 1
    assert set(repair["minimal_checks"]) == set(block) and all(u > 1 for u in repair["minimal_checks"].values())
    assert (
        repair["toolchain"]["tensorrt"] == block
        and f"node_block_list={block!r}" in repair["toolchain"]["onnxconverter_common"]
    )
    # the exporter with the list writes a model parity's check passes; with any one node less it fails again
    verdict, meta = _verdict_with(ws, spec, parent, path_id, block, pool, tmp_path / "repaired")
    assert verdict == "pass" and meta["float16"]["kept_float32_nodes"] == block
    for dropped in block:
        less = [n for n in block if n != dropped]
        assert _verdict_with(ws, spec, parent, path_id, less, pool, tmp_path / dropped)[0] == "fail", dropped


def test_a_constant_float16_cannot_hold_is_kept_in_float32_on_onnx_runtime(root):
    repair = _checked(root, "offsets", f"{BUGS}:make_fp16_offsets", "torch/onnx/ort")["diagnosis"]["repair"]
    assert repair["passes"] and repair["minimal"] and repair["op_types"] == {"Add": 1} and repair["runtime"] == "ort"
    assert len(repair["node_block_list"]) == 1 and repair["after"]["tol_units"] <= 1 < repair["before"]["tol_units"]
    assert all(units > 1 for units in repair["minimal_checks"].values())
    # the converter alone converts the blocked Add's constant to float16 all the same: the toolchain form says so
    assert not repair["toolchain"]["converter_alone"]["passes"]
    assert "keep_float32" in repair["toolchain"]["onnxconverter_common"]


def test_weights_the_converter_clips_are_named_with_the_option_that_passes(root):
    repair = _checked(root, "clipped", f"{BUGS}:make_fp16_clipped_weights", "torch/onnx/ort")["diagnosis"]["repair"]
    assert repair["passes"] and repair["node_block_list"] == []
    assert repair["converter"]["clipped_weights"] > 0 and repair["converter"]["option"] == "max_finite_val=65504"
    assert repair["converter"]["passes"] and "max_finite_val=65504" in repair["toolchain"]["onnxconverter_common"]


# --------------------------------------------------------------------------- the search on handmade graphs


def _graph(nodes, initializers, opset=17):
    """A float32 graph x -> y; its weights' types declared in ``value_info``, as torch.onnx declares them."""
    from onnx import helper, numpy_helper

    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", 1, [16, 4])],
        [helper.make_tensor_value_info("y", 1, [16, 4])],
        initializer=[numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in initializers.items()],
        value_info=[helper.make_tensor_value_info(k, 1, np.shape(v)) for k, v in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _magnitude():
    """|x| computed as sqrt((256 x)^2) / 256 between two harmless nodes: (256 x)^2 overflows float16 for |x| > 1."""
    from onnx import helper

    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Sub", ["x", "r"], ["n"], name="negative_part"),
        helper.make_node("Add", ["r", "n"], ["x2"], name="rejoin"),
        helper.make_node("Mul", ["x2", "scale"], ["a"], name="scale"),
        helper.make_node("Mul", ["a", "a"], ["s"], name="square"),
        helper.make_node("Sqrt", ["s"], ["m"], name="root"),
        helper.make_node("Div", ["m", "scale"], ["y"], name="unscale"),
    ]
    return _graph(nodes, {"scale": 256.0})


def _tolerance(name):
    from parity.model.spec import Tolerance
    from parity.platform.precision import default_tolerance

    return Tolerance(*default_tolerance("fp16"))


def test_the_search_keeps_the_overflowing_nodes_and_proves_each_one_needed():
    from parity.diagnose.precision.float16_repair import render_repair, repair_path

    x = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32) * 2
    repair = repair_path(_magnitude(), {"x": x}, {"y": np.abs(x.astype(np.float64))}, _tolerance, runtime="onnxref")
    assert repair["passes"] and repair["node_block_list"] == ["square", "root"] and repair["minimal"]
    assert repair["op_types"] == {"Mul": 1, "Sqrt": 1} and repair["ranked_on"] == "onnxref"
    assert all(units > 1 for units in repair["minimal_checks"].values()) and repair["after"]["tol_units"] <= 1
    assert repair["runs"] <= 12 and repair["seconds"] < 10
    assert "keep 2 node(s) in float32" in render_repair(repair)[0]
    # the same graph on ONNX Runtime's CPU provider computes in float32 between casts: nothing to repair there
    on_ort = repair_path(_magnitude(), {"x": x}, {"y": np.abs(x.astype(np.float64))}, _tolerance, runtime="ort")
    assert on_ort["passes"] and on_ort["node_block_list"] == [] and "as converted" in on_ort["reason"]


def test_no_repair_exists_says_why_in_one_line_and_a_small_budget_is_not_called_minimal():
    from parity.diagnose.precision.float16_repair import render_repair, repair_path

    x = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32) * 2
    wrong = repair_path(_magnitude(), {"x": x}, {"y": np.abs(x.astype(np.float64)) + 1}, _tolerance, runtime="onnxref")
    assert not wrong["passes"] and wrong["reason"].startswith("the float32 twin fails too")
    assert render_repair(wrong) == [f"  precision repair: none: {wrong['reason']}"]
    short = repair_path(
        _magnitude(), {"x": x}, {"y": np.abs(x.astype(np.float64))}, _tolerance, runtime="onnxref", max_runs=4
    )
    assert short["passes"] and not short["minimal"] and len(short["node_block_list"]) > 2
    assert "not proven minimal" in render_repair(short)[0]


def test_blocked_nodes_compute_in_float32_where_the_converter_alone_passes_float16_between_them():
    """The converter's own model (1.16) converts a blocked node's declared weight and casts it back, and passes a
    value read by two blocked nodes through float16 (an overflow here); parity's conversion keeps both float32."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    from parity.exporters.onnx_fp16 import convert

    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["a"], name="scale"),
        helper.make_node("Mul", ["a", "a"], ["s"], name="square"),
        helper.make_node("Sqrt", ["s"], ["m1"], name="root1"),
        helper.make_node("Sqrt", ["s"], ["m2"], name="root2"),
        helper.make_node("Add", ["m1", "m2"], ["y"], name="sum"),
    ]
    model = _graph(nodes, {"scale": 1000.3})
    x = np.full((16, 4), 3.0, np.float32)
    block = ["scale", "square", "root1", "root2", "sum"]
    alone = ReferenceEvaluator(convert(model, block, strict=False)).run(None, {"x": x})[0]
    strict = convert(model, block)
    y = ReferenceEvaluator(strict).run(None, {"x": x})[0]
    assert not np.all(np.isfinite(alone)) and y.dtype == np.float32
    assert np.allclose(y, 2 * 3 * 1000.3, rtol=1e-6)  # 1000.3 itself kept: float16 would hold 1000.5
    assert {t.name: t.data_type for t in strict.graph.initializer} == {"scale__float32": 1}
    assert {t.name: t.data_type for t in convert(model, block, strict=False).graph.initializer} == {"scale": 10}


def test_the_exporter_records_the_block_list_and_rejects_a_node_the_graph_lacks(tmp_path):
    import onnx

    from parity.exporters import onnx_fp16
    from parity.exporters.common import ExportJob
    from parity.platform.errors import ExportError

    onnx.save(_magnitude(), str(tmp_path / "model.onnx"))
    meta = {"file": "model.onnx", "input_names": ["x"], "output_names": ["y"]}

    def job(name):
        (tmp_path / name).mkdir()
        return ExportJob(
            spec=None,
            weights={},
            batch_size=16,
            opset=17,
            out_dir=tmp_path / name,
            parent_dir=tmp_path,
            parent_meta=meta,
            precision="fp16",
        )

    recorded = onnx_fp16.export(job("kept"), node_block_list=["square", "root"])["float16"]
    assert recorded["kept_float32_nodes"] == ["square", "root"] and recorded["clipped_weights"] == 0
    assert onnx_fp16.export(job("plain"))["float16"]["kept_float32_nodes"] == []
    with pytest.raises(ExportError, match="node_block_list names 1 node.s. the graph does not have: squares$"):
        onnx_fp16.export(job("unknown"), node_block_list=["squares"])


def test_a_bfloat16_path_has_no_onnx_conversion_to_repair():
    from parity.diagnose.precision.float16_repair import repair_for_diagnosis

    result = repair_for_diagnosis("unused", "unused", "unused", "bf16", 1, "unused", {})
    assert not result["passes"] and "bfloat16" in result["reason"] and result["runs"] == 0
