"""The NumPy layer library of the drift diagnosis, on the built-in models' real golden data.

Declared forms must reproduce every golden tap; every variant must be distinguishable from the
declared form (or not apply); ``test_layer`` must name an injected cause and nothing else.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pytest

from parity.diagnose.causes import cause
from parity.diagnose.causes.layers import KINDS, NotApplicable, get
from parity.model.spec import LAYER_KINDS, Layer, Tolerance
from parity.model.workspace import Workspace

REPO = Path(__file__).resolve().parents[3]
MODELS = ("mlp", "cnn", "transformer")
TOL = Tolerance(atol=1e-5, rtol=1e-5)
# Epsilon variants below the declared 1e-5 (and eps outside the sqrt) change a normalisation by
# about |x_hat| * delta_eps / (2 var): on activations of variance ~1 that is under 1e-5, so at some
# taps they cannot be told apart. There they must be marked distinct=False (never named a cause),
# and each must still be distinguishable at some tap of the same kind.
SUBTOLERANCE = {"eps=1e-6", "eps=1e-12", "eps=0", "eps_outside_sqrt"}


@functools.cache
def model(name):
    """(spec, canonical float64 weights, activations by tap name plus "input")."""
    spec = Workspace(REPO).load_spec(name)
    golden = REPO / "golden" / name
    with np.load(golden / "weights.npz", allow_pickle=False) as data:
        weights = {k: data[k].astype(np.float64) for k in data.files}
    with np.load(golden / "inputs.npz", allow_pickle=False) as data:
        acts = {"input": data["x"].astype(np.float64)}
    with np.load(golden / "reference.npz", allow_pickle=False) as data:
        acts.update({k[len("tap/") :]: data[k] for k in data.files if k.startswith("tap/")})
    return spec, weights, acts


def cases():
    for name in MODELS:
        spec = Workspace(REPO).load_spec(name)
        for tap in spec.layers:
            yield pytest.param(name, tap, id=f"{name}.{tap}")


def layer_case(name, tap):
    """(layer, inputs, the layer's own weights, golden output, prefix)."""
    spec, weights, acts = model(name)
    layer = spec.layers[tap]
    prefix = layer.params or tap
    return layer, [acts[i] for i in spec.layer_inputs(tap)], cause.layer_weights(weights, prefix), acts[tap], prefix


def fp32(value):
    return np.asarray(value, np.float32).astype(np.float64)


def dropout_observed(x, rate, seed=0):
    """Inverted dropout with a seeded mask, as a path that left dropout active would compute."""
    keep = np.random.default_rng(seed).random(x.shape) >= rate
    return fp32(np.where(keep, x / (1.0 - rate), 0.0))


def variant(kind, attrs, name):
    found = {v.name: v for v in get(kind).variants(attrs)}
    return found[name]


def test_registry_covers_every_spec_kind():
    assert set(KINDS) == set(LAYER_KINDS)
    for kind, module in KINDS.items():
        assert module.KIND == kind and module.__doc__ and callable(module.forward) and callable(module.variants)
    with pytest.raises(KeyError):
        get("conv3d")


@pytest.mark.parametrize("name,tap", list(cases()))
def test_declared_form_reproduces_golden_tap(name, tap):
    layer, inputs, weights, golden, _ = layer_case(name, tap)
    out = get(layer.kind).forward(inputs, weights, dict(layer.attrs))
    assert out.shape == golden.shape
    assert np.max(np.abs(out - golden)) <= 1e-9


@pytest.mark.parametrize("name,tap", list(cases()))
def test_every_variant_differs_from_declared(name, tap):
    layer, inputs, weights, golden, prefix = layer_case(name, tap)
    module = get(layer.kind)
    attrs = dict(layer.attrs)
    declared = module.forward(inputs, weights, attrs)
    observed = dropout_observed(inputs[0], attrs["rate"]) if layer.kind == "dropout" else golden
    report = {
        v["name"]: v for v in cause.test_layer(layer, inputs, model(name)[1], golden, TOL, prefix=prefix)["variants"]
    }
    for v in module.variants(attrs):
        try:
            out = v.compute(inputs, weights, attrs, observed)
        except NotApplicable:
            assert math.isinf(report[v.name]["tol_units"]) and not report[v.name]["reproduces"]
            continue
        if out.shape != declared.shape:  # cannot apply here: a shape mismatch, reported as inf
            assert math.isinf(report[v.name]["tol_units"])
            continue
        units = np.max(np.abs(out - declared) / (TOL.atol + TOL.rtol * np.abs(declared)))
        if v.name in SUBTOLERANCE and units <= 1.0:
            assert report[v.name]["distinct"] is False
        else:
            assert units > 1.0, f"{v.name} cannot be told apart from the declared form ({units:.3g} tol units)"


def test_subtolerance_epsilon_variants_are_distinguishable_somewhere():
    for name, tap in [("transformer", "block0_norm1"), ("cnn", "bn1")]:
        layer, inputs, weights, _, _ = layer_case(name, tap)
        declared = get(layer.kind).forward(inputs, weights, dict(layer.attrs))
        for v in get(layer.kind).variants(dict(layer.attrs)):
            try:  # a variant fitted to an observed activation has nothing to fit here
                out = v.compute(inputs, weights, dict(layer.attrs), None)
            except NotApplicable:
                continue
            assert np.max(np.abs(out - declared) / (TOL.atol + TOL.rtol * np.abs(declared))) > 1.0, (tap, v.name)


INJECTED = [
    ("transformer", "block0_norm1", "eps=1e-3"),
    ("transformer", "block0_gelu", "gelu_tanh"),
    ("cnn", "conv2", "same_top_left"),
    ("cnn", "bn1", "batch_statistics"),
    ("cnn", "flatten", "flatten_nhwc"),
    ("cnn", "dropout", "dropout_active"),
]


@pytest.mark.parametrize("name,tap,expected", INJECTED, ids=[f"{n}.{t}:{v}" for n, t, v in INJECTED])
def test_test_layer_names_the_injected_cause(name, tap, expected):
    layer, inputs, weights, _, prefix = layer_case(name, tap)
    attrs = dict(layer.attrs)
    if expected == "dropout_active":
        observed = dropout_observed(inputs[0], attrs["rate"], seed=1)
    else:
        observed = fp32(variant(layer.kind, attrs, expected).compute(inputs, weights, attrs, None))
    result = cause.test_layer(layer, inputs, model(name)[1], observed, TOL, prefix=prefix)
    found = result["cause"]
    assert found is not None, result["explanation"]
    assert found["variant"] == expected
    assert found["before"]["tol_units"] > 1.0 >= found["after"]["tol_units"]
    assert found["before"] == result["declared"]
    assert expected in result["explanation"] or found["description"] in result["explanation"]


@pytest.mark.parametrize("name,tap", [(n, t) for n, t, _ in INJECTED])
def test_declared_form_in_fp32_names_no_cause(name, tap):
    layer, inputs, weights, _, prefix = layer_case(name, tap)
    observed = fp32(get(layer.kind).forward(inputs, weights, dict(layer.attrs)))
    result = cause.test_layer(layer, inputs, model(name)[1], observed, TOL, prefix=prefix)
    assert result["cause"] is None
    assert result["declared"]["tol_units"] <= 1.0
    assert "computes what the spec declares" in result["explanation"]


@pytest.mark.parametrize("name,tap", [(n, t) for n, t, _ in INJECTED])
def test_noise_names_no_cause(name, tap):
    layer, inputs, _, golden, prefix = layer_case(name, tap)
    noise = np.random.default_rng(0).standard_normal(golden.shape)
    result = cause.test_layer(layer, inputs, model(name)[1], noise, TOL, prefix=prefix)
    assert result["cause"] is None
    assert result["explanation"].startswith("no known")
    assert not any(v["reproduces"] for v in result["variants"])


def test_nonfinite_observed_names_no_cause():
    layer, inputs, weights, _, prefix = layer_case("transformer", "block0_gelu")
    observed = fp32(
        variant("activation", dict(layer.attrs), "gelu_tanh").compute(inputs, weights, dict(layer.attrs), None)
    )
    observed[0, 0, 0] = np.nan
    result = cause.test_layer(layer, inputs, model("transformer")[1], observed, TOL, prefix=prefix)
    assert result["cause"] is None and "non-finite" in result["explanation"]


def test_failing_variant_is_reported_not_raised():
    layer = Layer("conv", {"stride": 2, "padding": "same"})
    x = np.ones((1, 2, 4, 4))
    weights = {"k/kernel": np.ones((3, 2, 3, 5)), "k/bias": np.zeros(3)}  # non-square: hw swap cannot apply
    out = get("conv").forward([x], cause.layer_weights(weights, "k"), dict(layer.attrs))
    result = cause.test_layer(layer, [x], weights, out, TOL, prefix="k")
    swapped = next(v for v in result["variants"] if v["name"] == "kernel_hw_swapped")
    assert math.isinf(swapped["tol_units"]) and not swapped["reproduces"] and "square" in swapped["error"]
    assert result["cause"] is None


def test_conv_same_split_matches_explicit_padding():
    """TF 'same' at stride 2 on 4x4 pads bottom/right; PyTorch padding=1 equals the top-left split."""
    rng = np.random.default_rng(0)
    x, kernel = rng.standard_normal((2, 3, 4, 4)), rng.standard_normal((5, 3, 3, 3))
    conv = get("conv")
    same = conv.forward([x], {"kernel": kernel}, {"stride": 2, "padding": "same"})
    assert np.allclose(same, conv.forward([x], {"kernel": kernel}, {"stride": 2, "padding": [[0, 1], [0, 1]]}))
    top_left = variant("conv", {"stride": 2, "padding": "same"}, "same_top_left").compute(
        [x], {"kernel": kernel}, {"stride": 2, "padding": "same"}, None
    )
    assert np.allclose(top_left, conv.forward([x], {"kernel": kernel}, {"stride": 2, "padding": 1}))
    # one output element by hand: cross-correlation, no flip
    assert np.isclose(same[1, 4, 0, 0], np.sum(x[1, :, 0:3, 0:3] * kernel[4]))


def test_pool_padding_counts_and_ceil_mode():
    x = np.arange(1.0, 10.0).reshape(1, 1, 3, 3)
    pool = get("pool")
    attrs = {"mode": "avg", "size": 2, "stride": 2, "padding": [[1, 0], [1, 0]]}
    assert pool.forward([x], {}, attrs)[0, 0, 0, 0] == 1.0  # only the real element counts
    assert variant("pool", attrs, "count_include_pad").compute([x], {}, attrs, None)[0, 0, 0, 0] == 0.25
    valid = {"mode": "max", "size": 2}
    assert pool.forward([x], {}, valid).shape == (1, 1, 1, 1)
    ceil = variant("pool", valid, "ceil_mode").compute([x], {}, valid, None)
    assert ceil.shape == (1, 1, 2, 2) and ceil[0, 0, 1, 1] == 9.0


def test_attention_causal_mask():
    rng = np.random.default_rng(0)
    weights = {f"{p}/kernel": rng.standard_normal((4, 4)) for p in ("query", "key", "value", "out")}
    x = rng.standard_normal((1, 3, 4))
    attrs = {"heads": 2, "causal": True}
    out = get("attention").forward([x], weights, attrs)
    # with a causal mask the first token only sees itself: changing later tokens leaves it alone
    x2 = x.copy()
    x2[0, 1:] += 1.0
    assert np.allclose(out[0, 0], get("attention").forward([x2], weights, attrs)[0, 0])
    assert [v.name for v in get("attention").variants(attrs)][-1] == "non_causal"


def test_generic_variants_find_a_dropout_inside_a_layer_typed_otherwise_and_float16_rounding():
    import numpy as np

    from parity.diagnose.causes.cause import test_layer
    from parity.model.spec import Layer, Tolerance

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 32))
    layer = Layer("activation", {"form": "gelu_erf"})
    from parity.diagnose.causes.layers import get

    declared = get("activation").forward([x], {}, {"form": "gelu_erf"})
    mask = rng.random(declared.shape) < 0.2
    dropped = np.where(mask, 0.0, declared / 0.8)  # a dropout (rate 0.2) left on inside the activation
    result = test_layer(layer, [x], {}, dropped, Tolerance(1e-6, 1e-6))
    assert result["cause"]["variant"] == "dropout_active_inside"
    x16 = x.astype(np.float16).astype(np.float64)  # the layer ran in float16 on float16 inputs
    rounded = get("activation").forward([x16], {}, {"form": "gelu_erf"}).astype(np.float16).astype(np.float64)
    result = test_layer(layer, [x16], {}, rounded, Tolerance(1e-6, 1e-6))
    assert result["cause"]["variant"] == "float16_rounding"


