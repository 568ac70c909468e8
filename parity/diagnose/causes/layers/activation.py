"""activation: an elementwise non-linearity, attribute ``form``.

Forms (float64): ``relu`` max(x, 0); ``relu6`` min(max(x, 0), 6); ``leaky_relu`` x if x >= 0
else alpha*x (attribute ``alpha``, default 0.01 as in PyTorch and JAX); ``gelu_erf``
0.5x(1 + erf(x/sqrt 2)); ``gelu_tanh`` 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))); ``gelu_sigmoid``
x*sigmoid(1.702x); ``sigmoid``; ``tanh``; ``silu`` x*sigmoid(x); ``hard_swish`` x*relu6(x+3)/6;
``hard_sigmoid`` clip(alpha*x + 0.5, 0, 1) (attribute ``alpha``, default 1/6 as in PyTorch
``Hardsigmoid`` and Keras 3); ``softplus`` log(1 + e^(beta*x))/beta, and x itself where beta*x > threshold
(attributes ``beta``, default 1, and ``threshold``, default none: PyTorch's ``nn.Softplus(beta, threshold)``
reverts to the identity above its threshold, 20 by default; Keras' and ONNX's ``Softplus`` have no threshold);
``log_sigmoid`` log(sigmoid(x)) computed stably, -log(1 + e^-x) (PyTorch ``nn.LogSigmoid``, Keras ``log_sigmoid``).

Variants are the declared form's known neighbours; a neighbour equal to the declared form on
the inputs at hand (``relu6`` with nothing above 6) is not applicable there:

* GELU: ``gelu_erf`` / ``gelu_tanh`` / ``gelu_sigmoid``: PyTorch ``nn.GELU()`` and
  ``jax.nn.gelu(approximate=False)`` are exact, ``jax.nn.gelu`` defaults to ``approximate=True``
  (tanh), Keras ``gelu`` defaults to ``approximate=False``; tanh fusions in converters and
  the 1.702 sigmoid form (the GELU paper, quick_gelu in CLIP) replace one by another;
* ReLU family: ``relu`` / ``relu6`` (MobileNet, TFLite fused ReLU6) / ``leaky_relu_<alpha>``
  (alpha 0.01 PyTorch/JAX, 0.2 ``tf.nn.leaky_relu``, 0.3 Keras ``LeakyReLU``);
* hard sigmoid: ``hard_sigmoid`` (slope 1/6: PyTorch, Keras 3) / ``hard_sigmoid_0.2`` (slope
  0.2: Keras 2 and ONNX ``HardSigmoid``'s default alpha, when a converter omits alpha) /
  ``sigmoid``;
* ``silu`` / ``hard_swish`` (MobileNetV3's approximation, swapped in by mobile converters);
* softplus: ``softplus_no_threshold`` (the threshold lost: ONNX ``Softplus`` has none, and torch.onnx's TorchScript
  exporter writes ``Softplus(beta*x)/beta``, dropping it), ``softplus_beta_dropped`` (beta lost, the threshold
  kept on x: a scale within 1e-5 of 1 removed by an ONNX optimiser's no-op rule), ``softplus_plain`` (both lost:
  ONNX ``Softplus(x)``; OpenVINO's PyTorch frontend computes this for ``softplus(beta=2, threshold=5)``);
* log-sigmoid: ``log_of_sigmoid``, the log of a sigmoid computed in float32 (torch.onnx's ``Log(Sigmoid(x))``, and
  OpenVINO's and LiteRT's lowerings): a float32 sigmoid is right to about float32's resolution at 1, 2^-24, absolute,
  so its log lies within ``log(sigmoid -+ 2^-24)``. Where the true sigmoid is below 2^-24 (x below about -16.6) the
  float32 one may underflow to 0 (ONNX Runtime's below about -17, a flushed subnormal below -88): the variant is
  -inf where the path gives -inf there, and where it gives a finite value, the declared one to float32's rounding
  there (4 units in the last place, or a subnormal's spacing: a path that clamps the log-sigmoid is not this); above
  -16.6 the interval (the observed value where it lies inside, its nearer end elsewhere). It applies only where the
  path gives -inf at an input where a float32 sigmoid can underflow.
"""

from __future__ import annotations

import math

import numpy as np

