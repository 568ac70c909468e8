"""The layer kind of a user's torch module or Keras layer, as ``parity init`` writes it into the spec
(``Layer(kind, attrs, params=...)``), so the diagnosis can test causes on users' models without editing.

Only what the NumPy modules of ``parity.diagnose.layers`` compute exactly is typed; anything else stays untyped
(a container, a custom module, an option the module does not cover). A typed layer that reads weights gets
``params=`` its tap name: golden build stores a torch module's weights by ``state_dict`` name (``conv.weight``)
and a Keras layer's by variable path (``conv/kernel``), and the diagnosis maps either to the kind's canonical
layout (``parity.diagnose.layers.native``; Keras kernels in their own layout are marked ``weight_layout``).
Keras activations are channels-last: image kinds get ``layout: "nhwc"``. A Flax module (``flax_layer``) is typed
where the descent into a JAX model's tree reaches it, a ``flax.nnx`` one by ``nnx_layer``; its weights are found by
its parameter path. Today's transformer layers are typed too: RMSNorms (transformers' ``LlamaRMSNorm`` and kin,
``T5LayerNorm``, Gemma's ``1 + w`` ones, ``torch.nn.RMSNorm``, Keras' ``RMSNormalization`` and
``LayerNormalization(rms_scaling=True)``, Flax's ``RMSNorm``), transformers' gated MLPs and the default rotary
embedding (its positions read as its second input, ``torch_further_inputs``). Imports torch, keras or flax inside.
"""

from __future__ import annotations

WEIGHTED = (  # kinds that read weights
    "dense",
    "conv",
    "batch_norm",
    "layer_norm",
    "recurrent",
    "attention",
    "rms_norm",
    "gated_mlp",
)
# transformers' RMSNorm classes -> Gemma's ``1 + w`` offset (the epsilon is ``variance_epsilon`` or ``eps``)
HF_RMS_NORMS = {
    "LlamaRMSNorm": 0,
    "MistralRMSNorm": 0,
    "MixtralRMSNorm": 0,
    "Qwen2RMSNorm": 0,
    "Qwen3RMSNorm": 0,
    "T5LayerNorm": 0,
    "GemmaRMSNorm": 1,
    "Gemma2RMSNorm": 1,
    "Gemma3RMSNorm": 1,
}
# transformers' gated MLPs: ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``
HF_GATED_MLPS = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP", "GemmaMLP", "Gemma2MLP")
# transformers' rotary embeddings that compute ``cos(cat(freqs, freqs))`` from the positions (the default RoPE)
HF_ROTARY = (
    "LlamaRotaryEmbedding",
    "MistralRotaryEmbedding",
    "Qwen2RotaryEmbedding",
    "Qwen3RotaryEmbedding",
    "GemmaRotaryEmbedding",
    "Gemma2RotaryEmbedding",
)
ACTIVATIONS = {
    "ReLU": "relu",
    "ReLU6": "relu6",
    "Sigmoid": "sigmoid",
    "Tanh": "tanh",
    "SiLU": "silu",
    "Hardswish": "hard_swish",
    "Hardsigmoid": "hard_sigmoid",
    "Softplus": "softplus",
}
# the activation classes of transformers (transformers.activations) -> the catalogue's form
HF_ACTIVATIONS = {
    "GELUActivation": "gelu_erf",
    "NewGELUActivation": "gelu_tanh",
    "GELUTanh": "gelu_tanh",
    "PytorchGELUTanh": "gelu_tanh",
    "FastGELUActivation": "gelu_tanh",
    "QuickGELUActivation": "gelu_sigmoid",
    "SiLUActivation": "silu",
}
# Keras activation names (as its configs serialise them) -> (form, alpha); "linear" is no activation
KERAS_ACTIVATIONS = {
    "relu": ("relu", None),
    "relu6": ("relu6", None),
    "sigmoid": ("sigmoid", None),
    "tanh": ("tanh", None),
    "silu": ("silu", None),
    "swish": ("silu", None),
    "gelu": ("gelu_erf", None),
    "softplus": ("softplus", None),
    "hard_sigmoid": ("hard_sigmoid", None),
    "hard_silu": ("hard_swish", None),
    "hard_swish": ("hard_swish", None),
    "leaky_relu": ("leaky_relu", 0.2),
}


