"""resize: nearest, (bi)linear or (bi)cubic resizing of the spatial axes of an NCHW input, as ONNX ``Resize`` defines it.

For each spatial axis of input length ``n`` and output length ``m`` (``size``, or ``floor(n * scale)``), output
index ``o`` reads input coordinate ``c`` by ``coordinate_transformation_mode`` (``s`` = ``scale`` where given,
else ``m / n``):

* ``half_pixel``: ``c = (o + 0.5) / s - 0.5``; ``pytorch_half_pixel``: the same, 0 where ``m == 1``;
* ``align_corners``: ``c = o * (n - 1) / (m - 1)``; ``asymmetric``: ``c = o / s``;
* ``tf_half_pixel_for_nn``: ``c = (o + 0.5) / s`` (tf2onnx's nearest resize with TensorFlow's half-pixel centres);
* ``half_pixel_symmetric`` (opset 19): half_pixel shifted by ``n / 2 * (1 - m / (n * s))``, the same where
  ``m == n * s``.

``mode`` ``"nearest"`` takes input ``nearest_mode(c)``: ``round_prefer_floor``, ``round_prefer_ceil``, ``floor``,
``ceil`` (clamped to the input); ``"linear"`` interpolates between ``floor(c)`` and ``floor(c) + 1`` with ``c``
clamped to ``[0, n - 1]``; ``"cubic"`` sums the four inputs ``floor(c) - 1 .. floor(c) + 2`` weighted by Keys' cubic
kernel with ``cubic_coeff_a`` (default -0.75, ONNX's and PyTorch's; -0.5 is TensorFlow's and JAX's), ``c`` not
clamped: an input index outside the image reads the edge pixel, or with ``exclude_outside`` (TensorFlow's half-pixel
``ResizeBicubic``, ``jax.image.resize``) gets weight 0 and the others are renormalised to sum 1. ``cubic_table``
(TensorFlow's ``ResizeBicubic``: 1024) reads the kernel from a table of that many steps per pixel, the fraction
``c - floor(c)`` rounded to it; 0 (default): computed exactly. PyTorch's ``nn.Upsample(mode="nearest")`` is
``asymmetric`` + ``floor``, ``mode="bilinear"`` is ``half_pixel`` (at every output length, 1 too: torch reads
``(o + 0.5) n / m - 0.5`` there, not ``pytorch_half_pixel``'s 0; ``align_corners=True``: ``align_corners``),
``mode="bicubic"`` the same with ``cubic_coeff_a`` -0.75; TensorFlow's half-pixel bicubic is ``half_pixel``, -0.5,
``exclude_outside``, ``cubic_table`` 1024; ``jax.image.resize(method="cubic")`` the same computed exactly where it
upsamples (or is called with ``antialias=False``): downsampling, its default ``antialias=True`` widens the kernel by
the scale, which this kind does not compute.

Variants: every other coordinate mode, and for nearest every other rounding, that gives different values on
these inputs: the bugs of converters and runtimes in Resize (a coordinate mode or rounding lost or changed). For
cubic: ``cubic_coeff_a_<a>`` (-0.5 and -0.75 swapped), ``cubic_exclude_outside`` / ``cubic_edges_clamped``
(``exclude_outside`` gained or lost: jax2onnx writes ``Resize(cubic)`` without it), ``cubic_coefficients_exact`` /
``cubic_coefficients_table1024`` (TensorFlow's tabulated kernel computed exactly, as ONNX Runtime does for tf2onnx's
``Resize``, or the other way), and ``linear``.
"""

from __future__ import annotations

import math

import numpy as np

from parity.diagnose.causes.layers import NotApplicable, Variant, with_attrs

KIND = "resize"
COORDINATES = (
    "half_pixel",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
    "half_pixel_symmetric",
)
RARE = ("tf_half_pixel_for_nn", "half_pixel_symmetric")  # tried after the other coordinate modes and roundings
ROUNDINGS = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
CUBIC_A = (-0.75, -0.5)  # ONNX's and PyTorch's; TensorFlow's and JAX's (Keys)
TF_CUBIC_TABLE = 1024  # TensorFlow's ResizeBicubic kernel table: steps per pixel


