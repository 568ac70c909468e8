"""The catalogue's newer kinds and variants against real frameworks and runtimes: each declared form equals the real
layer in float64, and each variant is named by ``test_layer`` when a real runtime (ONNX Runtime, torch) commits the
fault it describes, and not otherwise."""

from __future__ import annotations

import numpy as np
import pytest

from parity.diagnose.causes.cause import layer_weights, recompute, test_layer
from parity.diagnose.causes.layers import NotApplicable, get
from parity.model.spec import Layer, Tolerance

TOL = Tolerance(atol=1e-6, rtol=1e-6)
FP32 = Tolerance(atol=1e-5, rtol=1e-5)  # for what ONNX Runtime computes in float32


def _ort(node, inputs: dict, initializers: dict, out_rank: int):
    """Run one ONNX node in ONNX Runtime, in float32 (the type every op it runs here takes)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    dtype, np_dtype = TensorProto.FLOAT, np.float32
    graph = helper.make_graph(
        [node],
        "one",
        [helper.make_tensor_value_info(n, dtype, v.shape) for n, v in inputs.items()],
        [helper.make_tensor_value_info(node.output[0], dtype, [None] * out_rank)],
        [numpy_helper.from_array(np.asarray(v, np_dtype), n) for n, v in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {n: np.asarray(v, np_dtype) for n, v in inputs.items()})[0].astype(np.float64)


def _named(result):
    return result["cause"]["variant"] if result["cause"] else result["explanation"]


def test_grouped_depthwise_and_1d_convolutions_match_torch_and_every_variant_differs():
    import torch

    torch.manual_seed(0)
    for module, shape in (
        (torch.nn.Conv2d(4, 8, 3, padding=1, groups=2), (2, 4, 7, 7)),
        (torch.nn.Conv2d(6, 12, 3, stride=2, padding=1, groups=6), (2, 6, 8, 8)),
        (torch.nn.Conv1d(4, 6, 5, padding=2, dilation=1, groups=2), (2, 4, 11)),
    ):
        module = module.double()
        x = torch.randn(*shape, dtype=torch.float64)
        attrs = {"stride": list(module.stride), "padding": list(module.padding), "groups": module.groups}
        weights = layer_weights({f"c.{k}": v.numpy() for k, v in module.state_dict().items()}, "c", "conv")
        declared = get("conv").forward([x.numpy()], weights, attrs)
        assert np.allclose(declared, module(x).detach().numpy(), rtol=0, atol=1e-12)
        for variant in get("conv").variants(attrs):
            try:
                value = variant.compute([x.numpy()], weights, attrs, None)
            except NotApplicable:
                continue
            assert value.shape != declared.shape or np.max(np.abs(value - declared)) > 1e-3, variant.name


@pytest.mark.parametrize("op", ["Conv", "MaxPool", "AveragePool"])
def test_tf_same_padding_in_a_runtime_is_named_a_padding_shift(op):
    """The spec declares PyTorch's symmetric padding=1 at stride 2 on 8x8; the runtime pads as TF 'same' does
    (SAME_UPPER: nothing before, one after): the odd extra pixel at the end."""
    from onnx import helper

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 8, 8))
    kernel = rng.standard_normal((4, 3, 3, 3))
    options = {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}
    if op == "Conv":
        node = helper.make_node("Conv", ["x", "w"], ["y"], **options)
        observed = _ort(node, {"x": x}, {"w": kernel}, 4)
        layer, weights = Layer("conv", {"stride": 2, "padding": 1}, params="c"), {"c/kernel": kernel}
    else:
        node = helper.make_node(op, ["x"], ["y"], **options)
        observed = _ort(node, {"x": x}, {}, 4)
        layer = Layer("pool", {"mode": "max" if op == "MaxPool" else "avg", "size": 3, "stride": 2, "padding": 1})
        weights = {}
    x32 = x.astype(np.float32).astype(np.float64)  # the runtime's input, as the layer's observed input
    result = test_layer(layer, [x32], weights, observed, FP32)
    assert result["declared"]["tol_units"] > 1.0
    assert _named(result) == "padding_shifted"
    declared = recompute(layer, [x32], weights)  # the declared form in the runtime names no cause
    assert test_layer(layer, [x32], weights, declared, FP32)["cause"] is None


def test_resize_nearest_rounding_lost_in_a_runtime_is_named():
    """torch's nearest Upsample (asymmetric, floor) exported without its nearest_mode: ONNX Runtime rounds."""
    import torch
    from onnx import helper

    from parity.model.layer_types import torch_layer

    x = np.random.default_rng(0).standard_normal((1, 2, 4, 6))
    kind, attrs = torch_layer(torch.nn.Upsample(scale_factor=1.5, mode="nearest"))
    node = helper.make_node(
        "Resize", ["x", "", "scales"], ["y"], mode="nearest", coordinate_transformation_mode="asymmetric"
    )
    observed = _ort(node, {"x": x}, {"scales": np.array([1.0, 1.0, 1.5, 1.5])}, 4)
    result = test_layer(Layer(kind, attrs), [x], {}, observed, FP32)
    assert _named(result) == "nearest_round_prefer_floor"


