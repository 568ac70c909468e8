"""A failing path's exported graph reduced (``parity.diagnose.graph.reduce``) and written as a bug report anyone can
run.

The folder holds ``model.onnx`` (checker-valid), ``test_data_set_0/`` in the ONNX test-data layout (its inputs, and
as outputs the values known to be right), ``repro.py`` (numpy, onnx and the failing runtime only, with the session
options the path used; exits 1 while the outputs differ, 0 once they agree) and ``README.md`` (the environment with
versions first, what diverges and by how much, the node, the tested cause, the link, the reduction, the command).

Which values are right comes from the diagnosis (``trusted_for``): the evaluator it names, else for a runtime fault
``onnx.reference`` (or ONNX Runtime with its optimisations off, where the failing runtime is ``onnx.reference``,
where the optimiser is to blame, or where ``onnx.reference`` cannot run the graph), which gives every tensor; for a
converter fault, the float64 golden of the model's source at the mapped taps and the outputs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from parity.platform import safefs

SCRIPT = '''"""Runs model.onnx on test_data_set_0 with @RUNTIME@ and compares with the expected outputs (the values
known to be right): exits 1 while they differ beyond atol + rtol * |expected|, 0 once they agree."""
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

ATOL, RTOL, RUNTIME, THREADS = @ATOL@, @RTOL@, "@RUNTIME@", @THREADS@
HERE = Path(__file__).resolve().parent


def tensors(kind):
    files = sorted((HERE / "test_data_set_0").glob(f"{kind}_*.pb"), key=lambda f: int(f.stem.split("_")[1]))
    return {t.name: numpy_helper.to_array(t) for t in (onnx.load_tensor(str(f)) for f in files)}


model = onnx.load(str(HERE / "model.onnx"))
inputs, expected = tensors("input"), tensors("output")
names = [o.name for o in model.graph.output]
if RUNTIME == "onnxref":
    from onnx.reference import ReferenceEvaluator

    got = ReferenceEvaluator(model).run(names, inputs)
else:  # the session options of the path: optimisation level, intra-op threads, one inter-op thread
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_DISABLE_ALL if RUNTIME == "ort-noopt"
                                        else ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
    session = ort.InferenceSession(str(HERE / "model.onnx"), options, providers=["CPUExecutionProvider"])
    got = session.run(names, inputs)
bad = False
for name, value in zip(names, got):
    value, want = np.asarray(value, np.float64), np.asarray(expected[name], np.float64)
    if value.shape != want.shape:
        print(f"{name}: shape {value.shape} where {want.shape} is expected")
        bad = True
        continue
    finite = np.isfinite(value) & np.isfinite(want)
    same = (value == want) | (np.isnan(value) & np.isnan(want))
    nonfinite = int(np.count_nonzero(~finite & ~same))  # NaN or Inf where the expected value is not the same
    error = np.where(finite, np.abs(value - want), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        units = np.where(error == 0, 0.0, error / (ATOL + RTOL * np.abs(np.where(finite, want, 0.0))))
    out = int(np.count_nonzero(units > 1)) + nonfinite
    print(f"{name}: max abs error {np.max(error, initial=0.0):.3g} = {np.max(units, initial=0.0):.3g} tolerance units "
          f"(atol {ATOL:g} + rtol {RTOL:g} * |expected|) on the finite elements; {nonfinite} NaN or Inf where the "
          f"expected value is not; {out} of {value.size} elements out of tolerance")
    bad = bad or out > 0
print("the bug is present" if bad else "the outputs agree: fixed")
sys.exit(1 if bad else 0)
'''


def trusted_for(diagnosis: dict, runtime: str) -> str | None:
    """The evaluator whose values are right ("onnxref", "ort-noopt", or "source" for the golden taps), from the
    diagnosis; None where no link in an exported graph is named (nothing in a graph to reduce)."""
    links = diagnosis.get("links") or {}
    cause = diagnosis.get("node_cause") or {}
    if cause.get("trusted"):
        return cause["trusted"]
    if links.get("enters_at") == "runtime":
        return "ort-noopt" if diagnosis.get("optimiser") or runtime == "onnxref" else "onnxref"
    if links.get("enters_at") == "converter":
        return "source"
    return None


def _golden_known(spec, model, diagnosis, reference, meta, feed, extra: dict | None = None) -> dict:
    """Graph inputs, golden outputs and golden taps at their mapped tensors, in the graph's own shapes; ``extra``:
    more reference values by tensor (the boundary of the leaf the descent into the model's tree found)."""
    from parity.diagnose.graph.onnx_graph import _Graph

    shapes = _Graph(model).shapes
    known = dict(feed)
    known.update({tensor: reference[name] for name, tensor in zip(spec.outputs, meta["output_names"])})
    found = {
        row.get("tensor"): reference.get(f"tap/{row['tap']}")
        for row in diagnosis.get("taps") or []
        if row.get("found") not in ("fused", "unmapped", "unobservable", "withdrawn")
    }
    orders = {row.get("tensor"): row["order"] for row in diagnosis.get("taps") or [] if row.get("order")}
    leaf = (diagnosis.get("tree") or {}).get("leaf") or {}  # the boundary of the leaf, in the orders it was read
    for tensor, order in ((leaf.get("tensor"), leaf.get("order")), (leaf.get("input_tensor"), leaf.get("input_order"))):
        if tensor and order:
            orders.setdefault(tensor, order)
    for tensor, value in {**found, **(extra or {})}.items():
        if not tensor or value is None:
            continue
        shape = shapes.get(tensor)
        if tensor in orders and len(orders[tensor]) == value.ndim:  # the axis order the diagnosis proved
            known[tensor] = np.transpose(value, np.argsort(orders[tensor]))
        elif shape is None or tuple(shape) == value.shape:
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
    types = {
        v.name: v.type.tensor_type.elem_type
        for v in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output)
    }
    return {
        name: np.asarray(value).astype(helper.tensor_dtype_to_np_dtype(types[name]))
        if types.get(name)
        else np.asarray(value)
        for name, value in known.items()
    }


