"""The ``jax/tf`` path of a JAX model whose special functions JAX lowers to StableHLO composites (``erf``, ``sinh``):
serialised at a StableHLO version the installed TensorFlow reads, composites as calls, so it runs at any batch."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from parity.cli import cli
from tests.conftest import REPO


def test_composites_run_in_tensorflow_at_a_dynamic_batch():
    import jax
    import jax.numpy as jnp
    import tensorflow as tf
    from jax.experimental import jax2tf

    from parity.exporters.jax_tf import serialised_for_tensorflow

    def f(x):
        return jnp.sinh(jax.scipy.special.erf(x))

    with serialised_for_tensorflow() as stablehlo:
        converted = tf.function(
            jax2tf.convert(f, polymorphic_shapes=["(b, 4)"]),
            autograph=False,
            input_signature=[tf.TensorSpec((None, 4), tf.float32)],
        )
        converted.get_concrete_function()
    assert stablehlo["composites"] == ["chlo.erf", "chlo.sinh"], stablehlo
    for batch in (1, 3):
        x = np.linspace(-0.9, 0.9, 4 * batch, dtype=np.float32).reshape(batch, 4)
        np.testing.assert_allclose(converted(x).numpy(), np.asarray(f(x)), rtol=1e-6, atol=1e-7)


@pytest.mark.slow  # a golden build, jax2tf and a TensorFlow check in workers: about 15 s
def test_jax_tf_path_of_a_model_with_erf_passes(tmp_path):
    from tests.jax_composite import save_params

    save_params(tmp_path / "params.npz")

    def invoke(*args):
        return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)

    reference = f"{REPO / 'tests' / 'jax_composite.py'}:apply,{tmp_path / 'params.npz'}"
    assert invoke("init", "jerf", "--workspace", tmp_path, "--jax", reference, "--input", "x=4x5").exit_code == 0
    assert invoke("golden", "build", "--workspace", tmp_path, "--model", "jerf").exit_code == 0
    result = invoke("check", "--workspace", tmp_path, "--path", "jax/tf", "--json", tmp_path / "r.json")
    (r,) = json.loads((tmp_path / "r.json").read_text())["results"]
    assert result.exit_code == 0 and r["verdict"] == "pass", (r["verdict"], r["reason"])
    assert r["export"]["axes"]["dynamic"] == {"x": {"0": "batch"}}  # checked at other batch sizes too