def _torch_rnn(cell):
    import torch

    torch.manual_seed(0)
    module = (torch.nn.GRU if cell == "gru" else torch.nn.LSTM)(4, 3, batch_first=True).double()
    return module, {f"rnn.{k}": v.detach().numpy() for k, v in module.state_dict().items()}


def test_onnx_gru_default_linear_before_reset_is_named():
    """ONNX GRU with linear_before_reset=0 (its default) on weights reordered correctly to z, r, h."""
    import torch
    from onnx import helper

    module, state = _torch_rnn("gru")
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    assert np.allclose(
        recompute(Layer("recurrent", {"cell": "gru"}, params="rnn"), [x.numpy()], state),
        module(x)[0].detach().numpy(),
        atol=1e-12,
    )
    z_r_h = [1, 0, 2]  # torch r, z, n -> ONNX z, r, h

    def reorder(value):
        return np.concatenate([np.split(value, 3, axis=0)[i] for i in z_r_h], axis=0)

    w, r = reorder(state["rnn.weight_ih_l0"])[None], reorder(state["rnn.weight_hh_l0"])[None]
    b = np.concatenate([reorder(state["rnn.bias_ih_l0"]), reorder(state["rnn.bias_hh_l0"])])[None]
    node = helper.make_node("GRU", ["x", "w", "r", "b"], ["y"], hidden_size=3, linear_before_reset=0)
    observed = _ort(node, {"x": x.numpy().transpose(1, 0, 2)}, {"w": w, "r": r, "b": b}, 4)[:, 0].transpose(1, 0, 2)
    result = test_layer(Layer("recurrent", {"cell": "gru"}, params="rnn"), [x.numpy()], state, observed, FP32)
    assert _named(result) == "linear_before_reset_0"


def test_onnx_lstm_reading_torch_gate_blocks_unordered_is_named():
    """A converter that copies torch's i, f, g, o blocks into an ONNX LSTM, which reads i, o, f, c."""
    import torch
    from onnx import helper

    module, state = _torch_rnn("lstm")
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    layer = Layer("recurrent", {"cell": "lstm"}, params="rnn")
    assert np.allclose(recompute(layer, [x.numpy()], state), module(x)[0].detach().numpy(), atol=1e-12)
    b = np.concatenate([state["rnn.bias_ih_l0"], state["rnn.bias_hh_l0"]])[None]
    node = helper.make_node("LSTM", ["x", "w", "r", "b"], ["y"], hidden_size=3)
    observed = _ort(
        node,
        {"x": x.numpy().transpose(1, 0, 2)},
        {"w": state["rnn.weight_ih_l0"][None], "r": state["rnn.weight_hh_l0"][None], "b": b},
        4,
    )[:, 0].transpose(1, 0, 2)
    result = test_layer(layer, [x.numpy()], state, observed, FP32)
    assert _named(result) == "gates_onnx_order"