def _evaluated(trusted: str, graph, feed: dict, threads: int, folder=None) -> tuple[str, dict]:
    """Every intermediate as ``trusted`` computes it; ``onnx.reference`` that cannot run the graph gives way to ONNX
    Runtime with its optimisations off."""
    from parity.diagnose.graph import onnx_graph

    names = onnx_graph.intermediate_names(graph)
    try:
        return trusted, onnx_graph.run_tensors(trusted, graph, feed, names, threads, folder=folder)
    except Exception:
        if trusted != "onnxref":
            raise
        return "ort-noopt", onnx_graph.run_tensors("ort-noopt", graph, feed, names, threads, folder=folder)


def write(
    workspace: str,
    model: str,
    path_id: str,
    golden_dir: str,
    precision: str,
    threads: int,
    artifact_dir: str,
    artifact_meta: dict,
    diagnosis: dict,
    out_dir: str,
    environment: dict,
    command: str,
    leaf_known: dict | None = None,
) -> dict:
    """Worker task: reduce the path's graph and write the folder; ``{"written", "ops", "output", "stats", the
    reduction's numbers, "trusted", "runtime", "reason"}``. ``leaf_known``: the reference's values at the tensors
    that bound the leaf layer the diagnosis found (its input and output), so a converter fault is cut there."""
    from parity.diagnose.graph import onnx_graph
    from parity.diagnose.graph.reduce import reduce
    from parity.golden import store as golden
    from parity.model import feeds
    from parity.model.workspace import Workspace
    from parity.run import paths
    from parity.runtimes.onnx_common import onnx_feed

    spec = Workspace(workspace).load_spec(model)
    runtime = paths.by_id(path_id, "cpu", precision).runtime.name
    verified = golden.load(Path(golden_dir), spec)
    graph, folder = onnx_graph.load(Path(artifact_dir) / artifact_meta["file"])  # weights in a data file stay there
    feed = onnx_feed(spec, artifact_meta, feeds.from_arrays(spec, verified.arrays["inputs.npz"]))
    graph = onnx_graph.pinned(graph, feed)
    trusted = trusted_for(diagnosis, runtime)
    if trusted == "source":
        reference = verified.arrays["reference.npz"]
        known = _as_graph_types(
            graph, _golden_known(spec, graph, diagnosis, reference, artifact_meta, feed, leaf_known)
        )
    else:
        assert trusted is not None  # the job asks only where the diagnosis names the evaluator that is right
        trusted, known = _evaluated(trusted, graph, feed, threads, folder)
    tolerances = spec.output_tolerances(precision)
    names = {
        **{r["tensor"]: r["tap"] for r in diagnosis.get("taps") or [] if r.get("tensor")},
        **dict(zip(artifact_meta["output_names"], spec.outputs)),
    }

    def tolerance_for(tensor):
        return tolerances.for_name(names.get(tensor, ""))

    reduced = reduce(graph, feed, runtime, known, tolerance_for, threads, folder)
    numbers = {
        "nodes_before": reduced.nodes_before,
        "nodes_after": reduced.nodes_after,
        "checks": reduced.checks,
        "reproduced": reduced.reproduced,
        "seconds": reduced.seconds,
        "trusted": trusted,
        "runtime": runtime,
    }
    if reduced.model is None:
        return {"written": False, "reason": reduced.reason, **numbers}
    other = _other_failure(graph, feed, runtime, reduced, known, tolerance_for, threads, folder)
    if other:
        return {"written": False, "reason": other, **numbers}
    write_report(
        Path(out_dir),
        reduced,
        tolerance_for(reduced.output),
        threads,
        diagnosis=diagnosis,
        environment=environment,
        command=command,
        trusted=trusted,
    )
    return {
        "written": True,
        "ops": [node.op_type for node in reduced.model.graph.node],
        "output": reduced.output,
        "stats": {k: v for k, v in reduced.stats.items() if isinstance(v, (int, float, str))},
        **numbers,
    }


