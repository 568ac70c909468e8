"""The accuracy gate of quantized paths: is the int8 model still the model that was trained?

Elementwise tolerances cannot answer it (every int8 output is off by far more than float rounding). The field's rule
is MLPerf's: a quantized model is accepted when its task metric keeps 99 % (or 99.9 %) of the float reference's. parity
judges that rule with 95 % confidence instead of as a point estimate on one eval split:

- the path and the float64 golden are scored on the *same* labelled samples, so the comparison is paired: only the
  discordant samples (right for one, wrong for the other) carry information, the ones both get right or wrong cancel;
- the drop ``golden - path`` gets Tango's score interval for a difference of paired proportions (Tango 1998, Stat.
  Med. 17:891; the restricted maximum-likelihood variance, which stays sensible with no discordant sample at all);
- the path **passes** when the one-sided upper bound of the drop is within ``(1 - keep) * golden``, **fails** when
  the one-sided lower bound is beyond it, and is otherwise **inconclusive**: the split is too small to tell, and the
  gate says about how many more labelled samples would decide if the observed rates held.

A model without labels is gated by agreement: the golden's own argmax is the label, so the golden scores 1 and the
drop is the rate of samples whose argmax changed. NumPy and the standard library only.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from parity.check.metrics import predictions

MAX_SCALE = 1e6  # "more samples" is searched up to a million times the split: beyond, it says none would decide


def scored_against(golden_logits, labels, gate) -> tuple[str, np.ndarray]:
    """``(metric, truth)``: what the ``gate`` scores eval predictions against, the labels (``accuracy``) or the
    golden argmax (``agreement``, also where there are no labels)."""
    metric = gate.metric if labels is not None else "agreement"
    return metric, predictions(golden_logits) if metric == "agreement" else np.asarray(labels)


def percent(value: float) -> str:
    return f"{100 * value:.2f} %"


def judge(logits, golden_logits, labels, gate) -> dict:
    """The ``gate`` (``parity.model.spec.Gate``) on a path's eval ``logits`` against the float64 ``golden_logits``
    of the same samples, scored against ``labels`` (None: by agreement with the golden argmax)."""
    predicted, golden = predictions(logits), predictions(golden_logits)
    metric, truth = scored_against(golden_logits, labels, gate)
    golden_right, path_right = golden == truth, predicted == truth
    n = len(truth)
    lost = int(np.sum(golden_right & ~path_right))  # the golden gets it right, the path does not
    gained = int(np.sum(~golden_right & path_right))
    golden_value, value = float(np.mean(golden_right)), float(np.mean(path_right))
    allowed = (1.0 - gate.keep) * golden_value
    z = NormalDist().inv_cdf(gate.confidence)
    lower, upper = paired_interval(lost, gained, n, z)
    decision = "pass" if upper <= allowed + 1e-12 else "fail" if lower > allowed + 1e-12 else "inconclusive"
    judged = {
        "metric": metric,
        "keep": gate.keep,
        "confidence": gate.confidence,
        "samples": n,
        "value": value,
        "golden": golden_value,
        "drop": (lost - gained) / n,
        "allowed": allowed,
        "interval": [lower, upper],
        "lost": lost,
        "gained": gained,
        "agreement": float(np.mean(predicted == golden)),
        "decision": decision,
        "more_samples": None,
    }
    if metric != gate.metric:
        judged["note"] = f"no labels: gated by agreement with the golden argmax instead of {gate.metric}"
    if decision == "inconclusive":
        judged["more_samples"] = more_samples(lost, gained, n, allowed, z)
    judged["reason"] = None if decision == "pass" else describe(judged)
    return judged


def paired_interval(lost: float, gained: float, n: float, z: float) -> tuple[float, float]:
    """Tango's score interval for the drop ``(lost - gained) / n`` of ``n`` paired samples: the drops whose score
    statistic stays within ``z`` (each bound one-sided at ``NormalDist().cdf(z)``). Counts may be fractional (the
    scaled split ``more_samples`` asks about)."""
    if n <= 0:
        return -1.0, 1.0

    def score(delta: float) -> float:
        other = n - lost - gained  # both right or both wrong
        b = lost * (1 - delta) + gained * (1 - 3 * delta) - 2 * other * delta
        c = gained * delta * (1 - delta)
        p21 = (b + math.sqrt(max(b * b + 8 * n * c, 0.0))) / (4 * n)  # restricted MLE of P(path-only right)
        variance = n * (2 * p21 + delta * (1 - delta))
        excess = lost - gained - n * delta
        if variance <= 0.0:
            return 0.0 if abs(excess) < 1e-12 else math.copysign(math.inf, excess)
        return excess / math.sqrt(variance)

    def root(target: float) -> float:  # score falls as delta rises: bisect score(delta) = target on [-1, 1]
        low, high = -1.0, 1.0
        for _ in range(52):  # 2 / 2^52: float precision
            middle = (low + high) / 2
            low, high = (middle, high) if score(middle) > target else (low, middle)
        return (low + high) / 2

    return root(z), root(-z)


def more_samples(lost: float, gained: float, n: int, allowed: float, z: float) -> int | None:
    """About how many more labelled samples would decide an inconclusive gate, were the rates of lost and gained
    samples (and so the golden's value and the ``allowed`` drop) to stay as observed. None where no number would:
    the observed drop sits at the allowed one."""

    def decided(scale: float) -> bool:
        lower, upper = paired_interval(lost * scale, gained * scale, n * scale, z)
        return upper <= allowed + 1e-12 or lower > allowed + 1e-12

    if not decided(MAX_SCALE):
        return None
    low, high = 1.0, MAX_SCALE
    while high - low > 1e-3 * low:
        middle = math.sqrt(low * high)
        low, high = (low, middle) if decided(middle) else (middle, high)
    return max(1, math.ceil(n * high) - n)


def describe(judged: dict) -> str:
    """One line: why a gate did not pass (``judge``'s result)."""
    metric, pct = judged["metric"], percent
    low, high = judged["interval"]
    kept = (
        f"{metric} {pct(judged['value'])} vs golden {pct(judged['golden'])} on {judged['samples']} samples "
        f"({judged['lost']} lost, {judged['gained']} gained): drop {pct(judged['drop'])}, "
        f"{100 * judged['confidence']:.0f} % bounds [{pct(low)}, {pct(high)}], allowed {pct(judged['allowed'])} "
        f"(keep {judged['keep']:g})"
    )
    if judged["decision"] == "fail":
        return f"accuracy gate: {kept}"
    more = judged["more_samples"]
    decide = (
        "the drop sits at the allowed one: no number of samples would decide"
        if more is None
        else f"about {more} more labelled samples would decide, were the rates to hold"
    )
    return f"accuracy gate inconclusive: {kept}; {decide}"


def sqnr_db(reference, test) -> float:
    """Signal-to-quantization-noise ratio of ``test`` against ``reference`` in dB: 10 log10(sum ref^2 / sum
    (ref - test)^2); inf where they are equal, -inf where the reference is zero and the test is not."""
    reference, test = np.asarray(reference, dtype=np.float64), np.asarray(test, dtype=np.float64)
    noise = float(np.sum((reference - test) ** 2))
    signal = float(np.sum(reference**2))
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def by_sqnr(compared: dict, actual: dict, golden: dict) -> dict:
    """``closeness.compare_outputs``'s entries for a quantized path: an int8 output is off by far more than any
    float tolerance, so a value merely beyond tolerance is not a failure here (the gate judges the task); each
    entry gets its SQNR in dB instead. A wrong shape, a missing output or a NaN still fails."""
    judged = {}
    for name, stats in compared.items():
        stats = dict(stats)
        numeric = name in actual and np.issubdtype(np.asarray(golden[name]).dtype, np.number)
        if numeric and "tol_units" in stats and not stats.get("nonfinite"):
            stats["sqnr_db"] = sqnr_db(golden[name], actual[name])
            stats["ok"] = True
            stats["judged_by"] = "accuracy gate"
        judged[name] = stats
    return judged
