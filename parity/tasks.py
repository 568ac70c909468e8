"""Tasks that run inside worker processes (they import frameworks; the orchestrator does not)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from parity import compare, golden, metrics, paths, provenance
from parity.errors import Unavailable
from parity.exporters.common import ExportJob
from parity.workspace import Workspace

NATIVE_SOURCES = {"torch": "parity.sources.torch:TorchSource", "tf": "parity.sources.tf:KerasSource",
                  "jax": "parity.sources.jax:JaxSource"}


def run_batched(runner, x: np.ndarray, batch_size: int) -> dict[str, np.ndarray]:
    """Run a static-batch runner over any number of samples (the last batch zero-padded)."""
    n = len(x)
    chunks = []
    for start in range(0, n, batch_size):
        block = x[start:start + batch_size]
        if len(block) < batch_size:
            block = np.concatenate([block, np.zeros((batch_size - len(block), *x.shape[1:]), x.dtype)])
        chunks.append(runner.run(block))
    return {name: np.concatenate([c[name] for c in chunks])[:n] for name in chunks[0]}


def train_weights(workspace: str, model: str, train_file: str, eval_file: str, out_file: str) -> dict:
    """Seeded, deterministic training of the torch definition; canonical float32 weights to ``out_file``."""
    import torch

    from parity.sources.torch import build_module, canonical_state

    spec = Workspace(workspace).load_spec(model)
    cfg = spec.training
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)
    module = build_module(spec, None, "float32").train()
    with np.load(train_file, allow_pickle=False) as data:
        x = torch.from_numpy(data["x"].astype(np.float32))
        y = torch.from_numpy(data["y"])
    optimizer = torch.optim.Adam(module.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    order = torch.Generator().manual_seed(cfg.seed)
    for _ in range(cfg.epochs):
        for batch in torch.randperm(len(x), generator=order).split(cfg.batch_size):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(module(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
    module.eval()
    weights = canonical_state(spec, module)
    golden.save_npz(Path(out_file), weights)
    with torch.no_grad():
        train_accuracy = float((module(x).argmax(-1) == y).float().mean())
    return {"final_loss": float(loss), "train_accuracy": train_accuracy}


def _source(framework: str, spec, weights, dtype: str):
    return paths.load_target(NATIVE_SOURCES[framework])(spec, weights, spec.batch_size, dtype)


def fp64_reference(workspace: str, model: str, framework: str, scratch: str, out_file: str) -> None:
    """Outputs, taps, eval logits and gradients of one framework's definition in float64."""
    spec = Workspace(workspace).load_spec(model)
    scratch = Path(scratch)
    arrays = reference_arrays(spec, framework, golden.load_arrays(scratch, "weights.npz"),
                              golden.load_arrays(scratch, "inputs.npz"), golden.load_arrays(scratch, "eval.npz")["x"],
                              "float64")
    golden.save_npz(Path(out_file), arrays)


def reference_arrays(spec, framework: str, weights: dict, inputs: dict, eval_x: np.ndarray, dtype: str) -> dict:
    """A native source's outputs, taps, eval outputs (``eval/logits``) and, with a loss, gradients (``grad/…``),
    all computed in ``dtype``; a definition that returns another dtype anywhere raises ``TypeError``."""

    def cast(x):
        return x if x.dtype.kind in "iu" else x.astype(dtype)  # token ids stay integers

    source = _source(framework, spec, weights, dtype)  # each source holds every weight as layouts.held_dtype says
    x = cast(inputs["x"])
    arrays = dict(source.run(x))
    if spec.taps:
        arrays.update({f"tap/{name}": v for name, v in source.taps(x).items()})
    arrays["eval/logits"] = run_batched(source, cast(eval_x), spec.batch_size)[spec.outputs[0]]
    if spec.loss is not None:
        arrays.update({f"grad/{name}": v for name, v in source.gradients(x, inputs["labels"]).items()})
    for key, value in arrays.items():
        if value.dtype != np.dtype(dtype):
            raise TypeError(f"{framework} returned {value.dtype} for {key} in a {dtype} run")
    return arrays


