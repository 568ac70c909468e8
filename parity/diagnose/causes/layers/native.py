"""A layer's weights as its framework stores them, mapped to the canonical names and layouts of its kind's module.

The built-in models store canonical weights (``conv1/kernel`` already OIHW). A user's model keeps its framework's
own (golden build stores them as the framework names them), so the cause test maps them here:

* torch (``state_dict`` names, ``<prefix>.<name>``): ``nn.Linear`` ``weight`` ``(out, in)`` is the transposed
  kernel; ``Conv1d/2d`` ``weight`` is already ``(O, I/groups, [kh,] kw)``; BatchNorm's ``weight``, ``bias``,
  ``running_mean``, ``running_var``; LayerNorm's ``weight``, ``bias``; GRU/LSTM ``weight_ih_l0`` ...
  (torch's gate order, the canonical one); ``nn.MultiheadAttention``'s ``in_proj_weight`` ``(3E, E)`` split into
  query, key and value kernels, ``out_proj.weight`` transposed; transformers' attention modules' ``q_proj``,
  ``k_proj``, ``v_proj``, ``o_proj`` Linears (transposed kernels); an RMSNorm's ``weight``; a gated MLP's
  ``gate_proj``, ``up_proj``, ``down_proj`` Linears (transposed kernels);
* Keras (variable paths, ``<prefix>/<name>``): Dense, BatchNormalization and LayerNormalization use the canonical
  names and layouts already; the others declare ``weight_layout`` in their attributes: ``"keras"`` (``Conv1D/2D``
  kernels ``([kh,] kw, I/groups, O)``; GRU/LSTM ``kernel`` ``(I, G*H)``, ``recurrent_kernel``, ``bias`` in Keras'
  gate order, GRU ``z, r, h`` with a ``(2, 3H)`` bias when ``reset_after``; MultiHeadAttention's ``(d, heads,
  head_dim)`` kernels and ``attention_output``) or ``"keras_depthwise"`` (``DepthwiseConv2D``'s ``(kh, kw, C,
  multiplier)`` kernel); an RMSNorm (``RMSNormalization``'s ``scale``, ``LayerNormalization(rms_scaling=True)``'s
  ``gamma``) declares ``"keras"`` too;
* Flax (parameter paths, ``<prefix>/<name>``, ``weight_layout: "flax"``): ``Dense`` kernels are canonical, ``Conv``
  kernels ``([kh,] kw, I/groups, O)`` as Keras' (grouped ones too), a ``LayerNorm``'s ``scale`` and ``bias`` are
  gamma and beta, an ``RMSNorm``'s ``scale`` gamma.

Activations too may be the framework's own: ``bind`` computes a layer whose attributes say ``"layout": "nhwc"``
(a Keras model's channels-last taps: the channel axis last for any rank >= 3) in channels-first order and hands the
result back channels-last, and applies a fused ``"activation"`` (a form of the ``activation`` kind: Keras'
``Dense(..., activation="relu")``) after the layer, to the declared form and every variant alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from parity.diagnose.causes.layers import Variant, get

WEIGHT_LAYOUTS = ("keras", "keras_depthwise", "flax")


def _blocks(value, order):
    """The gate blocks of ``value`` (stacked on axis 0) rearranged: block ``i`` of the result is ``order[i]``."""
    parts = np.split(value, len(order), axis=0)
    return np.concatenate([parts[i] for i in order], axis=0)


def _torch_attention(w: dict) -> dict:
    found = {}
    if "in_proj_weight" in w:
        for name, kernel in zip(("query", "key", "value"), np.split(w["in_proj_weight"], 3, axis=0)):
            found[f"{name}/kernel"] = kernel.T
    if "in_proj_bias" in w:
        for name, bias in zip(("query", "key", "value"), np.split(w["in_proj_bias"], 3)):
            found[f"{name}/bias"] = bias
    if "out_proj.weight" in w:
        found["out/kernel"] = w["out_proj.weight"].T
    if "out_proj.bias" in w:
        found["out/bias"] = w["out_proj.bias"]
    for own, name in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value"), ("o_proj", "out")):
        if f"{own}.weight" in w:  # transformers' attention modules: one Linear per projection
            found[f"{name}/kernel"] = w[f"{own}.weight"].T
        if f"{own}.bias" in w:
            found[f"{name}/bias"] = w[f"{own}.bias"]
    return found


def _renamed(names: dict, transpose: tuple = ()):
    def mapping(w: dict) -> dict:
        return {new: (w[old].T if old in transpose else w[old]) for old, new in names.items() if old in w}

    return mapping


TORCH = {
    "dense": _renamed({"weight": "kernel", "bias": "bias"}, transpose=("weight",)),
    "conv": _renamed({"weight": "kernel", "bias": "bias"}),
    "batch_norm": _renamed(
        {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean", "running_var": "moving_variance"}
    ),
    "layer_norm": _renamed({"weight": "gamma", "bias": "beta"}),
    "recurrent": _renamed({"weight_ih_l0": "w_ih", "weight_hh_l0": "w_hh", "bias_ih_l0": "b_ih", "bias_hh_l0": "b_hh"}),
    "attention": _torch_attention,
    "rms_norm": _renamed({"weight": "gamma"}),
    "gated_mlp": _renamed(
        {
            f"{name}_proj.{part}": f"{name}/{'kernel' if part == 'weight' else 'bias'}"
            for name in ("gate", "up", "down")
            for part in ("weight", "bias")
        },
        transpose=("gate_proj.weight", "up_proj.weight", "down_proj.weight"),
    ),
}


def _by_leaf(w: dict) -> dict:
    """Keras nests a recurrent layer's weights under its cell (``lstm_cell/kernel``): keyed by the last name."""
    return {name.rsplit("/", 1)[-1]: value for name, value in w.items()}


