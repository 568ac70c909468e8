"""The worker task of a diagnosis: one path's taps, outputs and gradients on the fixed input set.

Native sources report their taps themselves. An ONNX path finds each tap's tensor in the graph,
adds those tensors as graph outputs and runs once; on request it also compares ONNX Runtime with
the reference evaluator on every intermediate tensor of the same file (the runtime link).
"""

from __future__ import annotations

from pathlib import Path

from parity.golden import store as golden
from parity.model import feeds
from parity.model.workspace import Workspace
from parity.run import paths
from parity.run.tasks import build_runner, perturbed
from parity.runtimes.onnx_common import onnx_feed

ONNX_RUNTIMES = ("ort", "ort-noopt", "onnxref")
SAVEDMODEL_REASON = "a SavedModel made by jax2tf exposes only its outputs, not its layers"
GPU_RUNTIME_REASON = ("taps are read from ONNX graphs on the CPU runtimes only; on a GPU runtime outputs are compared "
                      "(diagnose the same path with --device cpu to locate the tap)")


def collect(workspace: str, model: str, path_id: str, golden_dir: str, precision: str, threads: int,
            artifact_dir: str | None = None, artifact_meta: dict | None = None, runtime_link: bool = False,
            gradients: bool = True, weight_perturbation: dict | None = None, device: str = "cpu") -> dict:
    """``{"outputs", "taps", "located", "gradients", "runtime_compare"}`` for one path (canonical layout).

    ``gradients`` False skips them (a source run only for the converter link needs none);
    ``weight_perturbation`` is the deliberate drift a check may add to a native source's weights."""
    spec = Workspace(workspace).load_spec(model)
    path = paths.by_id(path_id, device, precision)
    verified = golden.load(Path(golden_dir), spec)
    inputs = verified.arrays["inputs.npz"]
    x, labels = feeds.from_arrays(spec, inputs), inputs.get("labels")
    if artifact_dir is not None and path.runtime.name in ONNX_RUNTIMES and path.device == "cpu":
        golden_taps = {t: verified.arrays["reference.npz"][f"tap/{t}"] for t in spec.taps}
        return _collect_onnx(spec, path, artifact_dir, artifact_meta, x, golden_taps, precision, threads, runtime_link)
    runner = build_runner(spec, path, perturbed(verified.arrays["weights.npz"], weight_perturbation), spec.batch_size,
                          threads, artifact_dir, artifact_meta)
    if artifact_dir is None:  # a native source reports its taps itself
        taps = runner.taps(x) if spec.taps else {}
        located = {t: {"found": "native"} for t in taps}
    else:
        reason = SAVEDMODEL_REASON if path.runtime is paths.TF_SAVEDMODEL else GPU_RUNTIME_REASON
        taps, located = {}, {t: {"found": "unmapped", "reason": reason} for t in spec.taps}
    return {"outputs": runner.run(x), "taps": taps, "located": located,
            "gradients": runner.gradients(x, labels) if gradients and runner.differentiable and spec.loss else None,
            "runtime_compare": None}


def _collect_onnx(spec, path, artifact_dir, meta, x, golden_taps, precision, threads, runtime_link) -> dict:
    import onnx

    from parity.diagnose import onnx_graph, onnx_taps

    model = onnx.load(str(Path(artifact_dir) / meta["file"]))
    feed = onnx_feed(spec, meta, x)
    model = onnx_graph.pinned(model, feed)  # an export's dynamic axes at the golden feed's sizes
    candidates = onnx_taps.candidate_names(model, spec, golden_taps, meta["input_layout"]) if spec.taps else []
    names = list(dict.fromkeys([*meta["output_names"], *candidates]))
    values = onnx_graph.run_tensors(path.runtime.name, onnx_graph.with_outputs(model, names), feed, names, threads)
    outputs = {name: values[tensor] for name, tensor in zip(spec.outputs, meta["output_names"])}
    exporter = path.exports[-1].name  # jax2tf's graphs carry no Keras names: tf2onnx mapping falls back to values
    located, taps = {}, {}
    if spec.taps:
        mapped = onnx_taps.map_taps(model, spec, exporter, golden_taps, values, meta["input_layout"])
        for tap, where in mapped.items():
            located[tap] = {"found": where["how"], "tensor": where.get("tensor"), "fused_into": where.get("fused_into"),
                            "reason": where.get("reason")}
            if where["how"] not in ("fused", "unmapped") and where.get("tensor") in values:
                try:
                    taps[tap] = onnx_taps.to_canonical(values[where["tensor"]], where, golden_taps[tap].shape)
                except ValueError as error:  # the tensor found does not fit the tap: report it, compare the rest
                    located[tap] = {"found": "unmapped", "tensor": where.get("tensor"), "reason": str(error)}
    runtime_compare = None
    if runtime_link:
        runtime_compare = onnx_graph.compare_runtimes(model, feed, spec.output_tolerances(precision).default, threads)
        runtime_compare["boundary_tensors"] = list(meta["output_names"]) + [
            where["tensor"] for where in located.values() if where.get("tensor")]
    return {"outputs": outputs, "taps": taps, "located": located, "gradients": None, "runtime_compare": runtime_compare}
