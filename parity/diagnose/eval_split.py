"""A failure seen only on the eval split is diagnosed on the eval samples that fail, not on the fixed input set
(where the path agrees and nothing would be found).

Two worker tasks: ``failing_rows`` runs the path on the whole eval split and returns the rows whose first output is
out of tolerance; ``reference_rows`` computes the float64 reference (outputs and taps) of the model's own source
on those rows, as the golden build does for the fixed set. The diagnosis then compares the path's taps on those
rows with it (``parity.diagnose.chain``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from parity.check import closeness
from parity.golden import store as golden
from parity.golden import weights as golden_weights
from parity.model import batch_axes, feeds
from parity.model.workspace import Workspace
from parity.run import paths
from parity.run.tasks import build_runner

LIMIT = 64  # at most this many failing rows are diagnosed (the worst first)


def eval_rows(spec, evals: dict, rows: list[int]) -> dict[str, np.ndarray]:
    """The eval feeds at ``rows`` (inputs only)."""
    x = feeds.from_arrays(spec, evals)
    return {name: value[np.asarray(rows)] if value.ndim else value for name, value in x.items()}


def failing_rows(
    workspace: str,
    model: str,
    path_id: str,
    golden_dir: str,
    precision: str,
    threads: int,
    artifact_dir: str | None = None,
    artifact_meta: dict | None = None,
    device: str = "cpu",
) -> list[int]:
    """The eval rows (at most ``LIMIT``, worst first, then in order) whose eval output (the golden ``eval/logits``:
    the first output with a batch axis) is out of tolerance; an eval output without one (every output computed once
    for the whole batch) was computed on the first batch of rows, which are the rows taken where it fails."""
    spec = Workspace(workspace).load_spec(model)
    path = paths.by_id(path_id, device, precision)
    verified = golden.load(Path(golden_dir), spec)
    weights = golden_weights.for_build(spec, verified.arrays["weights.npz"])  # a user model's: its own
    runner = build_runner(spec, path, weights, spec.batch_size, threads, artifact_dir, artifact_meta)
    axes = batch_axes.recorded(verified.manifest)
    output = batch_axes.eval_output(spec, axes)
    evals = feeds.from_arrays(spec, verified.arrays["eval.npz"])
    logits = feeds.run_batched(runner, evals, spec.batch_size, axes)[output]
    reference = verified.arrays["reference.npz"]["eval/logits"]
    tol = closeness.OutputTolerances(spec.output_tolerances, precision, runner.output_dtypes).for_name(output)
    axis = batch_axes.axis_of(axes, output)
    if axis is None:
        stats = closeness.error_stats(logits, reference, tol)
        return [] if stats.get("ok") else list(range(min(spec.batch_size, feeds.samples(spec, evals), LIMIT)))
    units = []
    for row in range(reference.shape[axis]):
        stats = closeness.error_stats(np.take(logits, row, axis), np.take(reference, row, axis), tol)
        units.append(np.inf if not stats.get("ok") and "tol_units" not in stats else stats.get("tol_units", np.inf))
    bad = [row for row in range(len(units)) if not units[row] <= 1.0]
    worst = sorted(bad, key=lambda row: -units[row])[:LIMIT]
    return sorted(worst)


def reference_rows(workspace: str, model: str, golden_dir: str, rows: list[int]) -> dict:
    """``{"outputs", "taps"}`` of the model's own source in float64 on the eval ``rows`` (float32 where the model
    does not run in float64, as its golden says)."""
    spec = Workspace(workspace).load_spec(model)
    verified = golden.load(Path(golden_dir), spec)
    x = eval_rows(spec, verified.arrays["eval.npz"], rows)
    dtype = verified.manifest.get("reference", {}).get("dtype", "float64")
    framework = spec.frameworks[0]
    if framework == "onnx":
        from parity.interop import onnx_file

        model_proto = onnx_file.load_checked(spec.onnx_model_path)
        import onnx

        model_proto.graph.output.extend(
            onnx.helper.make_empty_tensor_value_info(t)
            for t in spec.taps
            if t not in {o.name for o in model_proto.graph.output}
        )
        computed = onnx_file.reference_outputs(model_proto, x, dtype)
        return {"outputs": {n: computed[n] for n in spec.outputs}, "taps": {t: computed[t] for t in spec.taps}}
    from parity import sources

    weights = golden_weights.for_build(spec, verified.arrays["weights.npz"])
    source = sources.native(framework)(spec, weights, len(rows), dtype)
    return {
        "outputs": {k: np.asarray(v, np.float64) for k, v in source.run(x).items()},
        "taps": {k: np.asarray(v, np.float64) for k, v in source.taps(x).items()} if spec.taps else {},
    }