def _keras_conv(w: dict, depthwise: bool) -> dict:
    kernel = w["kernel"]
    if depthwise:  # (kh, kw, C, m) -> (C*m, 1, kh, kw): output channel c*m + j filters input channel c
        kernel = np.moveaxis(kernel, (-2, -1), (0, 1))
        kernel = kernel.reshape(kernel.shape[0] * kernel.shape[1], 1, *kernel.shape[2:])
    else:  # ([kh,] kw, I, O) -> (O, I, [kh,] kw)
        kernel = np.moveaxis(kernel, (-1, -2), (0, 1))
    return {"kernel": kernel, **({"bias": w["bias"]} if "bias" in w else {})}


def _keras_recurrent(w: dict, cell: str) -> dict:
    w = _by_leaf(w)
    order = (1, 0, 2) if cell == "gru" else (0, 1, 2, 3)  # Keras GRU z, r, h -> torch r, z, n; LSTM i, f, c, o
    found = {"w_ih": _blocks(w["kernel"].T, order), "w_hh": _blocks(w["recurrent_kernel"].T, order)}
    bias = w.get("bias")
    if bias is not None and bias.ndim == 2:  # GRU reset_after: input and recurrent biases
        found["b_ih"], found["b_hh"] = _blocks(bias[0], order), _blocks(bias[1], order)
    elif bias is not None:
        found["b_ih"] = _blocks(bias, order)
    return found


def _keras_attention(w: dict) -> dict:
    found = {}
    for name in ("query", "key", "value"):
        if f"{name}/kernel" in w:
            kernel = w[f"{name}/kernel"]
            found[f"{name}/kernel"] = kernel.reshape(kernel.shape[0], -1)
        if f"{name}/bias" in w:
            found[f"{name}/bias"] = w[f"{name}/bias"].reshape(-1)
    if "attention_output/kernel" in w:
        kernel = w["attention_output/kernel"]
        found["out/kernel"] = kernel.reshape(-1, kernel.shape[-1])
    if "attention_output/bias" in w:
        found["out/bias"] = w["attention_output/bias"]
    return found


def _flax(w: dict, kind: str | None) -> dict:
    """A Flax module's own weights: a LayerNorm's ``scale`` and ``bias`` are gamma and beta; a ``Conv`` kernel is
    ``([kh,] kw, I/groups, O)`` as Keras holds it; a ``Dense`` kernel is ``(in, out)`` already."""
    if kind in ("layer_norm", "rms_norm"):
        return _renamed({"scale": "gamma", "bias": "beta"})(w)
    if kind == "conv":
        return _keras_conv(w, False)
    return w


