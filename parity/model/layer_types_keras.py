"""The layer kind of a Keras layer, as ``parity init`` writes it into the spec (``parity.model.layer_types`` says
what is typed and why). Keras activations are channels-last: image kinds get ``layout: "nhwc"``, and kernels in
Keras's own layout are marked ``weight_layout``. Imports keras inside.
"""

from __future__ import annotations

from parity.model.layer_types import pair

KERAS_ACTIVATIONS = {
    "relu": ("relu", None),
    "relu6": ("relu6", None),
    "sigmoid": ("sigmoid", None),
    "tanh": ("tanh", None),
    "silu": ("silu", None),
    "swish": ("silu", None),
    "gelu": ("gelu_erf", None),
    "softplus": ("softplus", None),
    "log_sigmoid": ("log_sigmoid", None),
    "hard_sigmoid": ("hard_sigmoid", None),
    "hard_silu": ("hard_swish", None),
    "hard_swish": ("hard_swish", None),
    "leaky_relu": ("leaky_relu", 0.2),
}


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
    if isinstance(layer, (L.Conv1D, L.Conv2D)) and config["padding"] in ("same", "valid"):
        return "conv", _fused(
            {
                "stride": pair(config["strides"]),
                "padding": config["padding"],
                "dilation": pair(config["dilation_rate"]),
                "groups": config.get("groups", 1),
                **last,
                "weight_layout": "keras",
            },
            config,
        )
    if isinstance(layer, L.DepthwiseConv2D) and config["padding"] in ("same", "valid"):
        channels = int(layer.kernel.shape[2])
        return "conv", _fused(
            {
                "stride": pair(config["strides"]),
                "padding": config["padding"],
                "dilation": pair(config["dilation_rate"]),
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
            "size": pair(config["pool_size"]),
            "stride": pair(config["strides"] or config["pool_size"]),
            "padding": config["padding"],
            **last,
        }
    if isinstance(layer, L.UpSampling2D) and config["interpolation"] in ("nearest", "bilinear"):
        nearest = config["interpolation"] == "nearest"  # nearest repeats each pixel; bilinear is tf.image.resize's
        return "resize", {
            "mode": "nearest" if nearest else "linear",
            "scale": pair(config["size"]),
            "coordinate_transformation_mode": "asymmetric" if nearest else "half_pixel",
            **({"nearest_mode": "floor"} if nearest else {}),
            **last,
        }
    if (
        isinstance(layer, L.Resizing)
        and config["interpolation"] == "bicubic"
        and keras.backend.backend() == "tensorflow"
        and not any(config.get(k) for k in ("crop_to_aspect_ratio", "pad_to_aspect_ratio", "antialias"))
    ):  # TensorFlow's half-pixel ResizeBicubic: Keys a = -0.5, outside taps dropped, its kernel from a table
        return "resize", {
            "mode": "cubic",
            "size": [config["height"], config["width"]],
            "coordinate_transformation_mode": "half_pixel",
            "cubic_coeff_a": -0.5,
            "exclude_outside": True,
            "cubic_table": 1024,
            **last,
        }
    if (
        isinstance(layer, L.Resizing)
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
    if isinstance(layer, L.Flatten):
        return "flatten", {"order": "nhwc", **last} if last else {"order": "nchw"}
    return None


def _eps(config: dict, keras) -> float:
    """A normalisation's epsilon; None is Keras's own default, ``keras.config.epsilon()`` (its ops read it so)."""
    eps = config.get("epsilon")
    return float(keras.config.epsilon() if eps is None else eps)


def _config(layer, L) -> dict | None:
    """``layer.get_config()`` for an instance of a class ``keras_layer`` types, else None: read only once the class
    matches, as a custom layer's config may not be serialisable (a sub-layer taken in ``__init__`` raises
    ``NotImplementedError``); a subclass whose config cannot be read stays untyped."""
    typed = (
        L.Dense, L.BatchNormalization, L.LayerNormalization, L.Activation, L.ReLU, L.LeakyReLU, L.GRU, L.LSTM,
        L.MultiHeadAttention, L.Dropout, L.Conv1D, L.Conv2D, L.DepthwiseConv2D, L.MaxPooling1D, L.MaxPooling2D,
        L.AveragePooling1D, L.AveragePooling2D, L.UpSampling2D, L.Resizing, L.Flatten,
    ) + ((L.RMSNormalization,) if hasattr(L, "RMSNormalization") else ())  # fmt: skip
    if not isinstance(layer, typed):
        return None
    try:
        return layer.get_config()
    except NotImplementedError:
        return None


def keras_layer(layer) -> tuple[str, dict] | None:
    """``(kind, attrs)`` for a Keras layer the catalogue computes, else None. A subclass is typed as its base class
    (as torch's are); the diagnosis tests a cause there only where that form reproduces the reference's own output
    (``parity.diagnose.causes.cause.declared_units``)."""
    import keras

    L = keras.layers
    config = _config(layer, L)
    if config is None:
        return None
    if isinstance(layer, L.Dense):
        attrs = _fused({}, config)
        return ("dense", attrs) if attrs is not None else None
    if isinstance(layer, L.BatchNormalization) and config["axis"] in (-1, [-1]):
        return "batch_norm", {"eps": _eps(config, keras), "layout": "nhwc"}
    if isinstance(layer, L.LayerNormalization) and config["axis"] in (-1, [-1]) and not config.get("rms_scaling"):
        return "layer_norm", {"eps": _eps(config, keras)}
    if isinstance(layer, L.LayerNormalization) and config["axis"] in (-1, [-1]):  # rms_scaling: x / sqrt(var + eps)
        return "rms_norm", {"eps": _eps(config, keras), "by_variance": True, "weight_layout": "keras"}
    if isinstance(layer, getattr(L, "RMSNormalization", ())) and config["axis"] in (-1, [-1]):
        return "rms_norm", {"eps": _eps(config, keras), "weight_layout": "keras"}
    if isinstance(layer, L.Activation):
        found = _keras_activation(config["activation"])
        if found is None or found[0] == "linear":
            return None
        return "activation", {"form": found[0], **({"alpha": found[1]} if found[1] is not None else {})}
    if isinstance(layer, L.ReLU) and not config.get("threshold") and config.get("max_value") in (None, 6, 6.0):
        slope = float(config.get("negative_slope") or 0.0)
        if slope:
            return ("activation", {"form": "leaky_relu", "alpha": slope}) if config.get("max_value") is None else None
        return "activation", {"form": "relu" if config.get("max_value") is None else "relu6"}
    if isinstance(layer, L.LeakyReLU):
        return "activation", {"form": "leaky_relu", "alpha": float(config["negative_slope"])}
    if isinstance(layer, (L.GRU, L.LSTM)):
        if (
            config["go_backwards"]
            or config["stateful"]
            or config["return_state"]
            or config["activation"] != "tanh"
            or config["recurrent_activation"] != "sigmoid"
        ):
            return None
        attrs = {"cell": "gru" if isinstance(layer, L.GRU) else "lstm", "sequences": bool(config["return_sequences"])}
        if isinstance(layer, L.GRU):
            attrs["linear_before_reset"] = bool(config["reset_after"])
        return "recurrent", {**attrs, "weight_layout": "keras"}
    if isinstance(layer, L.MultiHeadAttention):
        if (
            config.get("value_dim") not in (None, config["key_dim"])
            or config.get("output_shape") is not None
            or config.get("attention_axes") not in (None, (1,), [1])
            or config.get("use_gate")
            or config.get("sliding_window")
        ):
            return None
        return "attention", {"heads": config["num_heads"], "weight_layout": "keras"}
    if isinstance(layer, L.Dropout) and not config.get("noise_shape"):
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
