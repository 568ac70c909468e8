"""Step-by-step verification of a generation path against the float64 golden.

Teacher-forced: the path was fed the golden's tokens, so each step's logits are compared with the golden's at the
same step (tolerance units, KL divergence, top-1). Free-running: the path's own greedy tokens against the golden's
(the share that agree, the first that differs). Consistency: the path's own cached and uncached results, which must
agree whatever the golden (cache = no cache, batch 1 = the same prompt in a left-padded batch, chunked prefill = one
prefill). Every comparison is in float64.

A golden batch holds either full logits (``logits`` (steps, B, V)) or, for a large vocabulary, the top-k ids and
logits of each row with the row's log-sum-exp (``topk_ids``, ``topk_logits``, ``lse``): then tolerance and top-1 are
judged on those ids and the KL divergence is the one of the top-k ids and "the rest" as one outcome, a lower bound
of the full KL.
"""

from __future__ import annotations

import numpy as np

# float32 paths against the float64 reference, in logits: on the tiny Llama, Qwen2, Mistral, Phi-3 and Gemma-2 the
# torch float32 and ONNX Runtime paths stay below 0.003 units of these (|d| <= 2.4e-7), a decode step that reads
# rotary positions restarted at 0 is about 50 units off.
FLOAT32_TOLERANCES = {"atol": 1e-4, "rtol": 1e-4}
CONSISTENCY = ("cache_vs_full", "batch1_vs_padded", "chunked_prefill")


def logsumexp(x: np.ndarray) -> np.ndarray:
    """log(sum(exp(x))) over the last axis, without overflow."""
    top = x.max(-1)
    return top + np.log(np.exp(x - top[..., None]).sum(-1))


def tol_units(ref: np.ndarray, got: np.ndarray, tolerances: dict) -> float:
    """max |got - ref| / (atol + rtol |ref|), in float64 (inf where a value is not finite)."""
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    if ref.shape != got.shape:
        raise ValueError(f"shapes differ: golden {ref.shape}, path {got.shape}")
    if ref.size == 0:
        return 0.0
    if not (np.isfinite(got).all() and np.isfinite(ref).all()):
        return float("inf")
    diff = np.abs(got - ref)
    allowed = tolerances["atol"] + tolerances["rtol"] * np.abs(ref)
    # an exact element is 0 units whatever its tolerance; a difference against a zero tolerance is infinitely many
    units = np.divide(diff, allowed, out=np.where(diff > 0, np.inf, 0.0), where=allowed > 0)
    return float(units.max())


def _step(golden: dict, got: np.ndarray, step: int, tolerances: dict) -> dict:
    """tol_units, kl (max over rows), top1 (all rows agree, a tie within tolerance counting as agreement), max_abs."""
    got = np.asarray(got[step], np.float64)  # (B, V)
    atol, rtol = tolerances["atol"], tolerances["rtol"]
    if "logits" in golden:
        ref = np.asarray(golden["logits"][step], np.float64)
        units, max_abs = tol_units(ref, got, tolerances), float(np.abs(got - ref).max()) if got.size else 0.0
        lp, lq = ref - logsumexp(ref)[:, None], got - logsumexp(got)[:, None]
        kl = (np.exp(lp) * (lp - lq)).sum(-1)
        picked = got.argmax(-1)
        best = ref.argmax(-1)
        gap = ref[np.arange(len(ref)), best] - ref[np.arange(len(ref)), picked]
        tie = gap <= atol + rtol * np.abs(ref[np.arange(len(ref)), best])
    else:
        ids = np.asarray(golden["topk_ids"][step], np.int64)  # (B, K), best first
        ref = np.asarray(golden["topk_logits"][step], np.float64)
        at = np.take_along_axis(got, ids, -1)
        units, max_abs = tol_units(ref, at, tolerances), float(np.abs(at - ref).max())
        lp = ref - np.asarray(golden["lse"][step], np.float64)[:, None]
        lq = at - logsumexp(got)[:, None]
        p, q = np.exp(lp), np.exp(lq)
        rest_p, rest_q = np.clip(1 - p.sum(-1), 1e-300, None), np.clip(1 - q.sum(-1), 1e-300, None)
        kl = (p * (lp - lq)).sum(-1) + rest_p * (np.log(rest_p) - np.log(rest_q))
        picked = got.argmax(-1)
        in_top = ids == picked[:, None]
        picked_ref = np.where(in_top.any(-1), (ref * in_top).sum(-1), -np.inf)
        tie = ref[:, 0] - picked_ref <= atol + rtol * np.abs(ref[:, 0])
    finite = np.isfinite(kl)
    kl_max = float(kl.max()) if finite.all() else float("inf")
    return {"tol_units": units, "kl": max(kl_max, 0.0), "top1": bool(tie.all()), "max_abs": max_abs}