def test_resize_matches_torch_and_names_a_lost_align_corners():
    import numpy as np
    import torch

    from parity.diagnose.causes.cause import test_layer
    from parity.diagnose.causes.layers import get
    from parity.model.layer_types import torch_layer
    from parity.model.spec import Layer, Tolerance

    x = np.random.default_rng(0).standard_normal((2, 3, 5, 7))
    for options in (
        {"scale_factor": 1.5, "mode": "nearest"},
        {"size": (4, 11), "mode": "nearest"},
        {"scale_factor": 1.7, "mode": "bilinear"},
        {"scale_factor": 2, "mode": "bilinear", "align_corners": True},
    ):
        module = torch.nn.Upsample(**options)
        kind, attrs = torch_layer(module)
        assert np.allclose(get(kind).forward([x], {}, attrs), module(torch.from_numpy(x)).numpy(), atol=1e-12)
    # the model declares half-pixel bilinear; what ran resized with align_corners
    _, declared = torch_layer(torch.nn.Upsample(scale_factor=2, mode="bilinear"))
    observed = torch.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)(torch.from_numpy(x)).numpy()
    result = test_layer(Layer("resize", declared), [x], {}, observed, Tolerance(1e-6, 1e-6))
    assert result["cause"]["variant"] == "coordinates_align_corners"