from parity.diagnose.causes.layers import NotApplicable, Variant

KIND = "activation"
_ERF = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x):
    return np.exp(-np.logaddexp(0.0, -x))


FORMS = {
    "relu": lambda x, alpha: np.maximum(x, 0.0),
    "relu6": lambda x, alpha: np.clip(x, 0.0, 6.0),
    "leaky_relu": lambda x, alpha: np.where(x >= 0, x, alpha * x),
    "gelu_erf": lambda x, alpha: 0.5 * x * (1.0 + _ERF(x * math.sqrt(0.5))),
    "gelu_tanh": lambda x, alpha: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
    "gelu_sigmoid": lambda x, alpha: x * _sigmoid(1.702 * x),
    "sigmoid": lambda x, alpha: _sigmoid(x),
    "tanh": lambda x, alpha: np.tanh(x),
    "silu": lambda x, alpha: x * _sigmoid(x),
    "hard_swish": lambda x, alpha: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0,
    "hard_sigmoid": lambda x, alpha: np.clip(alpha * x + 0.5, 0.0, 1.0),
    "softplus": lambda x, alpha: np.logaddexp(0.0, x),  # beta 1, no threshold; ``forward`` reads both
    "log_sigmoid": lambda x, alpha: -np.logaddexp(0.0, -x),
}
FLOAT32_AT_ONE = 2.0**-24  # the absolute resolution of a float32 value near 1: half its unit in the last place
FLOAT32_SUBNORMAL = 2.0**-149  # the spacing of float32's subnormals
DEFAULT_ALPHA = {"leaky_relu": 0.01, "hard_sigmoid": 1.0 / 6.0}
_LEAKY = (0.01, 0.2, 0.3)
_NEIGHBOURS = {  # declared form -> (variant name, form, alpha)
    "relu": [("relu6", "relu6", None)] + [(f"leaky_relu_{a:g}", "leaky_relu", a) for a in _LEAKY],
    "relu6": [("relu", "relu", None)],
    "leaky_relu": [("relu", "relu", None)] + [(f"leaky_relu_{a:g}", "leaky_relu", a) for a in _LEAKY],
    "gelu_erf": [("gelu_tanh", "gelu_tanh", None), ("gelu_sigmoid", "gelu_sigmoid", None)],
    "gelu_tanh": [("gelu_erf", "gelu_erf", None), ("gelu_sigmoid", "gelu_sigmoid", None)],
    "gelu_sigmoid": [("gelu_erf", "gelu_erf", None), ("gelu_tanh", "gelu_tanh", None)],
    "sigmoid": [("hard_sigmoid", "hard_sigmoid", 1.0 / 6.0), ("hard_sigmoid_0.2", "hard_sigmoid", 0.2)],
    "hard_sigmoid": [
        ("hard_sigmoid_1/6", "hard_sigmoid", 1.0 / 6.0),
        ("hard_sigmoid_0.2", "hard_sigmoid", 0.2),
        ("sigmoid", "sigmoid", None),
    ],
    "silu": [("hard_swish", "hard_swish", None)],
    "hard_swish": [("silu", "silu", None)],
}


def _softplus(x, beta: float = 1.0, threshold: float | None = None):
    y = np.logaddexp(0.0, beta * x) / beta
    return y if threshold is None else np.where(beta * x > threshold, x, y)


def forward(inputs, weights, attrs):
    form = attrs["form"]
    if form == "softplus":
        return _softplus(np.asarray(inputs[0], np.float64), attrs.get("beta", 1.0), attrs.get("threshold"))
    if form not in FORMS:
        raise ValueError(f"unknown activation form {form!r}; known: {', '.join(FORMS)}")
    return FORMS[form](np.asarray(inputs[0], np.float64), attrs.get("alpha", DEFAULT_ALPHA.get(form)))


def _neighbour(form, alpha):
    def compute(inputs, weights, attrs, observed):
        x = np.asarray(inputs[0], np.float64)
        y = FORMS[form](x, alpha)
        if np.array_equal(y, forward(inputs, weights, attrs)):
            raise NotApplicable(f"{form} equals the declared {attrs['form']} on these inputs")
        return y

    return compute