def export_step(workspace: str, model: str, target: str, golden_dir: str, opset: int, out_dir: str,
                parent_dir: str | None, parent_meta: dict | None, batch_size: int | None = None,
                device: str = "cpu", precision: str = "fp32") -> dict:
    """Run one exporter into ``out_dir`` (static batch ``batch_size``, default the spec's) for ``device`` and
    ``precision`` (which only some steps read); return its metadata plus the export time."""
    spec = Workspace(workspace).load_spec(model)
    verified = golden.load(Path(golden_dir), spec)
    started = time.perf_counter()
    job = ExportJob(spec=spec, weights=verified.arrays["weights.npz"], batch_size=batch_size or spec.batch_size,
                    opset=opset, out_dir=Path(out_dir), parent_dir=Path(parent_dir) if parent_dir else None,
                    parent_meta=parent_meta, golden_manifest=verified.manifest, device=device, precision=precision,
                    inputs=_input_batch(verified, batch_size or spec.batch_size))
    meta = paths.load_target(target)(job)
    meta["export_s"] = time.perf_counter() - started
    meta["code_files"] = provenance.loaded_code_files()  # re-checked on every cache lookup
    meta["batch_size"] = job.batch_size
    return meta


def _input_batch(verified, batch_size: int) -> np.ndarray:
    """The golden input batch at ``batch_size`` (the eval split's first samples when it differs)."""
    x = verified.arrays["inputs.npz"]["x"]
    return x if len(x) == batch_size else verified.arrays["eval.npz"]["x"][:batch_size]


def perturbed(weights: dict, perturbation: dict | None) -> dict:
    """Canonical weights plus a deliberate ``{name: delta}`` (none: the weights as they are)."""
    weights = dict(weights)
    for name, delta in (perturbation or {}).items():
        weights[name] = weights[name] + np.asarray(delta, dtype=weights[name].dtype)
    return weights


def build_runner(spec, path, weights: dict, batch_size: int, threads: int, artifact_dir: str | None = None,
                 artifact_meta: dict | None = None, runner_class=None):
    """The path's runner at a static batch, on the path's device at its precision: a native source from
    canonical ``weights``, or the path's runtime on an exported artifact. ``runner_class`` overrides the
    path's (e.g. a deliberately broken one)."""
    runner_class = runner_class or paths.load_target(path.runtime_target)
    placement = {"device": path.device, "precision": path.precision}
    if artifact_dir is None:
        return runner_class(spec, weights, batch_size, "float32", **placement)
    return runner_class(spec, Path(artifact_dir), artifact_meta, batch_size, threads, **placement)


def check_path(workspace: str, model: str, path_id: str, golden_dir: str, precision: str, threads: int,
               artifact_dir: str | None = None, artifact_meta: dict | None = None, export_s: float = 0.0,
               weight_perturbation: dict | None = None, device: str = "cpu") -> dict:
    """Outputs, determinism, metrics and gradients of one path against golden (timing is ``parity.timing``'s).

    Every precision is compared with the float64 golden, under that precision's tolerances and metric
    rules. A runner that finds it cannot run here (``Unavailable``) makes the path a skip with its reason.
    ``weight_perturbation`` ({name: delta}) adds to canonical weights before a native source is
    built: a deliberate drift, used to prove that the gate holds.
    """
    try:
        return _check_path(workspace, model, path_id, golden_dir, precision, threads, artifact_dir, artifact_meta,
                           export_s, weight_perturbation, device)
    except Unavailable as error:
        return {"verdict": "skip", "reason": str(error)}


