"""``parity repro``'s worker task: a failing path's exported graph reduced (``parity.diagnose.reduce``) and written
as a bug report anyone can run.

The folder holds ``model.onnx`` (checker-valid), ``test_data_set_0/`` in the ONNX test-data layout (inputs, and as
outputs the values known to be right), ``repro.py`` (numpy, onnx and the failing runtime only; exits 1 while the
outputs differ, 0 once they agree) and ``README.md`` (what diverges and by how much, the node, the tested cause,
the link, the reduction, the environment with versions first).

Which values are right comes from the diagnosis: the runtime that follows the spec (or ONNX Runtime with its
optimisations off, for an optimiser fault) gives every tensor; for a converter fault, the source's golden
activations at the mapped taps and the golden outputs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from parity.golden import store as golden
from parity.model import feeds
from parity.model.workspace import Workspace
from parity.platform import safefs
from parity.run import paths
from parity.runtimes.onnx_common import onnx_feed

SCRIPT = '''"""Runs model.onnx on test_data_set_0 with @RUNTIME@ and compares with the expected outputs (the
values known to be right): exits 1 while they differ beyond atol + rtol * |expected|, 0 once they agree."""
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

ATOL, RTOL, RUNTIME, THREADS = @ATOL@, @RTOL@, "@RUNTIME@", @THREADS@
HERE = Path(__file__).resolve().parent


def tensors(kind):
    files = sorted((HERE / "test_data_set_0").glob(f"{kind}_*.pb"), key=lambda f: int(f.stem.split("_")[1]))
    out = {}
    for file in files:
        proto = onnx.TensorProto()
        proto.ParseFromString(file.read_bytes())
        out[proto.name] = numpy_helper.to_array(proto)
    return out


model = onnx.load(str(HERE / "model.onnx"))
inputs, expected = tensors("input"), tensors("output")
names = [o.name for o in model.graph.output]
if RUNTIME == "onnxref":
    from onnx.reference import ReferenceEvaluator

    got = ReferenceEvaluator(model).run(names, inputs)
else:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_DISABLE_ALL if RUNTIME == "ort-noopt"
                                        else ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    options.intra_op_num_threads = THREADS
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    got = session.run(names, inputs)
bad = False
for name, value in zip(names, got):
    value, want = np.asarray(value, np.float64), np.asarray(expected[name], np.float64)
    finite = np.isfinite(value) & np.isfinite(want)
    alike = finite | (value == want) | (np.isnan(value) & np.isnan(want))
    error = np.where(finite, np.abs(value - want), 0.0)
    units = np.max(error / (ATOL + RTOL * np.abs(want)), initial=0.0)
    out = int(np.count_nonzero(~alike) + np.count_nonzero(error > ATOL + RTOL * np.abs(want)))
    print(f"{name}: {out} of {value.size} elements out of tolerance; max abs error {np.max(error, initial=0.0):.3g} "
          f"({units:.3g}x atol {ATOL:g} + rtol {RTOL:g} |expected|); {np.count_nonzero(~alike)} non-finite where "
          f"the expected value is not")
    bad = bad or out > 0
print("the bug is present" if bad else "the outputs agree: fixed")
sys.exit(1 if bad else 0)
'''


def trusted_for(diagnosis: dict, runtime: str) -> str | None:
    """The evaluator whose values are right, from the diagnosis (None: nothing in a graph to reduce)."""
    links = diagnosis.get("links") or {}
    cause = diagnosis.get("node_cause") or {}
    if cause.get("trusted"):
        return cause["trusted"]
    if links.get("enters_at") == "runtime":
        if diagnosis.get("optimiser"):
            return "ort-noopt"
        return "onnxref" if runtime.startswith("ort") else "ort-noopt"
    if links.get("enters_at") == "converter":
        return "source"
    return None


def _golden_known(spec, model, diagnosis, reference, meta, feed) -> dict:
    """Graph inputs, golden outputs and golden taps at their mapped tensors, in the graph's own shapes."""
    from parity.diagnose.onnx_graph import _Graph

    shapes = _Graph(model).shapes
    known = dict(feed)
    known.update({tensor: reference[name] for name, tensor in zip(spec.outputs, meta["output_names"])})
    for row in diagnosis.get("taps") or []:
        tensor, value = row.get("tensor"), reference.get(f"tap/{row['tap']}")
        if not tensor or value is None or row.get("found") in ("fused", "unmapped", "unobservable"):
            continue
        shape = shapes.get(tensor)
        if shape is None or tuple(shape) == value.shape:
            known[tensor] = value
        elif value.ndim == 4 and tuple(shape) == tuple(value.shape[i] for i in (0, 2, 3, 1)):
            known[tensor] = np.transpose(value, (0, 2, 3, 1))
        elif int(np.prod(shape)) == value.size:
            known[tensor] = value.reshape(shape)
    return known


def _as_graph_types(model, known: dict) -> dict:
    """``known`` with each value in its tensor's own dtype in the graph (golden values are float64)."""
    import onnx
    from onnx import helper

    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in (*inferred.graph.input, *inferred.graph.value_info,
                                                            *inferred.graph.output)}
    return {name: np.asarray(value).astype(helper.tensor_dtype_to_np_dtype(types[name]))
            if types.get(name) else np.asarray(value) for name, value in known.items()}


def _runner(runtime: str, threads: int):
    def run(model, feed):
        from parity.diagnose.onnx_graph import run_tensors

        output = model.graph.output[0].name
        return run_tensors(runtime, model, feed, [output], threads)[output]

    return run


