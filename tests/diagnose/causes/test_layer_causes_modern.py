"""The cause catalogue on today's transformer layers: RMSNorm (epsilon, Gemma's ``1 + w`` offset, the mean, the
float32 upcast), gated MLPs and rotary embeddings, each module checked against an independent implementation (the
torch op in float64) and typed from the frameworks' own classes; and on users' models (tests/modernlayers.py) whose
export computes one RMSNorm otherwise, the diagnosis names the leaf and the variant."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from parity.diagnose.causes.cause import test_layer
from parity.diagnose.causes.layers import get
from parity.model.layer_types import torch_further_inputs, torch_layer
from parity.model.layer_types_flax import nnx_layer
from parity.model.layer_types_keras import keras_layer
from parity.model.spec import Layer, Tolerance
from tests.conftest import REPO, failing_export

MODERN = REPO / "tests" / "modernlayers.py"
TOL = Tolerance(atol=1e-5, rtol=1e-5)


def _variant(kind, attrs, name):
    return next(v for v in get(kind).variants(attrs) if v.name == name)


def _torch_rms(x, weight, eps):
    return F.rms_norm(torch.from_numpy(x), (x.shape[-1],), torch.from_numpy(weight), eps).numpy()


@pytest.fixture
def tokens():
    rng = np.random.default_rng(0)
    return rng.standard_normal((2, 5, 16)) * 0.05, rng.random(16) + 0.5


def test_rms_norm_and_its_variants_match_torch_in_float64(tokens):
    x, w = tokens
    attrs = {"eps": 1e-6}
    weights = {"gamma": w}
    np.testing.assert_allclose(get("rms_norm").forward([x], weights, attrs), _torch_rms(x, w, 1e-6), rtol=1e-12)
    for name, expected in [
        ("eps=1e-5", _torch_rms(x, w, 1e-5)),
        ("eps=float32_eps", _torch_rms(x, w, float(np.finfo(np.float32).eps))),
        ("weight_offset", _torch_rms(x, 1.0 + w, 1e-6)),
        (
            "by_variance",
            _torch_rms(x, w, 1e-6)
            * np.sqrt(((x**2).mean(-1, keepdims=True) + 1e-6) / (x.var(-1, keepdims=True) + 1e-6)),
        ),
        ("no_scale", _torch_rms(x, np.ones_like(w), 1e-6)),
    ]:
        got = _variant("rms_norm", attrs, name).compute([x], weights, attrs, None)
        np.testing.assert_allclose(got, expected, rtol=1e-12, err_msg=name)
    t = torch.from_numpy(x)
    outside = (t / (t.pow(2).mean(-1, keepdim=True).sqrt() + 1e-6) * torch.from_numpy(w)).numpy()
    np.testing.assert_allclose(
        _variant("rms_norm", attrs, "eps_outside_sqrt").compute([x], weights, attrs, None), outside, rtol=1e-12
    )
    half = F.rms_norm(t.half(), (16,), torch.from_numpy(w).half(), 1e-6).double().numpy()
    got = _variant("rms_norm", attrs, "no_upcast_float16").compute([x], weights, attrs, None)
    assert np.max(np.abs(got - half)) <= 2e-3 * np.max(np.abs(half))  # float16 steps: within float16's rounding
    assert not np.allclose(got, get("rms_norm").forward([x], weights, attrs), rtol=1e-5, atol=1e-6)


def test_gemma_offset_and_keras_centered_forms_are_the_frameworks_own(tokens):
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    x, w = tokens
    norm = GemmaRMSNorm(16).double()
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(w - 1.0))
    assert torch_layer(norm) == ("rms_norm", {"eps": 1e-6, "offset": 1})
    with torch.no_grad():
        expected = norm(torch.from_numpy(x)).numpy()
    got = get("rms_norm").forward([x], {"gamma": w - 1.0}, {"eps": 1e-6, "offset": 1})
    np.testing.assert_allclose(got, expected, rtol=1e-6)  # Gemma's norm computes in float32 (x.float())
    dropped = _variant("rms_norm", {"eps": 1e-6, "offset": 1}, "weight_offset")
    np.testing.assert_allclose(
        dropped.compute([x], {"gamma": w - 1.0}, {"eps": 1e-6, "offset": 1}, None),
        _torch_rms(x, w - 1.0, 1e-6),
        rtol=1e-12,
    )

    import keras

    layer = keras.layers.LayerNormalization(epsilon=1e-3, rms_scaling=True, dtype="float64")
    out = np.asarray(layer(x))
    kind, attrs = keras_layer(layer)
    assert kind == "rms_norm" and attrs["by_variance"] is True
    from parity.diagnose.causes.cause import recompute

    weights = {"ln/" + v.path.rsplit("/", 1)[-1]: np.asarray(v) for v in layer.weights}
    # Keras computes in float32 here: the forms differ by far more than that (variance against mean square)
    np.testing.assert_allclose(recompute(Layer(kind, attrs), [x], weights, prefix="ln"), out, rtol=1e-5, atol=1e-6)
    assert not np.allclose(recompute(Layer(kind, {**attrs, "by_variance": False}), [x], weights, "ln"), out, rtol=1e-3)
    rms = keras.layers.RMSNormalization(epsilon=1e-6, dtype="float64")
    out = np.asarray(rms(x))
    kind, attrs = keras_layer(rms)
    weights = {"rms/" + v.path.rsplit("/", 1)[-1]: np.asarray(v) for v in rms.weights}
    assert kind == "rms_norm" and not attrs.get("by_variance")
    np.testing.assert_allclose(recompute(Layer(kind, attrs), [x], weights, prefix="rms"), out, rtol=1e-5, atol=1e-6)


def test_keras_normalisations_without_an_epsilon_are_typed_with_keras_default(tokens):
    """``epsilon=None`` is Keras's own default, ``keras.config.epsilon()``: the typed form reproduces the layer."""
    import keras

    from parity.diagnose.causes.cause import recompute

    x, _ = tokens
    eps = keras.config.epsilon()
    for layer, kind in [
        (keras.layers.RMSNormalization(epsilon=None, dtype="float64"), "rms_norm"),
        (keras.layers.LayerNormalization(epsilon=None, rms_scaling=True, dtype="float64"), "rms_norm"),
        (keras.layers.LayerNormalization(epsilon=None, dtype="float64"), "layer_norm"),
    ]:
        out = np.asarray(layer(x * 1e-3))  # mean squares ~2.5e-9, below the default epsilon (1e-7): it matters
        typed, attrs = keras_layer(layer)
        assert typed == kind and attrs["eps"] == eps
        weights = {"n/" + v.path.rsplit("/", 1)[-1]: np.asarray(v) for v in layer.weights}
        np.testing.assert_allclose(recompute(Layer(typed, attrs), [x * 1e-3], weights, "n"), out, rtol=1e-9)


