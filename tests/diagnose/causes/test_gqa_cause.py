"""Grouped-query attention in the cause catalogue: the ``attention`` kind with ``kv_heads`` (query head h reads
key/value head h // group, as transformers' ``repeat_kv`` and torch SDPA's ``enable_gqa``) and transformers' rotary
tables, checked against torch in float64; transformers' attention modules typed with their inputs read from the
call; and a Llama decoder whose export tiles the key/value heads (tests/modernlayers.py) named at its leaf with
``kv_heads_tiled``, its correct twin with no cause."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from parity.diagnose.causes.cause import test_layer
from parity.diagnose.causes.layers import NotApplicable, get
from parity.model.layer_types import torch_further_inputs, torch_layer
from parity.model.spec import Layer, Tolerance
from tests.conftest import REPO, failing_export

MODERN = REPO / "tests" / "modernlayers.py"
TOL = Tolerance(atol=1e-6, rtol=1e-6)
MHA_VARIANTS = ["scale_sqrt_d_model", "scale_head_dim", "no_scale", "softmax_query_axis", "heads_interleaved", "causal"]


def _variant(attrs, name):
    return next(v for v in get("attention").variants(attrs) if v.name == name)


def _weights(rng, d, heads, kv, hd):
    return {
        "query/kernel": rng.standard_normal((d, heads * hd)),
        "query/bias": rng.standard_normal(heads * hd),
        "key/kernel": rng.standard_normal((d, kv * hd)),
        "key/bias": rng.standard_normal(kv * hd),
        "value/kernel": rng.standard_normal((d, kv * hd)),
        "out/kernel": rng.standard_normal((heads * hd, d)),
    }


def _torch_gqa(x, w, heads, kv, grouping, causal=False):
    """The layer in torch, float64: SDPA with ``enable_gqa`` for the declared grouping, the heads tiled by hand."""
    t = {k: torch.from_numpy(v) for k, v in w.items()}
    x = torch.from_numpy(x)
    b, n, _ = x.shape
    q = (x @ t["query/kernel"] + t["query/bias"]).view(b, n, heads, -1).transpose(1, 2)
    k = (x @ t["key/kernel"] + t["key/bias"]).view(b, n, kv, -1).transpose(1, 2)
    v = (x @ t["value/kernel"]).view(b, n, kv, -1).transpose(1, 2)
    if grouping == "tile":
        k, v = k.repeat(1, heads // kv, 1, 1), v.repeat(1, heads // kv, 1, 1)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=grouping == "repeat")
    return (out.transpose(1, 2).reshape(b, n, -1) @ t["out/kernel"]).numpy()


@pytest.mark.parametrize(("heads", "kv"), [(4, 2), (6, 2), (8, 4)])
def test_grouped_heads_are_torch_sdpas_and_the_tiled_order_is_named(heads, kv):
    rng = np.random.default_rng(heads + kv)
    x, w = rng.standard_normal((2, 5, 12)), _weights(rng, 12, heads, kv, 3)
    attrs = {"heads": heads, "kv_heads": kv, "causal": True}
    declared = get("attention").forward([x], w, attrs)
    np.testing.assert_allclose(declared, _torch_gqa(x, w, heads, kv, "repeat", causal=True), rtol=1e-10, atol=1e-10)
    tiled = _torch_gqa(x, w, heads, kv, "tile", causal=True)
    np.testing.assert_allclose(_variant(attrs, "kv_heads_tiled").compute([x], w, attrs, None), tiled, rtol=1e-10)
    assert not np.allclose(declared, tiled, rtol=1e-3)
    found = test_layer(Layer("attention", attrs), [x], w, tiled, TOL, prefix=None)
    assert found["cause"]["variant"] == "kv_heads_tiled", found
    assert test_layer(Layer("attention", attrs), [x], w, declared, TOL, prefix=None)["cause"] is None


def test_tiled_heads_are_not_applicable_with_one_or_every_kv_head_and_mha_is_unchanged():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 8))
    mqa = {"heads": 4, "kv_heads": 1}
    with pytest.raises(NotApplicable):
        _variant(mqa, "kv_heads_tiled").compute([x], _weights(rng, 8, 4, 1, 2), mqa, None)
    every = {"heads": 4, "kv_heads": 4}
    w = _weights(rng, 8, 4, 4, 2)
    with pytest.raises(NotApplicable):
        _variant({**every, "kv_heads": 2}, "kv_heads_tiled").compute([x], w, every, None)
    # kv_heads absent or equal to heads: the multi-head layer, its variants and its values as before
    assert [v.name for v in get("attention").variants({"heads": 4})] == MHA_VARIANTS
    assert [v.name for v in get("attention").variants(every)] == MHA_VARIANTS
    np.testing.assert_array_equal(
        get("attention").forward([x], w, every), get("attention").forward([x], w, {"heads": 4})
    )
    with pytest.raises(ValueError, match="divides heads"):
        get("attention").forward([x], _weights(rng, 8, 4, 3, 2), {"heads": 4, "kv_heads": 3})


def _llama_attention(impl="sdpa", kv=2, model="llama"):
    from transformers import LlamaConfig, Qwen2Config
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention

    config = (LlamaConfig if model == "llama" else Qwen2Config)(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=kv, rope_theta=10000.0
    )
    config._attn_implementation = impl
    torch.manual_seed(0)
    attention = (LlamaAttention if model == "llama" else Qwen2Attention)(config, 0).double().eval()
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    tables = LlamaRotaryEmbedding(config)(x, torch.arange(6)[None])
    return attention, x, tables


def _typed(attention, call):
    kind, attrs = torch_layer(attention)
    further = torch_further_inputs(attention, (), call)
    assert further is not None
    inputs = [call["hidden_states"].numpy(), *[t.numpy() for t in further[1].values()]]
    weights = {f"a.{k}": v.numpy() for k, v in attention.state_dict().items()}  # torch's names, as golden build
    return Layer(kind, {**attrs, **further[0]}), inputs, weights


def _causal(dtype):
    keep = torch.tril(torch.ones(6, 6, dtype=torch.bool))[None, None].expand(2, 1, 6, 6)
    if dtype == torch.bool:
        return keep
    return torch.zeros(2, 1, 6, 6, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)


@pytest.mark.parametrize(
    ("impl", "mask", "model"),
    [
        ("sdpa", None, "llama"),
        ("sdpa", torch.bool, "llama"),
        ("eager", torch.float64, "llama"),
        ("sdpa", None, "qwen2"),
    ],
)
def test_transformers_attention_is_typed_from_its_call_and_reproduced(impl, mask, model):
    """Llama's and Qwen2's attention (q/k/v biases) with SDPA (no mask: causal; a boolean mask) or eager attention (an
    additive mask at the dtype's lowest value): the typed layer with the call's rotary tables and mask is the module's
    output; its export with the heads tiled is named ``kv_heads_tiled``, with pairs rotated ``rotary_pairs``."""
    attention, x, (cos, sin) = _llama_attention(impl, model=model)
    call = {"hidden_states": x, "position_embeddings": (cos, sin), "attention_mask": None, "position_ids": None}
    if mask is not None:
        call["attention_mask"] = _causal(mask)
    layer, inputs, weights = _typed(attention, call)
    assert layer.attrs["kv_heads"] == 2 and layer.attrs["rotary"] == "half"
    assert layer.attrs.get("causal", False) is (mask is None and impl == "sdpa")
    with torch.no_grad():
        expected = attention(**call)[0].numpy()
    passing = test_layer(layer, inputs, weights, expected, TOL, prefix="a")
    assert passing["cause"] is None and passing["declared"]["tol_units"] <= 1.0, passing["declared"]

    def tile(hidden, n_rep):
        return hidden.repeat(1, n_rep, 1, 1)

    from transformers.models.llama import modeling_llama
    from transformers.models.qwen2 import modeling_qwen2

    with pytest.MonkeyPatch.context() as patch:  # the module's own computation, the heads tiled
        for where in (modeling_llama, modeling_qwen2):
            patch.setattr(where, "repeat_kv", tile)
        if impl == "sdpa":
            from transformers.integrations import sdpa_attention

            patch.setattr(sdpa_attention, "repeat_kv", tile)
            patch.setattr(sdpa_attention, "use_gqa_in_sdpa", lambda *a: False)
        with torch.no_grad():
            observed = attention(**call)[0].numpy()
    found = test_layer(layer, inputs, weights, observed, TOL, prefix="a")
    assert found["cause"]["variant"] == "kv_heads_tiled", found["declared"]


def _pairs_rotated(x, inv_freq, positions):
    """q or k (b, heads, t, hd) rotated over adjacent pairs, as complex numbers (Meta's original Llama)."""
    angles = positions[..., None].double() * inv_freq.double()  # (b, t, hd/2)
    turns = torch.polar(torch.ones_like(angles), angles)[:, None]
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(pairs * turns).reshape(x.shape)


def test_rotary_pairs_are_metas_rotation_of_adjacent_pairs():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, rope_theta=10000.0)
    rotary = LlamaRotaryEmbedding(config).double()
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((1, 5, 32)), _weights(rng, 32, 2, 1, 16)
    positions = torch.arange(5)[None]
    cos, sin = rotary(torch.from_numpy(x), positions)
    attrs = {"heads": 2, "kv_heads": 1, "rotary": "half", "causal": True}
    t = {k: torch.from_numpy(v) for k, v in w.items()}
    q = (torch.from_numpy(x) @ t["query/kernel"] + t["query/bias"]).view(1, 5, 2, 16).transpose(1, 2)
    k = (torch.from_numpy(x) @ t["key/kernel"] + t["key/bias"]).view(1, 5, 1, 16).transpose(1, 2)
    v = (torch.from_numpy(x) @ t["value/kernel"]).view(1, 5, 1, 16).transpose(1, 2)
    q, k = (_pairs_rotated(a, rotary.inv_freq, positions) for a in (q, k))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    expected = (out.transpose(1, 2).reshape(1, 5, -1) @ t["out/kernel"]).numpy()
    inputs = [x, cos.numpy(), sin.numpy()]
    got = _variant(attrs, "rotary_pairs").compute(inputs, w, attrs, None)
    # the tables hold float32 angles (transformers'), the complex rotation float64 ones
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert (
        test_layer(Layer("attention", attrs), inputs, w, expected, Tolerance(atol=1e-4, rtol=1e-4))["cause"]["variant"]
        == "rotary_pairs"
    )
    assert "kv_heads_tiled" in [v.name for v in get("attention").variants(attrs)]  # listed, not applicable: one kv head


def test_a_transformers_attention_call_it_cannot_recompute_is_left_untyped():
    attention, x, tables = _llama_attention("eager")
    call = {"hidden_states": x, "position_embeddings": tables, "attention_mask": _causal(torch.bool)}
    assert torch_further_inputs(attention, (), call) is None  # eager attention adds the mask: a boolean one is not
    assert torch_further_inputs(attention, (), {**call, "attention_mask": None, "past_key_values": object()}) is None
    assert torch_further_inputs(attention, (), {**call, "attention_mask": None, "softcap": 30.0}) is None
    attention.config._attn_implementation = "flex_attention"
    assert torch_layer(attention) is None
    same, _, _ = _llama_attention(kv=4)
    assert torch_layer(same) == ("attention", {"heads": 4, "rotary": "half"})  # no kv_heads where it equals heads


@pytest.mark.slow
def test_a_llama_whose_export_tiles_the_key_value_heads_is_named_with_kv_heads_tiled(tmp_path):
    diagnosis = failing_export(
        tmp_path, "gqa", ["--torch", f"{MODERN}:make_llama_gqa_tiled_export", "--input", "x=2x8x32"]
    )[0]
    assert diagnosis["first_divergent_path"] == ["layers.1", "layers.1.self_attn"], diagnosis["tree"]
    test = diagnosis["cause_test"]
    assert test["kind"] == "attention" and test["attrs"] == {
        "heads": 4,
        "kv_heads": 2,
        "rotary": "half",
        "causal": True,
    }
    assert diagnosis["cause"]["variant"] == "kv_heads_tiled", test
    assert diagnosis["cause"]["after"]["tol_units"] <= 1.0


@pytest.mark.slow
def test_a_llama_with_grouped_query_attention_exported_as_it_is_names_no_cause(tmp_path):
    from click.testing import CliRunner

    from parity.cli import cli

    def invoke(*args):
        result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    invoke("init", "gqa", "--workspace", tmp_path, "--torch", f"{MODERN}:make_llama_gqa", "--input", "x=2x8x32")
    invoke("golden", "build", "--workspace", tmp_path, "--model", "gqa")
    out = invoke("diagnose", "--workspace", tmp_path, "--model", "gqa", "--path", "torch/onnx/ort", "--json", "-")
    (result,) = json.loads(out[out.index("{") :])["results"]
    assert result["verdict"] == "pass"
    diagnosis = result["diagnosis"]
    assert diagnosis["first_divergent_tap"] is None and diagnosis["cause"] is None, diagnosis
    assert not (diagnosis.get("tree") or {}).get("first_divergent_path"), diagnosis.get("tree")
