"""Faults the type checker found (``mypy``, configured in pyproject.toml), each pinned by the behaviour it broke."""

from __future__ import annotations

import numpy as np
import pytest


def test_a_flax_conv_with_an_int_kernel_size_is_recognised_as_one_axis():
    """flax reads ``nn.Conv(features, kernel_size=3)`` as a one-axis kernel; ``flax_layer`` took ``len`` of the int."""
    jax = pytest.importorskip("jax")
    nn = pytest.importorskip("flax.linen")

    from parity.diagnose.causes.layers.native import bind, canonical_weights
    from parity.model.layer_types_flax import flax_layer

    module = nn.Conv(4, 3, padding="SAME")
    x = np.random.default_rng(0).standard_normal((2, 9, 5)).astype(np.float32)
    params = module.init(jax.random.PRNGKey(1), x)["params"]
    kind, attrs = flax_layer(module.bind({"params": params}))
    assert kind == "conv"
    weights = canonical_weights({f"layer/{k}": np.asarray(v) for k, v in params.items()}, "layer", kind, attrs)
    np.testing.assert_allclose(
        bind(kind, attrs).forward([x], weights), np.asarray(module.apply({"params": params}, x)), rtol=1e-4, atol=1e-4
    )


def test_an_export_step_run_without_its_parent_artifact_says_what_it_lacks(tmp_path):
    """A conversion step handed no parent artifact: an ``ExportError`` naming it, not a ``TypeError`` on None."""
    pytest.importorskip("onnx")
    from parity.exporters import onnx_fp16
    from parity.exporters.common import ExportJob
    from parity.platform.errors import ExportError

    job = ExportJob(spec=None, weights={}, batch_size=1, opset=17, out_dir=tmp_path, precision="fp16")
    with pytest.raises(ExportError, match="needs the previous step's artifact"):
        onnx_fp16.export(job)