def _keras(w: dict, kind: str | None, attrs: dict) -> dict:
    if attrs.get("weight_layout") == "flax":
        return _flax(w, kind)
    if kind == "conv":
        return _keras_conv(w, attrs.get("weight_layout") == "keras_depthwise")
    if kind == "recurrent":
        return _keras_recurrent(w, attrs.get("cell", "lstm"))
    if kind == "attention":
        return _keras_attention(w)
    if kind == "rms_norm":  # RMSNormalization's ``scale``, LayerNormalization(rms_scaling=True)'s ``gamma``
        return _renamed({"scale": "gamma", "gamma": "gamma"})(w)
    return w


def canonical_weights(all_weights: dict, prefix: str, kind: str | None = None, attrs: dict | None = None) -> dict:
    """The weights of the layer at ``prefix``, keyed by the canonical names of ``kind``'s module, as float64: those
    named ``prefix/...`` (canonical, or Keras' when ``attrs["weight_layout"]`` says so), else a torch module's
    ``prefix.name`` mapped by ``TORCH``."""
    attrs = attrs or {}
    head = f"{prefix}/"
    own = {
        name[len(head) :]: np.asarray(value, np.float64) for name, value in all_weights.items() if name.startswith(head)
    }
    if attrs.get("weight_layout") is not None:
        if attrs["weight_layout"] not in WEIGHT_LAYOUTS:
            raise ValueError(f"unknown weight_layout {attrs['weight_layout']!r}; known: {', '.join(WEIGHT_LAYOUTS)}")
        return _keras(own, kind, attrs) if own else own
    if own or kind not in TORCH:
        return own
    dotted = f"{prefix}."
    torch = {
        name[len(dotted) :]: np.asarray(value, np.float64)
        for name, value in all_weights.items()
        if name.startswith(dotted)
    }
    return TORCH[kind](torch)


ADAPTED = ("layout", "activation", "weight_layout")  # attributes ``bind`` handles; the kind's module never sees them


def _first(x):
    x = np.asarray(x, np.float64)
    return np.moveaxis(x, -1, 1) if x.ndim >= 3 else x


def _last(y):
    y = np.asarray(y, np.float64)
    return np.moveaxis(y, 1, -1) if y.ndim >= 3 else y


@dataclass(frozen=True)
class Bound:
    """A layer kind bound to its declared attributes: ``forward(inputs, weights)`` and ``variants`` (each
    ``compute(inputs, weights, attrs, observed)``) in the tap's own layout."""

    forward: Callable[[list[np.ndarray], dict[str, np.ndarray]], np.ndarray]
    variants: list[Any]


def bind(kind: str, attrs: dict) -> Bound:
    """``kind``'s module with ``attrs``' native layout and fused activation applied around it (see the module)."""
    module = get(kind)
    inner = {k: v for k, v in attrs.items() if k not in ADAPTED}
    channels_last = attrs.get("layout", "nchw") == "nhwc"
    if attrs.get("layout", "nchw") not in ("nchw", "nhwc"):
        raise ValueError(f"unknown layout {attrs['layout']!r}: 'nchw' (channels first) or 'nhwc' (channels last)")
    form = attrs.get("activation")
    if form is not None:
        from parity.diagnose.causes.layers.activation import FORMS

        if form not in FORMS:
            raise ValueError(f"unknown fused activation {form!r}; known: {', '.join(FORMS)}")

    def finish(y):
        if form is not None:
            y = get("activation").forward(
                [y], {}, {"form": form, **({"alpha": attrs["alpha"]} if "alpha" in attrs else {})}
            )
        return _last(y) if channels_last else np.asarray(y, np.float64)

    def start(inputs):
        return [_first(x) for x in inputs] if channels_last else list(inputs)

    def forward(inputs, weights, _attrs=None):
        return finish(module.forward(start(inputs), weights, inner))

    def adapt(variant):
        def compute(inputs, weights, _attrs, observed):
            observed = _first(observed) if channels_last and observed is not None else observed
            return finish(variant.compute(start(inputs), weights, inner, observed))

        return Variant(variant.name, variant.description, compute)

    variants = module.variants(inner)
    return Bound(forward, variants if form is None and not channels_last else [adapt(v) for v in variants])
