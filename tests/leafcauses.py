"""Users' nested torch models whose ONNX path diverges at one leaf layer, for a converter or runtime bug whose cause
the catalogue can test there (tests/diagnose/causes/test_leaf_causes.py).

Where the installed torch.onnx (dynamo exporter, torch 2.13, onnxscript 0.7.2) and ONNX Runtime (1.31) commit the
bug themselves, the model is left as a user writes it. Where they do not, the leaf is an instance of the torch class
it stands for (``isinstance`` holds, its weights and attributes are the class's) whose ``forward`` computes what the
real bug computes under ``torch.onnx.is_in_onnx_export()`` only, so every native run (golden build, the ``torch``
path, the reference side of the descent) is correct; each factory's docstring says which it is.

Frameworks are imported inside the factories: this file is imported by worker processes by path.
"""

from __future__ import annotations


def _seeded(seed: int = 0):
    import torch

    torch.manual_seed(seed)


def make_softplus_decoder():
    """An MLP decoder of two blocks (``Linear`` then ``nn.Softplus(beta=2, threshold=1)``) between a projection and
    a head: x (2x16) -> output (2x4).

    Fault: ``decoder.1.act`` is exported as ``Softplus(beta*x)/beta``, its threshold lost (torch computes ``x`` where
    ``beta*x > 1``). Mimicked under ``is_in_onnx_export()``: the installed dynamo exporter keeps the threshold (a
    ``Where``), but torch.onnx's TorchScript exporter (``dynamo=False``, torch 2.13) writes exactly this
    (``symbolic_opset9.softplus`` ignores ``threshold``)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class ExportSoftplus(nn.Softplus):
        def forward(self, x):
            if torch.onnx.is_in_onnx_export():
                return F.softplus(x * self.beta) / self.beta  # the TorchScript exporter's Softplus(Mul)/Div
            return super().forward(x)

    class Block(nn.Module):
        def __init__(self, width: int, faulty: bool):
            super().__init__()
            self.fc = nn.Linear(width, width)
            self.act = (ExportSoftplus if faulty else nn.Softplus)(beta=2.0, threshold=1.0)

        def forward(self, x):
            return self.act(self.fc(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 32)
            self.decoder = nn.Sequential(Block(32, False), Block(32, True))
            self.head = nn.Linear(32, 4)

        def forward(self, x):
            return self.head(self.decoder(self.proj(x)))

    _seeded()
    net = Net()
    with torch.no_grad():
        for block in net.decoder:
            block.fc.weight.mul_(4.0)  # pre-activations of a few units: many above the threshold
    return net.eval()


def make_log_softmax_classifier():
    """A classifier whose head ends in ``nn.LogSoftmax(dim=1)`` over 10 classes with confident (large) logits, as a
    trained model's are: x (2x16) -> log-probabilities (2x10).

    Fault: ``head.3`` (the LogSoftmax) is exported as ``Log(Softmax(x))``: in float32 the softmax of every class
    more than about 104 below the top one underflows to 0 and its log is -inf, where torch's log-softmax is finite.
    Mimicked under ``is_in_onnx_export()``: the installed torch.onnx exports ``LogSoftmax`` (every opset, both
    exporters), but hand-written decompositions and converters that lower it this way are common."""
    import torch
    from torch import nn

    class ExportLogSoftmax(nn.LogSoftmax):
        def forward(self, x):
            if torch.onnx.is_in_onnx_export():
                return torch.log(torch.softmax(x, self.dim))
            return super().forward(x)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
            self.head = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 10), ExportLogSoftmax(dim=1))

        def forward(self, x):
            return self.head(self.features(x))

    _seeded()
    net = Net()
    with torch.no_grad():
        net.head[2].weight.mul_(400.0)  # logits spread over hundreds: a confident classifier
    return net.eval()


def make_masked_encoder():
    """A token encoder: ``embed`` (Linear), one ``encoder`` block (self-attention ``nn.MultiheadAttention(16, 2,
    batch_first=True)`` with a ``key_padding_mask`` from the attention mask, residual, LayerNorm), mean over the
    tokens, head: x (2x5x8), attention_mask (2x5, int64, 1 = token) -> output (2x3). A batch may hold an empty
    sequence (every position padding): torch gives NaN for its rows (a softmax over nothing but -inf).

    Fault: ``encoder.attn`` is exported with the boolean mask turned into an additive mask of float32's lowest value
    (as Hugging Face models build theirs): a fully masked row then attends uniformly to every key and gives the mean
    of the values, not NaN. Mimicked under ``is_in_onnx_export()``: the installed torch.onnx and ONNX Runtime give
    NaN there, as torch does."""
    import torch
    from torch import nn

    class ExportMaskedAttention(nn.MultiheadAttention):
        def forward(self, query, key, value, key_padding_mask=None, **kwargs):
            if torch.onnx.is_in_onnx_export() and key_padding_mask is not None and key_padding_mask.dtype == torch.bool:
                key_padding_mask = torch.zeros(key_padding_mask.shape, dtype=query.dtype).masked_fill(
                    key_padding_mask, torch.finfo(query.dtype).min
                )
            return super().forward(query, key, value, key_padding_mask=key_padding_mask, **kwargs)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = ExportMaskedAttention(16, 2, batch_first=True)
            self.norm = nn.LayerNorm(16)

        def forward(self, h, padding):
            return self.norm(h + self.attn(h, h, h, key_padding_mask=padding, need_weights=False)[0])

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(8, 16)
            self.encoder = Block()
            self.head = nn.Linear(16, 3)

        def forward(self, x, attention_mask):
            h = self.encoder(self.embed(x), attention_mask == 0)
            return self.head(h.mean(dim=1))

    _seeded()
    return Net().eval()


def make_pre_emphasis():
    """A barometric signal front end in float64, then a float32 head: ``frontend`` = ``AbsolutePressure`` (the input's
    deviations in Pa plus the standard atmosphere, 101325 Pa, in float64: float32 would keep 1/128 Pa of them) and
    ``PreEmphasis`` (``y[t] = p[t] - a * p[t-1]``, ``a`` = 0.999995 a float64 buffer, computed in float64 and handed
    on in float32): x (2x32) -> output (2x4).

    Fault (real, nothing mimicked): torch.onnx's default graph optimiser (onnxscript's ``mul_by_1`` rewrite rule,
    whose constant pattern matches any singleton within a relative 1e-5 of 1) removes the ``Mul`` by ``a``: the
    exported graph computes ``p[t] - p[t-1]``, off by ``(1 - a) * 101325``, about 0.5. ``torch.onnx.export(...,
    optimize=False)`` keeps it. (torch.onnx also writes a Python float multiplying a float64 tensor as a float32
    constant cast to double: ``x.double() * 1.000001`` is rounded to float32's 1.00000095 before the optimiser
    drops it.)"""
    import torch
    from torch import nn

    class AbsolutePressure(nn.Module):
        def forward(self, x):
            return x.double() + 101325.0

    class PreEmphasis(nn.Module):
        def __init__(self, coefficient: float):
            super().__init__()
            self.register_buffer("coefficient", torch.tensor(coefficient, dtype=torch.float64))

        def forward(self, x):  # computed in float64, handed on in float32
            return (x[:, 1:] - self.coefficient * x[:, :-1]).float()

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.frontend = nn.Sequential(AbsolutePressure(), PreEmphasis(0.999995))
            self.head = nn.Linear(31, 4)

        def forward(self, x):
            return self.head(self.frontend(x))

    _seeded()
    return Net().eval()


def make_upsample_decoder():
    """A small segmentation net: an encoder (Conv2d, ReLU, MaxPool2d), a decoder of two blocks (Conv2d, ReLU, then
    in the first ``nn.Upsample(scale_factor=2, mode="bilinear")``), a 1x1 head: x (2x3x8x8) -> output (2x2x8x8).

    Fault: ``decoder.0.up`` is exported with ``align_corners=True`` (ONNX ``Resize`` coordinate mode
    ``align_corners`` instead of ``pytorch_half_pixel``). Mimicked under ``is_in_onnx_export()``: the installed
    torch.onnx exports the coordinate mode right."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class ExportAlignCornersUpsample(nn.Upsample):
        def forward(self, x):
            if torch.onnx.is_in_onnx_export():
                return F.interpolate(x, scale_factor=self.scale_factor, mode=self.mode, align_corners=True)
            return super().forward(x)

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, up):
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, 3, padding=1)
            self.act = nn.ReLU()
            self.up = up

        def forward(self, x):
            return self.up(self.act(self.conv(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
            self.decoder = nn.Sequential(
                Block(8, 8, ExportAlignCornersUpsample(scale_factor=2, mode="bilinear")), Block(8, 8, nn.Identity())
            )
            self.head = nn.Conv2d(8, 2, 1)

        def forward(self, x):
            return self.head(self.decoder(self.encoder(x)))

    _seeded()
    return Net().eval()