def test_a_custom_keras_layer_holding_a_sub_layer_is_left_untyped():
    """Its ``get_config`` raises ``NotImplementedError`` (a layer in ``__init__``): typing reads a config only once
    the class matches, and a subclass of a typed class whose config cannot be read stays untyped."""
    import keras

    class Wrapper(keras.layers.Layer):
        def __init__(self, inner, **kwargs):
            super().__init__(**kwargs)
            self.inner = inner

        def call(self, x):
            return self.inner(x)

    class DenseWithHelper(keras.layers.Dense):
        def __init__(self, helper, **kwargs):
            super().__init__(4, **kwargs)
            self.helper = helper

        def get_config(self):
            raise NotImplementedError("not serialisable")

    assert keras_layer(Wrapper(keras.layers.Dense(4))) is None
    assert keras_layer(DenseWithHelper(keras.layers.Dense(4))) is None
    assert keras_layer(keras.layers.Dense(4)) == ("dense", {})


def test_torch_and_flax_rms_norms_are_typed():
    from flax import linen, nnx
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.t5.modeling_t5 import T5LayerNorm

    from parity.model.layer_types_flax import flax_layer

    assert torch_layer(LlamaRMSNorm(8, eps=1e-5)) == ("rms_norm", {"eps": 1e-5})
    assert torch_layer(T5LayerNorm(8)) == ("rms_norm", {"eps": 1e-6})
    assert torch_layer(torch.nn.RMSNorm(8)) == (
        "rms_norm",
        {"eps": float(np.finfo(np.float64).eps), "eps_from_dtype": True},
    )
    assert torch_layer(torch.nn.RMSNorm((4, 8))) is None
    assert flax_layer(linen.RMSNorm(epsilon=1e-5)) == ("rms_norm", {"eps": 1e-5, "weight_layout": "flax"})
    assert nnx_layer(nnx.RMSNorm(8, rngs=nnx.Rngs(0))) == ("rms_norm", {"eps": 1e-6, "weight_layout": "flax"})
    from parity.diagnose.causes.cause import layer_weights

    assert set(layer_weights({"n/scale": np.ones(8)}, "n", "rms_norm", {"weight_layout": "flax"})) == {"gamma"}