def _pair(value):
    return list(value) if isinstance(value, (tuple, list)) else value


# --------------------------------------------------------------------------- torch


def _torch_pool(module, nn):
    if isinstance(module, (nn.MaxPool1d, nn.MaxPool2d)) and (
        module.return_indices or module.dilation not in (1, (1,), (1, 1))
    ):
        return None
    attrs = {
        "mode": "max" if isinstance(module, (nn.MaxPool1d, nn.MaxPool2d)) else "avg",
        "size": _pair(module.kernel_size),
        "stride": _pair(module.stride or module.kernel_size),
        "padding": _pair(module.padding),
        "ceil_mode": bool(module.ceil_mode),
    }
    if attrs["mode"] == "avg":
        attrs["count_include_pad"] = bool(module.count_include_pad)
        if getattr(module, "divisor_override", None):
            attrs["divisor_override"] = int(module.divisor_override)
    return "pool", attrs


def _torch_upsample(module):
    if module.mode not in ("nearest", "bilinear", "linear") or module.recompute_scale_factor:
        return None
    nearest = module.mode == "nearest"
    attrs = {
        "mode": "nearest" if nearest else "linear",
        "coordinate_transformation_mode": "asymmetric"
        if nearest
        else ("align_corners" if module.align_corners else "pytorch_half_pixel"),
    }
    if nearest:
        attrs["nearest_mode"] = "floor"
    if module.size is not None:
        attrs["size"] = _pair(module.size)
    else:
        attrs["scale"] = _pair(module.scale_factor)
    return "resize", attrs


def _torch_recurrent(module, nn):
    if not module.batch_first or module.num_layers != 1 or module.bidirectional or getattr(module, "proj_size", 0):
        return None
    return "recurrent", (
        {"cell": "gru", "linear_before_reset": True} if isinstance(module, nn.GRU) else {"cell": "lstm"}
    )


def _hf(module, names) -> str | None:
    """The name of the first of transformers' classes ``names`` that ``module`` is an instance of (a subclass keeps
    its base's form, as ``isinstance`` types torch's own classes), else None."""
    return next(
        (c.__name__ for c in type(module).__mro__ if c.__module__.startswith("transformers.") and c.__name__ in names),
        None,
    )


def _torch_rms_norm(module, nn):
    if isinstance(module, nn.RMSNorm):
        if len(module.normalized_shape) != 1:
            return None
        eps = module.eps if module.eps is not None else 1.1920928955078125e-07  # finfo(float32).eps: torch's None
        return "rms_norm", {"eps": float(eps)}
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if weight is None or weight.dim() != 1 or not isinstance(eps, (int, float)):
        return None
    offset = HF_RMS_NORMS[_hf(module, HF_RMS_NORMS)]
    return "rms_norm", {"eps": float(eps), **({"offset": 1} if offset else {})}


