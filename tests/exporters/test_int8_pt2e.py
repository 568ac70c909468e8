"""torch/pt2e-int8: torchao's pt2e flow with X86InductorQuantizer writes a .pt2 whose program really holds int8 (quantize
/ dequantize ops, int8 weights), run compiled by inductor into int8 kernels, keeps the zoo's accuracy, keeps the modules
the spec names in float, and reads taps through pt2e's conv-BatchNorm folding."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from parity.check import metrics
from parity.exporters.common import ExportJob
from parity.golden import calibration
from parity.golden import store as golden
from parity.model import feeds
from parity.model.spec import Quantization
from parity.model.workspace import Workspace
from parity.platform.errors import ExportError
from parity.run import paths, tasks
from tests.conftest import zoo_copy

PATH = "torch/pt2e-int8"
ACCURACY_LOSS = 0.02  # the int8 program's accuracy on the eval split at most this far below the golden's


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> Path:
    return zoo_copy(tmp_path_factory.mktemp("pt2e"), "mlp", "cnn")


def loaded(root: Path, model: str, keep_float: dict | None = None):
    spec = Workspace(root).load_spec(model)
    if keep_float is not None:
        spec = dataclasses.replace(spec, quantization=Quantization(keep_float=keep_float))
    return spec, golden.load(Workspace(root).golden_dir(model), spec)


def export_pt2e(root: Path, model: str, out: Path, keep_float: dict | None = None) -> dict:
    from parity.exporters.torch_pt2e import export

    spec, verified = loaded(root, model, keep_float)
    out.mkdir(parents=True, exist_ok=True)
    inputs = feeds.padded(
        spec,
        feeds.rows(spec, feeds.from_arrays(spec, verified.arrays["eval.npz"]), 0, spec.batch_size),
        spec.batch_size,
    )
    job = ExportJob(
        spec=spec,
        weights=verified.arrays["weights.npz"],
        batch_size=spec.batch_size,
        opset=18,
        out_dir=out,
        inputs=inputs,
        calibration=calibration.calibration_feeds(spec, verified)[0],
        path_id=PATH,
    )
    return export(job)


def program_graph(out: Path, meta: dict):
    """The saved program's graph, loaded as the runner loads it."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401 - the quantize / dequantize ops the program calls

    from parity.runtimes.torch_export import load_program

    return load_program(out / meta["file"]).graph


def ops_of(graph, module: str) -> list:
    """The call_function nodes the model's ``module`` produced (the exporter's wrapper holds the model as ``model``)."""

    def inner(node):
        stack = node.meta.get("nn_module_stack") or {}
        return list(stack.values())[-1][0] if stack else ""

    return [n for n in graph.nodes if n.op == "call_function" and inner(n) == f"model.{module}"]


def op_name(node) -> str:
    return str(getattr(node, "target", ""))


def test_the_program_holds_int8_runs_compiled_and_keeps_accuracy(zoo, tmp_path):
    """mlp: every Linear computes on a dequantized int8 weight and a quantized-dequantized activation; the runner
    runs the program compiled by inductor and the eval accuracy stays within a couple of points of the golden."""
    meta = export_pt2e(zoo, "mlp", tmp_path)
    record = meta["quantization"]
    assert record["tool"] == "torchao pt2e" and record["quantizer"] == "X86InductorQuantizer" and record["per_channel"]
    assert record["quantized"] == ["dense1", "dense2", "logits"] and record["quantized_layers"] == 3
    assert record["calibration_samples"] == 256 and record["qdq_pairs"] >= 6 and record["kept_float"] == []
    graph = program_graph(tmp_path, meta)
    targets = [op_name(n) for n in graph.nodes]
    assert sum("quantize_per_tensor" in t and "dequantize" not in t for t in targets) >= 3
    assert sum("dequantize_per_channel" in t for t in targets) == 3
    for layer in ("dense1", "dense2", "logits"):
        (linear,) = [n for n in ops_of(graph, layer) if "linear" in op_name(n)]
        assert "dequantize_per_tensor" in op_name(linear.args[0]) and "dequantize_per_channel" in op_name(
            linear.args[1]
        )
    assert meta["axes"]["dynamic"] == {"x": {"0": "batch"}}

    spec, verified = loaded(zoo, "mlp")
    runner = tasks.build_runner(spec, paths.by_id(PATH), {}, spec.batch_size, 1, str(tmp_path), meta)
    assert not runner.differentiable
    evals = verified.arrays["eval.npz"]
    logits = feeds.run_batched(runner, feeds.from_arrays(spec, evals), spec.batch_size)["logits"]
    golden_accuracy = metrics.accuracy(verified.arrays["reference.npz"]["eval/logits"], evals["y"])
    assert metrics.accuracy(logits, evals["y"]) >= golden_accuracy - ACCURACY_LOSS
    record = runner.runtime_record()
    assert record["ran"] == "compiled" and record["graphs_compiled"] == 1 and record["compile_s"] > 0
    assert runner.numerics["torch_compile"]["freezing"] is True