def _attention_case():
    import torch

    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    keep = torch.rand(2, 5, 5) > 0.4
    keep[:, :, 0] = True
    keep[0, 1] = False  # query 1 of the first sequence may attend to nothing
    state = {f"attn.{k}": v.detach().numpy() for k, v in mha.state_dict().items()}
    return mha, x, keep, state


def _sdpa(mha, x, mask):
    """nn.MultiheadAttention's projections around F.scaled_dot_product_attention with ``mask``."""
    import torch
    import torch.nn.functional as F

    q, k, v = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, dim=-1)
    split = [t.reshape(2, 5, 2, 4).transpose(1, 2) for t in (q, k, v)]
    with torch.no_grad():
        out = F.scaled_dot_product_attention(*split, attn_mask=mask[:, None])
        return mha.out_proj(out.transpose(1, 2).reshape(2, 5, 8)).numpy()


def test_masked_attention_matches_torch_sdpa_with_a_fully_masked_row():
    mha, x, keep, state = _attention_case()
    layer = Layer("attention", {"heads": 2, "mask": "keep"}, inputs=("x", "mask"), params="attn")
    expected = _sdpa(mha, x, keep)
    assert np.allclose(recompute(layer, [x.numpy(), keep.numpy()], state), expected, rtol=0, atol=1e-12)
    assert np.allclose(expected[0, 1], mha.out_proj.bias.detach().numpy())  # SDPA: zero attention, then the bias
    with pytest.raises(ValueError, match="mask's convention"):
        recompute(Layer("attention", {"heads": 2}, params="attn"), [x.numpy(), keep.numpy()], state)


def test_fully_masked_row_conventions_of_real_torch_are_named():
    import torch

    mha, x, keep, state = _attention_case()
    layer = Layer("attention", {"heads": 2, "mask": "keep"}, inputs=("x", "mask"), params="attn")
    inputs = [x.numpy(), keep.numpy()]
    with torch.no_grad():  # nn.MultiheadAttention's own softmax: NaN where every key is masked
        nan = mha(x, x, x, attn_mask=(~keep).repeat_interleave(2, 0))[0].numpy()
    assert np.isnan(nan[0, 1]).all() and np.isfinite(nan[1]).all()
    lowest = torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, torch.finfo(torch.float64).min)
    observed = {
        "masked_row_nan": nan,
        "masked_row_uniform": _sdpa(mha, x, lowest),
        "mask_inverted": _sdpa(mha, x, ~keep),
        "mask_ignored": _sdpa(mha, x, torch.ones_like(keep)),
    }
    for expected, value in observed.items():
        result = test_layer(layer, inputs, state, value, TOL)
        assert _named(result) == expected, expected
    assert test_layer(layer, inputs, state, _sdpa(mha, x, keep), TOL)["cause"] is None


def test_generic_variants_on_real_torch_faults():
    """A GELU that ran in bfloat16, one with a dropout left on after it, and one skipped: named whatever the kind."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    x = torch.randn(64, 32, dtype=torch.float64)
    layer = Layer("activation", {"form": "gelu_erf"})
    bf16 = F.gelu(x.bfloat16()).double().numpy()
    result = test_layer(layer, [x.bfloat16().double().numpy()], {}, bf16, Tolerance(atol=1e-5, rtol=1e-3))
    assert _named(result) == "bfloat16_rounding"
    assert next(v for v in result["variants"] if v["name"] == "bfloat16_rounding")["generic"] is True
    dropped = F.dropout(F.gelu(x), p=0.25, training=True).numpy()
    assert _named(test_layer(layer, [x.numpy()], {}, dropped, TOL)) == "dropout_active_inside"
    assert _named(test_layer(layer, [x.numpy()], {}, x.numpy(), TOL)) == "layer_skipped"
    assert test_layer(layer, [x.numpy()], {}, F.gelu(x).numpy(), TOL)["cause"] is None