def test_linen_and_nnx_layers_are_typed_alike():
    """linen's and nnx's Conv and LayerNorm share one typing: the same attributes, and the same refusals (3-D,
    circular padding, input dilation, more axes than the last)."""
    from flax import linen, nnx

    from parity.model.layer_types_flax import flax_layer, nnx_core_layer

    rngs = nnx.Rngs(0)
    conv = flax_layer(linen.Conv(4, (3, 3), strides=2, padding="SAME", kernel_dilation=(1, 2)))
    assert conv == nnx_core_layer(nnx.Conv(2, 4, (3, 3), strides=2, padding="SAME", kernel_dilation=(1, 2), rngs=rngs))
    assert conv[1]["dilation"] == [1, 2] and conv[1]["layout"] == "nhwc"
    assert flax_layer(linen.LayerNorm(epsilon=1e-5)) == nnx_core_layer(nnx.LayerNorm(8, epsilon=1e-5, rngs=rngs))
    for refused in [
        nnx.Conv(2, 4, (3, 3, 3), rngs=rngs),
        nnx.Conv(2, 4, (3, 3), padding="CIRCULAR", rngs=rngs),
        nnx.Conv(2, 4, 3, input_dilation=2, rngs=rngs),
        nnx.LayerNorm(8, reduction_axes=(-2, -1), rngs=rngs),
    ]:
        assert nnx_core_layer(refused) is None, refused
    assert flax_layer(linen.Conv(4, (3, 3, 3))) is None
    assert flax_layer(linen.LayerNorm(reduction_axes=(-2, -1))) is None


def test_torch_rms_norm_without_an_epsilon_takes_its_computing_types():
    """``nn.RMSNorm(eps=None)`` computes with float64's machine epsilon in the float64 golden and float32's on float32,
    float16 and bfloat16 inputs: the golden is the declared form, a float32 run is named by float32's epsilon, a
    float16 run by torch is not offered ``eps=1e-3``, and an export reading float16's epsilon is named so."""
    x = np.random.default_rng(3).standard_normal((4, 6, 16)) * 1e-4  # mean squares ~1e-8: each epsilon tells
    norm = torch.nn.RMSNorm(16)
    kind, attrs = torch_layer(norm)
    layer, weights = Layer(kind, attrs), {"n.weight": np.ones(16)}
    assert "eps=1e-3" not in {v.name for v in get(kind).variants(attrs)}

    def run(dtype, eps=None):
        with torch.no_grad():
            module = torch.nn.RMSNorm(16, eps=eps).to(dtype)
            return module(torch.from_numpy(x).to(dtype)).double().numpy()

    def named(observed, tol=TOL):
        return (test_layer(layer, [x], weights, observed, tol, prefix="n")["cause"] or {}).get("variant")

    assert named(run(torch.float64)) is None
    assert named(run(torch.float32)) == "eps=float32_eps"
    assert named(run(torch.float16), Tolerance(atol=2e-3, rtol=2e-3)) in (None, "eps=float32_eps")
    assert named(run(torch.float64, eps=float(np.finfo(np.float16).eps))) == "eps=float16_eps"


def _llama(**overrides):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRotaryEmbedding

    config = LlamaConfig(**{"hidden_size": 16, "intermediate_size": 24, "num_attention_heads": 2, **overrides})
    torch.manual_seed(0)
    return config, LlamaMLP(config).double().eval(), LlamaRotaryEmbedding(config)


def test_a_gated_mlp_matches_llamas_and_names_the_swapped_halves():
    config, mlp, _ = _llama()
    assert torch_layer(mlp) == ("gated_mlp", {"act": "silu"})
    x = np.random.default_rng(1).standard_normal((2, 3, 16))
    with torch.no_grad():
        expected = mlp(torch.from_numpy(x)).numpy()
        swapped = mlp.down_proj(F.silu(mlp.up_proj(torch.from_numpy(x))) * mlp.gate_proj(torch.from_numpy(x))).numpy()
    weights = {k: v.numpy() for k, v in mlp.state_dict().items()}
    layer = Layer("gated_mlp", {"act": "silu"})
    weights = {f"mlp.{k}": v for k, v in weights.items()}  # torch's own names, as golden build stores them
    passing = test_layer(layer, [x], weights, expected, TOL, prefix="mlp")
    assert passing["cause"] is None and passing["declared"]["tol_units"] <= 1e-3
    found = test_layer(layer, [x], weights, swapped, TOL, prefix="mlp")
    assert found["cause"]["variant"] == "halves_swapped"
    gelu = mlp.down_proj(
        F.gelu(mlp.gate_proj(torch.from_numpy(x)), approximate="tanh") * mlp.up_proj(torch.from_numpy(x))
    )
    found = test_layer(layer, [x], weights, gelu.detach().numpy(), TOL, prefix="mlp")
    assert found["cause"]["variant"] == "act=gelu_tanh"


