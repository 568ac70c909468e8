"""The layer kind of a user's torch module or Keras layer, as ``parity init`` writes it into the spec
(``Layer(kind, attrs, params=...)``), so the diagnosis can test causes on users' models without editing.

Only what the NumPy modules of ``parity.diagnose.causes.layers`` compute exactly is typed; anything else stays untyped
(a container, a custom module, an option the module does not cover). A typed layer that reads weights gets
``params=`` its tap name: golden build stores a torch module's weights by ``state_dict`` name (``conv.weight``)
and a Keras layer's by variable path (``conv/kernel``), and the diagnosis maps either to the kind's canonical
layout (``parity.diagnose.causes.layers.native``; Keras kernels in their own layout are marked ``weight_layout``).
Keras activations are channels-last: image kinds get ``layout: "nhwc"``. A Flax module (``flax_layer``) is typed
where the descent into a JAX model's tree reaches it, a ``flax.nnx`` one by ``nnx_layer``; its weights are found by
its parameter path. This module types torch modules and holds what the three share; ``layer_types_keras`` types
Keras layers and ``layer_types_flax`` Flax modules. Today's transformer layers are typed too: RMSNorms (transformers' ``LlamaRMSNorm`` and kin,
``T5LayerNorm``, Gemma's ``1 + w`` ones, ``torch.nn.RMSNorm``, Keras' ``RMSNormalization`` and
``LayerNormalization(rms_scaling=True)``, Flax's ``RMSNorm``), transformers' gated MLPs, the default rotary
embedding (its positions read as its second input, ``torch_further_inputs``) and the Llama, Mistral and Qwen2
attention modules (grouped-query heads; the rotary tables and the mask read from the call). Imports torch, keras or flax inside.
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
# transformers' attention modules: q/k/v/o Linears, grouped-query heads, the rotary tables applied to q and k as
# halves (``apply_rotary_pos_emb``), then eager or SDPA attention; their inputs read by ``torch_hf_attention``
HF_ATTENTION = ("LlamaAttention", "MistralAttention", "Qwen2Attention")
HF_ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa")
ACTIVATIONS = {
    "ReLU": "relu",
    "ReLU6": "relu6",
    "Sigmoid": "sigmoid",
    "Tanh": "tanh",
    "SiLU": "silu",
    "Hardswish": "hard_swish",
    "Hardsigmoid": "hard_sigmoid",
    "Softplus": "softplus",
    "LogSigmoid": "log_sigmoid",
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


def pair(value):
    return list(value) if isinstance(value, (tuple, list)) else value


# --------------------------------------------------------------------------- torch


def _torch_pool(module, nn):
    if isinstance(module, (nn.MaxPool1d, nn.MaxPool2d)) and (
        module.return_indices or module.dilation not in (1, (1,), (1, 1))
    ):
        return None
    attrs = {
        "mode": "max" if isinstance(module, (nn.MaxPool1d, nn.MaxPool2d)) else "avg",
        "size": pair(module.kernel_size),
        "stride": pair(module.stride or module.kernel_size),
        "padding": pair(module.padding),
        "ceil_mode": bool(module.ceil_mode),
    }
    if attrs["mode"] == "avg":
        attrs["count_include_pad"] = bool(module.count_include_pad)
        if getattr(module, "divisor_override", None):
            attrs["divisor_override"] = int(module.divisor_override)
    return "pool", attrs


def _torch_upsample(module):
    if module.mode not in ("nearest", "bilinear", "linear", "bicubic") or module.recompute_scale_factor:
        return None
    nearest = module.mode == "nearest"
    attrs = {
        "mode": "nearest" if nearest else ("cubic" if module.mode == "bicubic" else "linear"),
        "coordinate_transformation_mode": "asymmetric"
        if nearest
        else ("align_corners" if module.align_corners else "half_pixel"),
    }  # torch reads (o + 0.5) * n / m - 0.5 at every length, 1 too: half_pixel, as torch.onnx writes it
    if nearest:
        attrs["nearest_mode"] = "floor"
    if module.mode == "bicubic":  # Keys' kernel with a = -0.75, taps outside the image read the edge
        attrs.update(cubic_coeff_a=-0.75, exclude_outside=False)
    if module.size is not None:
        attrs["size"] = pair(module.size)
    else:
        attrs["scale"] = pair(module.scale_factor)
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
        if module.eps is not None:
            return "rms_norm", {"eps": float(module.eps)}
        # torch reads the machine epsilon of the type it computes in: float64's in the float64 golden, float32's on
        # float32, float16 and bfloat16 inputs (parity.diagnose.causes.layers.rms_norm)
        return "rms_norm", {"eps": 2.220446049250313e-16, "eps_from_dtype": True}
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
    own = inv_freq.detach().cpu().float().numpy()  # transformers reads it in float32 whatever the model's dtype
    if not np.allclose(own, expected, rtol=1e-6):
        return None  # frequencies scaled or edited: not the default table
    return "rotary", {"base": float(theta), "dim": dim, "rotation": "half", "inv_freq": [float(f) for f in own]}


def _torch_hf_attention(module, nn):
    import math

    config = getattr(module, "config", None)
    parts = [getattr(module, f"{n}_proj", None) for n in "qkvo"]
    heads, kv = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    hd = getattr(module, "head_dim", None)
    if (
        not all(isinstance(p, nn.Linear) for p in parts)
        or not all(isinstance(n, int) and n > 0 for n in (heads, kv, hd))
        or heads % kv
        or getattr(config, "_attn_implementation", None) not in HF_ATTENTION_IMPLEMENTATIONS
        or not isinstance(getattr(module, "scaling", None), float)
    ):
        return None
    q, k, v, o = parts
    if (q.out_features, k.out_features, v.out_features, o.in_features) != (heads * hd, kv * hd, kv * hd, heads * hd):
        return None
    attrs = {"heads": heads, **({"kv_heads": kv} if kv != heads else {}), "rotary": "half"}
    if not math.isclose(module.scaling, hd**-0.5, rel_tol=1e-12):
        attrs["scale"] = float(module.scaling)
    return "attention", attrs


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
    if _hf(module, HF_ATTENTION):
        return _torch_hf_attention(module, nn)
    if isinstance(module, nn.Linear):
        return "dense", {}
    if isinstance(module, (nn.Conv1d, nn.Conv2d)) and module.padding_mode == "zeros":
        return "conv", {
            "stride": pair(module.stride),
            "padding": pair(module.padding),
            "dilation": pair(module.dilation),
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
    if _hf(module, HF_ATTENTION):
        return torch_hf_attention(module, args, kwargs)
    return torch_masked_attention(module, args, kwargs)


HF_ATTENTION_ARGUMENTS = ("hidden_states", "position_embeddings", "attention_mask", "past_key_values")
HF_ATTENTION_UNREAD = ("position_ids", "cache_position", "use_cache", "output_attentions")  # the attention ignores


def torch_hf_attention(module, args: tuple, kwargs: dict) -> tuple[dict, dict] | None:
    """For a call of one of transformers' attention modules the catalogue types, without a cache: ``(attrs,
    {"cos", "sin"[, "attention_mask"]})``. The rotary tables are ``position_embeddings``; the mask, where given, is
    read as the layer's fourth input (``mask``: ``"keep"`` for a boolean mask, SDPA's convention, ``"additive"`` for a
    float one, whose fully masked rows, at the dtype's lowest value, attend uniformly or, at ``-inf``, give NaN in eager
    attention and zero in SDPA); without one, SDPA attention is causal (``is_causal``, for more than one token) and
    eager attention is not masked. None for any other call (a cache, an argument the attention would read)."""
    import torch

    if torch_layer(module) is None or len(args) > len(HF_ATTENTION_ARGUMENTS):
        return None
    bound = {**dict(zip(HF_ATTENTION_ARGUMENTS, args)), **kwargs}
    hidden, tables, mask = (bound.get(n) for n in HF_ATTENTION_ARGUMENTS[:3])
    other = {k: v for k, v in bound.items() if k not in HF_ATTENTION_ARGUMENTS and k not in HF_ATTENTION_UNREAD}
    if (
        not torch.is_tensor(hidden)
        or hidden.dim() != 3
        or bound.get("past_key_values") is not None
        or any(v is not None for v in other.values())
        or not isinstance(tables, (tuple, list))
        or len(tables) != 2
        or not all(torch.is_tensor(t) and t.dim() == 3 and t.shape[-1] == module.head_dim for t in tables)
    ):
        return None
    tokens = hidden.shape[1]
    further = {"cos": tables[0], "sin": tables[1]}
    eager = module.config._attn_implementation == "eager"
    if mask is None:
        return ({"causal": True} if not eager and module.is_causal and tokens > 1 else {}), further
    if not torch.is_tensor(mask) or mask.dim() != 4 or tuple(mask.shape[-2:]) != (tokens, tokens):
        return None
    if mask.dtype == torch.bool and not eager:  # eager attention adds the mask: a boolean one is not its input
        attrs = {"mask": "keep"}
    elif mask.is_floating_point():
        finite = bool(torch.isfinite(mask).all())
        attrs = {"mask": "additive", "masked_rows": "uniform" if finite else ("nan" if eager else "zero")}
    else:
        return None
    return attrs, {**further, "attention_mask": mask}


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
