"""The layer kind of a user's torch module, as ``parity init`` writes it into the spec (``Layer(kind, attrs,
params=...)``), so the diagnosis can test causes on users' models without editing.

Only what the NumPy modules of ``parity.diagnose.layers`` compute exactly is typed; anything else stays untyped
(a container, a custom module, an option the module does not cover). Imports torch inside.
"""

from __future__ import annotations

ACTIVATIONS = {"ReLU": "relu", "ReLU6": "relu6", "Sigmoid": "sigmoid", "Tanh": "tanh", "SiLU": "silu",
               "Hardswish": "hard_swish", "Softplus": "softplus"}


def _pair(value):
    return list(value) if isinstance(value, (tuple, list)) else value


def torch_layer(module) -> tuple[str, dict] | None:
    """``(kind, attrs)`` for a torch module the catalogue computes, else None."""
    from torch import nn

    name = type(module).__name__
    if isinstance(module, nn.Linear):
        return "dense", {}
    if isinstance(module, nn.Conv2d) and module.padding_mode == "zeros" and not isinstance(module.padding, str):
        return "conv", {"stride": _pair(module.stride), "padding": _pair(module.padding),
                        "dilation": _pair(module.dilation), "groups": module.groups}
    if isinstance(module, nn.BatchNorm2d) and module.track_running_stats:
        return "batch_norm", {"eps": module.eps}
    if isinstance(module, nn.LayerNorm) and len(module.normalized_shape) == 1:
        return "layer_norm", {"eps": module.eps}
    if isinstance(module, nn.GELU):
        return "activation", {"form": "gelu_tanh" if module.approximate == "tanh" else "gelu_erf"}
    if isinstance(module, nn.LeakyReLU):
        return "activation", {"form": "leaky_relu", "alpha": module.negative_slope}
    if name in ACTIVATIONS and type(module).__module__.startswith("torch.nn"):
        if name == "Softplus" and (module.beta != 1 or module.threshold != 20):
            return None
        return "activation", {"form": ACTIVATIONS[name]}
    if isinstance(module, (nn.MaxPool2d, nn.AvgPool2d)):
        if isinstance(module, nn.MaxPool2d) and module.dilation not in (1, (1, 1)):
            return None
        attrs = {"mode": "max" if isinstance(module, nn.MaxPool2d) else "avg", "size": _pair(module.kernel_size),
                 "stride": _pair(module.stride or module.kernel_size), "padding": _pair(module.padding),
                 "ceil_mode": bool(module.ceil_mode)}
        if isinstance(module, nn.AvgPool2d):
            attrs["count_include_pad"] = bool(module.count_include_pad)
            if module.divisor_override:
                attrs["divisor_override"] = int(module.divisor_override)
        return "pool", attrs
    if isinstance(module, nn.Upsample) and module.mode in ("nearest", "bilinear"):
        attrs = {"mode": "nearest" if module.mode == "nearest" else "linear",
                 "coordinate_transformation_mode": "asymmetric" if module.mode == "nearest" else
                 ("align_corners" if module.align_corners else "pytorch_half_pixel")}
        if module.mode == "nearest":
            attrs["nearest_mode"] = "floor"
        if module.size is not None:
            attrs["size"] = _pair(module.size)
        else:
            attrs["scale"] = _pair(module.scale_factor)
        return "resize", attrs
    if isinstance(module, nn.Dropout):
        return "dropout", {"rate": module.p}
    if isinstance(module, nn.Flatten) and module.start_dim == 1 and module.end_dim == -1:
        return "flatten", {"order": "nchw"}
    return None
