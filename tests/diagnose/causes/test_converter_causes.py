"""The real departures of converters and runtimes that scripts/probe_layers.py finds (docs/converters.md), each
named by the cause catalogue: the one layer is exported with parity's exporters and run on the path's runtime (as
the probe does), and ``cause.test_layer`` recomputes the layer from its input and names the variant that reproduces
what the path computed, while the framework's own float32 run of the same layer gets no cause."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from parity.diagnose.causes.cause import test_layer
from parity.diagnose.causes.layers import NotApplicable, get
from parity.model.spec import Layer, Tolerance
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))

import probe_layers

TOL = Tolerance(1e-5, 1e-5)  # the probe's, and a spec's default fp32 tolerance
KEEP_ALL_BUT_ROW_0 = np.ones((6, 6))
KEEP_ALL_BUT_ROW_0[0] = 0
INF_ROW_0 = np.zeros((6, 6))
INF_ROW_0[0] = -np.inf


def _observed(framework: str, case: str, paths: tuple[str, ...], tmp_path) -> tuple[np.ndarray, dict]:
    """The probe's ``case`` of ``framework``: its input and each path's output."""
    import importlib

    cases = importlib.import_module(probe_layers.CASE_MODULES[framework]).CASES
    spec, weights, feeds = probe_layers.build_spec(framework, case, cases[case])
    out = {}
    for path in paths:
        got = probe_layers.run_path(spec, weights, feeds, path, tmp_path)
        assert "error" not in got, got
        out[path] = np.asarray(got["y"], np.float64)
    return np.asarray(feeds["x"], np.float64), out


def _named(kind: str, attrs: dict, inputs, observed, weights=None) -> str | None:
    result = test_layer(Layer(kind, attrs), inputs, weights or {}, observed, TOL)
    return (result["cause"] or {}).get("variant")


def _picks(start: int, stop: int, width: int = 48) -> np.ndarray:
    """A dense kernel that takes features ``start:stop``: the probe's attention slices q, k and v off its input."""
    kernel = np.zeros((width, stop - start))
    kernel[np.arange(start, stop), np.arange(stop - start)] = 1.0
    return kernel


ATTENTION = {"query/kernel": _picks(0, 16), "key/kernel": _picks(16, 32), "value/kernel": _picks(32, 48)}
ATTENTION["out/kernel"] = np.eye(16)


def test_openvino_drops_softplus_beta_and_threshold(tmp_path):
    from torch import nn

    from parity.model.layer_types import torch_layer

    x, out = _observed("torch", "act/softplus-beta2-threshold5", ("torch", "torch/openvino"), tmp_path)
    kind, attrs = torch_layer(nn.Softplus(beta=2.0, threshold=5.0))
    assert _named(kind, attrs, [x], out["torch/openvino"]) == "softplus_plain"
    assert _named(kind, attrs, [x], out["torch"]) is None


@pytest.mark.slow
def test_executorch_runs_tanh_gelu_as_exact_gelu(tmp_path):
    from torch import nn

    from parity.model.layer_types import torch_layer

    x, out = _observed("torch", "act/gelu-tanh", ("torch", "torch/executorch"), tmp_path)
    kind, attrs = torch_layer(nn.GELU(approximate="tanh"))
    assert _named(kind, attrs, [x], out["torch/executorch"]) == "gelu_erf"
    assert _named(kind, attrs, [x], out["torch"]) is None


def test_log_sigmoid_as_the_log_of_a_float32_sigmoid_is_named_on_onnx_runtime_and_openvino(tmp_path):
    from torch import nn

    from parity.model.layer_types import torch_layer

    x, out = _observed("torch", "act/logsigmoid", ("torch", "torch/onnx/ort", "torch/openvino"), tmp_path)
    kind, attrs = torch_layer(nn.LogSigmoid())
    assert attrs == {"form": "log_sigmoid"}
    # ONNX Runtime's sigmoid is 0 below about -17, OpenVINO's below -88 (subnormals flushed): -inf, both
    assert (~np.isfinite(out["torch/onnx/ort"])).sum() > (~np.isfinite(out["torch/openvino"])).sum() > 0
    for path in ("torch/onnx/ort", "torch/openvino"):
        assert _named(kind, attrs, [x], out[path]) == "log_of_sigmoid", path
    assert _named(kind, attrs, [x], out["torch"]) is None
    wrong = out["torch"].copy()  # -inf where a float32 sigmoid (0.0067 at -5) cannot underflow: not explained
    wrong[np.abs(x + 5.0) < 0.6] = -np.inf
    assert _named(kind, attrs, [x], wrong) is None