def _other_failure(
    graph, feed: dict, runtime: str, reduced, known: dict, tolerance_for, threads: int, folder=None
) -> str | None:
    """Why the reduced graph's failure is not the one the check saw, or None where it is: in the whole graph, its
    output tensor given its right value must bring every graph output back within tolerance (what fails there is
    what fails the check); a reduced graph whose failure leaves the outputs failing when mended is another part."""
    from parity.check.closeness import error_stats
    from parity.diagnose.graph import onnx_graph

    outputs = [o.name for o in graph.graph.output if o.name in known]
    if reduced.output in outputs:
        return None
    mended = graph.__class__()
    mended.CopyFrom(graph)
    fed = f"{reduced.output}__right"
    for node in mended.graph.node:
        node.input[:] = [fed if name == reduced.output else name for name in node.input]
    value_info = next((v for v in (*graph.graph.value_info, *graph.graph.output) if v.name == reduced.output), None)
    if value_info is None:
        from onnx import helper

        value = np.asarray(reduced.expected)
        value_info = helper.make_tensor_value_info(
            reduced.output, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape
        )
    entry = mended.graph.input.add()
    entry.CopyFrom(value_info)
    entry.name = fed
    try:
        fed_right = {**feed, fed: np.asarray(reduced.expected)}
        values = onnx_graph.run_tensors(runtime, mended, fed_right, outputs, threads, folder=folder)
    except Exception as error:  # noqa: BLE001 - the graph cannot be cut there: say so rather than guess
        return f"the reduced graph's output {reduced.output!r} cannot be put back into the whole graph ({error})"
    still = [
        name
        for name in outputs
        if not error_stats(np.asarray(values[name]), np.asarray(known[name]), tolerance_for(name)).get("ok")
    ]
    if not still:
        return None
    return (
        f"the reduced graph fails at {reduced.output!r}, but with its right value there the whole graph's outputs "
        f"({', '.join(still)}) still fail: it is not the failure the check saw, so no bug report is written"
    )


