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


def _axes(value) -> tuple:
    """A Flax axes argument as a tuple (an int is one axis)."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _last_axis_only(module) -> bool:
    """Whether a Flax normalisation (``LayerNorm``, ``RMSNorm``; linen or nnx) reduces and scales the last axis
    alone, on one device."""
    return _axes(module.reduction_axes) == (-1,) and _axes(module.feature_axes) == (-1,) and module.axis_name is None


def _conv_attrs(module, default_conv) -> dict | None:
    """The conv kind's attributes of a Flax ``Conv`` (linen or nnx: the same fields), None where it computes
    something the kind does not (3-D or more, a mask, another convolution, input dilation, circular padding);
    ``default_conv``: whether its convolution is ``jax.lax.conv_general_dilated``."""
    kernel = _axes(module.kernel_size)
    if (
        len(kernel) not in (1, 2)
        or module.mask is not None
        or not default_conv
        or module.input_dilation not in (None, 1, (1,) * len(kernel))
    ):
        return None
    padding = _flax_padding(module.padding, len(kernel))
    if padding is None:
        return None
    return {
        "stride": pair(module.strides or 1),
        "padding": padding,
        "dilation": pair(module.kernel_dilation or 1),
        "groups": module.feature_group_count,
        "layout": "nhwc",
        "weight_layout": "flax",
    }


def flax_layer(module) -> tuple[str, dict] | None:
    """``(kind, attrs)`` for a ``flax.linen`` module the catalogue computes, else None. Flax holds activations
    channels-last and kernels ``([kh,] kw, I/groups, O)`` and names a LayerNorm's weights ``scale`` and ``bias``:
    attributes ``layout: "nhwc"`` and ``weight_layout: "flax"`` say so (``parity.diagnose.causes.layers.native``)."""
    import flax.linen as nn

    if isinstance(module, nn.Dense) and module.dot_general is None and module.dot_general_cls is None:
        return "dense", {}
    if isinstance(module, nn.LayerNorm) and _last_axis_only(module):
        return "layer_norm", {"eps": module.epsilon, "weight_layout": "flax"}
    if isinstance(module, nn.Conv):
        default = module.conv_general_dilated is None and module.conv_general_dilated_cls is None
        attrs = _conv_attrs(module, default)
        return ("conv", attrs) if attrs is not None else None
    if isinstance(module, nn.Dropout) and module.broadcast_dims in ((), None):
        return "dropout", {"rate": module.rate}
    if isinstance(module, nn.RMSNorm) and _last_axis_only(module):
        return "rms_norm", {"eps": module.epsilon, "weight_layout": "flax"}
    return None


def nnx_layer(module) -> tuple[str, dict] | None:
    """``(kind, attrs)`` for a ``flax.nnx`` module the catalogue computes, else None: an ``nnx.RMSNorm`` over the last
    axis (its ``scale`` parameter is gamma, ``weight_layout: "flax"``)."""
    from flax import nnx

    if isinstance(module, nnx.RMSNorm) and _last_axis_only(module):
        return "rms_norm", {"eps": module.epsilon, "weight_layout": "flax"}
    return None


def nnx_core_layer(module) -> tuple[str, dict] | None:
    """``(kind, attrs)`` for the ``flax.nnx`` layers linen has too (``Linear``, ``LayerNorm``, ``Conv``,
    ``Dropout``), typed as ``flax_layer`` types linen's: same parameter names and layouts; else None."""
    import jax
    from flax import nnx

    if isinstance(module, nnx.Linear) and module.dot_general is jax.lax.dot_general:
        return "dense", {}
    if isinstance(module, nnx.LayerNorm) and _last_axis_only(module) and module.use_scale and module.use_bias:
        return "layer_norm", {"eps": module.epsilon, "weight_layout": "flax"}
    if isinstance(module, nnx.Conv):
        attrs = _conv_attrs(module, module.conv_general_dilated is jax.lax.conv_general_dilated)
        return ("conv", attrs) if attrs is not None else None
    if isinstance(module, nnx.Dropout) and module.broadcast_dims in ((), None):
        return "dropout", {"rate": module.rate}
    return None
