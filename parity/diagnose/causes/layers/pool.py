"""pool: 2-D average or max pooling of an NCHW input.

Attributes: ``mode`` ``"avg"`` | ``"max"``; ``size`` int or (kh, kw); ``stride`` (default
``size``); ``padding`` as for ``conv`` (default ``"valid"``; ``"same"`` splits as TF/XLA do);
``count_include_pad`` (default False: TF 'same' pooling and ONNX ``AveragePool`` divide by the
number of real elements; PyTorch ``AvgPool2d`` defaults to True); ``ceil_mode`` (default False:
output ``floor((n + pads - k)/s) + 1``; True rounds up as PyTorch/ONNX ``ceil_mode`` do, the
last window may overhang the input and never counts the overhang); ``divisor_override`` (PyTorch's
``AvgPool2d``: every window divided by this number). Max pooling pads with -inf. A 1-D input ``(N, C, L)`` pools
its length (int or 1-tuple ``size``, ``stride``, ``padding``), as over a height of 1.

Variants:

* ``max_pool`` / ``avg_pool``: the other mode (a converter or port mapping the wrong op);
* ``count_include_pad`` / ``count_exclude_pad``: padded average pooling dividing by the full
  window or only the real elements (PyTorch default versus TF/ONNX default); not applicable
  without padding;
* ``ceil_mode`` / ``floor_mode``: the other output rounding; changes the output shape, not
  applicable where both roundings agree;
* ``padding_shifted``: explicit padding moved one row and column to the end (``(p-1, p+1)``: TF/XLA put the odd
  extra padding at the end, PyTorch pads symmetrically), or, declared ``"same"``, ``same_top_left``: the odd extra
  padding first (ONNX ``SAME_LOWER``); not applicable without padding to move or where the split is even;
* ``divisor_dropped``: a declared ``divisor_override`` lost, every window divided by its full size (ONNX
  ``AveragePool`` has no divisor attribute, and torch.onnx exports the pool without it).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from parity.diagnose.causes.layers import NotApplicable, Variant, with_attrs
from parity.diagnose.causes.layers.conv import as_2d, pads, pair

KIND = "pool"


def _geometry(shape, attrs, ceil_mode):
    """Explicit pads, ceil-mode overhang and output size per spatial axis."""
    size = pair(attrs["size"])
    stride = pair(attrs.get("stride", attrs["size"]))
    explicit = pads(attrs.get("padding", "valid"), shape, size, stride, (1, 1))
    overhang, out = [], []
    for n, (before, after), k, s in zip(shape, explicit, size, stride):
        span = n + before + after
        count = (span - k) // s + 1
        if ceil_mode:
            count = -(-(span - k) // s) + 1
            if (count - 1) * s >= n + before:  # the last window must start inside the input or left padding
                count -= 1
        out.append(count)
        overhang.append(max((count - 1) * s + k - span, 0))
    return size, stride, explicit, overhang, out


def _flat(x, attrs):
    """The input and attributes as 2-D (a 1-D pool over a height of 1)."""
    return as_2d(x, {**attrs, "stride": attrs.get("stride", attrs["size"])}, keys=("size", "stride"))


def forward(inputs, weights, attrs):
    if np.ndim(inputs[0]) == 3:  # 1-D: over a height of 1
        x, flat = _flat(inputs[0], attrs)
        return forward([x], weights, flat)[:, :, 0, :]
    x = np.asarray(inputs[0], np.float64)
    ceil_mode = attrs.get("ceil_mode", False)
    (kh, kw), (sh, sw), explicit, overhang, (oh, ow) = _geometry(x.shape[2:], attrs, ceil_mode)
    widths = [(b, a + extra) for (b, a), extra in zip(explicit, overhang)]
    mode = attrs["mode"]
    if mode not in ("avg", "max"):
        raise ValueError(f"unknown pool mode {mode!r}")
    fill = -np.inf if mode == "max" else 0.0
    padded = np.pad(x, ((0, 0), (0, 0), *widths), constant_values=fill)
    windows = sliding_window_view(padded, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw][:, :, :oh, :ow]
    if mode == "max":
        return windows.max(axis=(-2, -1))
    if attrs.get("divisor_override"):  # PyTorch's AvgPool2d(divisor_override=d): every window divided by d
        return windows.sum(axis=(-2, -1)) / float(attrs["divisor_override"])
    real = np.ones(x.shape[2:])
    if attrs.get("count_include_pad", False):
        real = np.pad(real, explicit, constant_values=1.0)
        real = np.pad(real, [(0, extra) for extra in overhang])
    else:
        real = np.pad(real, widths)
    counts = sliding_window_view(real, (kh, kw))[::sh, ::sw][:oh, :ow].sum(axis=(-2, -1))
    return windows.sum(axis=(-2, -1)) / counts


def _count(include):
    def compute(inputs, weights, attrs, observed):
        x, flat = _flat(inputs[0], attrs)
        explicit = _geometry(x.shape[2:], flat, attrs.get("ceil_mode", False))[2]
        if attrs["mode"] != "avg" or not any(b or a for b, a in explicit):
            raise NotApplicable("no padding in an average pool: both counts agree")
        return forward(inputs, weights, {**attrs, "count_include_pad": include})

    return compute


def _rounding(ceil_mode):
    def compute(inputs, weights, attrs, observed):
        x, flat = _flat(inputs[0], attrs)
        if _geometry(x.shape[2:], flat, ceil_mode)[4] == _geometry(x.shape[2:], flat, not ceil_mode)[4]:
            raise NotApplicable("floor and ceil output sizes agree here")
        return forward(inputs, weights, {**attrs, "ceil_mode": ceil_mode})

    return compute


def _shifted(inputs, weights, attrs, observed):
    padding = attrs.get("padding", "valid")
    x, flat = _flat(inputs[0], attrs)
    size, stride = pair(flat["size"]), pair(flat["stride"])
    if padding == "same":
        moved = pads("same", x.shape[2:], size, stride, (1, 1), extra_first=True)
        if moved == pads("same", x.shape[2:], size, stride, (1, 1)):
            raise NotApplicable("'same' padding splits evenly here: top-left equals the declared split")
    else:
        explicit = pads(flat.get("padding", "valid"), x.shape[2:], size, stride, (1, 1))
        if not any(before for before, _ in explicit):
            raise NotApplicable("no explicit padding to shift")
        moved = tuple((max(before - 1, 0), after + (1 if before else 0)) for before, after in explicit)
    value = forward([x], weights, {**flat, "padding": [list(p) for p in moved]})
    return value[:, :, 0, :] if np.ndim(inputs[0]) == 3 else value


def _no_divisor(inputs, weights, attrs, observed):
    return forward(inputs, weights, {**attrs, "divisor_override": None, "count_include_pad": True})


def variants(attrs):
    other = "max" if attrs["mode"] == "avg" else "avg"
    if attrs.get("divisor_override"):
        dropped = [
            Variant(
                "divisor_dropped",
                f"divisor_override={attrs['divisor_override']} dropped: every window "
                f"divided by its size (an exported AveragePool has no divisor)",
                _no_divisor,
            )
        ]
    else:
        dropped = []
    include = not attrs.get("count_include_pad", False)
    ceil_mode = not attrs.get("ceil_mode", False)
    return [
        Variant(f"{other}_pool", f"{other} pooling instead of {attrs['mode']}", with_attrs(forward, mode=other)),
        Variant(
            "count_include_pad" if include else "count_exclude_pad",
            f"average pool divides by the {'full window' if include else 'real elements'} at padded borders",
            _count(include),
        ),
        Variant(
            "ceil_mode" if ceil_mode else "floor_mode",
            f"output size rounded {'up (ceil_mode)' if ceil_mode else 'down'}",
            _rounding(ceil_mode),
        ),
        Variant(
            "same_top_left" if attrs.get("padding") == "same" else "padding_shifted",
            "'same' padding with the extra row/column on top/left instead of bottom/right"
            if attrs.get("padding") == "same"
            else "explicit padding shifted by one pixel to the bottom/right (TF/XLA put the odd extra row at the end)",
            _shifted,
        ),
        *dropped,
    ]