def _check_path(workspace, model, path_id, golden_dir, precision, threads, artifact_dir, artifact_meta, export_s,
                weight_perturbation, device) -> dict:
    spec = Workspace(workspace).load_spec(model)
    path = paths.by_id(path_id, device, precision)
    golden_dir = Path(golden_dir)
    verified = golden.load(golden_dir, spec)
    inputs, eval_data = verified.arrays["inputs.npz"], verified.arrays["eval.npz"]
    reference, golden_grads = verified.arrays["reference.npz"], verified.arrays["gradients.npz"]
    tolerances = spec.output_tolerances(precision)
    x = inputs["x"]

    started = time.perf_counter()
    runner = build_runner(spec, path, perturbed(verified.arrays["weights.npz"], weight_perturbation), spec.batch_size,
                          threads, artifact_dir, artifact_meta)
    outputs = runner.run(x)
    first_result_s = export_s + time.perf_counter() - started

    result = {"outputs": compare.compare_named(outputs, {n: reference[n] for n in spec.outputs}, tolerances.for_name),
              "numerics": runner.numerics,
              "tolerances": {"outputs": tolerances.to_json(), "gradients": spec.gradient_tolerances(precision).to_json()}}
    deterministic, nondeterminism = compare.bitwise_equal(outputs, runner.run(x))
    result["deterministic"] = deterministic
    result["determinism_max_diff"] = nondeterminism
    eval_logits = run_batched(runner, eval_data["x"], spec.batch_size)[spec.outputs[0]]
    result["eval_outputs"] = compare.compare_named({spec.outputs[0]: eval_logits},
                                                   {spec.outputs[0]: reference["eval/logits"]}, tolerances.for_name)
    result["metrics"] = None
    if "y" in eval_data:  # a user model without labels has no metrics
        result["metrics"] = metrics.check_metrics(eval_logits, eval_data["y"], reference["eval/logits"], verified.metrics,
                                                  spec.metric_rules, precision, spec.num_classes)
    result["gradients"] = None
    result["time_to_first_gradient_s"] = None
    if path.differentiable and spec.loss is not None:
        grad_started = time.perf_counter()
        grads = runner.gradients(x, inputs["labels"])
        result["time_to_first_gradient_s"] = time.perf_counter() - grad_started
        result["gradients"] = compare.compare_named(grads, golden_grads, spec.gradient_tolerances(precision).for_name)
    result["verdict"], result["reason"] = _verdict(spec, result)
    result["first_result_s"] = first_result_s
    return result


def _verdict(spec, result: dict) -> tuple[str, str | None]:
    """fail naming every failing category (outputs, eval-split outputs, gradients, metrics, determinism)."""
    failures = []
    worst = compare.first_failure(result["outputs"])
    if worst:
        failures.append(compare.describe("output", *worst))
    worst = compare.first_failure(result.get("eval_outputs") or {})
    if worst:
        failures.append(compare.describe("output on the eval split", *worst))
    if result["gradients"] is not None:
        failing = [name for name, s in result["gradients"].items() if not s["ok"]]
        if failing:
            name, stats = compare.first_failure(result["gradients"])
            listed = ", ".join(failing[:6]) + (f" (+{len(failing) - 6} more)" if len(failing) > 6 else "")
            failures.append(f"gradients differ for {len(failing)} of {len(result['gradients'])} ({listed}); "
                            f"worst {compare.describe('gradient', name, stats)}")
    m = result["metrics"]
    if m is not None and not m["ok"]:
        bad = [f"{k} {v['value']:.4f} vs golden {v['golden']:.4f}" for k, v in m.items() if isinstance(v, dict) and not v["ok"]]
        if not m["argmax_agreement_ok"]:
            bad.append(f"argmax agreement {m['argmax_agreement']:.4f}")
        failures.append("metric " + "; ".join(bad))
    if spec.require_determinism and not result["deterministic"]:
        failures.append(f"two runs differ (max {result['determinism_max_diff']:.3g}) and the spec requires determinism")
    return ("fail", "; ".join(failures)) if failures else ("pass", None)
