"""The labelled data every built-in model is trained and checked on (NumPy only at use time).

scikit-learn's 8x8 digits (1797 images, 10 classes) ship with the package, so nothing is
downloaded. Preprocessing happens here, once, in NumPy, before any framework sees the data:
pixel values are scaled from 0..16 to 0..1, and the split is a fixed seeded permutation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DATASET = "sklearn.datasets.load_digits"
SPLIT_SEED = 20260101
EVAL_FRACTION = 0.25


@dataclass(frozen=True)
class Split:
    train_x: np.ndarray
    train_y: np.ndarray
    eval_x: np.ndarray
    eval_y: np.ndarray


def digits_split(sample_shape: tuple[int, ...]) -> Split:
    """Train / eval split of the digits, each sample reshaped to ``sample_shape`` (float64)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = digits.data.astype(np.float64) / 16.0
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(x))
    n_eval = round(len(x) * EVAL_FRACTION)
    eval_idx, train_idx = order[:n_eval], order[n_eval:]
    shape = (-1, *sample_shape)
    return Split(x[train_idx].reshape(shape), y[train_idx], x[eval_idx].reshape(shape), y[eval_idx])
