"""Training-step parity: one plain-SGD step on a path, checked against golden weights and gradients.

From the golden weights ``w`` and float64 golden gradients ``g``, one step with rate ``lr`` must give
``w - lr * g``. A parameter passes when every element is within ``lr * (atol + rtol * |g|)`` (the
gradient tolerance, carried through the step) plus float rounding of the weight,
``2 * eps * max(|w|, |w - lr * g|)`` in the runner's dtype. NumPy only: the worker task
that runs it on a path is ``parity.run.tasks.verify_step``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

SABOTAGES = ("double_lr", "skip:<param>")


def check_step(runner, x, labels, lr: float, golden_weights: dict, golden_grads: dict, grad_tolerances) -> dict:
    """Take ONE ``runner.train_step`` from the golden weights and compare every trainable weight.

    ``runner`` must be freshly built from ``golden_weights`` (its starting weights are checked: a
    parameter that did not start there fails). ``golden_grads`` may hold the input gradient
    (``input:<name>``): it is skipped. ``grad_tolerances`` is a ``parity.model.spec.Tolerances``.

    Returns ``{"ok", "params": {name: {"max_abs", "tol_units", "ok", ...}}, "worst", "lr", "step_s"}``;
    ``worst`` is the parameter with the largest error in tolerance units (a failing one first).
    """
    from parity.platform.precision import DTYPE_EPS, DTYPE_MIN_NORMAL

    lr = float(lr)
    # weights are stored in the runner's dtype (reported widened to float32): its rounding, subnormals included
    eps, min_normal = DTYPE_EPS.get(runner.compute_dtype), DTYPE_MIN_NORMAL.get(runner.compute_dtype, 0.0)
    names = [name for name in golden_grads if not name.startswith("input:")]
    before = runner.trainable_weights()
    started = time.perf_counter()
    runner.train_step(x, labels, lr)
    step_s = time.perf_counter() - started
    after = runner.trainable_weights()
    params = {}
    for name in names:
        if name not in after:
            params[name] = {"ok": False, "reason": "the runner reports no such trainable weight"}
            continue
        tol = grad_tolerances.for_name(name)
        params[name] = step_stats(
            before.get(name),
            after[name],
            golden_weights[name],
            golden_grads[name],
            lr,
            tol.atol,
            tol.rtol,
            eps,
            min_normal,
        )
    unexpected = sorted(set(after) - set(names))
    worst = max(params, key=lambda n: (not params[n]["ok"], params[n].get("tol_units", float("inf"))), default=None)
    result = {
        "ok": bool(params) and all(s["ok"] for s in params.values()) and not unexpected,
        "params": params,
        "worst": worst,
        "lr": lr,
        "step_s": step_s,
    }
    if unexpected:
        result["unexpected"] = unexpected
    return result


def step_stats(
    before, after, weight, grad, lr: float, atol: float, rtol: float, eps: float | None = None, min_normal: float = 0.0
) -> dict:
    """One parameter after one step against ``weight - lr * grad`` (float64 arithmetic); ``eps`` and
    ``min_normal``: the machine epsilon and smallest normal number of the dtype the weights are stored in
    (default: ``after``'s epsilon; below ``min_normal`` a number is rounded to subnormal spacing)."""
    after = np.asarray(after)
    weight = np.asarray(weight, dtype=np.float64)
    grad = np.asarray(grad, dtype=np.float64)
    if after.shape != weight.shape or grad.shape != weight.shape:
        return {"ok": False, "reason": f"shape {tuple(after.shape)} != golden {tuple(weight.shape)}"}
    if eps is None:
        eps = float(np.finfo(after.dtype).eps) if after.dtype.kind == "f" else float(np.finfo(np.float32).eps)
    a = after.astype(np.float64)
    if not np.all(np.isfinite(a)):
        bad = int(a.size - np.count_nonzero(np.isfinite(a)))
        return {"ok": False, "reason": f"{bad} of {a.size} elements are NaN or Inf after the step"}
    stats: dict[str, Any] = {}
    if before is not None:  # the step must start from the golden weights (exact up to the runner's dtype)
        start = np.abs(np.asarray(before, dtype=np.float64) - weight)
        stats["start_max_abs"] = float(start.max()) if start.size else 0.0
        stats["start_ok"] = bool(np.all(start <= eps * np.maximum(np.abs(weight), min_normal)))
    expected = weight - lr * grad
    diff = np.abs(a - expected)
    allowance = lr * (atol + rtol * np.abs(grad)) + 2 * eps * np.maximum(
        np.maximum(np.abs(weight), np.abs(expected)), min_normal
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(diff == 0, 0.0, diff / allowance)
    tol_units = float(ratio.max()) if ratio.size else 0.0
    stats.update(
        {
            "max_abs": float(diff.max()) if diff.size else 0.0,
            "tol_units": tol_units,
            "n_bad": int(np.count_nonzero(~(ratio <= 1.0))),
            "size": int(diff.size),
            "ok": bool(tol_units <= 1.0 and stats.get("start_ok", True)),
        }
    )
    if not stats.get("start_ok", True):
        stats["reason"] = f"did not start from the golden weights (max_abs {stats['start_max_abs']:.3g})"
    return stats


def describe(result: dict) -> str:
    """One line: the step's verdict and its worst parameter."""
    name = result["worst"]
    if name is None:
        return "no parameters compared"
    stats = result["params"][name]
    verdict = "ok" if result["ok"] else "FAILED"
    if "reason" in stats:
        return f"training step {verdict}: {name}: {stats['reason']}"
    return (
        f"training step {verdict} (lr {result['lr']:g}): worst {name}, max_abs {stats['max_abs']:.3g} is "
        f"{stats['tol_units']:.3g}x the allowance, {stats['n_bad']} of {stats['size']} elements out"
    )


def sabotaged(runner_class, sabotage: str | None):
    """``runner_class``, or a subclass with a deliberate training bug, to prove ``check_step`` catches it.

    ``"double_lr"``: every step uses twice the rate. ``"skip:<param>"``: the optimizer is not given
    ``<param>`` (a parameter left out of the update, the classic bug).
    """
    if not sabotage:
        return runner_class
    if sabotage == "double_lr":

        def train_step(self, x, labels, lr):
            runner_class.train_step(self, x, labels, 2 * lr)

        return type(f"DoubleLr{runner_class.__name__}", (runner_class,), {"train_step": train_step})
    if sabotage.startswith("skip:"):
        skipped = sabotage.split(":", 1)[1]

        def optimized_params(self):
            names = runner_class.optimized_params(self)
            if skipped not in names:
                raise ValueError(f"cannot skip {skipped!r}: not one of {names}")
            return [name for name in names if name != skipped]

        return type(f"Skip{runner_class.__name__}", (runner_class,), {"optimized_params": optimized_params})
    raise ValueError(f"unknown sabotage {sabotage!r}; known: {', '.join(SABOTAGES)}")