def test_a_module_kept_float_has_no_quantize_around_it(zoo, tmp_path):
    """keep_float's module path runs in float32: its Linear reads the float weight and a float activation, while
    the other layers stay int8; the record says which were kept."""
    meta = export_pt2e(zoo, "mlp", tmp_path, keep_float={"torch/pt2e*": ("dense2",)})
    record = meta["quantization"]
    assert record["kept_float"] == ["dense2"] and record["quantized"] == ["dense1", "logits"]
    assert "not_quantized" not in record
    graph = program_graph(tmp_path, meta)
    (linear,) = [n for n in ops_of(graph, "dense2") if "linear" in op_name(n)]
    assert not any("quantize" in op_name(arg) for arg in linear.args if hasattr(arg, "op"))
    assert not any("quantize" in op_name(user) for user in linear.users)


def test_a_kept_float_name_the_program_does_not_call_is_refused(zoo, tmp_path):
    """A keep_float name that is no module of the model is an export error naming the modules there are, never a
    quantization that silently ignores it."""
    with pytest.raises(ExportError) as raised:
        export_pt2e(zoo, "mlp", tmp_path, keep_float={PATH: ("dense9",)})
    message = str(raised.value)
    assert "\n" not in message and "'dense9'" in message and "dense1" in message and "relu2" in message


@pytest.mark.slow
def test_cnn_end_to_end_passes_the_gate_and_reads_taps_through_folding(zoo, tmp_path):
    """cnn through the check (export in its worker, the accuracy gate): pass, compiled; the conv that is a subclass
    of torch.nn.Conv2d is said to stay float; BatchNorm folded into its conv is read at the conv's output."""
    from parity.pipeline import orchestrate

    report = orchestrate.check(Workspace(zoo), ["cnn"], orchestrate.Options(threads=1, patterns=(PATH,)))
    (result,) = [r for r in report["results"] if r["path"] == PATH]
    assert result["verdict"] == "pass", result["reason"]
    assert result["runtime"]["ran"] == "compiled" and result["runtime"]["not_quantized"] == ["conv2"]
    meta = export_pt2e(zoo, "cnn", tmp_path)
    assert meta["quantization"]["folded"] == {"bn1": "conv1", "bn2": "conv2"}
    spec, verified = loaded(zoo, "cnn")
    runner = tasks.build_runner(spec, paths.by_id(PATH), {}, spec.batch_size, 1, str(tmp_path), meta)
    taps = runner.taps(feeds.from_arrays(spec, verified.arrays["inputs.npz"]))
    assert runner.tap_locations["conv1"]["found"] == "fused" and runner.tap_locations["conv1"]["fused_into"] == "bn1"
    assert "conv1" not in taps and set(taps) >= {"bn1", "relu1", "pool1", "logits"}
    reference = verified.arrays["reference.npz"]
    assert abs(taps["bn1"] - reference["tap/bn1"]).max() < 0.1  # the norm's values, within int8 input rounding
