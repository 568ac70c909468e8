"""cnn: conv-BatchNorm-ReLU-avgpool, a stride-2 'same' conv-BatchNorm-ReLU, dropout and a dense classifier
on the 8x8 digits (NCHW, 10 classes).

``conv2`` has stride 2 and 'same' padding in the TF/XLA sense: on its 4x4 input the one row and
column of padding go to the bottom and right. PyTorch's ``padding=1`` would pad both sides and
shift the grid, so the torch definition pads explicitly (``SameConv2d``).

Flatten order is canonical NCHW (C, H, W): the Keras definition runs in NHWC, so it permutes
to NCHW before ``Flatten`` and the ``logits`` kernel keeps one layout in all three frameworks.
BatchNorm runs on its moving statistics (inference), epsilon 1e-5 everywhere; dropout (0.25) is
active only while the weights are trained.

Pooling is 2x2 *average*, not max: the digits' blank background gives exact ties inside max-pool
windows, where the input gradient is only a subgradient (torch and TF route it to the first
maximum, ``jnp.max`` splits it), so golden input gradients would depend on tie-breaking.
JAX pools by reshape + mean because jax2onnx 0.17 lowers a 4-D ``lax.reduce_window`` to an
ONNX pool over 4 spatial dims, which onnxruntime and the ONNX reference reject.
"""

from parity.model.spec import InputSpec, Layer, ModelSpec, ParamSpec, Tolerance, Tolerances, Training

CHANNELS = (8, 16)
CLASSES = 10
EPSILON = 1e-5
DROPOUT = 0.25
FLAT = CHANNELS[1] * 2 * 2  # 8x8 -> pool -> 4x4 -> stride-2 conv -> 2x2


def torch_module():
    from torch import nn
    from torch.nn import functional

    class SameConv2d(nn.Conv2d):
        """Stride-2 3x3 conv with TF/XLA 'same' padding on an even input: one row/column, bottom-right."""

        def forward(self, x):
            return super().forward(functional.pad(x, (0, 1, 0, 1)))

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, CHANNELS[0], 3, padding=1)
            self.bn1 = nn.BatchNorm2d(CHANNELS[0], eps=EPSILON)
            self.relu1 = nn.ReLU()
            self.pool1 = nn.AvgPool2d(2)
            self.conv2 = SameConv2d(CHANNELS[0], CHANNELS[1], 3, stride=2)
            self.bn2 = nn.BatchNorm2d(CHANNELS[1], eps=EPSILON)
            self.relu2 = nn.ReLU()
            self.flatten = nn.Flatten()
            self.dropout = nn.Dropout(DROPOUT)
            self.logits = nn.Linear(FLAT, CLASSES)

        def forward(self, x):
            h = self.pool1(self.relu1(self.bn1(self.conv1(x))))
            h = self.relu2(self.bn2(self.conv2(h)))
            return self.logits(self.dropout(self.flatten(h)))

    return CNN()


def keras_model(dtype):
    import keras
    from keras import layers

    def stage(h, i, channels, strides):
        h = layers.Conv2D(channels, 3, strides=strides, padding="same", name=f"conv{i}", dtype=dtype)(h)
        h = layers.BatchNormalization(epsilon=EPSILON, name=f"bn{i}", dtype=dtype)(h)
        return layers.ReLU(name=f"relu{i}", dtype=dtype)(h)

    x = keras.Input((8, 8, 1), dtype=dtype, name="x")  # NHWC
    h = layers.AveragePooling2D(2, name="pool1", dtype=dtype)(stage(x, 1, CHANNELS[0], 1))
    h = stage(h, 2, CHANNELS[1], 2)
    h = layers.Permute((3, 1, 2), name="to_nchw", dtype=dtype)(h)  # flatten in canonical (C, H, W) order
    h = layers.Flatten(name="flatten", dtype=dtype)(h)
    h = layers.Dropout(DROPOUT, name="dropout", dtype=dtype)(h)
    logits = layers.Dense(CLASSES, name="logits", dtype=dtype)(h)
    return keras.Model(x, logits, name="cnn")


