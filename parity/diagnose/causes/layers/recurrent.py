"""recurrent: one unidirectional GRU or LSTM layer over ``(batch, time, features)``, from a zero state, returning
the hidden state at every step ``(batch, time, hidden)``.

Weights, as PyTorch holds them (the gate blocks stacked along the first axis): ``w_ih`` ``(G*H, I)``, ``w_hh``
``(G*H, H)``, ``b_ih`` and ``b_hh`` ``(G*H,)``; LSTM gates ``i, f, g, o`` (G = 4), GRU gates ``r, z, n`` (G = 3).
Attributes: ``cell`` ``"lstm"`` or ``"gru"``; ``linear_before_reset`` (GRU, default True: PyTorch's and Keras'
``reset_after=True``; False: Keras ``reset_after=False``, ONNX's default); ``sequences`` (default True: every step,
as PyTorch's output and Keras' ``return_sequences=True``; False: the last step only, ``(batch, hidden)``, Keras'
default).

* LSTM: ``c' = f*c + i*g``, ``h' = o*tanh(c')`` with ``i, f, o = sigmoid(.)``, ``g = tanh(.)``;
* GRU (PyTorch): ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))`` (ONNX ``linear_before_reset=1``),
  ``h' = (1 - z) * n + z * h``.

Variants (how a converter or a port can read the same weights):

* ``gates_onnx_order``: the gate blocks taken in ONNX's order (LSTM ``i, o, f, c``; GRU ``z, r, h``, which is also
  Keras' GRU order) as if they were PyTorch's (LSTM ``i, f, g, o``, Keras' too; GRU ``r, z, n``);
* ``linear_before_reset_0`` (GRU declared with it): the reset gate applied before the hidden projection,
  ``W_hn (r * h)``, ONNX's default; ``linear_before_reset_1`` (declared without it): after, ``r * (W_hn h)``;
* ``hidden_bias_dropped``: ``b_hh`` lost.
"""

from __future__ import annotations

import numpy as np

from parity.diagnose.causes.layers import NotApplicable, Variant

KIND = "recurrent"
GATES = {"lstm": 4, "gru": 3}


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _blocks(weights, order=None):
    w = {k: np.asarray(weights[k], np.float64) if k in weights else None for k in ("w_ih", "w_hh", "b_ih", "b_hh")}
    if order is not None:
        for key, value in w.items():
            if value is not None:
                parts = np.split(value, len(order), axis=0)
                w[key] = np.concatenate([parts[i] for i in order], axis=0)
    return w


def run(x, weights, cell: str, linear_before_reset: bool = True, order=None, hidden_bias: bool = True):
    x = np.asarray(x, np.float64)
    w = _blocks(weights, order)
    size = w["w_hh"].shape[1]
    b_ih = w["b_ih"] if w["b_ih"] is not None else 0.0
    b_hh = w["b_hh"] if w["b_hh"] is not None and hidden_bias else np.zeros(GATES[cell] * size)
    h = np.zeros((x.shape[0], size))
    c = np.zeros_like(h)
    out = []
    for t in range(x.shape[1]):
        gi = x[:, t] @ w["w_ih"].T + b_ih
        if cell == "lstm":
            gates = gi + h @ w["w_hh"].T + b_hh
            i, f, g, o = np.split(gates, 4, axis=1)
            c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
            h = _sigmoid(o) * np.tanh(c)
        else:
            xr, xz, xn = np.split(gi, 3, axis=1)
            w_hr, w_hz, w_hn = np.split(w["w_hh"], 3, axis=0)
            b_hr, b_hz, b_hn = np.split(b_hh, 3)
            r = _sigmoid(xr + h @ w_hr.T + b_hr)
            z = _sigmoid(xz + h @ w_hz.T + b_hz)
            hidden = r * (h @ w_hn.T + b_hn) if linear_before_reset else (r * h) @ w_hn.T + b_hn
            n = np.tanh(xn + hidden)
            h = (1.0 - z) * n + z * h
        out.append(h)
    return np.stack(out, axis=1)


def forward(inputs, weights, attrs):
    cell = attrs.get("cell", "lstm")
    if cell not in GATES:
        raise ValueError(f"unknown recurrent cell {cell!r}; known: {', '.join(GATES)}")
    return _declared(inputs, weights, attrs)


def _declared(inputs, weights, attrs, **changes):
    """The declared layer, with ``changes`` to ``run``'s options; the last step only unless ``sequences``."""
    options = {"linear_before_reset": bool(attrs.get("linear_before_reset", True)), **changes}
    out = run(inputs[0], weights, attrs.get("cell", "lstm"), **options)
    return out if attrs.get("sequences", True) else out[:, -1]


def _onnx_order(inputs, weights, attrs, observed):
    # where PyTorch's block k sits when the blocks are read in ONNX's order: LSTM i,o,f,c; GRU z,r,h
    return _declared(inputs, weights, attrs, order=(0, 2, 3, 1) if attrs.get("cell", "lstm") == "lstm" else (1, 0, 2))


def _reset_flipped(inputs, weights, attrs, observed):
    if attrs.get("cell", "lstm") != "gru":
        raise NotApplicable("an LSTM has no reset gate")
    return _declared(inputs, weights, attrs, linear_before_reset=not attrs.get("linear_before_reset", True))


def _no_hidden_bias(inputs, weights, attrs, observed):
    if weights.get("b_hh") is None or not np.any(weights["b_hh"]):
        raise NotApplicable("the layer has no hidden bias")
    return _declared(inputs, weights, attrs, hidden_bias=False)


def variants(attrs):
    after = bool(attrs.get("linear_before_reset", True))
    return [
        Variant(
            "gates_onnx_order",
            "gate blocks read in ONNX's (and Keras GRU's) order (LSTM i,o,f,c; GRU z,r,h) as PyTorch's",
            _onnx_order,
        ),
        Variant(
            f"linear_before_reset_{int(not after)}",
            "GRU reset gate applied before the hidden projection (ONNX's default linear_before_reset=0; "
            "PyTorch applies it after)"
            if after
            else "GRU reset gate applied after the hidden projection "
            "(linear_before_reset=1, PyTorch's form) where the layer declares it before",
            _reset_flipped,
        ),
        Variant("hidden_bias_dropped", "the hidden-to-hidden bias b_hh lost", _no_hidden_bias),
    ]
