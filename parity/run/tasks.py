"""Tasks that run inside worker processes (they import frameworks; the orchestrator does not)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from parity.check import accuracy_gate, metrics
from parity.check import closeness as compare
from parity.golden import shapes
from parity.golden import store as golden
from parity.golden import weights as golden_weights
from parity.model import batch_axes, containers, feeds
from parity.model.workspace import Workspace
from parity.platform.errors import NotDifferentiable, Unavailable, one_line
from parity.run import paths

# what only an export or a training step needs is imported by its task: a worker that only checks (a cached check,
# the common case) has less to load before its first result


def export_step(
    workspace: str,
    model: str,
    target: str,
    golden_dir: str,
    opset: int,
    out_dir: str,
    parent_dir: str | None,
    parent_meta: dict | None,
    batch_size: int | None = None,
    device: str = "cpu",
    precision: str = "fp32",
    calibrate: bool = False,
    path_id: str = "",
) -> dict:
    """Run one exporter into ``out_dir`` (static batch ``batch_size``, default the spec's) for ``device`` and
    ``precision`` (which only some steps read); return its metadata plus the export time. A quantizer
    (``calibrate``) gets its calibration samples (``parity.golden.calibration``), recorded in the meta."""
    from parity.exporters.common import ExportJob
    from parity.exporters.onnx_names import check_exported
    from parity.golden import calibration
    from parity.run import provenance

    spec = Workspace(workspace).load_spec(model)
    verified = golden.load(Path(golden_dir), spec)
    started = time.perf_counter()
    job = ExportJob(
        spec=spec,
        weights=golden_weights.for_build(spec, verified.arrays["weights.npz"]),  # type: ignore[arg-type]
        batch_size=batch_size or spec.batch_size,
        opset=opset,
        out_dir=Path(out_dir),
        parent_dir=Path(parent_dir) if parent_dir else None,
        parent_meta=parent_meta,
        golden_manifest=verified.manifest,
        device=device,
        precision=precision,
        inputs=_input_batch(verified, spec, batch_size or spec.batch_size),
        path_id=path_id,
    )
    where = None
    if calibrate:
        job.calibration, where = calibration.calibration_feeds(spec, verified, Workspace(workspace).root)
    meta = paths.load_target(target)(job)
    if where and (meta.get("quantization") or {}).get("calibration_samples") != 0:  # dynamic: no calibration
        meta["calibration_data"] = where
        if isinstance(meta.get("quantization"), dict):  # the rows it calibrated on, as the export is keyed
            meta["quantization"]["calibration_sha256"] = calibration.digest(job.calibration or {})
    meta["export_s"] = time.perf_counter() - started
    if meta.get("format") == "onnx" and not meta.get("user_file"):
        check_exported(Path(out_dir) / meta["file"])  # an invalid graph is the converter's error, not a runtime's
        meta["opset"] = exported_opset(Path(out_dir) / meta["file"], opset)
    meta["code_files"] = provenance.loaded_code_files()  # re-checked on every cache lookup
    meta["batch_size"] = job.batch_size
    return meta


def exported_opset(path: Path, requested: int) -> dict:
    """The default-domain opset the artifact really has, beside the one asked for; a note where they differ (an
    exporter keeps another opset where an op has no version adapter)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    found = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), None)
    record = {"requested": requested, "exported": found}
    if found != requested:
        record["note"] = f"the exporter wrote opset {found}, not the {requested} asked for"
    return record


def _input_batch(verified, spec, batch_size: int) -> dict:
    """The golden feeds at ``batch_size`` (the eval split's first samples, filled up as ``run_batched`` does,
    when it differs)."""
    x = feeds.from_arrays(spec, verified.arrays["inputs.npz"])
    if feeds.samples(spec, x) == batch_size:
        return x
    evals = feeds.from_arrays(spec, verified.arrays["eval.npz"])
    return feeds.padded(spec, feeds.rows(spec, evals, 0, batch_size), batch_size)


def weights_for(spec, verified, perturbation: dict | None = None):
    """The weights to build ``spec``'s runner with: the golden data's (the zoo's copy; for a user model without one,
    None where its builder holds its own, so that no second copy of the model is made), plus a deliberate
    ``{name: delta}`` where given (read from the model then)."""
    weights = verified.arrays["weights.npz"]
    return perturbed(weights, perturbation) if perturbation else golden_weights.for_build(spec, weights)