def write(workspace: str, model: str, path_id: str, golden_dir: str, precision: str, threads: int, artifact_dir: str,
          artifact_meta: dict, diagnosis: dict, out_dir: str, environment: dict, command: str) -> dict:
    """Reduce the path's graph and write the folder; ``{"written": bool, ...the reduction's numbers, "reason"}``."""
    import onnx

    from parity.diagnose import onnx_graph
    from parity.diagnose.reduce import reduce

    spec = Workspace(workspace).load_spec(model)
    path = paths.by_id(path_id, "cpu", precision)
    verified = golden.load(Path(golden_dir), spec)
    reference = verified.arrays["reference.npz"]
    graph = onnx.load(str(Path(artifact_dir) / artifact_meta["file"]))
    feed = onnx_feed(spec, artifact_meta, feeds.from_arrays(spec, verified.arrays["inputs.npz"]))
    graph = onnx_graph.pinned(graph, feed)
    runtime = path.runtime.name
    trusted = trusted_for(diagnosis, runtime)
    if trusted == "source":
        known = _as_graph_types(graph, _golden_known(spec, graph, diagnosis, reference, artifact_meta, feed))
    else:
        known = {**feed, **onnx_graph.run_tensors(trusted, graph, feed, onnx_graph.intermediate_names(graph), threads)}
    tolerances = spec.output_tolerances(precision)
    names = {**{r["tensor"]: r["tap"] for r in diagnosis.get("taps") or [] if r.get("tensor")},
             **dict(zip(artifact_meta["output_names"], spec.outputs))}
    reduced = reduce(graph, known, _runner(runtime, threads), lambda tensor: tolerances.for_name(names.get(tensor, "")))
    numbers = {"nodes_before": reduced.nodes_before, "nodes_after": reduced.nodes_after, "checks": reduced.checks,
               "reproduced": reduced.reproduced, "seconds": reduced.seconds, "trusted": trusted, "runtime": runtime}
    if reduced.model is None:
        return {"written": False, "reason": reduced.reason, **numbers}
    onnx.checker.check_model(reduced.model, full_check=True)
    tol = tolerances.for_name(names.get(reduced.output, ""))
    _write_folder(Path(out_dir), reduced, runtime, threads, tol, diagnosis, environment, command, numbers)
    ops = [node.op_type for node in reduced.model.graph.node]
    return {"written": True, "ops": ops, "output": reduced.output, "stats": _plain(reduced.stats), **numbers}


def _plain(stats: dict) -> dict:
    return {k: (float(v) if isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool) else v)
            for k, v in stats.items()}


def _write_folder(out: Path, reduced, runtime: str, threads: int, tol, diagnosis: dict, environment: dict,
                  command: str, numbers: dict) -> None:
    """Everything into a scratch folder beside ``out``, then put in place at once."""
    from parity.interop.onnx_test_data import write_test_data

    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = safefs.owned_tempdir(out.parent, f".{out.name}.tmp-")
    try:
        (scratch / "model.onnx").write_bytes(reduced.model.SerializeToString())
        expected = np.asarray(reduced.expected).astype(_dtype(reduced.model))
        write_test_data(scratch, reduced.inputs, {reduced.output: expected})
        script = SCRIPT.replace("@RUNTIME@", runtime).replace("@THREADS@", str(threads))
        script = script.replace("@ATOL@", repr(float(tol.atol))).replace("@RTOL@", repr(float(tol.rtol)))
        (scratch / "repro.py").write_text(script)
        (scratch / "README.md").write_text(_readme(reduced, runtime, diagnosis, environment, command, numbers, tol))
        if out.exists():
            shutil.rmtree(out)
        safefs.replace_dir(scratch, out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _dtype(model):
    from onnx import helper

    elem = model.graph.output[0].type.tensor_type.elem_type
    return helper.tensor_dtype_to_np_dtype(elem) if elem else np.float32


def _readme(reduced, runtime, diagnosis, environment, command, numbers, tol) -> str:
    from parity.check.closeness import describe

    versions = environment.get("packages", {})
    cause = diagnosis.get("node_cause") or diagnosis.get("cause") or {}
    links = diagnosis.get("links") or {}
    lines = [
        f"# {diagnosis.get('model')} {diagnosis.get('path')}: {runtime} departs from the known values", "",
        "## Environment", "",
        *[f"- {name} {version}" for name, version in sorted(versions.items())],
        f"- python {environment.get('python', '?')}; {environment.get('cpu', '?')}", "",
        "## What diverges", "",
        f"- {describe('tensor', reduced.output, reduced.stats)} (atol {tol.atol:g}, rtol {tol.rtol:g}), judged on "
        f"all {next(iter(reduced.inputs.values())).shape[0] if reduced.inputs else 1} samples at once",
        f"- nodes: {' -> '.join(n.op_type + ' ' + n.name for n in reduced.model.graph.node)}",
        f"- first divergent tap of the diagnosis: {diagnosis.get('first_divergent_tap') or 'none'}",
        f"- tested cause: {cause.get('description') or 'none confirmed'}",
        *([f"- fix: {cause['fix']}"] if cause.get("fix") else []),
        f"- link: {links.get('enters_at') or 'none'}: {links.get('explanation', '')}",
        f"- right values from: {numbers['trusted']} ('source': the float64 golden of the model's source)", "",
        "## Reduction", "",
        f"- {numbers['nodes_before']} nodes -> {numbers['nodes_after']}, {numbers['checks']} candidate checks "
        f"({numbers['reproduced']} failed), {numbers['seconds']:.2f} s", "",
        "## Reproduce", "",
        "    python repro.py    # exits 1 while the bug is present, 0 once fixed", "",
        f"Made by `{command}`.", ""]
    return "\n".join(lines)
