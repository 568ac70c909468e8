"""Building golden data: the zoo's (trained, three frameworks proven equal in float64) or a user model's
(``parity.golden.user``), in worker processes, published atomically."""

from __future__ import annotations

import shutil
import time

import numpy as np

from parity.check.metrics import task_metrics
from parity.golden import user
from parity.golden.shapes import build_shapes
from parity.golden.store import load_arrays, new_scratch, publish, save_npz
from parity.model.digits import DATASET, SPLIT_SEED, digits_split
from parity.platform.errors import ParityError

FP64_AGREEMENT = 1e-9


def build(workspace, spec, pool, progress=lambda message: None) -> dict:
    """Train the weights, run every framework in float64, prove they agree, write golden atomically.

    ``pool`` is a ``WorkerPool``: training and each framework run in their own processes.
    Raises ``ParityError`` (nothing written) when the definitions disagree beyond ``FP64_AGREEMENT``.
    """
    if spec.weights_from_model:
        return user.build(workspace, spec, pool, progress)
    started = time.perf_counter()
    scratch = new_scratch(workspace, spec)
    try:
        split = digits_split(spec.model_inputs[0].shape)
        save_npz(scratch / "train.npz", {"x": split.train_x, "y": split.train_y})
        save_npz(scratch / "eval.npz", {"x": split.eval_x.astype(np.float32), "y": split.eval_y})
        save_npz(
            scratch / "inputs.npz",
            {"x": split.eval_x[: spec.batch_size].astype(np.float32), "labels": split.eval_y[: spec.batch_size]},
        )
        progress(f"{spec.name}: training ({spec.training.epochs} epochs, torch, seed {spec.training.seed})")
        train_info = pool.call(
            "torch",
            "parity.golden.tasks:train_weights",
            workspace=str(workspace.root),
            model=spec.name,
            train_file=str(scratch / "train.npz"),
            eval_file=str(scratch / "eval.npz"),
            out_file=str(scratch / "weights.npz"),
        )
        references = {}
        for framework in spec.frameworks:
            progress(f"{spec.name}: float64 reference in {framework}")
            out_file = scratch / f"reference-{framework}.npz"
            pool.call(
                framework,
                "parity.golden.tasks:fp64_reference",
                workspace=str(workspace.root),
                model=spec.name,
                framework=framework,
                scratch=str(scratch),
                out_file=str(out_file),
            )
            references[framework] = load_arrays(scratch, out_file.name)
        agreement = _cross_framework_agreement(spec, references)
        reference = references[spec.frameworks[0]]
        save_npz(scratch / "reference.npz", {k: v for k, v in reference.items() if not k.startswith("grad/")})
        save_npz(
            scratch / "gradients.npz", {k[len("grad/") :]: v for k, v in reference.items() if k.startswith("grad/")}
        )

        progress(f"{spec.name}: float64 reference at the verification shapes")
        build_shapes(workspace, spec, scratch, pool, spec.frameworks[0], "float64", None)
        eval_y = load_arrays(scratch, "eval.npz")["y"]
        golden_metrics = task_metrics(reference["eval/logits"], eval_y, spec.num_classes, spec.metric_rules.top_k)
        manifest = {
            "reference_framework": spec.frameworks[0],
            "frameworks": list(spec.frameworks),
            "cross_framework_fp64_max_abs": agreement["outputs"],
            "cross_framework_fp64_grad_max_abs": agreement["gradients"],
            "cross_framework_fp64_by_tap": agreement["by_tap"],
            "metrics": golden_metrics,
            "training": {**vars(spec.training), **train_info},
            "data": {
                "dataset": DATASET,
                "split_seed": SPLIT_SEED,
                "train": len(split.train_y),
                "eval": len(split.eval_y),
                "inputs": spec.batch_size,
            },
        }
        return publish(workspace, spec, scratch, manifest, started)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _cross_framework_agreement(spec, references: dict[str, dict]) -> dict:
    """Largest float64 disagreement between the definitions; refuse past ``FP64_AGREEMENT``.

    Taps are checked in network order first, so the message names the first layer where the
    definitions part (a definition bug such as a different epsilon or GELU form).
    """
    frameworks = list(references)
    base_name = frameworks[0]
    base = references[base_name]
    by_tap: dict[str, float] = {}
    worst_outputs = worst_grads = 0.0
    for other_name in frameworks[1:]:
        other = references[other_name]
        for key in [f"tap/{t}" for t in spec.taps] + list(spec.outputs) + ["eval/logits"]:
            diff = float(np.max(np.abs(base[key] - other[key])))
            if key.startswith("tap/"):
                by_tap[key[4:]] = max(by_tap.get(key[4:], 0.0), diff)
            if diff > FP64_AGREEMENT:
                where = f"tap {key[4:]!r}" if key.startswith("tap/") else f"output {key!r}"
                raise ParityError(
                    f"model {spec.name!r}: the {base_name} and {other_name} definitions disagree in float64 at "
                    f"{where} (first divergence in network order): max abs {diff:.3g} > {FP64_AGREEMENT:g}. "
                    f"Check defaults that differ between frameworks there (epsilon, GELU erf/tanh, padding, layout)"
                )
            worst_outputs = max(worst_outputs, diff)
        for key in [k for k in base if k.startswith("grad/")]:
            diff = float(np.max(np.abs(base[key] - other[key])))
            if diff > FP64_AGREEMENT:
                raise ParityError(
                    f"model {spec.name!r}: {base_name} and {other_name} float64 gradients disagree for "
                    f"{key[5:]!r}: max abs {diff:.3g} > {FP64_AGREEMENT:g}"
                )
            worst_grads = max(worst_grads, diff)
    return {"outputs": worst_outputs, "gradients": worst_grads, "by_tap": by_tap}