def test_a_path_that_clamps_log_sigmoid_is_not_a_float32_sigmoid():
    """The log of a float32 sigmoid is -inf where it underflows, and right elsewhere: a path that clamps the
    log-sigmoid at -20 is not that, with or without underflows beside; the log of NumPy's float32 sigmoid is."""
    x = np.linspace(-120.0, 30.0, 64)
    declared = get("activation").forward([x], {}, {"form": "log_sigmoid"})
    x32 = x.astype(np.float32)
    with np.errstate(divide="ignore", over="ignore"):
        float32 = np.log(np.exp(x32) / (np.float32(1) + np.exp(x32))).astype(np.float64)  # 0 below about -103
    assert np.isneginf(float32).sum() > 0
    attrs = {"form": "log_sigmoid"}
    assert _named("activation", attrs, [x], float32) == "log_of_sigmoid"
    assert _named("activation", attrs, [x], np.maximum(declared, -20.0)) is None
    assert _named("activation", attrs, [x], np.where(np.isneginf(float32), -np.inf, np.maximum(float32, -20.0))) is None


def test_fully_masked_attention_rows_of_torch_sdpa_on_onnx_runtime_and_openvino(tmp_path):
    """torch's SDPA gives 0 for a query that sees no key (declared ``masked_rows: zero``)."""
    for case, mask, convention, named in (
        ("attn/mask-bool-masked-row", KEEP_ALL_BUT_ROW_0, "keep", {"torch/onnx/ort": "masked_row_uniform"}),
        ("attn/mask-inf-masked-row", INF_ROW_0, "additive", {"torch/onnx/ort": "masked_row_nan"}),
    ):
        x, out = _observed("torch", case, ("torch", "torch/onnx/ort", "torch/openvino"), tmp_path)
        attrs = {"heads": 4, "mask": convention, "masked_rows": "zero"}
        expected = {"torch": None, "torch/openvino": "masked_row_nan", **named}
        for path, variant in expected.items():
            assert _named("attention", attrs, [x, mask], out[path], ATTENTION) == variant, (case, path)


@pytest.mark.slow
def test_jax2onnx_resizes_and_boolean_masked_rows_on_onnx_runtime(tmp_path):
    """``jax.image.resize``: nearest half-pixel rounding ties up, cubic Keys a = -0.5 renormalised inside the image;
    jax2onnx writes ``round_prefer_floor`` and no ``exclude_outside``. ``jax.nn.dot_product_attention`` averages a
    boolean fully masked row; ONNX Runtime runs jax2onnx's graph to 0 there."""
    nchw = (0, 3, 1, 2)
    x, out = _observed("jax", "resize/nearest-6to9", ("jax", "jax/onnx/ort"), tmp_path)
    nearest = {"mode": "nearest", "size": [9, 9], "coordinate_transformation_mode": "half_pixel"}
    nearest["nearest_mode"] = "round_prefer_ceil"
    inputs = [x.transpose(nchw)]
    assert _named("resize", nearest, inputs, out["jax/onnx/ort"].transpose(nchw)) == "nearest_round_prefer_floor"
    assert _named("resize", nearest, inputs, out["jax"].transpose(nchw)) is None

    x, out = _observed("jax", "resize/bicubic-6to9", ("jax", "jax/onnx/ort"), tmp_path)
    cubic = {"mode": "cubic", "size": [9, 9], "coordinate_transformation_mode": "half_pixel"}
    cubic.update(cubic_coeff_a=-0.5, exclude_outside=True, layout="nhwc")
    assert _named("resize", cubic, [x], out["jax/onnx/ort"]) == "cubic_edges_clamped"
    assert _named("resize", cubic, [x], out["jax"]) is None

    x, out = _observed("jax", "attn/mask-bool-masked-row", ("jax", "jax/onnx/ort"), tmp_path)
    attrs = {"heads": 4, "mask": "keep", "masked_rows": "uniform"}
    mask = [x, KEEP_ALL_BUT_ROW_0]
    assert _named("attention", attrs, mask, out["jax/onnx/ort"], ATTENTION) == "masked_row_zero"
    assert _named("attention", attrs, mask, out["jax"], ATTENTION) is None


