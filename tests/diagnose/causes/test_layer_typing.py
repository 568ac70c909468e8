"""`parity init` types the layers of a user's torch or Keras model, and each typed layer's NumPy declared form, with
the weights as golden build names them, computes what the real layer computes (float64, random weights): users'
models get cause tests without editing."""

from __future__ import annotations

import textwrap

import numpy as np
from click.testing import CliRunner

from parity.cli import cli
from parity.model.workspace import Workspace
from tests.conftest import REPO

BUGS = REPO / "tests" / "converterbugs.py"

TORCH_MODEL = textwrap.dedent('''
    import torch
    from torch import nn


    class ToLength(nn.Module):
        def forward(self, x):
            return x.flatten(2)


    class Swap(nn.Module):
        def forward(self, x):
            return x.transpose(1, 2)


    class Net(nn.Module):
        """Images, then a sequence: every kind init types, each reading the previous tap."""

        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 8, 3, padding=1, groups=2)
            self.depthwise = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
            self.bn = nn.BatchNorm2d(8)
            self.relu = nn.ReLU()
            self.maxpool = nn.MaxPool2d(2, ceil_mode=True)
            self.avgpool = nn.AvgPool2d(3, stride=1, padding=1, divisor_override=4)
            self.up = nn.Upsample(scale_factor=1.5, mode="bilinear")
            self.near = nn.Upsample(scale_factor=2, mode="nearest")
            self.to_length = ToLength()
            self.conv1d = nn.Conv1d(8, 8, 3, padding=1, groups=4)
            self.bn1d = nn.BatchNorm1d(8)
            self.pool1d = nn.MaxPool1d(2)
            self.avg1d = nn.AvgPool1d(3, stride=2, padding=1, count_include_pad=False)
            self.swap = Swap()
            self.gru = nn.GRU(8, 8, batch_first=True)
            self.lstm = nn.LSTM(8, 6, batch_first=True)
            self.attn = nn.MultiheadAttention(6, 2, batch_first=True)
            self.norm = nn.LayerNorm(6)
            self.gelu = nn.GELU(approximate="tanh")
            self.silu = nn.SiLU()
            self.sigmoid = nn.Sigmoid()
            self.tanh = nn.Tanh()
            self.leaky = nn.LeakyReLU(0.1)
            self.flat = nn.Flatten()
            self.drop = nn.Dropout(0.1)
            self.head = nn.Linear(54, 3)
            with torch.no_grad():
                for bn in (self.bn, self.bn1d):
                    bn.running_mean.uniform_(-0.5, 0.5)
                    bn.running_var.uniform_(0.5, 2.0)

        def forward(self, x):
            h = self.near(self.up(self.avgpool(self.maxpool(self.relu(self.bn(self.depthwise(self.conv(x))))))))
            h = self.swap(self.avg1d(self.pool1d(self.bn1d(self.conv1d(self.to_length(h))))))
            h, _ = self.gru(h)
            h, _ = self.lstm(h)
            h = self.attn(h, h, h, need_weights=False)[0]
            h = self.leaky(self.tanh(self.sigmoid(self.silu(self.gelu(self.norm(h))))))
            return self.head(self.drop(self.flat(h)))


    def make():
        torch.manual_seed(0)
        return Net().eval()
''')

TORCH_KINDS = {
    "conv": "conv",
    "depthwise": "conv",
    "bn": "batch_norm",
    "relu": "activation",
    "maxpool": "pool",
    "avgpool": "pool",
    "up": "resize",
    "near": "resize",
    "conv1d": "conv",
    "bn1d": "batch_norm",
    "pool1d": "pool",
    "avg1d": "pool",
    "gru": "recurrent",
    "lstm": "recurrent",
    "attn": "attention",
    "norm": "layer_norm",
    "gelu": "activation",
    "silu": "activation",
    "sigmoid": "activation",
    "tanh": "activation",
    "leaky": "activation",
    "flat": "flatten",
    "drop": "dropout",
    "head": "dense",
}