@pytest.mark.parametrize(("act", "torch_act"), [("leaky_relu", F.leaky_relu), ("hard_sigmoid", F.hardsigmoid)])
def test_a_gated_mlp_reads_its_activation_with_the_activation_kinds_defaults(act, torch_act):
    """leaky_relu's and hard_sigmoid's slope default as the activation kind's do (torch's 0.01 and 1/6)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 8)) * 4.0
    weights = {"gate/kernel": rng.standard_normal((8, 6)), "up/kernel": rng.standard_normal((8, 6))}
    weights["down/kernel"] = rng.standard_normal((6, 8))
    gate, up = (torch.from_numpy(x @ weights[f"{n}/kernel"]) for n in ("gate", "up"))
    expected = (torch_act(gate) * up).numpy() @ weights["down/kernel"]
    got = get("gated_mlp").forward([x], weights, {"act": act})
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_a_rotary_table_matches_llamas_and_names_its_layout_offset_and_base():
    config, _, rotary = _llama(rope_theta=10000.0)
    kind, attrs = torch_layer(rotary)
    assert kind == "rotary" and attrs == {
        "base": 10000.0,
        "dim": 8,
        "rotation": "half",
        "inv_freq": rotary.inv_freq.tolist(),
    }
    x = torch.zeros(1, 6, 16)
    positions = torch.arange(6)[None]
    further = torch_further_inputs(rotary, (x, positions), {})
    assert further is not None and list(further[1]) == ["position_ids"]
    cos, _ = rotary(x, positions)
    layer = Layer(kind, attrs)
    inputs = [x.numpy(), positions.numpy()]
    assert test_layer(layer, inputs, {}, cos.numpy(), TOL, prefix=None)["cause"] is None
    cos_shifted, _ = rotary(x, positions + 1)
    assert (
        test_layer(layer, inputs, {}, cos_shifted.numpy(), TOL, prefix=None)["cause"]["variant"] == "position_offset+1"
    )
    freqs = positions[..., None].double() * rotary.inv_freq.double()
    interleaved = torch.repeat_interleave(freqs, 2, dim=-1).cos().numpy()
    assert test_layer(layer, inputs, {}, interleaved, TOL, prefix=None)["cause"]["variant"] == "rotation_interleaved"
    _, _, llama3 = _llama(rope_theta=500000.0)
    cos3, _ = llama3(x, positions)
    assert test_layer(layer, inputs, {}, cos3.numpy(), TOL, prefix=None)["cause"]["variant"] == "base=500000"


def test_a_rotary_table_at_2048_positions_in_float64_is_transformers_own():
    """transformers computes the angles in float32 in a float64 model too (off by up to 1.2e-4 radians at 2048): the
    declared form does the same from the module's own float32 frequencies, so it reproduces the table, and a
    shifted or another base's table is named."""
    config, _, rotary = _llama(rope_theta=10000.0, hidden_size=256)  # head_dim 128
    rotary = rotary.double()  # what a float64 golden runs: the buffer in float64, read back as float32
    kind, attrs = torch_layer(rotary)
    x = torch.zeros(1, 2048, 256, dtype=torch.float64)
    positions = torch.arange(2048)[None]
    inputs = [x.numpy(), positions.numpy()]
    layer = Layer(kind, attrs)
    cos, _ = rotary(x, positions)
    assert np.max(np.abs(get(kind).forward(inputs, {}, attrs) - cos.numpy())) < 1e-7  # float32's cosine rounding
    assert test_layer(layer, inputs, {}, cos.numpy(), TOL, prefix=None)["cause"] is None
    shifted, _ = rotary(x, positions + 1)
    assert test_layer(layer, inputs, {}, shifted.numpy(), TOL, prefix=None)["cause"]["variant"] == "position_offset+1"
    _, _, llama3 = _llama(rope_theta=500000.0, hidden_size=256)
    cos3, _ = llama3.double()(x, positions)
    assert test_layer(layer, inputs, {}, cos3.numpy(), TOL, prefix=None)["cause"]["variant"] == "base=500000"