def _torch_gated_mlp(module, nn):
    parts = [getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    if not all(isinstance(p, nn.Linear) for p in parts):
        return None
    act = (
        torch_layer(getattr(module, "act_fn", None)) if isinstance(getattr(module, "act_fn", None), nn.Module) else None
    )
    if act is None or act[0] != "activation" or set(act[1]) != {"form"}:
        return None
    return "gated_mlp", {"act": act[1]["form"]}


def _torch_rotary(module):
    import numpy as np

    config = getattr(module, "config", None)
    inv_freq = getattr(module, "inv_freq", None)
    theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
    if (
        getattr(module, "rope_type", None) != "default"
        or getattr(module, "attention_scaling", None) != 1.0
        or inv_freq is None
        or not isinstance(theta, (int, float))
    ):
        return None
    dim = 2 * int(inv_freq.numel())
    expected = 1.0 / (float(theta) ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    if not np.allclose(inv_freq.detach().double().cpu().numpy(), expected, rtol=1e-6):
        return None  # frequencies scaled or edited: not the default table
    return "rotary", {"base": float(theta), "dim": dim, "rotation": "half"}


def torch_layer(module) -> tuple[str, dict] | None:
    """``(kind, attrs)`` for a torch module the catalogue computes, else None."""
    from torch import nn

    name = type(module).__name__
    if isinstance(module, nn.RMSNorm) or _hf(module, HF_RMS_NORMS):
        return _torch_rms_norm(module, nn)
    if _hf(module, HF_GATED_MLPS):
        return _torch_gated_mlp(module, nn)
    if _hf(module, HF_ROTARY):
        return _torch_rotary(module)
    if isinstance(module, nn.Linear):
        return "dense", {}
    if isinstance(module, (nn.Conv1d, nn.Conv2d)) and module.padding_mode == "zeros":
        return "conv", {
            "stride": _pair(module.stride),
            "padding": _pair(module.padding),
            "dilation": _pair(module.dilation),
            "groups": module.groups,
        }
    if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)) and module.track_running_stats:
        return "batch_norm", {"eps": module.eps}
    if isinstance(module, nn.LayerNorm) and len(module.normalized_shape) == 1:
        return "layer_norm", {"eps": module.eps}
    if isinstance(module, nn.GELU):
        return "activation", {"form": "gelu_tanh" if module.approximate == "tanh" else "gelu_erf"}
    if isinstance(module, nn.LeakyReLU):
        return "activation", {"form": "leaky_relu", "alpha": module.negative_slope}
    hf = next(
        (
            HF_ACTIVATIONS[c.__name__]
            for c in type(module).__mro__
            if c.__module__ == "transformers.activations" and c.__name__ in HF_ACTIVATIONS
        ),
        None,
    )
    if hf is not None:
        return "activation", {"form": hf}
    if isinstance(module, nn.Softplus):  # torch's softplus is x itself where beta*x > threshold
        return "activation", {"form": "softplus", "beta": float(module.beta), "threshold": float(module.threshold)}
    if isinstance(module, (nn.Softmax, nn.LogSoftmax)) and module.dim is not None:
        return "softmax", {"axis": int(module.dim), "log": isinstance(module, nn.LogSoftmax)}
    if name in ACTIVATIONS and type(module).__module__.startswith("torch.nn"):
        return "activation", {"form": ACTIVATIONS[name]}
    if isinstance(module, (nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d)):
        return _torch_pool(module, nn)
    if isinstance(module, nn.Upsample):
        return _torch_upsample(module)
    if isinstance(module, (nn.GRU, nn.LSTM)):
        return _torch_recurrent(module, nn)
    if isinstance(module, nn.MultiheadAttention):
        if (
            not module.batch_first
            or not module._qkv_same_embed_dim
            or module.bias_k is not None
            or module.add_zero_attn
        ):
            return None
        return "attention", {"heads": module.num_heads}
    if type(module) is nn.Dropout:
        return "dropout", {"rate": module.p}
    if isinstance(module, nn.Flatten) and module.start_dim == 1 and module.end_dim == -1:
        return "flatten", {"order": "nchw"}
    return None


def torch_reads(module, args: tuple, kwargs: dict, previous) -> bool:
    """Whether ``module`` was called on ``previous`` alone (self-attention: query, key and value all
    ``previous``, no mask; a recurrent layer: no initial state), so its layer is recomputed from that tap."""
    from torch import nn

    if isinstance(module, nn.MultiheadAttention):
        names = ("query", "key", "value")
        fed = [args[i] if i < len(args) else kwargs.get(n) for i, n in enumerate(names)]
        rest = {k: v for k, v in kwargs.items() if k not in names}
        masked = len(args) > 3 and any(a is not None and not isinstance(a, bool) for a in args[3:])
        return (
            all(f is previous for f in fed)
            and not masked
            and rest.get("key_padding_mask") is None
            and rest.get("attn_mask") is None
            and not rest.get("is_causal", False)
        )
    return len(args) == 1 and args[0] is previous and all(v is None for v in kwargs.values())


