"""The one metrics module, against values computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from parity.check import metrics
from parity.model.spec import MetricRules


def one_hot_logits(predicted, num_classes):
    logits = np.zeros((len(predicted), num_classes))
    logits[np.arange(len(predicted)), predicted] = 1.0
    return logits


def test_accuracy_and_agreement():
    labels = np.array([0, 1, 2, 2])
    logits = one_hot_logits([0, 1, 1, 2], 3)
    assert metrics.accuracy(logits, labels) == 0.75
    assert metrics.argmax_agreement(logits, one_hot_logits([0, 1, 2, 2], 3)) == 0.75


def test_top_k():
    logits = np.array([[0.1, 0.5, 0.4], [0.9, 0.04, 0.06], [0.2, 0.3, 0.5]])
    labels = np.array([2, 1, 0])
    assert metrics.top_k_accuracy(logits, labels, 1) == 0.0
    assert metrics.top_k_accuracy(logits, labels, 2) == pytest.approx(1 / 3)
    assert metrics.top_k_accuracy(logits, labels, 3) == 1.0


def test_macro_f1_with_a_class_never_predicted():
    # class 2 occurs twice but is never predicted: its F1 is 0 (zero_division=0)
    labels = np.array([0, 0, 1, 2, 2])
    logits = one_hot_logits([0, 1, 1, 0, 1], 3)
    # F1 = 2tp / (2tp + fp + fn). class 0: tp 1, fp 1, fn 1 -> 0.5; class 1: tp 1, fp 2, fn 0 -> 0.5; class 2: 0
    assert metrics.macro_f1(logits, labels, 3) == pytest.approx((0.5 + 0.5 + 0.0) / 3)


def test_macro_f1_counts_classes_absent_from_labels_and_predictions():
    labels = np.array([0, 1])
    logits = one_hot_logits([0, 1], 4)
    assert metrics.macro_f1(logits, labels, 4) == pytest.approx(0.5)


def test_check_metrics_rules():
    labels = np.array([0, 1, 2, 2])
    golden = one_hot_logits([0, 1, 2, 2], 3)
    golden_metrics = metrics.task_metrics(golden, labels, 3, 3)
    same = metrics.check_metrics(golden.copy(), labels, golden, golden_metrics, MetricRules(), "fp32", 3)
    assert same["ok"] and same["argmax_agreement"] == 1.0
    one_off = one_hot_logits([0, 1, 1, 2], 3)
    fp32 = metrics.check_metrics(one_off, labels, golden, golden_metrics, MetricRules(), "fp32", 3)
    assert not fp32["ok"] and not fp32["accuracy"]["ok"] and not fp32["argmax_agreement_ok"]
    lenient = MetricRules(min_argmax_agreement={"fp16": 0.75}, min_fraction={"fp16": 0.75})
    assert metrics.check_metrics(one_off, labels, golden, golden_metrics, lenient, "fp16", 3)["ok"]