def consistency(pairs: dict, tolerances: dict) -> dict:
    """Each check of ``pairs`` (name -> (expected, got) arrays, or None where it does not apply) as
    ``{"ok", "tol_units", "max_abs"}``; ``ok`` None where not applicable."""
    results: dict[str, dict] = {}
    for name in CONSISTENCY:
        pair = pairs.get(name)
        if pair is None:
            results[name] = {"ok": None, "tol_units": None, "max_abs": None}
            continue
        expected, got = (np.asarray(a, np.float64) for a in pair)
        units = tol_units(expected, got, tolerances)
        max_abs = float(np.abs(got - expected).max()) if np.isfinite(units) and got.size else float("inf")
        results[name] = {"ok": bool(units <= 1.0), "tol_units": round(units, 6), "max_abs": max_abs}
    return results


def compare(golden: dict, path: dict, tolerances: dict | None = None) -> dict:
    """The generation block of a path's JSON.

    ``golden``: batch name -> {"tokens" (steps, B), and "logits" or "topk_ids"/"topk_logits"/"lse"}.
    ``path``: batch name -> {"logits": teacher-forced (steps, B, V), "tokens": free-running (steps, B)}, and
    ``"consistency"``: name -> (expected, got) arrays or None (see ``consistency``).
    """
    tolerances = tolerances or FLOAT32_TOLERANCES
    names = [name for name in golden if name in path and name != "consistency"]
    if not names:
        raise ValueError("the golden and the path share no batch")
    steps = int(np.asarray(golden[names[0]]["tokens"]).shape[0])
    per_step, first, first_mode, first_batch = [], None, None, None
    agree = total = 0
    first_token = None
    for step in range(steps):
        for name in names:
            result = _step(golden[name], path[name]["logits"], step, tolerances)
            mode = "prefill" if step == 0 else "decode"
            per_step.append(
                {
                    "step": step,
                    "mode": mode,
                    "batch": name,
                    "tol_units": round(result["tol_units"], 6),
                    "kl": result["kl"],
                    "top1": result["top1"],
                    "max_abs": result["max_abs"],
                }
            )
            if first is None and (not result["tol_units"] <= 1.0 or not result["top1"]):  # NaN fails too
                first, first_mode, first_batch = step, mode, name
    for name in names:
        want, got = np.asarray(golden[name]["tokens"]), np.asarray(path[name]["tokens"])
        same = want == got
        agree, total = agree + int(same.sum()), total + same.size
        bad = np.flatnonzero(~same.all(-1))
        if bad.size and (first_token is None or bad[0] < first_token):
            first_token = int(bad[0])
    checks = consistency(path.get("consistency", {}), tolerances)
    failing = [name for name, c in checks.items() if c["ok"] is False]
    if first is not None:
        row = next(r for r in per_step if r["step"] == first and r["batch"] == first_batch)
        what = f"{row['tol_units']:.3g} tolerance units" if not row["tol_units"] <= 1 else "top-1 token differs"
        reason = f"step {first} ({first_mode}, {first_batch}) departs from the golden: {what}"
    elif failing:
        c = checks[failing[0]]
        reason = f"consistency {failing[0]} fails: {c['tol_units']:.3g} tolerance units"
    else:
        reason = f"{steps} steps within tolerance, every consistency check holds"
    return _finite_only(
        {
            "steps": steps,
            "first_divergent_step": first,
            "mode": first_mode,
            "batch": first_batch,
            "token_agreement": round(agree / total, 6) if total else None,
            "first_divergent_token": first_token,
            "kl_max": max(r["kl"] for r in per_step),
            "top1_agreement": round(sum(r["top1"] for r in per_step) / len(per_step), 6),
            "max_abs_logit": max(r["max_abs"] for r in per_step),
            "tol_units_max": max(r["tol_units"] for r in per_step),
            "tolerances": dict(tolerances),
            "per_step": per_step,
            "consistency": checks,
            "verdict": "fail" if first is not None or failing else "pass",
            "reason": reason,
        }
    )


def _finite_only(value):
    """``value`` with every non-finite float as None (JSON has no infinity; None reads "not a number")."""
    if isinstance(value, dict):
        return {k: _finite_only(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_only(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value