def perturbed(weights, perturbation: dict | None) -> dict:
    """Canonical weights (a mapping: the golden copy, or the model's own) plus a deliberate ``{name: delta}`` (none:
    the weights as they are)."""
    weights = dict(weights)
    for name, delta in (perturbation or {}).items():
        weights[name] = weights[name] + np.asarray(delta, dtype=weights[name].dtype)
    return weights


def build_runner(
    spec,
    path,
    weights,
    batch_size: int,
    threads: int,
    artifact_dir: str | None = None,
    artifact_meta: dict | None = None,
    runner_class=None,
):
    """The path's runner at a static batch, on the path's device at its precision: a native source from
    canonical ``weights`` (None: the model's builder's own), or the path's runtime on an exported artifact. ``runner_class`` overrides the
    path's (e.g. a deliberately broken one)."""
    runner_class = runner_class or paths.load_target(path.runtime_target)
    placement = {"device": path.device, "precision": path.precision}
    if artifact_dir is None:
        return runner_class(spec, weights, batch_size, "float32", **placement)
    return runner_class(spec, Path(artifact_dir), artifact_meta, batch_size, threads, **placement)


def check_path(
    workspace: str,
    model: str,
    path_id: str,
    golden_dir: str,
    precision: str,
    threads: int,
    artifact_dir: str | None = None,
    artifact_meta: dict | None = None,
    export_s: float = 0.0,
    weight_perturbation: dict | None = None,
    device: str = "cpu",
    keep_outputs: bool = False,
) -> dict:
    """Outputs, determinism, metrics and gradients of one path against golden (timing is ``parity.bench.tasks``'s).

    Every precision is compared with the float64 golden, under that precision's tolerances and metric
    rules. A runner that finds it cannot run here (``Unavailable``) makes the path a skip with its reason.
    ``weight_perturbation`` ({name: delta}) adds to canonical weights before a native source is
    built: a deliberate drift, used to prove that the gate holds. ``keep_outputs``: a failing path's result holds
    its outputs on the golden inputs as the model gave them (``plain_outputs``, ``Runner.as_computed``), which its
    diagnosis reads as the plain run instead of running the path again.
    """
    try:
        return _check_path(
            workspace,
            model,
            path_id,
            golden_dir,
            precision,
            threads,
            artifact_dir,
            artifact_meta,
            export_s,
            weight_perturbation,
            device,
            keep_outputs,
        )
    except Unavailable as error:
        return {"verdict": "skip", "reason": str(error)}


