"""Each framework's definition is loaded by canonical name; mismatches are listed, not crashed on."""

from __future__ import annotations

import numpy as np
import pytest

from parity.golden import store as golden
from parity.model.workspace import Workspace
from parity.platform.errors import WeightsMismatch
from parity.sources.jax import JaxSource
from parity.sources.tf import KerasSource
from parity.sources.torch import TorchSource
from tests.conftest import REPO, mlp_variant

SOURCES = {"torch": TorchSource, "tf": KerasSource, "jax": JaxSource}


@pytest.fixture(scope="module")
def mlp():
    ws = Workspace(REPO)
    return ws.load_spec("mlp"), golden.load_arrays(ws.golden_dir("mlp"), "weights.npz")


@pytest.mark.parametrize("framework", SOURCES)
def test_weights_with_missing_and_unexpected_names(mlp, framework):
    spec, weights = mlp
    broken = dict(weights)
    del broken["dense2/bias"]
    broken["extra/kernel"] = np.zeros((2, 2), np.float32)
    with pytest.raises(WeightsMismatch) as info:
        SOURCES[framework](spec, broken, spec.batch_size)
    assert "dense2/bias" in str(info.value) and "extra/kernel" in str(info.value)


@pytest.mark.parametrize(
    "framework,replace",
    [
        (
            "torch",
            {
                "self.dense2 = nn.Linear(HIDDEN[0], HIDDEN[1])": "self.dense2 = nn.Linear(HIDDEN[0], 33)",
                "self.logits = nn.Linear(HIDDEN[1], CLASSES)": "self.logits = nn.Linear(33, CLASSES)",
            },
        ),
        ("tf", {'layers.Dense(HIDDEN[1], name="dense2"': 'layers.Dense(33, name="dense2"'}),
    ],
)
def test_definition_with_misshaped_layer(mlp, workspace_copy, framework, replace):
    spec, weights = mlp
    variant = Workspace(workspace_copy(mlp_variant(replace))).load_spec("mlp")
    with pytest.raises(WeightsMismatch) as info:
        SOURCES[framework](variant, weights, spec.batch_size)
    assert "mis-shaped" in str(info.value) and "dense2/kernel" in str(info.value)


def test_jax_definition_reading_an_unknown_name(mlp, workspace_copy):
    spec, weights = mlp
    variant = Workspace(workspace_copy(mlp_variant({'params[f"{name}/bias"]': 'params[f"{name}/offset"]'}))).load_spec(
        "mlp"
    )
    with pytest.raises(WeightsMismatch) as info:
        JaxSource(variant, weights, spec.batch_size)
    assert "dense1/offset" in str(info.value)


@pytest.mark.parametrize("framework", SOURCES)
def test_wrong_input_shape_is_a_clear_error(mlp, framework):
    from parity.runtimes.base import ShapeMismatch

    spec, weights = mlp
    source = SOURCES[framework](spec, weights, spec.batch_size)
    with pytest.raises(ShapeMismatch, match=r"has shape \(64, 65\), the model takes \(batch, 64\)"):
        source.run(np.zeros((64, 65), np.float32))


@pytest.mark.slow  # a second proof: the fast set keeps jax2onnx's export of the mlp run by ONNX Runtime in
# tests/exporters/test_dynamic_exports.py::test_zoo_export_has_a_dynamic_batch[mlp-jax2onnx], and a runner that
# cannot differentiate in tests/check/test_training.py::test_a_runner_that_cannot_differentiate_takes_no_step
def test_onnx_runtime_runs_an_export_but_cannot_differentiate(mlp, tmp_path):
    from parity.exporters import jax_onnx
    from parity.exporters.common import ExportJob
    from parity.platform.errors import NotDifferentiable
    from parity.runtimes.ort import OrtRunner

    spec, weights = mlp
    meta = jax_onnx.export(ExportJob(spec, weights, spec.batch_size, spec.opset, tmp_path))
    runner = OrtRunner(spec, tmp_path, meta, spec.batch_size, threads=1)
    x = golden.load_arrays(Workspace(REPO).golden_dir("mlp"), "inputs.npz")["x"]
    expected = JaxSource(spec, weights, spec.batch_size).run(x)["logits"]
    np.testing.assert_allclose(runner.run(x)["logits"], expected, atol=1e-5)
    with pytest.raises(NotDifferentiable, match="OrtRunner cannot differentiate"):
        runner.gradients(x, np.zeros(64, np.int64))


def test_jax_function_without_parameters_runs(tmp_path):
    """A JAX model with no weights (``parity init --jax`` with an empty ``.npz``) is traced and run, its inputs in
    the run's dtype."""
    from click.testing import CliRunner

    from parity.cli import cli

    (tmp_path / "fn.py").write_text(
        "def apply(params, x):\n    import jax.numpy as jnp\n\n    return 2 * jnp.tanh(x)\n"
    )
    np.savez(tmp_path / "none.npz")
    result = CliRunner().invoke(
        cli,
        ["init", "fn", "--jax", f"{tmp_path / 'fn.py'}:apply,{tmp_path / 'none.npz'}", "--input", "x=2x5"]
        + ["--workspace", str(tmp_path)],
    )
    assert result.exit_code == 0, result.output
    spec = Workspace(tmp_path).load_spec("fn")
    x = np.linspace(-2, 2, 10, dtype=np.float32).reshape(2, 5)
    outputs = JaxSource(spec, {}, spec.batch_size).run(x)
    np.testing.assert_allclose(outputs[spec.outputs[0]], 2 * np.tanh(x), rtol=1e-6)