def jax_apply(params, x, tap=None):
    import jax
    import jax.numpy as jnp

    tap = tap or (lambda name, value: None)

    def conv(name, h, stride):
        out = jax.lax.conv_general_dilated(h, params[f"{name}/kernel"], (stride, stride), "SAME",
                                           dimension_numbers=("NCHW", "OIHW", "NCHW"))
        out = out + params[f"{name}/bias"][None, :, None, None]
        tap(name, out)
        return out

    def batch_norm(name, h):
        p = {k: params[f"{name}/{k}"][None, :, None, None] for k in ("gamma", "beta", "moving_mean", "moving_variance")}
        out = (h - p["moving_mean"]) / jnp.sqrt(p["moving_variance"] + EPSILON) * p["gamma"] + p["beta"]
        tap(name, out)
        return out

    def stage(h, i, stride):
        h = jax.nn.relu(batch_norm(f"bn{i}", conv(f"conv{i}", h, stride)))
        tap(f"relu{i}", h)
        return h

    h = stage(x, 1, 1)
    n, c, hh, ww = h.shape  # 2x2 average pool (reshape + mean; see the module docstring)
    h = h.reshape(n, c, hh // 2, 2, ww // 2, 2).mean(axis=(3, 5))
    tap("pool1", h)
    h = stage(h, 2, 2).reshape(x.shape[0], -1)
    tap("flatten", h)
    tap("dropout", h)  # inference: the identity
    logits = h @ params["logits/kernel"] + params["logits/bias"]
    tap("logits", logits)
    return logits


def _stage_params(i, cin, cout):
    stats = {f"bn{i}/{k}": ParamSpec((cout,), "vector", trainable=False) for k in ("moving_mean", "moving_variance")}
    return {
        f"conv{i}/kernel": ParamSpec((cout, cin, 3, 3), "conv_kernel"),
        f"conv{i}/bias": ParamSpec((cout,), "vector"),
        f"bn{i}/gamma": ParamSpec((cout,), "vector"),
        f"bn{i}/beta": ParamSpec((cout,), "vector"),
        **stats,
    }


SPEC = ModelSpec(
    name="cnn",
    description="CNN conv3x3(8)-BN-ReLU-avgpool, conv3x3/2 same(16)-BN-ReLU, dropout, dense 64-10 on 8x8 digits (NCHW)",
    input=InputSpec("x", (1, 8, 8), layout="nchw"),
    outputs=("logits",),
    num_classes=CLASSES,
    params={
        **_stage_params(1, 1, CHANNELS[0]),
        **_stage_params(2, CHANNELS[0], CHANNELS[1]),
        "logits/kernel": ParamSpec((FLAT, CLASSES), "dense_kernel"),
        "logits/bias": ParamSpec((CLASSES,), "vector"),
    },
    taps=("conv1", "bn1", "relu1", "pool1", "conv2", "bn2", "relu2", "flatten", "dropout", "logits"),
    layers={
        "conv1": Layer("conv", {"stride": 1, "padding": "same"}),
        "bn1": Layer("batch_norm", {"eps": EPSILON}),
        "relu1": Layer("activation", {"form": "relu"}),
        "pool1": Layer("pool", {"mode": "avg", "size": 2}),
        "conv2": Layer("conv", {"stride": 2, "padding": "same"}),
        "bn2": Layer("batch_norm", {"eps": EPSILON}),
        "relu2": Layer("activation", {"form": "relu"}),
        "flatten": Layer("flatten", {"order": "nchw"}),
        "dropout": Layer("dropout", {"rate": DROPOUT}),
        "logits": Layer("dense"),
    },
    # fp16: two convolutions and a BatchNorm in float16 reach 0.96 of the dtype's default (16 eps = 0.0156) on
    # the jax path; declared at about twice the worst error measured across torch, tf and jax. Other
    # reduced precisions use the defaults derived from the dtype (parity.platform.precision).
    tolerances={"fp32": Tolerances(Tolerance(atol=1e-5, rtol=1e-5)), "fp16": Tolerances(Tolerance(atol=0.03, rtol=0.03))},
    grad_tolerances={"fp32": Tolerances(Tolerance(atol=1e-6, rtol=1e-4))},
    bench_batch_sizes=(1, 64),
    training=Training(epochs=20, lr=3e-3, batch_size=64, seed=0),
    expected_errors={"jax/tf/onnx/*": "jax2tf serialises through XlaCallModule, which tf2onnx cannot convert"},
    torch_module=torch_module,
    keras_model=keras_model,
    jax_apply=jax_apply,
)