def _check_path(
    workspace,
    model,
    path_id,
    golden_dir,
    precision,
    threads,
    artifact_dir,
    artifact_meta,
    export_s,
    weight_perturbation,
    device,
    keep_outputs=False,
) -> dict:
    spec = Workspace(workspace).load_spec(model)
    path = paths.by_id(path_id, device, precision)
    golden_dir = Path(golden_dir)
    verified = golden.load(golden_dir, spec)
    inputs, eval_data = verified.arrays["inputs.npz"], verified.arrays["eval.npz"]
    reference, golden_grads = verified.arrays["reference.npz"], verified.arrays["gradients.npz"]
    tolerances = spec.output_tolerances(precision)
    x = feeds.from_arrays(spec, inputs)

    started = time.perf_counter()
    runner = build_runner(
        spec,
        path,
        weights_for(spec, verified, weight_perturbation),
        spec.batch_size,
        threads,
        artifact_dir,
        artifact_meta,
    )
    outputs = runner.run(x)
    first_result_s = export_s + time.perf_counter() - started
    as_computed = runner.as_computed() if keep_outputs else None

    judged = compare.OutputTolerances(spec.output_tolerances, precision, dict(runner.output_dtypes))
    # a sequence is compared element by element (each by its own dtype), after its length; an optional after its presence
    structures = dict(verified.manifest.get("containers") or {})
    golden_outputs = {key: reference[key] for key in containers.output_keys(spec.outputs, structures)}
    differ = containers.compare_structures(runner.output_structures, structures)  # named first, and they win
    compared = compare.compare_outputs(outputs, golden_outputs, judged)
    if path.quantized:
        compared = accuracy_gate.by_sqnr(compared, outputs, golden_outputs)
    result = {
        "outputs": {**differ, **{key: stats for key, stats in compared.items() if key not in differ}},
        "numerics": runner.numerics,
        "tolerances": {"outputs": tolerances.to_json(), "gradients": spec.gradient_tolerances(precision).to_json()},
    }
    deterministic, nondeterminism = compare.bitwise_equal(outputs, runner.run(x))
    result["deterministic"] = deterministic
    result["determinism_max_diff"] = nondeterminism
    axes = batch_axes.recorded(verified.manifest)
    eval_output = containers.eval_key(spec, axes, structures)  # the first output with a row per sample
    eval_logits = (
        None
        if eval_output is None
        else feeds.run_batched(runner, feeds.from_arrays(spec, eval_data), spec.batch_size, axes).get(eval_output)
    )
    evaluated = {eval_output: eval_logits} if eval_logits is not None else {}
    result["eval_outputs"] = (
        {}
        if eval_output is None
        else compare.compare_outputs(evaluated, {eval_output: reference["eval/logits"]}, judged)
    )
    result["gate"] = None
    if path.quantized:
        result["eval_outputs"] = accuracy_gate.by_sqnr(
            result["eval_outputs"], evaluated, {eval_output: reference["eval/logits"]}
        )
        result["gate"] = (
            accuracy_gate.judge(eval_logits, reference["eval/logits"], eval_data.get("y"), spec.gate)
            if eval_logits is not None
            else {
                "decision": "fail",
                "reason": ("accuracy gate: the model has no output with a row per eval sample to score"),
            }
        )
    result["metrics"] = None
    if "y" in eval_data:  # a user model without labels has no metrics
        result["metrics"] = metrics.check_metrics(
            eval_logits,
            eval_data["y"],
            reference["eval/logits"],
            verified.metrics,
            spec.metric_rules,
            precision,
            spec.num_classes,
        )
    result["shapes"] = check_shapes(spec, runner, verified, judged, artifact_meta, path.quantized)
    result["gradients"] = None
    result["time_to_first_gradient_s"] = None
    if path.differentiable and spec.loss is not None:
        grad_started = time.perf_counter()
        grads = runner.gradients(x, inputs["labels"])
        result["time_to_first_gradient_s"] = time.perf_counter() - grad_started
        result["gradients"] = compare.compare_named(grads, golden_grads, spec.gradient_tolerances(precision).for_name)
    result["runtime"] = runner.runtime_record()
    result["verdict"], result["reason"] = _verdict(spec, result)
    result["first_result_s"] = first_result_s
    if as_computed is not None and result["verdict"] == "fail":
        result["plain_outputs"] = as_computed
    return result


def check_shapes(spec, runner, verified, tolerances, meta: dict | None, quantized: bool = False) -> list[dict]:
    """The path at every verification shape: its outputs against the golden ones there (judged at ``tolerances``,
    ``closeness.OutputTolerances``; a ``quantized`` path's by SQNR, as the accuracy gate judges it), or the error it
    raised, with the axes its export fixed (``meta["axes"]["static"]``) named."""
    arrays = verified.arrays["shapes.npz"]
    checked = []
    for k, shape in enumerate(verified.manifest["shapes"]):
        entry = {"shape": shape}
        try:
            outputs = runner.run(shapes.feeds_at(spec, arrays, k))
            expected = {n: arrays[f"{k}/output/{n}"] for n in spec.outputs}
            entry["outputs"] = compare.compare_outputs(outputs, expected, tolerances)
            if quantized:
                entry["outputs"] = accuracy_gate.by_sqnr(entry["outputs"], outputs, expected)
            entry["ok"] = compare.first_failure(entry["outputs"]) is None
        except Exception as error:  # noqa: BLE001 - the runtime's own refusal of this shape is the finding
            entry.update(ok=False, error=one_line(f"{type(error).__name__}: {error}", 300))
        if not entry["ok"]:
            entry["baked"] = baked_axes(spec, meta, shape)
        checked.append(entry)
    return checked


def baked_axes(spec, meta: dict | None, shape: dict) -> list[str]:
    """``axis 'batch' of input 'x' fixed at 2`` for each axis the export fixed to a size other than ``shape``'s."""
    static = ((meta or {}).get("axes") or {}).get("static") or {}
    found = []
    for name, axes in static.items():
        for index, fixed in axes.items():
            if shape.get(fixed["axis"], fixed["size"]) != fixed["size"]:
                found.append(f"axis {fixed['axis']!r} of input {name!r} (dimension {index}) fixed at {fixed['size']}")
    return found