def _softplus_other(beta=None, threshold=True):
    """The declared softplus with its beta (None: kept) or its threshold (False: dropped) lost."""

    def compute(inputs, weights, attrs, observed):
        x = np.asarray(inputs[0], np.float64)
        y = _softplus(
            x, attrs.get("beta", 1.0) if beta is None else beta, attrs.get("threshold") if threshold else None
        )
        if np.array_equal(y, forward(inputs, weights, attrs)):
            raise NotApplicable("equals the declared softplus on these inputs")
        return y

    return compute


def _softplus_variants(attrs) -> list[Variant]:
    beta, threshold = attrs.get("beta", 1.0), attrs.get("threshold")
    found = []
    # above its threshold the declared form is x, off from the curve by at most log(1 + e^-threshold)/beta: below
    # float32's resolution at torch's default (20), so it cannot be told apart there
    if threshold is not None and math.log1p(math.exp(-threshold)) / beta > 1e-7:
        found.append(
            Variant(
                "softplus_no_threshold",
                f"softplus without its threshold ({threshold:g}): "
                f"log(1 + e^(beta x))/beta everywhere, where the declared form is x above it",
                _softplus_other(threshold=False),
            )
        )
    if beta != 1.0:
        found.append(
            Variant(
                "softplus_beta_dropped",
                f"softplus with beta 1 instead of {beta:g} (the threshold kept)",
                _softplus_other(beta=1.0),
            )
        )
        if threshold is not None:
            found.append(
                Variant(
                    "softplus_plain",
                    f"plain softplus log(1 + e^x): beta {beta:g} and threshold {threshold:g} both lost",
                    _softplus_other(beta=1.0, threshold=False),
                )
            )
    return found


def _log_of_sigmoid(inputs, weights, attrs, observed):
    """The log of a float32 sigmoid (module docstring): -inf where the observed value is and the float32 sigmoid may
    be 0; elsewhere the observed value where a float32 sigmoid's rounding holds it, the nearer end elsewhere."""
    x = np.asarray(inputs[0], np.float64)
    sigmoid = _sigmoid(x)
    may_underflow = sigmoid < FLOAT32_AT_ONE
    if not may_underflow.any():
        raise NotApplicable("no input where a float32 sigmoid can underflow to 0 (all above about -16.6)")
    if observed is None or np.shape(observed) != x.shape:
        raise NotApplicable("no observed output of this shape to find the underflows in")
    observed = np.asarray(observed, np.float64)
    underflow = may_underflow & np.isneginf(observed)
    if not underflow.any():
        raise NotApplicable("no -inf where a float32 sigmoid can underflow to 0: nothing a float32 sigmoid explains")
    with np.errstate(divide="ignore"):
        low = np.log(np.maximum(sigmoid - FLOAT32_AT_ONE, 0.0))
        high = np.log(np.minimum(sigmoid + FLOAT32_AT_ONE, 1.0))
    # below 2^-24 a finite float32 sigmoid is right to a few units in its last place, or to the subnormal spacing
    step = 4.0 * np.finfo(np.float32).eps * sigmoid + FLOAT32_SUBNORMAL
    with np.errstate(divide="ignore"):
        low = np.where(may_underflow, np.log(np.maximum(sigmoid - step, 0.0)), low)
        high = np.where(may_underflow, np.log(sigmoid + step), high)
    rounded = np.where(np.isnan(observed), high, np.clip(observed, low, high))
    return np.where(underflow, -np.inf, rounded)


def variants(attrs):
    declared = attrs["form"]
    if declared == "softplus":
        return _softplus_variants(attrs)
    if declared == "log_sigmoid":
        return [
            Variant(
                "log_of_sigmoid",
                "log(sigmoid(x)) with the sigmoid in float32 (Log(Sigmoid)): -inf where the sigmoid underflows to 0, "
                "where the declared log-sigmoid is finite",
                _log_of_sigmoid,
            )
        ]
    alpha = attrs.get("alpha", DEFAULT_ALPHA.get(declared))
    found = []
    for name, form, a in _NEIGHBOURS.get(declared, []):
        if form == declared and abs(a - alpha) < 1e-12:
            continue  # the declared form itself
        what = form if a is None else f"{form} (alpha {a:g})"
        found.append(Variant(name, f"{what} instead of the declared {declared}", _neighbour(form, a)))
    return found
