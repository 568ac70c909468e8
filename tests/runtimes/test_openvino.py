"""OpenVINO's paths: torch/openvino (an IR from openvino.convert_model) and */onnx/openvino (the ONNX frontend), run on
the CPU plugin at an explicit f32 precision hint, checked on the zoo; a changed weight in an ONNX file fails and is
diagnosed to its tap; a missing openvino is a skip with the reason."""

from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from parity.cli import cli
from parity.diagnose.collect import collect
from parity.model.workspace import Workspace
from parity.pipeline import orchestrate
from parity.run import paths, tasks
from tests.conftest import REPO, worker_pool, zoo_copy

pytest.importorskip("openvino")

OPENVINO_PATHS = ("torch/openvino", "torch/onnx/openvino", "tf/onnx/openvino", "jax/onnx/openvino", "onnx/openvino")


def checked(root, models, patterns) -> dict:
    report = orchestrate.check(Workspace(root), list(models), orchestrate.Options(threads=1, patterns=tuple(patterns)))
    return {(r["model"], r["path"]): r for r in report["results"]}


def assert_f32_hint(result: dict) -> None:
    numerics, record = result["numerics"], result["runtime"]
    assert numerics["inference_precision_hint"] == "f32" and numerics["ran_at"] == "f32"
    assert numerics["cpu_default_hint"] in ("f32", "bf16", "f16")
    assert numerics["default_here"].startswith(f"default here: {numerics['cpu_default_hint']} ")
    assert record["inference_precision"] == {
        "set": "f32",
        "ran": "f32",
        "cpu_default": numerics["cpu_default_hint"],
        "note": numerics["default_here"],
    }
    assert record["openvino"] and record["threads"] == 1 and record["dynamic_inputs"] == ["x"]


def test_torch_paths_pass_on_mlp_with_the_precision_hint_recorded(tmp_path):
    results = checked(zoo_copy(tmp_path, "mlp"), ["mlp"], ["torch/openvino", "torch/onnx/openvino"])
    for path in ("torch/openvino", "torch/onnx/openvino"):
        result = results[("mlp", path)]
        assert result["verdict"] == "pass", result["reason"]
        assert_f32_hint(result)
        assert [entry["ok"] for entry in result["shapes"]] == [True, True]  # batch 1 and 3 on one dynamic compile
        assert result["export"]["axes"]["dynamic"] == {"x": {"0": "batch"}}
    assert results[("mlp", "torch/openvino")]["numerics"]["artifact"] == "openvino"


@pytest.mark.parametrize("precision, hint", [("bf16", "bf16"), ("fp16", "f16")])
def test_at_a_reduced_precision_the_hint_asks_for_it_and_a_cpu_without_it_is_a_skip(tmp_path, precision, hint):
    """--precision bf16 / fp16 sets the plugin's hint to bf16 / f16 (what a CPU with such instructions runs by
    default) and judges the path at that precision's tolerances; a CPU that compiles at another precision when asked
    is a skip that says so, never a path judged at a precision it did not run."""
    import openvino as ov

    root = zoo_copy(tmp_path, "mlp")
    report = orchestrate.check(
        Workspace(root), ["mlp"], orchestrate.Options(threads=1, patterns=("torch/openvino",), precision=precision)
    )
    (result,) = report["results"]
    supported = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    if ("BF16" if hint == "bf16" else "FP16") in supported:
        assert result["verdict"] == "pass", result["reason"]
        assert result["numerics"]["ran_at"] == hint and result["runtime"]["inference_precision"]["set"] == hint
    else:
        assert result["verdict"] == "skip"
        assert f"when asked for {hint}: this CPU has no {hint} inference" in result["reason"], result["reason"]


def test_the_ir_holds_float32_weights_and_the_spec_names(tmp_path):
    """save_model compresses weights to float16 unless told not to: the IR must hold the float32 model, with its input
    and output named as the spec names them, its batch dynamic; the IR's taps are refused with the reason."""
    import openvino as ov

    meta = tasks.export_step(
        str(REPO), "mlp", paths.TORCH_OPENVINO.target, str(REPO / "golden" / "mlp"), 18, str(tmp_path), None, None
    )
    assert (meta["file"], meta["input_names"], meta["output_names"]) == ("model.xml", ["x"], ["logits"])
    xml = (tmp_path / "model.xml").read_text()
    assert 'element_type="f32"' in xml and 'element_type="f16"' not in xml
    model = ov.Core().read_model(str(tmp_path / "model.xml"))
    assert model.input("x").get_partial_shape().to_string() == "[?,64]" and model.output("logits")
    spec = Workspace(REPO).load_spec("mlp")
    observed = collect(
        str(REPO),
        "mlp",
        "torch/openvino",
        str(REPO / "golden" / "mlp"),
        "fp32",
        1,
        str(tmp_path),
        meta,
        gradients=False,
    )
    assert observed["taps"] == {} and set(observed["located"]) == set(spec.taps)
    assert all(
        where["found"] == "unmapped" and "TorchScript" in where["reason"] for where in observed["located"].values()
    )