def test_recurrent_matches_torch_lstm_and_gru_and_names_a_gate_order_mix_up():
    import numpy as np
    import torch

    from parity.diagnose.causes.cause import layer_weights, test_layer
    from parity.diagnose.causes.layers import get
    from parity.model.spec import Layer, Tolerance

    torch.manual_seed(0)
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    for cell, module in (
        ("lstm", torch.nn.LSTM(4, 3, batch_first=True)),
        ("gru", torch.nn.GRU(4, 3, batch_first=True)),
    ):
        module = module.double()
        weights = layer_weights(
            {f"rnn.{k}": v.detach().numpy() for k, v in module.state_dict().items()}, "rnn", "recurrent"
        )
        expected = module(x)[0].detach().numpy()
        assert np.allclose(get("recurrent").forward([x.numpy()], weights, {"cell": cell}), expected, atol=1e-12)
        # a runtime that read the gate blocks in ONNX's order
        from parity.diagnose.causes.layers.recurrent import _onnx_order

        observed = _onnx_order([x.numpy()], weights, {"cell": cell}, None)
        result = test_layer(
            Layer("recurrent", {"cell": cell}, params="rnn"),
            [x.numpy()],
            {f"rnn.{k}": v.detach().numpy() for k, v in module.state_dict().items()},
            observed,
            Tolerance(1e-6, 1e-6),
        )
        assert result["cause"]["variant"] == "gates_onnx_order", (cell, result["explanation"])
