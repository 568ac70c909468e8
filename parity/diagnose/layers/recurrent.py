"""recurrent: one unidirectional GRU or LSTM layer over ``(batch, time, features)``, from a zero state, returning
the hidden state at every step ``(batch, time, hidden)``.

Weights, as PyTorch holds them (the gate blocks stacked along the first axis): ``w_ih`` ``(G*H, I)``, ``w_hh``
``(G*H, H)``, ``b_ih`` and ``b_hh`` ``(G*H,)``; LSTM gates ``i, f, g, o`` (G = 4), GRU gates ``r, z, n`` (G = 3).
Attribute ``cell``: ``"lstm"`` or ``"gru"``.

* LSTM: ``c' = f*c + i*g``, ``h' = o*tanh(c')`` with ``i, f, o = sigmoid(.)``, ``g = tanh(.)``;
* GRU (PyTorch): ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))`` (ONNX ``linear_before_reset=1``),
  ``h' = (1 - z) * n + z * h``.

Variants (how a converter or a port can read the same weights):

* ``gates_onnx_order``: the gate blocks taken in ONNX's order (LSTM ``i, o, f, c``; GRU ``z, r, h``) as if they
  were PyTorch's;
* ``linear_before_reset_0`` (GRU): the reset gate applied before the hidden projection, ``W_hn (r * h)``,
  ONNX's default;
* ``hidden_bias_dropped``: ``b_hh`` lost.
"""

from __future__ import annotations

import numpy as np

from parity.diagnose.layers import NotApplicable, Variant

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
    return run(inputs[0], weights, cell)


def _onnx_order(inputs, weights, attrs, observed):
    cell = attrs.get("cell", "lstm")
    # where PyTorch's block k sits when the blocks are read in ONNX's order: LSTM i,o,f,c; GRU z,r,h
    order = (0, 2, 3, 1) if cell == "lstm" else (1, 0, 2)
    return run(inputs[0], weights, cell, order=order)


def _reset_first(inputs, weights, attrs, observed):
    if attrs.get("cell", "lstm") != "gru":
        raise NotApplicable("an LSTM has no reset gate")
    return run(inputs[0], weights, "gru", linear_before_reset=False)


def _no_hidden_bias(inputs, weights, attrs, observed):
    if weights.get("b_hh") is None:
        raise NotApplicable("the layer has no hidden bias")
    return run(inputs[0], weights, attrs.get("cell", "lstm"), hidden_bias=False)


def variants(attrs):
    return [Variant("gates_onnx_order", "gate blocks read in ONNX's order (LSTM i,o,f,c; GRU z,r,h) as PyTorch's",
                    _onnx_order),
            Variant("linear_before_reset_0", "GRU reset gate applied before the hidden projection (ONNX's default "
                    "linear_before_reset=0; PyTorch applies it after)", _reset_first),
            Variant("hidden_bias_dropped", "the hidden-to-hidden bias b_hh lost", _no_hidden_bias)]
