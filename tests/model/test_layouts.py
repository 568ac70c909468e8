"""Layout conversions round-trip, and a converted conv kernel computes the same conv in torch and TF."""

from __future__ import annotations

import numpy as np
import pytest

from parity.model import layouts


@pytest.mark.parametrize("framework", ["torch", "tf", "jax"])
@pytest.mark.parametrize("kind,shape", [("dense_kernel", (5, 3)), ("conv_kernel", (4, 2, 3, 3)), ("vector", (7,))])
def test_param_round_trip(framework, kind, shape):
    value = np.random.default_rng(0).standard_normal(shape)
    converted = layouts.param_to_framework(framework, kind, value)
    assert converted.shape == layouts.framework_shape(framework, kind, shape)
    np.testing.assert_array_equal(layouts.param_from_framework(framework, kind, converted), value)


def test_input_round_trip():
    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    nhwc = layouts.to_layout(x, "nchw", "nhwc")
    assert nhwc.shape == (2, 4, 5, 3) and nhwc[1, 2, 3, 0] == x[1, 0, 2, 3]
    np.testing.assert_array_equal(layouts.from_layout(nhwc, "nchw", "nhwc"), x)


def test_torch_names():
    assert layouts.torch_param_name("block0_attn/query/kernel") == "block0_attn.query.weight"
    assert layouts.torch_param_name("bn1/moving_variance") == "bn1.running_var"
    assert layouts.torch_param_name("pos/embedding") == "pos.embedding"


def test_conv_kernel_conversion_is_the_same_convolution():
    """OIHW weights in torch on NCHW == converted HWIO weights in TensorFlow on NHWC."""
    import tensorflow as tf
    import torch

    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 6, 5))
    kernel = rng.standard_normal((4, 3, 3, 2))  # OIHW, non-square on purpose
    expected = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(kernel)).numpy()
    tf_out = tf.nn.conv2d(
        layouts.to_layout(x, "nchw", "nhwc"),
        layouts.param_to_framework("tf", "conv_kernel", kernel),
        strides=1,
        padding="VALID",
    ).numpy()
    np.testing.assert_allclose(layouts.from_layout(tf_out, "nchw", "nhwc"), expected, rtol=1e-12, atol=1e-12)


def test_dense_kernel_conversion_is_the_same_matmul():
    import torch

    rng = np.random.default_rng(2)
    x, kernel = rng.standard_normal((4, 5)), rng.standard_normal((5, 3))  # canonical (in, out)
    linear = torch.nn.Linear(5, 3, bias=False).double()
    linear.weight.data = torch.from_numpy(layouts.param_to_framework("torch", "dense_kernel", kernel))
    np.testing.assert_allclose(linear(torch.from_numpy(x)).detach().numpy(), x @ kernel, rtol=1e-12)