def torch_further_inputs(module, args: tuple, kwargs: dict) -> tuple[dict, dict] | None:
    """For a call of a typed module that reads more than its first input: ``(attrs, {argument: tensor})``, what the
    call adds to its layer's attributes and the further inputs its kind reads, in order (``torch_masked_attention``
    for a masked self-attention; a rotary embedding's ``position_ids``). None for any other call."""
    import torch

    if _hf(module, HF_ROTARY) and torch_layer(module) is not None:
        bound = {**dict(zip(("x", "position_ids"), args)), **kwargs}
        positions = bound.get("position_ids")
        if len(args) > 2 or set(bound) != {"x", "position_ids"} or not torch.is_tensor(positions):
            return None
        return {}, {"position_ids": positions}
    return torch_masked_attention(module, args, kwargs)


MHA_ARGUMENTS = (
    "query",
    "key",
    "value",
    "key_padding_mask",
    "need_weights",
    "attn_mask",
    "average_attn_weights",
    "is_causal",
)  # nn.MultiheadAttention.forward's parameters, in order


def torch_masked_attention(module, args: tuple, kwargs: dict) -> tuple[dict, dict] | None:
    """For a call of an ``nn.MultiheadAttention`` the catalogue types that is self-attention (query, key and value
    the same tensor) with one mask (``key_padding_mask`` or ``attn_mask``, not causal) or none: ``(attrs, {argument:
    mask})`` (``({}, {})`` without a mask),
    the attributes the mask adds to the layer's (``mask``: ``"ignore"`` for a boolean mask, true where masked,
    ``"additive"`` for a float one; ``key_padding``; ``masked_rows: "nan"``, what torch gives a query whose every
    key is masked) and the mask as the attention kind reads it as its second input (a per-head ``attn_mask`` of
    ``(batch * heads, q, k)`` as ``(batch, heads, q, k)``). None for any other call."""
    import torch
    from torch import nn

    if not isinstance(module, nn.MultiheadAttention) or torch_layer(module) is None:
        return None
    if len(args) > len(MHA_ARGUMENTS) or any(k not in MHA_ARGUMENTS for k in kwargs):
        return None
    bound = {**dict(zip(MHA_ARGUMENTS, args)), **kwargs}
    query = bound.get("query")
    self_attention = bound.get("key") is query and bound.get("value") is query
    if not torch.is_tensor(query) or not self_attention or bound.get("is_causal") or query.dim() != 3:
        return None
    masks = {n: bound[n] for n in ("key_padding_mask", "attn_mask") if bound.get(n) is not None}
    if not masks:
        return {}, {}
    if len(masks) != 1 or not all(torch.is_tensor(m) for m in masks.values()):
        return None
    ((name, mask),) = masks.items()
    if mask.dtype != torch.bool and not mask.is_floating_point():
        return None
    if name == "attn_mask" and mask.dim() == 3:
        mask = mask.reshape(query.shape[0], module.num_heads, *mask.shape[1:])
    attrs = {
        "mask": "ignore" if mask.dtype == torch.bool else "additive",
        "key_padding": name == "key_padding_mask",
        "masked_rows": "nan",
    }
    return attrs, {name: mask}


# --------------------------------------------------------------------------- Keras


def _keras_activation(name) -> tuple[str, float | None] | None:
    """``(form, alpha)`` of a Keras activation name, ``("linear", None)`` for none, None if not in the catalogue."""
    if name in (None, "linear"):
        return "linear", None
    return KERAS_ACTIVATIONS.get(name) if isinstance(name, str) else None