def test_without_the_hint_the_plugin_runs_its_own_default(tmp_path):
    """What the hint guards against, on this machine: the same IR compiled without it runs at the plugin's default
    (bf16 on CPUs with bf16 instructions) and leaves the float32 tolerance; with it, the path is within."""
    import openvino as ov

    from parity.golden import store as golden

    core = ov.Core()
    default = core.get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()
    if default == "f32":
        pytest.skip("OpenVINO's CPU plugin defaults to f32 on this CPU: nothing to guard against here")
    golden_dir = REPO / "golden" / "transformer"
    meta = tasks.export_step(
        str(REPO), "transformer", paths.TORCH_OPENVINO.target, str(golden_dir), 18, str(tmp_path), None, None
    )
    spec = Workspace(REPO).load_spec("transformer")
    arrays = golden.load(golden_dir, spec).arrays
    x, expected = arrays["inputs.npz"]["x"], arrays["reference.npz"]["logits"]
    tolerance = spec.output_tolerances("fp32").for_name("logits")
    unhinted = core.compile_model(core.read_model(str(tmp_path / "model.xml")), "CPU", {"INFERENCE_NUM_THREADS": 1})
    assert unhinted.get_property("INFERENCE_PRECISION_HINT").get_type_name() == default
    drift = np.max(np.abs(unhinted({"x": x.astype(np.float32)})["logits"] - expected))
    runner = tasks.build_runner(spec, paths.by_id("torch/openvino"), {}, spec.batch_size, 1, str(tmp_path), meta)
    assert drift > tolerance.atol + tolerance.rtol * np.max(np.abs(expected)), drift
    assert np.max(np.abs(runner.run(x)["logits"] - expected)) < drift / 10


# --------------------------------------------------------------------------- an ONNX source, a changed weight


def _onnx_mlp(path: Path) -> None:
    """x (batch, 8) -> h1 = Relu(x w1 + b1) -> h2 = Relu(h1 w2 + b2) -> logits = h2 w3 + b3, batch dynamic."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    sizes, nodes, weights, previous = (8, 16, 16, 4), [], [], "x"
    for k, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes), 1):
        weights += [
            numpy_helper.from_array(rng.normal(scale=fan_in**-0.5, size=(fan_in, fan_out)).astype(np.float32), f"w{k}"),
            numpy_helper.from_array(rng.normal(scale=0.1, size=fan_out).astype(np.float32), f"b{k}"),
        ]
        output = "logits" if k == 3 else f"h{k}"
        nodes += [
            helper.make_node("MatMul", [previous, f"w{k}"], [f"mm{k}"]),
            helper.make_node("Add", [f"mm{k}", f"b{k}"], [output if k == 3 else f"pre{k}"]),
        ]
        if k < 3:
            nodes.append(helper.make_node("Relu", [f"pre{k}"], [output]))
        previous = output
    graph = helper.make_graph(
        nodes,
        "mlp3",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10  # what ONNX Runtime reads
    onnx.save(model, str(path))


@pytest.fixture
def onnx_source(tmp_path):
    """A workspace whose model ``net`` is an ONNX file with taps on its tensors h1, h2 and logits, golden built."""
    _onnx_mlp(tmp_path / "net.onnx")

    def invoke(*args):
        result = CliRunner().invoke(cli, [*map(str, args), "--workspace", str(tmp_path)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result

    invoke("init", "net", "--onnx", tmp_path / "net.onnx", "--input", "x=4x8")
    spec = tmp_path / "models" / "net.py"
    spec.write_text(spec.read_text().replace("    taps=(),", '    taps=("h1", "h2", "logits"),'))
    invoke("golden", "build", "--model", "net")
    return tmp_path, invoke


def test_an_onnx_file_with_a_changed_weight_fails_and_is_diagnosed_to_its_tap(onnx_source, tmp_path):
    """The file as it is passes on OpenVINO and its taps are found by name; the same file with one weight of the
    second layer changed fails, and the diagnosis names that layer's tap as the first divergent one."""
    import onnx

    from parity.diagnose import chain
    from parity.golden import store as golden

    root, invoke = onnx_source
    invoke("check", "--model", "net", "--path", "onnx/openvino", "--threads", "1", "--json", root / "r.json")
    (result,) = json.loads((root / "r.json").read_text())["results"]
    assert result["verdict"] == "pass", result["reason"]
    assert_f32_hint(result)

    ws = Workspace(root)
    artifact = tmp_path / "changed"
    artifact.mkdir()
    meta = tasks.export_step(
        str(root), "net", paths.ONNX_FILE.target, str(ws.golden_dir("net")), 17, str(artifact), None, None
    )
    model = onnx.load(str(artifact / "model.onnx"))
    w2 = next(t for t in model.graph.initializer if t.name == "w2")
    changed = onnx.numpy_helper.to_array(w2).copy()
    changed[3, 5] += 0.5
    w2.CopyFrom(onnx.numpy_helper.from_array(changed, "w2"))
    onnx.save(model, str(artifact / "model.onnx"))

    result = tasks.check_path(
        str(root), "net", "onnx/openvino", str(ws.golden_dir("net")), "fp32", 1, str(artifact), meta
    )
    assert result["verdict"] == "fail" and result["reason"].startswith("output logits"), result["reason"]
    spec = ws.load_spec("net")
    run = orchestrate.Run(ws, orchestrate.Options(threads=1))
    with worker_pool() as pool:
        diagnosis = chain.diagnose(
            run,
            pool,
            spec,
            golden.verify(ws.golden_dir("net"), spec),
            paths.by_id("onnx/openvino"),
            artifact={"dir": str(artifact), "meta": meta},
        )
    # the taps put it at h2; the descent into the graph's own nodes ends at the MatMul that reads the changed w2
    assert diagnosis["first_divergent_path"] == ["mm2"], (diagnosis["first_divergent_path"], diagnosis.get("notes"))
    assert any("taps put the first divergence at h2" in note for note in diagnosis["notes"])
    rows = {row["tap"]: row for row in diagnosis["taps"]}
    assert [rows[t]["found"] for t in ("h1", "h2", "logits")] == ["name", "name", "name"]
    assert rows["h1"]["stats"]["ok"] and not rows["h2"]["stats"]["ok"]