def _shape_failure(entry: dict) -> str:
    where = f"at {shapes.describe(entry['shape'])}"
    baked = f"the export baked a shape in: {'; '.join(entry['baked'])}; " if entry.get("baked") else ""
    if "error" in entry:
        return f"{where}: {baked}{entry['error']}"
    failing = compare.first_failure(entry["outputs"])
    assert failing is not None  # an entry not ok without an error has a failing output
    return f"{where}: {baked}{compare.describe('output', *failing)}"


def _verdict(spec, result: dict) -> tuple[str, str | None]:
    """fail naming every failing category (outputs, eval-split outputs, verification shapes, gradients, metrics,
    determinism)."""
    failures = []
    worst = compare.first_failure(result["outputs"])
    if worst:
        failures.append(compare.describe("output", *worst))
    worst = compare.first_failure(result.get("eval_outputs") or {})
    if worst:
        failures.append(compare.describe("output on the eval split", *worst))
    failures += [_shape_failure(entry) for entry in result.get("shapes") or () if not entry["ok"]]
    if result["gradients"] is not None:
        failing = [name for name, s in result["gradients"].items() if not s["ok"]]
        worst_gradient = compare.first_failure(result["gradients"])
        if failing and worst_gradient is not None:
            name, stats = worst_gradient
            listed = ", ".join(failing[:6]) + (f" (+{len(failing) - 6} more)" if len(failing) > 6 else "")
            failures.append(
                f"gradients differ for {len(failing)} of {len(result['gradients'])} ({listed}); "
                f"worst {compare.describe('gradient', name, stats)}"
            )
    gate = result.get("gate")
    if gate is not None and gate["decision"] != "pass":
        failures.append(gate["reason"])
    m = result["metrics"]
    if m is not None and not m["ok"] and gate is None:  # a quantized path's metrics are judged by its gate
        bad = [
            f"{k} {v['value']:.4f} vs golden {v['golden']:.4f}"
            for k, v in m.items()
            if isinstance(v, dict) and not v["ok"]
        ]
        if not m["argmax_agreement_ok"]:
            bad.append(f"argmax agreement {m['argmax_agreement']:.4f}")
        failures.append("metric " + "; ".join(bad))
    if spec.require_determinism and not result["deterministic"]:
        failures.append(f"two runs differ (max {result['determinism_max_diff']:.3g}) and the spec requires determinism")
    return ("fail", "; ".join(failures)) if failures else ("pass", None)


def verify_step(
    workspace: str,
    model: str,
    framework: str,
    lr: float = 0.1,
    sabotage: str | None = None,
    artifact_dir: str | None = None,
    artifact_meta: dict | None = None,
    precision: str = "fp32",
) -> dict:
    """Worker task: build ``framework``'s runner (a path id: ``torch``, ``tf``, ``jax``, or ``jax/tf`` with
    its exported ``artifact_dir`` / ``artifact_meta``) from the verified golden weights, ``check_step``
    it (``sabotage``: a deliberately wrong step, to prove the check catches it). Returns ``check_step``'s
    result plus ``"build_s"``. Timing a verified step is ``parity.bench.tasks.time_train_step``'s job."""
    ws = Workspace(workspace)
    spec = ws.load_spec(model)
    verified = golden.load(ws.golden_dir(model), spec)
    inputs = verified.arrays["inputs.npz"]
    weights, grads = dict(verified.arrays["weights.npz"]), verified.arrays["gradients.npz"]
    path = paths.by_id(framework)
    if not path.differentiable:
        raise NotDifferentiable(f"path {framework} cannot differentiate, so it has no training step")
    from parity.check import training

    runner_class = training.sabotaged(paths.load_target(path.runtime.target), sabotage)
    started = time.perf_counter()
    runner = build_runner(spec, path, weights, spec.batch_size, 1, artifact_dir, artifact_meta, runner_class)
    build_s = time.perf_counter() - started
    x, labels = feeds.from_arrays(spec, inputs), inputs["labels"]
    result = training.check_step(runner, x, labels, lr, weights, grads, spec.gradient_tolerances(precision))
    result["build_s"] = build_s
    return result