def _fused(attrs: dict, config: dict) -> dict | None:
    found = _keras_activation(config.get("activation"))
    if found is None:
        return None
    form, alpha = found
    if form != "linear":
        attrs["activation"] = form
        if alpha is not None:
            attrs["alpha"] = alpha
    return attrs


def _keras_image(layer, config):
    import keras

    L = keras.layers
    last = {"layout": "nhwc"} if config.get("data_format", "channels_last") == "channels_last" else {}
    if type(layer) in (L.Conv1D, L.Conv2D) and config["padding"] in ("same", "valid"):
        return "conv", _fused(
            {
                "stride": _pair(config["strides"]),
                "padding": config["padding"],
                "dilation": _pair(config["dilation_rate"]),
                "groups": config.get("groups", 1),
                **last,
                "weight_layout": "keras",
            },
            config,
        )
    if type(layer) is L.DepthwiseConv2D and config["padding"] in ("same", "valid"):
        channels = int(layer.kernel.shape[2])
        return "conv", _fused(
            {
                "stride": _pair(config["strides"]),
                "padding": config["padding"],
                "dilation": _pair(config["dilation_rate"]),
                "groups": channels,
                **last,
                "weight_layout": "keras_depthwise",
            },
            config,
        )
    pools = {L.MaxPooling1D: "max", L.MaxPooling2D: "max", L.AveragePooling1D: "avg", L.AveragePooling2D: "avg"}
    if type(layer) in pools:
        return "pool", {
            "mode": pools[type(layer)],
            "size": _pair(config["pool_size"]),
            "stride": _pair(config["strides"] or config["pool_size"]),
            "padding": config["padding"],
            **last,
        }
    if type(layer) is L.UpSampling2D and config["interpolation"] in ("nearest", "bilinear"):
        nearest = config["interpolation"] == "nearest"  # nearest repeats each pixel; bilinear is tf.image.resize's
        return "resize", {
            "mode": "nearest" if nearest else "linear",
            "scale": _pair(config["size"]),
            "coordinate_transformation_mode": "asymmetric" if nearest else "half_pixel",
            **({"nearest_mode": "floor"} if nearest else {}),
            **last,
        }
    if (
        type(layer) is L.Resizing
        and config["interpolation"] in ("nearest", "bilinear")
        and not config.get("crop_to_aspect_ratio")
        and not config.get("pad_to_aspect_ratio")
        and not config.get("antialias")
    ):
        nearest = config["interpolation"] == "nearest"  # tf.image.resize: half-pixel centres, nearest rounds up
        return "resize", {
            "mode": "nearest" if nearest else "linear",
            "size": [config["height"], config["width"]],
            "coordinate_transformation_mode": "half_pixel",
            **({"nearest_mode": "round_prefer_ceil"} if nearest else {}),
            **last,
        }
    if type(layer) is L.Flatten:
        return "flatten", {"order": "nhwc", **last} if last else {"order": "nchw"}
    return None