# --------------------------------------------------------------------------- not installed


def test_without_openvino_every_openvino_path_is_a_skip_with_the_install_hint(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a))
    for path_id in OPENVINO_PATHS:
        reason = paths.unavailable_reason(paths.by_id(path_id))
        assert reason is not None and "openvino not installed (pip install openvino, or parity[openvino])" in reason, (
            path_id,
            reason,
        )
    result = checked(zoo_copy(tmp_path, "mlp"), ["mlp"], ["torch/openvino"])[("mlp", "torch/openvino")]
    assert result["verdict"] == "skip" and "openvino not installed" in result["reason"], result
    assert paths.unavailable_reason(paths.by_id("torch/onnx/ort")) is None  # only OpenVINO's paths


# --------------------------------------------------------------------------- the zoo


@pytest.mark.slow
def test_every_openvino_path_passes_on_the_zoo(tmp_path):
    results = checked(
        zoo_copy(tmp_path, "mlp", "cnn", "transformer"),
        ["mlp", "cnn", "transformer"],
        ["torch/openvino", "*/onnx/openvino"],
    )
    for model in ("mlp", "cnn", "transformer"):
        for path in OPENVINO_PATHS[:4]:
            result = results[(model, path)]
            assert result["verdict"] == "pass", (model, path, result["reason"])
            assert_f32_hint(result)


def test_an_exported_onnx_graph_on_openvino_has_its_layers_read_as_on_onnx_runtime(tmp_path):
    """torch/onnx/openvino: the diagnosis maps the export's layers to its tensors as for ONNX Runtime and reads them
    from OpenVINO's own run; on a passing path every tap it finds agrees with the golden."""
    from parity.golden import store as golden

    meta = tasks.export_step(
        str(REPO), "mlp", paths.TORCH_ONNX.target, str(REPO / "golden" / "mlp"), 18, str(tmp_path), None, None
    )
    observed = collect(
        str(REPO),
        "mlp",
        "torch/onnx/openvino",
        str(REPO / "golden" / "mlp"),
        "fp32",
        1,
        str(tmp_path),
        meta,
        gradients=False,
    )
    spec = Workspace(REPO).load_spec("mlp")
    reference = golden.load(REPO / "golden" / "mlp", spec).arrays["reference.npz"]
    read = {tap: value for tap, value in observed["taps"].items() if observed["located"][tap]["found"] != "fused"}
    assert len(read) >= 3, observed["located"]
    for tap, value in read.items():
        np.testing.assert_allclose(value, reference[f"tap/{tap}"], rtol=1e-4, atol=1e-4)