def keys(t: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel at distances ``t``."""
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _cubic(x: np.ndarray, axis: int, c: np.ndarray, attrs: dict) -> np.ndarray:
    n = x.shape[axis]
    base = np.floor(c)
    fraction = c - base
    table = int(attrs.get("cubic_table", 0))
    if table:
        fraction = np.rint(fraction * table) / table
    taps = base[:, None].astype(np.int64) + np.arange(-1, 3)[None, :]  # (m, 4)
    weights = keys(fraction[:, None] - np.arange(-1, 3)[None, :], float(attrs.get("cubic_coeff_a", -0.75)))
    if attrs.get("exclude_outside", False):
        weights = np.where((taps >= 0) & (taps < n), weights, 0.0)
        weights = weights / weights.sum(axis=1, keepdims=True)
    taps = np.clip(taps, 0, n - 1)
    shape = [-1 if i == axis else 1 for i in range(x.ndim)]
    return sum(np.take(x, taps[:, k], axis=axis) * weights[:, k].reshape(shape) for k in range(4))


def _coordinates(n: int, m: int, scale: float, mode: str) -> np.ndarray:
    o = np.arange(m, dtype=np.float64)
    if mode == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if m > 1 else np.zeros(m)
    if mode == "align_corners":
        return o * (n - 1) / (m - 1) if m > 1 else np.zeros(m)
    if mode == "asymmetric":
        return o / scale
    if mode == "tf_half_pixel_for_nn":
        return (o + 0.5) / scale
    if mode == "half_pixel_symmetric":
        return n / 2 * (1 - m / (n * scale)) + (o + 0.5) / scale - 0.5
    raise ValueError(f"unknown coordinate_transformation_mode {mode!r}; known: {', '.join(COORDINATES)}")


def _nearest(c: np.ndarray, rounding: str, n: int) -> np.ndarray:
    if rounding == "round_prefer_floor":
        index = np.where(c - np.floor(c) == 0.5, np.floor(c), np.round(c))
    elif rounding == "round_prefer_ceil":
        index = np.floor(c + 0.5)
    elif rounding == "floor":
        index = np.floor(c)
    elif rounding == "ceil":
        index = np.ceil(c)
    else:
        raise ValueError(f"unknown nearest_mode {rounding!r}; known: {', '.join(ROUNDINGS)}")
    return np.clip(index, 0, n - 1).astype(np.int64)


def _axis(x: np.ndarray, axis: int, m: int, scale: float, attrs: dict) -> np.ndarray:
    n = x.shape[axis]
    c = _coordinates(n, m, scale, attrs.get("coordinate_transformation_mode", "half_pixel"))
    if attrs.get("mode", "nearest") == "nearest":
        return np.take(x, _nearest(c, attrs.get("nearest_mode", "round_prefer_floor"), n), axis=axis)
    if attrs["mode"] == "cubic":
        return _cubic(x, axis, c, attrs)
    if attrs["mode"] != "linear":
        raise ValueError(f"unknown resize mode {attrs['mode']!r}; known: nearest, linear, cubic")
    c = np.clip(c, 0, n - 1)
    low = np.floor(c).astype(np.int64)
    high = np.minimum(low + 1, n - 1)
    weight = (c - low).reshape([-1 if i == axis else 1 for i in range(x.ndim)])
    return np.take(x, low, axis=axis) * (1.0 - weight) + np.take(x, high, axis=axis) * weight


def forward(inputs, weights, attrs):
    x = np.asarray(inputs[0], np.float64)
    scales = attrs.get("scale")
    sizes = attrs.get("size")
    for i, axis in enumerate(range(2, x.ndim)):
        n = x.shape[axis]
        scale = float(scales[i] if isinstance(scales, (list, tuple)) else scales) if scales is not None else None
        m = int(sizes[i] if isinstance(sizes, (list, tuple)) else sizes) if sizes is not None else math.floor(n * scale)
        x = _axis(x, axis, m, scale if scale is not None else m / n, attrs)
    return x


def _other(attrs, **change):
    def compute(inputs, weights, attrs_, observed):
        declared = forward(inputs, weights, attrs)
        value = forward(inputs, weights, {**attrs, **change})
        if value.shape == declared.shape and np.allclose(value, declared, rtol=1e-12, atol=1e-12):  # rounding apart
            raise NotApplicable(f"{change} gives the declared values on these inputs")
        return value

    return compute


def variants(attrs):
    declared = attrs.get("coordinate_transformation_mode", "half_pixel")
    coordinates = [
        Variant(
            f"coordinates_{mode}",
            f"Resize coordinate_transformation_mode {mode} instead of {declared}",
            _other(attrs, coordinate_transformation_mode=mode),
        )
        for mode in COORDINATES
        if mode != declared
    ]
    found = [v for v in coordinates if v.name.removeprefix("coordinates_") not in RARE]
    if attrs.get("mode", "nearest") == "nearest":
        rounding = attrs.get("nearest_mode", "round_prefer_floor")
        found += [
            Variant(f"nearest_{r}", f"Resize nearest_mode {r} instead of {rounding}", _other(attrs, nearest_mode=r))
            for r in ROUNDINGS
            if r != rounding
        ]
    elif attrs["mode"] == "cubic":
        found += _cubic_variants(attrs)
    else:
        found.append(Variant("nearest", "nearest instead of linear interpolation", with_attrs(forward, mode="nearest")))
    # the rarer modes last: of variants that reproduce equally well, the first listed is named
    return found + [v for v in coordinates if v.name.removeprefix("coordinates_") in RARE]


def _cubic_variants(attrs) -> list[Variant]:
    a = float(attrs.get("cubic_coeff_a", -0.75))
    exclude = bool(attrs.get("exclude_outside", False))
    table = int(attrs.get("cubic_table", 0))
    found = [
        Variant(
            f"cubic_coeff_a_{other:g}",
            f"Resize cubic_coeff_a {other:g} instead of {a:g}",
            _other(attrs, cubic_coeff_a=other),
        )
        for other in CUBIC_A
        if other != a
    ]
    found.append(
        Variant(
            "cubic_edges_clamped" if exclude else "cubic_exclude_outside",
            "Resize cubic without exclude_outside: taps outside the image read the edge pixel, where the declared "
            "form drops them and renormalises the kernel"
            if exclude
            else "Resize cubic with exclude_outside: taps outside the image dropped and the kernel renormalised, "
            "where the declared form reads the edge pixel",
            _other(attrs, exclude_outside=not exclude),
        )
    )
    found.append(
        Variant(
            "cubic_coefficients_exact" if table else f"cubic_coefficients_table{TF_CUBIC_TABLE}",
            f"the cubic kernel computed exactly, where the declared form reads it from a table of {table} steps per "
            "pixel (TensorFlow's ResizeBicubic)"
            if table
            else f"the cubic kernel read from a table of {TF_CUBIC_TABLE} steps per pixel (TensorFlow's "
            "ResizeBicubic), where the declared form computes it exactly",
            _other(attrs, cubic_table=0 if table else TF_CUBIC_TABLE),
        )
    )
    found.append(Variant("linear", "linear instead of cubic interpolation", _other(attrs, mode="linear")))
    found.append(Variant("nearest", "nearest instead of cubic interpolation", _other(attrs, mode="nearest")))
    return found