def keras_layer(layer) -> tuple[str, dict] | None:
    """``(kind, attrs)`` for a Keras layer the catalogue computes, else None."""
    import keras

    L = keras.layers
    config = layer.get_config()
    if type(layer) is L.Dense:
        attrs = _fused({}, config)
        return ("dense", attrs) if attrs is not None else None
    if type(layer) is L.BatchNormalization and config["axis"] in (-1, [-1]):
        return "batch_norm", {"eps": config["epsilon"], "layout": "nhwc"}
    if type(layer) is L.LayerNormalization and config["axis"] in (-1, [-1]) and not config.get("rms_scaling"):
        return "layer_norm", {"eps": config["epsilon"]}
    if type(layer) is L.LayerNormalization and config["axis"] in (-1, [-1]):  # rms_scaling: x / sqrt(var + eps)
        return "rms_norm", {"eps": config["epsilon"], "by_variance": True, "weight_layout": "keras"}
    if type(layer) is getattr(L, "RMSNormalization", None) and config["axis"] in (-1, [-1]):
        return "rms_norm", {"eps": config["epsilon"], "weight_layout": "keras"}
    if type(layer) is L.Activation:
        found = _keras_activation(config["activation"])
        if found is None or found[0] == "linear":
            return None
        return "activation", {"form": found[0], **({"alpha": found[1]} if found[1] is not None else {})}
    if type(layer) is L.ReLU and not config.get("threshold") and config.get("max_value") in (None, 6, 6.0):
        slope = float(config.get("negative_slope") or 0.0)
        if slope:
            return ("activation", {"form": "leaky_relu", "alpha": slope}) if config.get("max_value") is None else None
        return "activation", {"form": "relu" if config.get("max_value") is None else "relu6"}
    if type(layer) is L.LeakyReLU:
        return "activation", {"form": "leaky_relu", "alpha": float(config["negative_slope"])}
    if type(layer) in (L.GRU, L.LSTM):
        if (
            config["go_backwards"]
            or config["stateful"]
            or config["return_state"]
            or config["activation"] != "tanh"
            or config["recurrent_activation"] != "sigmoid"
        ):
            return None
        attrs = {"cell": "gru" if type(layer) is L.GRU else "lstm", "sequences": bool(config["return_sequences"])}
        if type(layer) is L.GRU:
            attrs["linear_before_reset"] = bool(config["reset_after"])
        return "recurrent", {**attrs, "weight_layout": "keras"}
    if type(layer) is L.MultiHeadAttention:
        if (
            config.get("value_dim") not in (None, config["key_dim"])
            or config.get("output_shape") is not None
            or config.get("attention_axes") not in (None, (1,), [1])
            or config.get("use_gate")
            or config.get("sliding_window")
        ):
            return None
        return "attention", {"heads": config["num_heads"], "weight_layout": "keras"}
    if type(layer) is L.Dropout and not config.get("noise_shape"):
        return "dropout", {"rate": config["rate"]}
    return _keras_image(layer, config)


def keras_reads(layer, previous) -> dict | None:
    """``{}`` (or the attributes the call adds: ``causal`` for ``use_causal_mask``) when ``layer`` was called once,
    on ``previous`` alone (attention: as query and value, no mask tensor), else None."""
    nodes = getattr(layer, "_inbound_nodes", [])
    if len(nodes) != 1 or previous is None:
        return None
    try:
        fed = layer.input
    except (AttributeError, ValueError):
        return None
    fed = list(fed) if isinstance(fed, (list, tuple)) else [fed]
    if not fed or any(tensor is not previous for tensor in fed):
        return None
    arguments = getattr(nodes[0], "arguments", None)
    kwargs = dict(getattr(arguments, "kwargs", {}) or {})
    if kwargs.get("attention_mask") is not None:
        return None
    return {"causal": True} if kwargs.get("use_causal_mask") else {}


# --------------------------------------------------------------------------- Flax (linen)


def _flax_padding(padding, rank: int):
    """A Flax ``Conv`` padding as the conv kind's attribute, None for one it does not compute (CIRCULAR, CAUSAL)."""
    if isinstance(padding, str):
        return padding.lower() if padding in ("SAME", "VALID") else None
    if isinstance(padding, int):
        return padding
    pairs = [(p, p) if isinstance(p, int) else tuple(p) for p in padding]
    return [list(p) for p in pairs] if len(pairs) == rank else None


