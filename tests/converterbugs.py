"""Users' models on which today's exporters and runtimes really diverge (no edited graphs): each factory builds a
small torch model with seeded random weights whose ONNX path fails for a reason of the converter or the runtime.

Frameworks are imported inside the factories: this file is imported by worker processes by path.
"""

from __future__ import annotations


def _modules():
    import torch
    from torch import nn

    class Scale(nn.Module):
        """Multiplies each feature by ``factor`` (a buffer, not a scalar: no optimiser folds it into a product)."""

        def __init__(self, factor: float, features: int):
            super().__init__()
            self.register_buffer("factor", torch.full((features,), factor))

        def forward(self, x):
            return x * self.factor

    class Scores(nn.Module):
        """Attention-style scores, each side scaled before the product so that the product stays in range."""

        def forward(self, x):
            return torch.matmul(x * 1e-20, x.transpose(-1, -2) * 1e-20)

    class Normalise(nn.Module):
        """Softmax over the tokens (dim 1) of (batch, tokens, features)."""

        def forward(self, x):
            return torch.softmax(x.reshape(x.shape[0], 4, 6), dim=1).reshape(x.shape[0], 24)

    return nn, Scale, Scores, Normalise


def _seeded(module):
    import torch

    torch.manual_seed(0)
    return module


def make_prescaled_scores():
    """ONNX Runtime's MatMulScaleFusion folds both 1e-20 scales into the MatMul's alpha: the product of the
    unscaled inputs overflows float32 (inf), where the graph as written stays in range."""
    nn, Scale, Scores, _ = _modules()
    _seeded(None)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 16)
            self.gain = Scale(1e20, 16)
            self.scores = Scores()
            self.flat = nn.Flatten()
            self.head = nn.Linear(25, 3)

        def forward(self, x):
            return self.head(self.flat(self.scores(self.gain(self.proj(x)))))

    return Net().eval()


def make_logsigmoid():
    """torch.onnx exports LogSigmoid as Log(Sigmoid(x)): in float32 Sigmoid underflows to 0 below about -104 and
    the Log of it is -inf, where torch's log-sigmoid is finite."""
    nn, Scale, _, _ = _modules()
    _seeded(None)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)
            self.gain = Scale(200.0, 8)
            self.act = nn.LogSigmoid()
            self.head = nn.Linear(8, 3)

        def forward(self, x):
            return self.head(self.act(self.gain(self.proj(x))))

    return Net().eval()


def make_softmax_tokens():
    """Softmax over dim 1 of a 3-D tensor: below opset 13 the ONNX Softmax with axis=1 normalises over axes 1 and
    2 together (ONNX Runtime follows that); onnx.reference, like torch, over axis 1 alone."""
    nn, _, _, Normalise = _modules()
    _seeded(None)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 24)
            self.norm = Normalise()
            self.head = nn.Linear(24, 3)

        def forward(self, x):
            return self.head(self.norm(self.proj(x)))

    return Net().eval()


def make_pool_divisor():
    """AvgPool2d with divisor_override=2: torch.onnx's AveragePool has no divisor, so every window is divided by
    its size (9) instead of 2."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.pool = nn.AvgPool2d(3, stride=1, padding=1, divisor_override=2)
            self.flat = nn.Flatten()
            self.head = nn.Linear(4 * 6 * 6, 3)

        def forward(self, x):
            return self.head(self.flat(self.pool(self.conv(x))))

    return Net().eval()


def softmax_tokens_onnx(path: str) -> None:
    """Write an opset-18 ONNX file of a (batch, 4, 6) -> (batch, 4, 6) Softmax over dim 1 (tokens);
    ``onnx.version_converter`` takes it to opset 11, where Softmax(axis=1) normalises over axes 1 and 2 together."""
    import torch
    from torch import nn

    class Net(nn.Module):
        def forward(self, x):
            return torch.softmax(x, dim=1)

    program = torch.onnx.export(Net().eval(), (torch.randn(2, 4, 6),), dynamo=True, opset_version=18, verbose=False)
    program.save(path)


def make_conv_scale():
    """A per-channel scale after a convolution, subnormal in float32 (1e-42), between two large ones: ONNX
    Runtime's ConvMulFusion folds it into the convolution's weights, where the products are subnormal and lose
    their digits. Marking the convolution's output as a graph output stops the fusion, so the failure vanishes
    when that tap is read."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Scale(nn.Module):
        def __init__(self, factor: float, channels: int):
            super().__init__()
            self.register_buffer("factor", torch.full((channels, 1, 1), factor))

        def forward(self, x):
            return x * self.factor

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.pre = Scale(1e32, 3)
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.post = Scale(1e-42, 4)
            self.act = nn.ReLU()
            self.out = Scale(1e10, 4)
            with torch.no_grad():  # positive weights: no cancellation in the float32 sums at this scale
                self.conv.weight.abs_()

        def forward(self, x):
            return self.out(self.act(self.post(self.conv(self.pre(x)))))

    return Net().eval()


def make_fp16_clipped_weights():
    """Weights up to 3.5e4: onnxconverter-common clips every weight beyond its max_finite_val (1e4 by default) to
    1e4 when it converts the graph to float16, so the float16 path computes another model."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 16)
            self.norm = nn.LayerNorm(16)
            self.act = nn.GELU()
            self.head = nn.Linear(16, 3)
            with torch.no_grad():
                self.proj.weight.mul_(1e5)

        def forward(self, x):
            return self.head(self.act(self.norm(self.proj(x))))

    return Net().eval()


def make_fp16_offsets():
    """Adds 1000.3, then takes 1000 away: in float16 the constant 1000.3 is 1000.5 (its resolution there is 0.5), so
    the float16 path is off by 0.2 where float32 is exact to 1e-4; the first Add must stay in float32."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Offset(nn.Module):
        def __init__(self, amount: float):
            super().__init__()
            self.amount = amount

        def forward(self, x):
            return x + self.amount

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 16)
            self.shift = Offset(1000.3)
            self.unshift = Offset(-1000.0)
            self.head = nn.Linear(16, 3)

        def forward(self, x):
            return self.head(self.unshift(self.shift(self.proj(x))))

    return Net().eval()


def make_typed_net():
    """One of each kind `parity init` types, in a chain (each reads the previous): grouped and depthwise
    convolutions, BatchNorm, activations, max and average pooling (with a divisor), a bilinear resize at a
    non-integer scale, flatten, dropout, dense, LayerNorm, GELU."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 8, 3, padding=1, groups=2)
            self.depthwise = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
            self.bn = nn.BatchNorm2d(8)
            self.relu = nn.ReLU()
            self.maxpool = nn.MaxPool2d(2, ceil_mode=True)
            self.avgpool = nn.AvgPool2d(3, stride=1, padding=1, divisor_override=4)
            self.up = nn.Upsample(scale_factor=1.5, mode="bilinear")
            self.flat = nn.Flatten()
            self.drop = nn.Dropout(0.1)
            self.dense = nn.Linear(8 * 3 * 3, 16)
            self.norm = nn.LayerNorm(16)
            self.act = nn.GELU(approximate="tanh")
            self.leaky = nn.LeakyReLU(0.1)
            self.head = nn.Linear(16, 3)
            with torch.no_grad():
                self.bn.running_mean.uniform_(-0.5, 0.5)
                self.bn.running_var.uniform_(0.5, 2.0)

        def forward(self, x):
            h = self.up(self.avgpool(self.maxpool(self.relu(self.bn(self.depthwise(self.conv(x)))))))
            return self.head(self.leaky(self.act(self.norm(self.dense(self.drop(self.flat(h)))))))

    return Net().eval()
