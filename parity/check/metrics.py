"""The one definition of every task metric (NumPy only).

Every path's logits, and the float64 golden logits, go through these same functions, so a
metric difference is never a difference in how the metric was computed.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def predictions(logits: np.ndarray) -> np.ndarray:
    """Argmax over the last axis (ties resolve to the lowest class index)."""
    return np.argmax(np.asarray(logits), axis=-1)


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(predictions(logits) == np.asarray(labels)))


def top_k_accuracy(logits: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Fraction of samples whose label is among the k largest logits (stable ordering)."""
    logits = np.asarray(logits)
    top = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    return float(np.mean(np.any(top == np.asarray(labels)[:, None], axis=-1)))


def macro_f1(logits: np.ndarray, labels: np.ndarray, num_classes: int) -> float:
    """Unweighted mean of per-class F1 over all ``num_classes`` classes.

    A class with no true positives has F1 = 0, including a class never predicted (precision
    undefined) or never present: the convention of scikit-learn's ``zero_division=0``.
    """
    predicted = predictions(logits)
    labels = np.asarray(labels)
    scores = []
    for c in range(num_classes):
        tp = np.sum((predicted == c) & (labels == c))
        fp = np.sum((predicted == c) & (labels != c))
        fn = np.sum((predicted != c) & (labels == c))
        scores.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores))


def argmax_agreement(logits: np.ndarray, golden_logits: np.ndarray) -> float:
    """Fraction of samples whose argmax equals the golden argmax."""
    return float(np.mean(predictions(logits) == predictions(golden_logits)))


def task_metrics(logits: np.ndarray, labels: np.ndarray, num_classes: int, top_k: int) -> dict[str, float]:
    return {
        "accuracy": accuracy(logits, labels),
        f"top{top_k}_accuracy": top_k_accuracy(logits, labels, top_k),
        "macro_f1": macro_f1(logits, labels, num_classes),
    }


def check_metrics(logits, labels, golden_logits, golden_metrics: dict, rules, precision: str, num_classes: int) -> dict:
    """Each metric against its float64 golden value under the spec's rules.

    A metric is ok when it reaches ``min_fraction[precision]`` of the golden value (1.0 at
    fp32: equal or better); argmax agreement must reach ``min_argmax_agreement[precision]``.
    """
    values = task_metrics(logits, labels, num_classes, rules.top_k)
    fraction = rules.min_fraction.get(precision, 1.0)
    result: dict[str, Any] = {
        name: {
            "value": value,
            "golden": golden_metrics[name],
            "ok": bool(value >= fraction * golden_metrics[name] - 1e-12),
        }
        for name, value in values.items()
    }
    agreement = argmax_agreement(logits, golden_logits)
    required = rules.min_argmax_agreement.get(precision, 1.0)
    result["argmax_agreement"] = agreement
    result["argmax_agreement_ok"] = bool(agreement >= required)
    result["ok"] = all(v["ok"] for v in result.values() if isinstance(v, dict)) and result["argmax_agreement_ok"]
    return result
