"""conv: 2-D cross-correlation, NCHW input, OIHW ``kernel``, optional ``bias`` ``(O,)``.

``y[n, o, i, j] = bias[o] + sum_{c, u, v} kernel[o, c, u, v] * xp[n, c, i*sh + u*dh, j*sw + v*dw]``
where ``xp`` is the zero-padded input. Attributes:

* ``stride``: int or (sh, sw), default 1; ``dilation``: int or (dh, dw), default 1;
* ``padding``: ``"valid"``; ``"same"`` in the TF/XLA sense (ONNX ``auto_pad=SAME_UPPER``): per
  axis ``total = max((ceil(n/s) - 1)*s + (k-1)*d + 1 - n, 0)``, ``before = total // 2``, the odd
  extra row/column after (bottom/right); an int p (symmetric); (ph, pw); or
  ``[[top, bottom], [left, right]]``.

Variants:

* ``same_top_left``: 'same' with the odd extra padding on top/left (ONNX ``SAME_LOWER``), what
  PyTorch ``padding=k//2`` (and Caffe's symmetric padding) gives at stride 2 on even inputs;
  not applicable where the split is even (stride 1, odd kernel);
* ``valid`` / ``same``: the padding mode dropped or added (output shape changes; reported as
  a shape mismatch unless the observed activation has that shape);
* ``kernel_flipped``: true convolution (kernel rotated 180 degrees), the classic
  Theano/Caffe-to-TF porting bug (Theano's ``conv2d`` flips, TF and PyTorch correlate);
* ``kernel_hw_swapped``: kernel height and width swapped (an HWIO->OIHW transpose with the
  spatial axes exchanged), square kernels only;
* ``bias_dropped``: no bias added;
* ``padding_shifted``: explicit padding moved one row and column to the end (the padding-shift of a
  port between frameworks that split odd padding differently);
* ``groups_ignored``: a grouped or depthwise convolution computed as a dense one over all channels.

``groups`` (default 1) splits the channels into groups, each with its own kernels (``groups`` equal to the
channels: depthwise); the kernel is then ``(O, C/groups, kh, kw)``, as PyTorch and ONNX hold it.

A 1-D convolution (``(N, C, L)`` input, ``(O, C/groups, k)`` kernel, PyTorch's ``Conv1d``) is the 2-D one over a
height of 1: its int or 1-tuple ``stride``, ``dilation`` and ``padding`` (or ``[[before, after]]``) act on the
length.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from parity.diagnose.causes.layers import NotApplicable, Variant, with_attrs

KIND = "conv"


def pair(value) -> tuple[int, int]:
    return (int(value), int(value)) if np.ndim(value) == 0 else (int(value[0]), int(value[1]))


def pads(padding, size, kernel, stride, dilation, extra_first=False):
    """``((top, bottom), (left, right))`` for spatial ``size``; ``extra_first`` puts an odd extra row/column first."""
    if isinstance(padding, str):
        if padding == "valid":
            return ((0, 0), (0, 0))
        if padding != "same":
            raise ValueError(f"unknown padding {padding!r}")
        result = []
        for n, k, s, d in zip(size, kernel, stride, dilation):
            total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
            small = total // 2
            result.append((total - small, small) if extra_first else (small, total - small))
        return tuple(result)
    if np.ndim(padding) == 0:
        return ((int(padding),) * 2,) * 2
    if np.ndim(padding) == 1:
        return tuple((int(p), int(p)) for p in padding)
    return tuple((int(a), int(b)) for a, b in padding)


def conv2d(x, kernel, bias, stride, padding, dilation, groups: int = 1):
    """Cross-correlation of NCHW ``x`` with OIHW ``kernel`` (``I`` = channels per group); ``padding`` is
    ``((top, bottom), (left, right))``; ``groups`` splits the channels (``groups`` = channels: depthwise)."""
    (sh, sw), (dh, dw) = stride, dilation
    x = np.pad(np.asarray(x, np.float64), ((0, 0), (0, 0), *padding))
    kernel = np.asarray(kernel, np.float64)
    _, per_group, kh, kw = kernel.shape
    if x.shape[1] != per_group * groups:
        raise ValueError(f"{x.shape[1]} input channels do not split into {groups} group(s) of {per_group}")
    windows = sliding_window_view(x, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
    windows = windows[:, :, ::sh, ::sw, ::dh, ::dw]
    out = kernel.shape[0] // groups
    y = np.concatenate(
        [
            np.einsum(
                "nchwuv,ocuv->nohw",
                windows[:, g * per_group : (g + 1) * per_group],
                kernel[g * out : (g + 1) * out],
                optimize=True,
            )
            for g in range(groups)
        ],
        axis=1,
    )
    return y if bias is None else y + np.asarray(bias, np.float64)[None, :, None, None]


def as_2d(x, attrs: dict, keys=("stride", "dilation")):
    """A 1-D ``(N, C, L)`` input and its attributes as 2-D over a height of 1 (``None`` attributes left out);
    2-D inputs are returned as they are."""
    x = np.asarray(x, np.float64)
    if x.ndim != 3:
        return x, attrs
    attrs = dict(attrs)
    for key in keys:
        if attrs.get(key) is not None:
            attrs[key] = (1, int(np.ravel(attrs[key])[0]))
    padding = attrs.get("padding", "valid")
    if not isinstance(padding, str):
        flat = [int(p) for p in np.ravel(padding)]
        attrs["padding"] = [[0, 0], [flat[0], flat[-1]]]
    return x[:, :, None, :], attrs


def _conv(inputs, weights, attrs, kernel=None, bias="declared", extra_first=False, shift=False):
    kernel = weights["kernel"] if kernel is None else kernel
    if np.ndim(inputs[0]) == 3:  # 1-D: over a height of 1
        x, attrs = as_2d(inputs[0], attrs)
        kernel = np.asarray(kernel, np.float64)[:, :, None, :] if np.ndim(kernel) == 3 else kernel
        return _conv([x], weights, attrs, kernel, bias, extra_first, shift)[:, :, 0, :]
    x = inputs[0]
    bias = weights.get("bias") if isinstance(bias, str) else bias
    stride, dilation = pair(attrs.get("stride", 1)), pair(attrs.get("dilation", 1))
    padding = pads(attrs.get("padding", "valid"), x.shape[2:], kernel.shape[2:], stride, dilation, extra_first)
    if shift:  # one row and column of padding moved from the start to the end
        padding = tuple((max(before - 1, 0), after + (1 if before else 0)) for before, after in padding)
    return conv2d(x, kernel, bias, stride, padding, dilation, int(attrs.get("groups", 1)))


def forward(inputs, weights, attrs):
    return _conv(inputs, weights, attrs)


def _top_left(inputs, weights, attrs, observed):
    x, flat = as_2d(inputs[0], attrs)
    kernel = weights["kernel"] if weights["kernel"].ndim == 4 else weights["kernel"][:, :, None, :]
    args = (flat["padding"], x.shape[2:], kernel.shape[2:], pair(flat.get("stride", 1)), pair(flat.get("dilation", 1)))
    if pads(*args) == pads(*args, extra_first=True):
        raise NotApplicable("'same' padding splits evenly here: top-left equals the declared split")
    return _conv(inputs, weights, attrs, extra_first=True)


def _flipped(inputs, weights, attrs, observed):
    kernel = weights["kernel"]
    if all(k == 1 for k in kernel.shape[2:]):
        raise NotApplicable("a 1x1 kernel is its own flip")
    return _conv(inputs, weights, attrs, kernel=np.flip(kernel, axis=tuple(range(2, kernel.ndim))))


def _hw_swapped(inputs, weights, attrs, observed):
    kernel = weights["kernel"]
    if kernel.ndim != 4 or kernel.shape[2] != kernel.shape[3] or kernel.shape[2] == 1:
        raise NotApplicable(f"kernel {kernel.shape[2:]} is not square (or is 1x1)")
    return _conv(inputs, weights, attrs, kernel=kernel.transpose(0, 1, 3, 2))


def _no_bias(inputs, weights, attrs, observed):
    if "bias" not in weights:
        raise NotApplicable("the layer has no bias")
    return _conv(inputs, weights, attrs, bias=None)


def _shifted(inputs, weights, attrs, observed):
    if attrs.get("padding", "valid") in ("valid", "same") or not any(np.ravel(attrs["padding"])):
        raise NotApplicable("no explicit padding to shift")
    return _conv(inputs, weights, attrs, shift=True)


def _groups_ignored(inputs, weights, attrs, observed):
    groups = int(attrs.get("groups", 1))
    if groups == 1:
        raise NotApplicable("not a grouped convolution")
    kernel = weights["kernel"]  # the group's kernel applied to every group's channels, as one block
    tiles = (1, groups) + (1,) * (kernel.ndim - 2)
    return _conv(inputs, weights, {**attrs, "groups": 1}, kernel=np.tile(kernel, tiles) / groups)


def variants(attrs):
    padding = attrs.get("padding", "valid")
    found = [
        Variant(
            "padding_shifted",
            "explicit padding shifted by one pixel to the bottom/right (TF/XLA put the odd extra row at the end)",
            _shifted,
        ),
        Variant(
            "groups_ignored", "channels mixed across groups: the grouped (depthwise) structure lost", _groups_ignored
        ),
    ]
    if padding == "same":
        found += [
            Variant(
                "same_top_left",
                "'same' padding with the extra row/column on top/left "
                "(PyTorch padding=k//2 at stride 2, ONNX SAME_LOWER) instead of bottom/right",
                _top_left,
            ),
            Variant("valid", "no padding ('valid') instead of 'same'", with_attrs(forward, padding="valid")),
        ]
    elif padding == "valid":
        found.append(Variant("same", "'same' padding instead of 'valid'", with_attrs(forward, padding="same")))
    return found + [
        Variant(
            "kernel_flipped",
            "kernel flipped spatially: convolution instead of cross-correlation (Theano/Caffe-to-TF port)",
            _flipped,
        ),
        Variant("kernel_hw_swapped", "kernel height and width axes swapped (a wrong HWIO/OIHW transpose)", _hw_swapped),
        Variant("bias_dropped", "bias not added", _no_bias),
    ]