def flax_layer(module) -> tuple[str, dict] | None:
    """``(kind, attrs)`` for a ``flax.linen`` module the catalogue computes, else None. Flax holds activations
    channels-last and kernels ``([kh,] kw, I/groups, O)`` and names a LayerNorm's weights ``scale`` and ``bias``:
    attributes ``layout: "nhwc"`` and ``weight_layout: "flax"`` say so (``parity.diagnose.layers.native``)."""
    import flax.linen as nn

    def axes(value):
        return tuple(value) if isinstance(value, (tuple, list)) else (value,)

    if isinstance(module, nn.Dense) and module.dot_general is None and module.dot_general_cls is None:
        return "dense", {}
    if (
        isinstance(module, nn.LayerNorm)
        and axes(module.reduction_axes) == (-1,)
        and axes(module.feature_axes) == (-1,)
        and module.axis_name is None
    ):
        return "layer_norm", {"eps": module.epsilon, "weight_layout": "flax"}
    kernel = axes(module.kernel_size) if isinstance(module, nn.Conv) else ()  # flax reads an int as one axis
    if (
        isinstance(module, nn.Conv)
        and len(kernel) in (1, 2)
        and module.mask is None
        and module.conv_general_dilated is None
        and module.conv_general_dilated_cls is None
        and module.input_dilation in (None, 1) + ((1,) * len(kernel),)
    ):
        rank = len(kernel)
        padding = _flax_padding(module.padding, rank)
        if padding is None:
            return None
        return "conv", {
            "stride": _pair(module.strides or 1),
            "padding": padding,
            "dilation": _pair(module.kernel_dilation or 1),
            "groups": module.feature_group_count,
            "layout": "nhwc",
            "weight_layout": "flax",
        }
    if isinstance(module, nn.Dropout) and module.broadcast_dims in ((), None):
        return "dropout", {"rate": module.rate}
    if isinstance(module, nn.RMSNorm) and _flax_rms_axes(module, axes):
        return "rms_norm", {"eps": module.epsilon, "weight_layout": "flax"}
    return None


def _flax_rms_axes(module, axes) -> bool:
    """Whether a Flax ``RMSNorm`` (linen or nnx) normalises the last axis alone, on one device."""
    return axes(module.reduction_axes) == (-1,) and axes(module.feature_axes) == (-1,) and module.axis_name is None


def nnx_layer(module) -> tuple[str, dict] | None:
    """``(kind, attrs)`` for a ``flax.nnx`` module the catalogue computes, else None: an ``nnx.RMSNorm`` over the last
    axis (its ``scale`` parameter is gamma, ``weight_layout: "flax"``)."""
    from flax import nnx

    def axes(value):
        return tuple(value) if isinstance(value, (tuple, list)) else (value,)

    if isinstance(module, nnx.RMSNorm) and _flax_rms_axes(module, axes):
        return "rms_norm", {"eps": module.epsilon, "weight_layout": "flax"}
    return None


def nnx_core_layer(module) -> tuple[str, dict] | None:
    """``(kind, attrs)`` for the ``flax.nnx`` layers linen has too (``Linear``, ``LayerNorm``, ``Conv``,
    ``Dropout``), typed as ``flax_layer`` types linen's: same parameter names and layouts; else None."""
    import jax
    from flax import nnx

    def axes(value):
        return tuple(value) if isinstance(value, (tuple, list)) else (value,)

    if isinstance(module, nnx.Linear) and module.dot_general is jax.lax.dot_general:
        return "dense", {}
    if isinstance(module, nnx.LayerNorm) and _flax_rms_axes(module, axes) and module.use_scale and module.use_bias:
        return "layer_norm", {"eps": module.epsilon, "weight_layout": "flax"}
    kernel = axes(module.kernel_size) if isinstance(module, nnx.Conv) else ()
    if (
        isinstance(module, nnx.Conv)
        and len(kernel) in (1, 2)
        and module.mask is None
        and module.conv_general_dilated is jax.lax.conv_general_dilated
        and module.input_dilation in (None, 1, (1,) * len(kernel))
        and (padding := _flax_padding(module.padding, len(kernel))) is not None
    ):
        return "conv", {
            "stride": _pair(module.strides or 1),
            "padding": padding,
            "dilation": _pair(module.kernel_dilation or 1),
            "groups": module.feature_group_count,
            "layout": "nhwc",
            "weight_layout": "flax",
        }
    if isinstance(module, nnx.Dropout) and module.broadcast_dims in ((), None):
        return "dropout", {"rate": module.rate}
    return None
