"""softmax: softmax or log-softmax over one axis.

``softmax(x) = exp(x - max) / sum(exp(x - max))`` over ``axis``; with ``log: True`` the log-softmax
``x - max - log(sum(exp(x - max)))``, finite wherever ``x`` is, however far an element lies below the maximum.
Attributes: ``axis`` (an axis of the input, negative from the end; PyTorch's ``nn.Softmax(dim)`` /
``nn.LogSoftmax(dim)``), ``log`` (default False).

Variants:

* ``log_of_softmax``: a log-softmax computed as ``Log(Softmax(x))`` in float32 (a converter or a hand-port that
  decomposes it): every element more than about 87 below its maximum has a float32 softmax that is subnormal or 0,
  and its log is far off or -inf where the log-softmax is finite. Computed as float32 does: the softmax rounded to
  float32, then the log of it; a subnormal softmax element is taken either way a kernel gives it (its log, or -inf
  where the kernel flushes it to zero), whichever the observed element is;
* ``axis_<k>``: the (log-)softmax over another axis ``k`` of the input (a dim lost or mis-mapped by a port, a
  layout change that did not move the axis);
* ``axis_coerced_2d``: over every axis from ``axis`` on, flattened: what ``Softmax`` / ``LogSoftmax`` meant before
  ONNX opset 13 (the input coerced to 2-D at ``axis``), read by a runtime or written by a converter in the old
  meaning;
* ``log_dropped`` / ``log_added``: the softmax where the log-softmax is declared, or the other way round.

Variants that equal the declared form on the inputs at hand are not applicable.
"""

from __future__ import annotations

import numpy as np

from parity.diagnose.causes.layers import NotApplicable, Variant

KIND = "softmax"
MAX_RANK = 5  # axis variants are tried on inputs of up to this rank (NCDHW)


def _axis(x: np.ndarray, axis: int) -> int:
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"softmax axis {axis} is not an axis of an input of rank {x.ndim}")
    return axis % x.ndim


def _compute(x: np.ndarray, axes: tuple[int, ...], log: bool) -> np.ndarray:
    top = x.max(axis=axes, keepdims=True)
    shifted = x - np.where(np.isfinite(top), top, 0.0)
    total = np.exp(shifted).sum(axis=axes, keepdims=True)
    return shifted - np.log(total) if log else np.exp(shifted) / total


def forward(inputs, weights, attrs, axes: tuple[int, ...] | None = None, log: bool | None = None):
    x = np.asarray(inputs[0], np.float64)
    axes = axes if axes is not None else (_axis(x, attrs["axis"]),)
    return _compute(x, axes, attrs.get("log", False) if log is None else log)


def _differs(value, inputs, weights, attrs, what: str):
    if np.array_equal(value, forward(inputs, weights, attrs), equal_nan=True):
        raise NotApplicable(f"{what} equals the declared form on these inputs")
    return value


def _log_of_softmax(inputs, weights, attrs, observed):
    """Softmax in float32, then its log in float32."""
    x = np.asarray(inputs[0], np.float64).astype(np.float32)
    axis = _axis(x, attrs["axis"])
    with np.errstate(divide="ignore", under="ignore"):
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        p = (e / e.sum(axis=axis, keepdims=True, dtype=np.float32)).astype(np.float32)
        value = np.log(p).astype(np.float64)
    subnormal = (p > 0) & (p < np.finfo(np.float32).tiny)
    if observed is not None and np.shape(observed) == value.shape:  # a kernel that flushes subnormals gives -inf
        value = np.where(subnormal & (np.asarray(observed) == -np.inf), -np.inf, value)
    return _differs(value, inputs, weights, attrs, "log of the float32 softmax")


def _over(axes_of):
    def compute(inputs, weights, attrs, observed):
        x = np.asarray(inputs[0], np.float64)
        axes = axes_of(x, _axis(x, attrs["axis"]))
        return _differs(forward(inputs, weights, attrs, axes=axes), inputs, weights, attrs, f"over axes {axes}")

    return compute


def _log(log: bool):
    def compute(inputs, weights, attrs, observed):
        return forward(inputs, weights, attrs, log=log)

    return compute


def _coerced(x, axis):
    if axis == x.ndim - 1:
        raise NotApplicable("the declared axis is the last: coerced to 2-D it is the same axis")
    return tuple(range(axis, x.ndim))


def variants(attrs):
    log = attrs.get("log", False)
    found = []
    if log:
        found.append(
            Variant(
                "log_of_softmax",
                "the log-softmax computed as Log(Softmax(x)) in float32: -inf (or a "
                "subnormal's log) where the softmax underflows",
                _log_of_softmax,
            )
        )
    found.append(
        Variant(
            "axis_coerced_2d",
            "over every axis from the declared one on, flattened (Softmax before ONNX opset 13)",
            _over(_coerced),
        )
    )
    for k in range(MAX_RANK):  # the input's rank is not known here: an axis it does not have is not applicable

        def other(x, axis, k=k):
            if k >= x.ndim or k == axis:
                raise NotApplicable(f"axis {k} is the declared axis or not an axis of this input")
            return (k,)

        found.append(Variant(f"axis_{k}", f"over axis {k} instead of the declared axis {attrs['axis']}", _over(other)))
    found.append(
        Variant("log_dropped", "softmax where log-softmax is declared", _log(False))
        if log
        else Variant("log_added", "log-softmax where softmax is declared", _log(True))
    )
    return found
