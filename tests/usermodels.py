"""Models as a user brings them: factories in an ordinary file, random weights, nothing from models/.

Frameworks are imported inside the factories: this file is imported by worker processes by path.
"""

from __future__ import annotations


def _net_class(export_offset: float = 0.0):
    import torch
    from torch import nn

    class Shift(nn.Module):
        """ReLU; under torch.onnx export it also adds ``export_offset``: an export that computes something else."""

        def forward(self, x):
            out = torch.relu(x)
            if export_offset and torch.onnx.is_in_onnx_export():
                out = out + export_offset
            return out

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.act = Shift()
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.flat = nn.Flatten()
            self.head = nn.Linear(8, 4)

        def forward(self, x):
            return self.head(self.flat(self.pool(self.act(self.bn(self.conv(x))))))

    return Net


def make_net():
    """A small CNN in eval mode with seeded random weights and BatchNorm statistics."""
    import torch

    torch.manual_seed(0)
    net = _net_class()()
    with torch.no_grad():
        net.bn.running_mean.uniform_(-0.5, 0.5)
        net.bn.running_var.uniform_(0.5, 2.0)
    return net.eval()


def make_broken_export_net():
    """The same network, whose ONNX export adds 0.05 after the ReLU (a deliberately broken export)."""
    import torch

    torch.manual_seed(0)
    return _net_class(export_offset=0.05)().eval()


def make_float32_only_net():
    """A network that casts to float32 inside forward: it cannot run in float64."""
    import torch
    from torch import nn

    class Float32Only(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 3)

        def forward(self, x):
            return self.fc.float()(x.float())

    torch.manual_seed(0)
    return Float32Only().eval()


def make_failing_factory():
    raise RuntimeError("checkpoint weights.pt not found")


def make_keras_model():
    """A small functional Keras CNN (NHWC) with random weights."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 3), name="image")
    h = layers.Conv2D(4, 3, padding="same", name="conv")(x)
    h = layers.BatchNormalization(name="bn")(h)
    h = layers.ReLU(name="relu")(h)
    h = layers.GlobalAveragePooling2D(name="pool")(h)
    return keras.Model(x, layers.Dense(3, name="head")(h), name="user_keras")


def make_resnet18(num_classes: int = 10):
    """ResNet-18 (BasicBlock, [2, 2, 2, 2], 11.2 M parameters), written out so nothing is downloaded."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                if stride != 1 or cin != cout
                else nn.Identity()
            )

        def forward(self, x):
            out = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(out)) + self.down(x))

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU()
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            widths = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
            for i, (cin, cout, stride) in enumerate(widths, 1):
                setattr(self, f"layer{i}", nn.Sequential(Block(cin, cout, stride), Block(cout, cout, 1)))
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.flatten = nn.Flatten()
            self.fc = nn.Linear(512, num_classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.flatten(self.avgpool(x)))

    torch.manual_seed(0)
    model = ResNet18()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
    return model.eval()


def jax_apply(params, x, tap=None):
    """A two-layer JAX MLP as a user writes it: nested params, an optional tap callback."""
    import jax.numpy as jnp

    h = x @ params["dense1"]["kernel"] + params["dense1"]["bias"]
    if tap is not None:
        tap("dense1", h)
    h = jnp.tanh(h)
    return h @ params["out"]["kernel"] + params["out"]["bias"]


def save_jax_params(path):
    import numpy as np

    rng = np.random.default_rng(0)
    np.savez(
        path,
        **{
            "dense1/kernel": rng.standard_normal((5, 7)).astype(np.float32),
            "dense1/bias": rng.standard_normal(7).astype(np.float32),
            "out/kernel": rng.standard_normal((7, 3)).astype(np.float32),
            "out/bias": np.zeros(3, np.float32),
        },
    )


def make_offset_logits():
    """Four logits that sit on a large common offset (64) and differ by a few hundredths: bfloat16 keeps 8
    significant bits, so near 64 it rounds in steps of 0.5 and every logit lands on the same value. Outputs
    stay within a bf16 tolerance of the float64 ones while the ranking, and so the accuracy, is lost."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    head = nn.Linear(8, 4)
    with torch.no_grad():
        head.weight.mul_(0.05)
        head.bias.fill_(64.0)
    return head
