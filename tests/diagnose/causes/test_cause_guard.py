"""A layer typed by its class (a subclass, typed as its base) is tested for a cause only where its declared form
reproduces the reference's own output from the reference's own input: one that computes something else gets no
variant named, however well a variant fits the path."""

from __future__ import annotations

import numpy as np

from parity.diagnose.causes.cause import not_its_kind, test_layer
from parity.model.spec import Layer, Tolerance

TOL = Tolerance(atol=1e-5, rtol=1e-5)


def _norm(x, eps):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)


def test_a_layer_that_computes_its_declared_form_is_tested():
    x = np.random.default_rng(0).standard_normal((2, 4, 8)) * 0.01
    layer = Layer("layer_norm", {"eps": 1e-5})
    assert not_its_kind(layer, [x], {}, _norm(x, 1e-5), TOL, None, "norm") is None
    # and the path's epsilon is named as before
    assert test_layer(layer, [x], {}, _norm(x, 1e-3), TOL, prefix=None)["cause"]["variant"] == "eps=1e-3"


def test_a_subclass_computing_something_else_gets_no_cause():
    """The reference itself computes with epsilon 1e-3 (the subclass's own ``call``): the path agreeing with a variant
    says nothing about a converter, so no cause is named and the reason is said."""
    x = np.random.default_rng(0).standard_normal((2, 4, 8)) * 0.01
    found = not_its_kind(Layer("layer_norm", {"eps": 1e-5}), [x], {}, _norm(x, 1e-3), TOL, None, "norm (MyNorm)")
    assert found is not None and found["cause"] is None
    assert "norm (MyNorm) is typed layer_norm" in found["explanation"]
    assert "computes something else" in found["explanation"]