def _init(tmp_path, name, *source):
    result = CliRunner().invoke(cli, ["init", name, "--workspace", str(tmp_path), *source], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return Workspace(tmp_path).load_spec(name, attach_golden=False), (tmp_path / "models" / f"{name}.py").read_text()


def _check_declared(spec, weights, seen, float32=()):
    """Each typed tap's declared form, recomputed from the input the real layer saw, equals its real output (to
    float64 round-off; to float32's for the taps in ``float32``, which the framework computes in float32)."""
    from parity.diagnose.causes.cause import recompute

    for tap, layer in spec.layers.items():
        fed, output = seen[tap]
        computed = recompute(layer, [fed], weights, prefix=layer.params or tap)
        assert computed.shape == output.shape, tap
        scale = max(1.0, np.max(np.abs(output)))
        assert np.max(np.abs(computed - output)) <= (1e-6 if tap in float32 else 1e-10) * scale, tap


def _torch_seen(net, x):
    import torch

    seen = {}

    def keep(name):
        def hook(module, args, output):  # returns None: the output is left as it is
            seen[name] = (args[0].numpy(), (output[0] if isinstance(output, tuple) else output).numpy())

        return hook

    hooks = [m.register_forward_hook(keep(n)) for n, m in net.named_children()]
    with torch.no_grad():
        net(x)
    for hook in hooks:
        hook.remove()
    return seen


def test_init_types_every_torch_kind_and_the_declared_forms_reproduce_torch(tmp_path):
    import importlib.util

    import torch

    (tmp_path / "mynet.py").write_text(TORCH_MODEL)
    spec, text = _init(tmp_path, "seq", "--torch", f"{tmp_path / 'mynet.py'}:make", "--input", "x=2x4x8x8")
    assert {tap: layer.kind for tap, layer in spec.layers.items()} == TORCH_KINDS  # ToLength and Swap: untyped
    assert spec.layers["attn"].attrs == {"heads": 2} and spec.layers["gru"].attrs["linear_before_reset"] is True
    assert (
        spec.layers["avgpool"].attrs["divisor_override"] == 4
        and spec.layers["avg1d"].attrs["count_include_pad"] is False
    )
    assert spec.layers["gelu"].attrs == {"form": "gelu_tanh"} and spec.layers["leaky"].attrs["alpha"] == 0.1
    assert {tap for tap, layer in spec.layers.items() if layer.params} == {
        "conv",
        "depthwise",
        "bn",
        "conv1d",
        "bn1d",
        "gru",
        "lstm",
        "attn",
        "norm",
        "head",
    }
    assert all(layer.params in (None, tap) for tap, layer in spec.layers.items())
    # the generated spec stays readable: one line per typed tap
    assert '        "gru": Layer("recurrent", {"cell": "gru", "linear_before_reset": True}, params="gru"),' in text
    assert sum(line.lstrip().startswith('"') and "Layer(" in line for line in text.splitlines()) == len(TORCH_KINDS)

    loader = importlib.util.spec_from_file_location("mynet", tmp_path / "mynet.py")
    source = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(source)
    net = source.make().double()
    weights = {k: v.numpy() for k, v in net.state_dict().items()}  # named as golden build stores a torch model's
    _check_declared(spec, weights, _torch_seen(net, torch.randn(2, 4, 8, 8, dtype=torch.float64)))


def test_init_types_the_older_image_net_too(tmp_path):
    """The converter-bug corpus' typed net (a bilinear resize at 1.5, LayerNorm, GELU) keeps its typing."""
    import torch

    from tests.converterbugs import make_typed_net

    spec, _ = _init(tmp_path, "typed", "--torch", f"{BUGS}:make_typed_net", "--input", "x=2x4x8x8")
    assert set(spec.layers) == {n for n, _ in make_typed_net().named_children()}
    net = make_typed_net().double()
    weights = {k: v.numpy() for k, v in net.state_dict().items()}
    _check_declared(spec, weights, _torch_seen(net, torch.randn(2, 4, 8, 8, dtype=torch.float64)))


def _keras_model(path):
    import keras

    L = keras.layers
    keras.utils.set_random_seed(0)
    x = inp = keras.Input((8, 8, 4), name="x")
    x = L.Conv2D(6, 3, padding="same", activation="relu", name="conv")(x)
    x = L.DepthwiseConv2D(3, strides=2, padding="same", depth_multiplier=2, name="depthwise")(x)
    x = L.BatchNormalization(name="bn")(x)
    x = L.ReLU(name="relu")(x)
    x = L.MaxPooling2D(2, name="maxpool")(x)
    x = L.AveragePooling2D(3, strides=1, padding="same", name="avgpool")(x)
    x = L.UpSampling2D(2, interpolation="bilinear", name="up")(x)
    x = L.Resizing(6, 5, interpolation="nearest", name="resize")(x)
    x = L.Flatten(name="flat")(x)
    x = L.Reshape((30, 12), name="to_sequence")(x)
    x = L.Conv1D(8, 3, padding="same", name="conv1d")(x)
    x = L.MaxPooling1D(2, name="pool1d")(x)
    x = L.GRU(8, return_sequences=True, name="gru")(x)
    x = L.LSTM(6, return_sequences=True, name="lstm")(x)
    x = L.MultiHeadAttention(2, 3, name="attn")(x, x)
    x = L.LayerNormalization(name="norm")(x)
    x = L.Activation("gelu", name="gelu")(x)
    x = L.GRU(5, reset_after=False, return_sequences=True, name="gru_v1")(x)
    x = L.LSTM(4, name="last")(x)
    x = L.Dropout(0.1, name="drop")(x)
    x = L.Dense(8, activation="swish", name="dense")(x)
    out = L.Dense(3, name="head")(x)
    model = keras.Model(inp, out)
    bn = model.get_layer("bn")
    rng = np.random.default_rng(0)
    bn.set_weights(
        [
            w if i < 2 else (rng.uniform(-0.5, 0.5, w.shape) if i == 2 else rng.uniform(0.5, 2.0, w.shape))
            for i, w in enumerate(bn.get_weights())
        ]
    )
    model.save(path)


def test_init_types_every_keras_kind_and_the_declared_forms_reproduce_keras(tmp_path):
    import keras

    from parity.model.user import keras_file

    _keras_model(tmp_path / "net.keras")
    spec, text = _init(tmp_path, "knet", "--keras", str(tmp_path / "net.keras"), "--input", "x=2x8x8x4")
    assert {tap: layer.kind for tap, layer in spec.layers.items()} == {
        "conv": "conv",
        "depthwise": "conv",
        "bn": "batch_norm",
        "relu": "activation",
        "maxpool": "pool",
        "avgpool": "pool",
        "up": "resize",
        "resize": "resize",
        "flat": "flatten",
        "conv1d": "conv",
        "pool1d": "pool",
        "gru": "recurrent",
        "lstm": "recurrent",
        "attn": "attention",
        "norm": "layer_norm",
        "gelu": "activation",
        "gru_v1": "recurrent",
        "last": "recurrent",
        "drop": "dropout",
        "dense": "dense",
        "head": "dense",
    }
    assert spec.layers["conv"].attrs["activation"] == "relu" and spec.layers["dense"].attrs["activation"] == "silu"
    assert spec.layers["depthwise"].attrs["groups"] == 6 and spec.layers["bn"].attrs["eps"] == 1e-3
    assert (
        spec.layers["gru_v1"].attrs["linear_before_reset"] is False and spec.layers["last"].attrs["sequences"] is False
    )
    assert '"flat": Layer("flatten", {"order": "nhwc", "layout": "nhwc"}),' in text

    model = keras_file("net.keras", tmp_path)("float64")
    weights = {v.path: np.asarray(v) for v in model.weights}  # named as golden build stores a Keras model's
    taps = [layer for layer in model.layers if layer.name in spec.layers]
    probe = keras.Model(model.inputs, [(layer.input, layer.output) for layer in taps])
    x = np.random.default_rng(1).standard_normal((2, 8, 8, 4))
    values = probe([x])
    seen = {}
    for layer, (fed, output) in zip(taps, values):
        fed = fed[0] if isinstance(fed, (list, tuple)) else fed
        seen[layer.name] = (np.asarray(fed, np.float64), np.asarray(output, np.float64))
    # tf.image.resize's bilinear runs in float32; TF's gelu is 0.5 x erfc(-x/sqrt 2), its float64 erfc good to ~1e-9
    _check_declared(spec, weights, seen, float32={"up", "gelu"})