@pytest.mark.slow
def test_tf2onnx_bicubic_and_litert_masked_rows(tmp_path):
    """TensorFlow's half-pixel ``ResizeBicubic`` reads Keys' kernel from a table of 1024 steps; ONNX Runtime computes
    tf2onnx's ``Resize(cubic)`` exactly. TensorFlow's softmax gives NaN for an additive -inf row; LiteRT averages."""
    import keras

    from parity.model.layer_types_keras import keras_layer

    x, out = _observed("tf", "resize/bicubic-6to9", ("tf", "tf/onnx/ort"), tmp_path)
    kind, attrs = keras_layer(keras.layers.Resizing(9, 9, interpolation="bicubic"))
    assert attrs["cubic_table"] == 1024 and attrs["layout"] == "nhwc"
    assert _named(kind, attrs, [x], out["tf/onnx/ort"]) == "cubic_coefficients_exact"
    assert _named(kind, attrs, [x], out["tf"]) is None

    x, out = _observed("tf", "attn/mask-inf-masked-row", ("tf", "tf/litert"), tmp_path)
    attrs = {"heads": 4, "mask": "additive", "masked_rows": "nan"}
    assert _named("attention", attrs, [x, INF_ROW_0], out["tf/litert"], ATTENTION) == "masked_row_uniform"
    assert _named("attention", attrs, [x, INF_ROW_0], out["tf"], ATTENTION) is None


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("size", [4, 9, 13])
def test_cubic_resize_matches_torch_bicubic_and_its_variants_differ(size, align_corners):
    import torch
    from torch import nn

    from parity.model.layer_types import torch_layer

    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    module = nn.Upsample(size=(size, size), mode="bicubic", align_corners=align_corners)
    kind, attrs = torch_layer(module)
    declared = get(kind).forward([x.numpy()], {}, attrs)
    assert np.allclose(declared, module(x).numpy(), rtol=0, atol=1e-12)
    names = set()
    for variant in get(kind).variants(attrs):
        try:
            value = variant.compute([x.numpy()], {}, attrs, None)
        except NotApplicable:
            continue
        names.add(variant.name)
        assert not np.allclose(value, declared, rtol=1e-6, atol=1e-6), variant.name
    assert "cubic_coeff_a_-0.5" in names
    if (size, align_corners) == (9, False):  # fractions 1/6, 1/2, 5/6: off the 1024 table, taps outside the image
        assert {"cubic_exclude_outside", "cubic_coefficients_table1024"} <= names


def test_cubic_resize_with_excluded_outside_taps_is_jax_image_resize():
    import jax
    import jax.numpy as jnp

    x = np.random.default_rng(1).standard_normal((1, 5, 7, 2)).astype(np.float32)
    attrs = {"mode": "cubic", "size": [8, 10], "coordinate_transformation_mode": "half_pixel"}
    attrs.update(cubic_coeff_a=-0.5, exclude_outside=True)
    ours = get("resize").forward([x.transpose(0, 3, 1, 2)], {}, attrs).transpose(0, 2, 3, 1)
    theirs = np.asarray(jax.image.resize(jnp.asarray(x), (1, 8, 10, 2), "cubic"), np.float64)
    assert np.allclose(ours, theirs, rtol=0, atol=5e-6)  # JAX in float32


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_torch_half_pixel_resize_to_one_row_is_typed_as_torch_computes_it(mode):
    """torch reads ``(o + 0.5) n / m - 0.5`` on an output axis of length 1 too (torch.onnx writes ``half_pixel``), not
    ``pytorch_half_pixel``'s pixel 0: its own output gets no cause, and reading pixel 0 there is named."""
    import torch
    from torch import nn

    from parity.model.layer_types import torch_layer

    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    for size in [(1, 4), (1, 1), (3, 1), (7, 9)]:
        module = nn.Upsample(size=size, mode=mode)
        kind, attrs = torch_layer(module)
        assert attrs["coordinate_transformation_mode"] == "half_pixel"
        declared = get(kind).forward([x.numpy()], {}, attrs)
        assert np.allclose(declared, module(x).numpy(), rtol=0, atol=1e-12), size
    module = nn.Upsample(size=(1, 4), mode=mode)
    kind, attrs = torch_layer(module)
    own = module(x).float().double().numpy()
    assert _named(kind, attrs, [x.numpy()], own) is None
    row_0 = get(kind).forward([x.numpy()], {}, {**attrs, "coordinate_transformation_mode": "pytorch_half_pixel"})
    assert _named(kind, attrs, [x.numpy()], row_0) == "coordinates_pytorch_half_pixel"