def write_report(
    out: Path,
    reduced,
    tolerance,
    threads: int = 1,
    *,
    diagnosis: dict | None = None,
    environment: dict | None = None,
    command: str | None = None,
    trusted: str | None = None,
) -> Path:
    """Write the bug-report folder of ``reduced`` (a ``Reduced`` with a model) at ``out``, replacing what is there:
    everything goes into a scratch folder beside it, which is then exchanged with ``out`` at once (a symlink at
    ``out`` is followed: the folder it leads to is replaced, the link stays)."""
    from parity.exporters.common import LARGE_BYTES, save_onnx
    from parity.interop.onnx_test_data import write_test_data
    from parity.platform.env import environment as current

    out = safefs.resolve_target(out)  # a symlink is followed and kept: its target is what is exchanged
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = safefs.owned_tempdir(out.parent, f".{out.name}.tmp-")
    try:
        save_onnx(reduced.model, scratch, threshold=LARGE_BYTES)  # one file below protobuf's 2 GiB
        write_test_data(scratch, reduced.inputs, {reduced.output: _typed(reduced.model, reduced.expected)})
        script = SCRIPT.replace("@RUNTIME@", reduced.failing).replace("@THREADS@", str(threads))
        script = script.replace("@ATOL@", repr(float(tolerance.atol))).replace("@RTOL@", repr(float(tolerance.rtol)))
        (scratch / "repro.py").write_text(script)
        readme = _readme(
            reduced, diagnosis or {}, environment or current(threads), command, trusted, tolerance, threads
        )
        (scratch / "README.md").write_text(readme)
        safefs.replace_dir(scratch, out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def _typed(model, value) -> np.ndarray:
    """The expected output in the dtype the reduced graph's output has."""
    from onnx import helper

    elem = model.graph.output[0].type.tensor_type.elem_type
    return np.asarray(value).astype(helper.tensor_dtype_to_np_dtype(elem)) if elem else np.asarray(value)


def _first_node(reduced, diagnosis: dict) -> str:
    cause = diagnosis.get("node_cause") or {}
    if cause.get("node"):
        return f"{cause['node']} ({cause.get('op_type')}), as the diagnosis names it"
    for check in (diagnosis.get("links") or {}).get("checks") or []:
        node = check.get("first_divergent_node")
        if check.get("link") == "runtime" and node:
            return f"{node['node']} ({node['op_type']}), as the diagnosis names it"
    last = reduced.model.graph.node[-1]
    return f"{last.name or '(unnamed)'} ({last.op_type}): it computes the earliest known tensor that fails"


def _headline(reduced, link: str | None, trusted: str | None) -> str:
    """The title of the report, by the link the diagnosis names: the converter's graph, or the runtime."""
    if link in ("converter", "definition"):
        return f"the {link} departs from the model's source (the exported graph computes other values; {reduced.failing} runs it)"
    return f"{reduced.failing} departs from {'the known values' if trusted in (None, 'source') else trusted}"


def _first_tap(diagnosis: dict) -> str:
    """The diagnosis's first divergent tap, or the path in the model's tree where it found the divergence."""
    from parity.diagnose.descend import display

    tap, trail = diagnosis.get("first_divergent_tap"), diagnosis.get("first_divergent_path") or []
    if trail and trail[0] != tap:
        return f"{display(trail)} (in the model's tree)" + (f"; tap {tap}" if tap else "")
    if trail and len(trail) > 1:
        return f"{tap} (in the model's tree: {display(trail)})"
    return tap or "none"


def environment_lines(versions: dict, environment: dict) -> list[str]:
    """A reproducer README's ``## Environment`` section: the packages' versions and the machine the run was on."""
    return [
        "## Environment",
        "",
        *[f"- {name} {version}" for name, version in sorted(versions.items()) if version],
        f"- python {environment.get('python', '?')}; {environment.get('platform', '')}; {environment.get('cpu', '?')}",
    ]


def _readme(reduced, diagnosis, environment, command, trusted, tol, threads) -> str:
    from parity.check.closeness import describe

    versions = environment.get("packages", {})
    cause = diagnosis.get("node_cause") or diagnosis.get("cause") or {}
    links = diagnosis.get("links") or {}
    samples = next(iter(reduced.inputs.values())).shape[0] if reduced.inputs else 1
    level = {"ort": "ORT_ENABLE_ALL", "ort-noopt": "ORT_DISABLE_ALL"}.get(reduced.failing)
    title = " ".join(str(p) for p in (diagnosis.get("model"), diagnosis.get("path")) if p) or "ONNX graph"
    lines = [
        f"# {title}: {_headline(reduced, links.get('enters_at'), trusted)}",
        "",
        *environment_lines(versions, environment),
        "",
        "## What diverges",
        "",
        (
            f"- {describe('tensor', reduced.output, reduced.stats)} (atol {tol.atol:g}, rtol {tol.rtol:g}), judged on "
            f"the first axis's {samples} samples at once"
        ),
        f"- runtime: {reduced.failing}"
        + (
            f" (CPU, graph optimisation level {level}, {threads} intra-op thread(s))"
            if level
            else " (onnx.reference.ReferenceEvaluator)"
        ),
        f"- nodes: {' -> '.join(f'{n.op_type} {n.name}'.strip() for n in reduced.model.graph.node)}",
        f"- first divergent node: {_first_node(reduced, diagnosis)}",
        f"- first divergent tap of the diagnosis: {_first_tap(diagnosis)}",
        f"- tested cause: {cause.get('description') or 'none confirmed'}",
        *([f"- fix: {cause['fix']}"] if cause.get("fix") else []),
        f"- link: {links.get('enters_at') or 'not diagnosed'}"
        + (f": {links['explanation']}" if links.get("explanation") else ""),
        (
            f"- right values from: {trusted or 'given'} ('source': the float64 golden of the model's source; "
            f"'onnxref': onnx.reference; 'ort-noopt': ONNX Runtime with graph optimisations off)"
        ),
        "",
        "## Reduction",
        "",
        (
            f"- {reduced.nodes_before} nodes -> {reduced.nodes_after}, {reduced.checks} candidate checks "
            f"({reduced.reproduced} failed), {reduced.seconds:.2f} s"
        ),
        *[f"- {step}" for step in reduced.steps],
        "",
        "## Reproduce",
        "",
        "    python repro.py    # exits 1 while the bug is present, 0 once fixed",
        "",
        *([f"Made by `{command}`.", ""] if command else []),
    ]
    return "\n".join(lines)
