"""The nested models of ``tests/nestedmodels.py``: each builds and runs natively as declared, its faulty leaf is
where its docstring says, and its export (torch.onnx, tf2onnx, jax2onnx, run by ONNX Runtime) really departs from
the native run while the same export without the fault does not."""

from __future__ import annotations

import numpy as np
import pytest

from tests import nestedmodels

TORCH = {  # factory -> (its inputs, the module path of the faulty leaf, the class it still is)
    "make_residual_stack": ({"x": (2, 16)}, "blocks.5.norm", "LayerNorm"),
    "make_cnn_stages": ({"x": (2, 3, 16, 16)}, "features.1.3", "AvgPool2d"),
    "make_faulty_distilbert": (
        {"input_ids": "ids", "attention_mask": "mask"},
        "transformer.layer.1.output_layer_norm",
        "LayerNorm",
    ),
    "make_faulty_vit": ({"pixel_values": (2, 3, 16, 16)}, "layers.2.layernorm_before", "LayerNorm"),
    "make_faulty_bert": (
        {"input_ids": "ids", "attention_mask": "mask", "token_type_ids": "zeros"},
        "encoder.layer.1.intermediate.intermediate_act_fn",
        "GELUActivation",
    ),
    "make_faulty_gpt2": ({"input_ids": "ids", "attention_mask": "mask"}, "h.1.mlp.act", "NewGELUActivation"),
}


def _feed(inputs: dict) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    mask = np.ones((2, 16), np.int64)
    mask[1, 11:] = 0
    kinds = {
        "ids": lambda: rng.integers(0, nestedmodels.VOCAB, (2, 16)),
        "mask": lambda: mask,
        "zeros": lambda: np.zeros((2, 16), np.int64),
    }
    return {
        name: kinds[shape]() if isinstance(shape, str) else rng.standard_normal(shape).astype(np.float32)
        for name, shape in inputs.items()
    }


def _first_output(out):
    return out if not isinstance(out, (tuple, dict)) and not hasattr(out, "last_hidden_state") else out[0]


def _departs(actual, expected, atol=1e-5, rtol=1e-5) -> float:
    """The worst element's error in units of ``atol + rtol * |expected|`` (over 1: out of tolerance)."""
    return float(np.max(np.abs(actual - expected) / (atol + rtol * np.abs(expected))))


@pytest.mark.parametrize("factory", sorted(TORCH))
def test_torch_factory_builds_runs_and_holds_its_faulty_leaf(factory):
    import torch

    inputs, leaf, base = TORCH[factory]
    model = getattr(nestedmodels, factory)()
    assert not model.training
    module = model.get_submodule(leaf)
    assert base in [cls.__name__ for cls in type(module).__mro__]
    with torch.no_grad():
        out = _first_output(model(**{k: torch.from_numpy(v) for k, v in _feed(inputs).items()}))
    assert out.shape[0] == 2 and torch.isfinite(out).all()


def test_norms_are_random():
    import torch

    model = nestedmodels.make_cnn_stages()
    bn = model.features[1][1]
    assert not torch.allclose(bn.weight, torch.ones_like(bn.weight))
    assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
    norm = nestedmodels.make_residual_stack().blocks[5].norm
    assert norm.eps == 1e-5 and norm.export_eps == 1e-1 and norm.bias.abs().max() > 0


@pytest.mark.slow
@pytest.mark.parametrize("factory", sorted(TORCH))
def test_torch_export_departs_from_eager(factory, tmp_path):
    import onnxruntime as ort
    import torch

    inputs, _, _ = TORCH[factory]
    model, feed = getattr(nestedmodels, factory)(), _feed(inputs)

    class Positional(torch.nn.Module):  # the exporter takes positional inputs; the models take keywords
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            return _first_output(self.model(**dict(zip(feed, args))))

    wrapped = Positional().eval()
    args = tuple(torch.from_numpy(v) for v in feed.values())
    with torch.no_grad():
        eager = wrapped(*args).numpy()
    torch.onnx.export(wrapped, args, str(tmp_path / "m.onnx"), dynamo=True, verbose=False)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    exported = session.run(None, {i.name: v for i, v in zip(session.get_inputs(), feed.values())})[0]
    assert _departs(exported, eager) > 3, factory