def test_no_cause_is_named_where_the_declared_form_reproduces_even_if_a_variant_does_too(tokens):
    """A variant is named only if it matches the path AND the declared form does not: an epsilon that cannot be told
    apart on these inputs, or a path that computes the declared form, names nothing."""
    x, w = tokens
    x = x * 100.0  # mean squares ~25: epsilons of 1e-5 and 1e-6 give the same output within tolerance
    layer = Layer("rms_norm", {"eps": 1e-6})
    observed = _torch_rms(x, w, 1e-5)
    result = test_layer(layer, [x], {"gamma": w}, observed, TOL, prefix=None)
    assert result["cause"] is None and result["declared"]["tol_units"] <= 1.0
    eps = next(v for v in result["variants"] if v["name"] == "eps=1e-5")
    assert eps["reproduces"] and not eps["distinct"]


def _checked(root, name, factory, *inputs):
    return failing_export(root, name, ["--torch", f"{MODERN}:{factory}", *[a for d in inputs for a in ("--input", d)]])[
        0
    ]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("modern")


@pytest.mark.slow
def test_a_llama_whose_export_uses_another_rms_norm_epsilon_is_named_with_that_epsilon(root):
    diagnosis = _checked(root, "llama", "make_llama_export_eps", "input_ids=2x16:int64")
    assert diagnosis["first_divergent_path"][-1] == "model.layers.1.post_attention_layernorm", diagnosis["tree"]
    assert diagnosis["cause_test"]["kind"] == "rms_norm" and diagnosis["cause_test"]["attrs"] == {"eps": 1e-6}
    assert diagnosis["cause"]["variant"] == "eps=1e-5", diagnosis["cause_test"]
    assert math.isfinite(diagnosis["cause"]["after"]["tol_units"]) and diagnosis["cause"]["after"]["tol_units"] <= 1


@pytest.mark.slow
def test_a_gemma_norm_exported_without_its_offset_is_named_with_the_offset_variant(root):
    diagnosis = _checked(root, "gemma", "make_gemma_norm_without_offset", "x=2x8x32")
    assert diagnosis["first_divergent_path"] == ["blocks", "blocks.1", "blocks.1.norm"]
    assert diagnosis["cause_test"]["attrs"] == {"eps": 1e-6, "offset": 1}
    assert diagnosis["cause"]["variant"] == "weight_offset", diagnosis["cause_test"]


@pytest.mark.slow
def test_a_gated_mlp_exported_with_its_halves_swapped_is_tested_whole(root):
    """None of the MLP's projections departs on its own (the act reads ``up``'s output, which departs from the
    reference's input of it): the walk stops at the MLP's own operations, and the MLP is tested as one layer."""
    diagnosis = _checked(root, "swiglu", "make_llama_mlp_halves_swapped", "x=2x8x32")
    assert diagnosis["first_divergent_path"] == ["blocks", "blocks.1", "blocks.1.mlp"], diagnosis["tree"]
    assert diagnosis["tree"]["verdict"] == "own_operations"
    assert diagnosis["cause_test"]["kind"] == "gated_mlp"
    assert diagnosis["cause"]["variant"] == "halves_swapped", diagnosis["cause_test"]


@pytest.mark.parametrize(
    "mode, coordinates, rounding, size, opset",
    [
        ("nearest", "tf_half_pixel_for_nn", "round_prefer_ceil", [8, 11], 13),
        ("linear", "half_pixel_symmetric", "floor", [8, 11], 19),
        ("nearest", "half_pixel_symmetric", "round_prefer_floor", [3, 4], 19),
    ],
)
def test_the_further_resize_coordinate_modes_match_onnx_runtime(mode, coordinates, rounding, size, opset):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    x = np.random.default_rng(0).standard_normal((1, 1, 5, 7)).astype(np.float32)
    node = helper.make_node(
        "Resize",
        ["x", "", "", "sizes"],
        ["y"],
        mode=mode,
        coordinate_transformation_mode=coordinates,
        nearest_mode=rounding,
    )
    graph = helper.make_graph(
        [node],
        "resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("sizes", TensorProto.INT64, [4], [1, 1, *size])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    attrs = {"mode": mode, "coordinate_transformation_mode": coordinates, "nearest_mode": rounding, "size": size}
    np.testing.assert_allclose(get("resize").forward([x], {}, attrs), expected, atol=1e-6)
    declared = {**attrs, "coordinate_transformation_mode": "half_pixel"}
    assert f"coordinates_{coordinates}" in [v.name for v in get("resize").variants(declared)]
