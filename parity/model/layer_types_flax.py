"""The layer kind of a Flax module (``flax.linen`` by ``flax_layer``, ``flax.nnx`` by ``nnx_layer`` and
``nnx_core_layer``), where the descent into a JAX model's tree reaches it (``parity.model.layer_types`` says what
is typed and why). Imports flax and jax inside.
"""

from __future__ import annotations

from parity.model.layer_types import pair


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
            "stride": pair(module.strides or 1),
            "padding": padding,
            "dilation": pair(module.kernel_dilation or 1),
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
            "stride": pair(module.strides or 1),
            "padding": padding,
            "dilation": pair(module.kernel_dilation or 1),
            "groups": module.feature_group_count,
            "layout": "nhwc",
            "weight_layout": "flax",
        }
    if isinstance(module, nnx.Dropout) and module.broadcast_dims in ((), None):
        return "dropout", {"rate": module.rate}
    return None