def test_keras_nested_saves_loads_and_runs(tmp_path):
    import keras

    path = nestedmodels.save_keras_nested(tmp_path / "nested.keras")
    model = keras.models.load_model(path, compile=False)
    assert [layer.name for layer in model.layers] == ["x", "proj", "encoder", "mlp", "head"]
    assert isinstance(model.get_layer("encoder"), keras.Model)
    assert isinstance(model.get_layer("mlp"), keras.Sequential)
    norm = model.get_layer("encoder").get_layer("norm")
    assert isinstance(norm, keras.layers.LayerNormalization) and norm.export_epsilon == 1e-1
    x = np.random.default_rng(0).standard_normal((2, 12)).astype(np.float32)
    assert model(x).shape == (2, 3)


@pytest.mark.slow
def test_keras_fault_is_in_the_tf2onnx_export_only(tmp_path, monkeypatch):
    import onnxruntime as ort
    import tensorflow as tf
    import tf2onnx

    model = nestedmodels.make_keras_nested()
    x = np.random.default_rng(0).standard_normal((2, 12)).astype(np.float32)
    native = tf.function(lambda a: model(a))(x).numpy()  # noqa: PLW0108 - as parity's native tf path runs it

    def exported():
        function = tf.function(lambda a: model(a))  # noqa: PLW0108 - a fresh function, traced apart from the model
        onnx_model, _ = tf2onnx.convert.from_function(
            function, input_signature=[tf.TensorSpec((None, 12), tf.float32, name="x")], opset=17
        )
        session = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, {session.get_inputs()[0].name: x})[0]

    assert _departs(exported(), native) > 3
    monkeypatch.setattr(nestedmodels, "_traced_by", lambda package: False)
    assert _departs(exported(), native) < 1


def test_flax_nested_params_nest_and_apply_taps_blocks(tmp_path):
    import jax.numpy as jnp

    from parity.model.user import unflatten

    flat = dict(np.load(nestedmodels.save_flax_params(tmp_path / "params.npz")))
    assert "blocks_3/norm/scale" in flat and "blocks_3/dense/kernel" in flat
    assert np.abs(flat["blocks_3/norm/bias"]).max() > 0
    taps = {}
    x = np.random.default_rng(0).standard_normal((2, 12)).astype(np.float32)
    out = nestedmodels.flax_apply(unflatten({k: jnp.asarray(v) for k, v in flat.items()}), x, taps.__setitem__)
    assert out.shape == (2, 3)
    assert list(taps) == ["proj", *(f"blocks_{i}" for i in range(nestedmodels.FLAX_BLOCKS))]


@pytest.mark.slow
def test_flax_fault_is_in_the_jax2onnx_export_only(tmp_path, monkeypatch):
    import jax
    import jax.numpy as jnp
    import onnxruntime as ort
    from jax2onnx import to_onnx

    from parity.model.user import unflatten

    params = unflatten(
        {k: jnp.asarray(v) for k, v in np.load(nestedmodels.save_flax_params(tmp_path / "p.npz")).items()}
    )
    x = np.random.default_rng(0).standard_normal((2, 12)).astype(np.float32)
    native = np.asarray(jax.jit(nestedmodels.flax_apply)(params, x))  # as parity's native jax path runs it

    def exported():
        model = to_onnx(
            lambda a: nestedmodels.flax_apply(params, a),
            [jax.ShapeDtypeStruct((2, 12), "float32")],
            model_name="nested",
            opset=17,
        )
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, {session.get_inputs()[0].name: x})[0]

    assert _departs(exported(), native) > 3
    monkeypatch.setattr(nestedmodels, "_traced_by", lambda package: False)
    assert _departs(exported(), native) < 1
