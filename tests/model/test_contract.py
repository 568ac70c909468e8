"""The model contract: named inputs (dtypes, value domains, named axes) and outputs of any structure, named the
same way everywhere; feeds checked before anything runs."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import numpy as np
import pytest

from parity.model import feeds, outputs
from parity.model.spec import InputSpec, ModelSpec, Values
from parity.runtimes.base import Runner, ShapeMismatch, is_array


def _spec(**changes):
    fields = {
        "name": "m",
        "description": "",
        "input": (
            InputSpec("input_ids", ("sequence",), dtype="int64", values=Values("integers", high=50)),
            InputSpec("attention_mask", ("sequence",), dtype="int64", values=Values("mask")),
            InputSpec("pixels", (3,), dtype="float32"),
        ),
        "axes": {"sequence": 8},
        "outputs": ("logits", "pooled"),
        "batch_size": 2,
        "weights_from_model": True,
        "torch_module": lambda: None,
        "loss": None,
    }
    spec = ModelSpec(**{**fields, **changes})
    spec.validate()
    return spec


class _Sum(Runner):
    """A NumPy model: logits = ids + mask (per token), pooled = pixel sums; returned as a dict."""

    def run_impl(self, x):
        return {
            "pooled": x["pixels"].sum(-1),
            "logits": (x["input_ids"] + x["attention_mask"]).astype(np.float32),
            "unused": None,
        }


@dataclasses.dataclass
class _Detections:
    boxes: np.ndarray
    scores: np.ndarray


def test_outputs_flatten_to_stable_names():
    tensor = np.zeros(2)
    nested = (
        OrderedDict(last_hidden_state=tensor, pooler_output=None, attentions=(tensor, tensor)),
        [_Detections(tensor, tensor)],
    )
    names = [name for name, _ in outputs.flatten(nested, is_array)]
    assert names == [
        "out.0.last_hidden_state",
        "out.0.attentions.0",
        "out.0.attentions.1",
        "out.1.0.boxes",
        "out.1.0.scores",
    ]
    assert [n for n, _ in outputs.flatten(tensor, is_array)] == ["output"]
    assert [n for n, _ in outputs.flatten({"a": {"b": tensor}}, is_array)] == ["a.b"]


def test_a_bare_tensor_or_a_flat_tuple_takes_the_declared_names_in_order():
    a, b = np.zeros(1), np.ones(1)
    assert list(outputs.named(("logits",), outputs.flatten(a, is_array))) == ["logits"]
    assert list(outputs.named(("x", "y"), outputs.flatten((a, b), is_array))) == ["x", "y"]
    assert list(outputs.named(("b",), outputs.flatten({"a": a, "b": b}, is_array))) == ["b"]
    with pytest.raises(outputs.OutputError, match=r"returns outputs a, b; the spec declares c"):
        outputs.named(("c",), outputs.flatten({"a": a, "b": b}, is_array))


def test_an_output_that_is_not_a_tensor_or_named_twice_is_refused():
    with pytest.raises(outputs.OutputError, match=r"model output 'out.1' is a str, not a tensor"):
        outputs.flatten((np.zeros(1), "text"), is_array)
    with pytest.raises(outputs.OutputError, match=r"two model outputs flatten to the name 'a.b'"):
        outputs.flatten({"a": {"b": np.zeros(1)}, "a.b": np.zeros(1)}, is_array)


def test_generated_feeds_follow_each_inputs_domain_and_the_named_axes():
    spec = _spec()
    x = feeds.generate(spec, 4, None, np.random.default_rng(0))
    assert x["input_ids"].shape == (4, 8) and x["input_ids"].dtype == np.int64
    assert 0 <= x["input_ids"].min() and x["input_ids"].max() < 50
    mask = x["attention_mask"]
    assert mask[0].all() and set(np.unique(mask)) <= {0, 1}
    assert all((np.diff(row) <= 0).all() and row[0] == 1 for row in mask)  # ones, then a padded tail
    assert x["pixels"].shape == (4, 3) and x["pixels"].dtype == np.float32
    shorter = feeds.generate(spec, 1, None, np.random.default_rng(0), {"sequence": 5})
    assert shorter["input_ids"].shape == (1, 5)


def test_runner_names_outputs_and_batches_any_number_of_samples():
    spec = _spec()
    x = feeds.generate(spec, 5, None, np.random.default_rng(1))
    out = feeds.run_batched(_Sum(spec, 2), x, 2)
    assert list(out) == ["logits", "pooled"] and out["logits"].shape == (5, 8)
    np.testing.assert_array_equal(out["pooled"], x["pixels"].sum(-1).astype(np.float32))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda x: {k: v for k, v in x.items() if k != "input_ids"}, r"input 'input_ids' of model 'm' is missing"),
        (lambda x: {**x, "extra": np.zeros(2)}, r"input 'extra' is not an input of model 'm'"),
        (
            lambda x: {**x, "input_ids": np.zeros((2, 8), np.float32)},
            r"input 'input_ids' is int64; it was given float32",
        ),
        (
            lambda x: {**x, "attention_mask": np.ones((2, 7), np.int64)},
            r"axis 'sequence' is 7 in input 'attention_mask' but 8",
        ),
        (
            lambda x: {**x, "pixels": np.zeros((2, 4), np.float32)},
            r"input 'pixels' has shape \(2, 4\), the model takes \(batch, 3\)",
        ),
    ],
)
def test_feeds_are_checked_before_anything_runs(change, message):
    spec = _spec()
    good = feeds.generate(spec, 2, None, np.random.default_rng(0))
    with pytest.raises(ShapeMismatch, match=message):
        _Sum(spec, 2).run(change(good))


def test_a_bare_array_feeds_only_a_model_with_one_input():
    with pytest.raises(Exception, match=r"takes 3 inputs \(input_ids, attention_mask, pixels\): pass a dict"):
        _Sum(_spec(), 2).run(np.zeros((2, 8)))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"axes": {}}, r"input 'input_ids' names axis 'sequence', which axes does not size"),
        ({"outputs": ("a", "a")}, r"output names must be unique"),
        ({"verify_shapes": ({"time": 3},)}, r"verify_shapes entry \{'time': 3\} is not"),
    ],
)
def test_spec_errors_name_what_is_wrong(changes, message):
    with pytest.raises(ValueError, match=message):
        _spec(**changes)


def test_bad_input_declarations_are_refused():
    with pytest.raises(ValueError, match=r"dtype 'string' is not one of"):
        InputSpec("x", (3,), dtype="string")
    with pytest.raises(ValueError, match=r"neither a size nor an axis name"):
        InputSpec("x", ("batch",))
    with pytest.raises(ValueError, match=r"take one value"):
        Values("integers", low=0, high=1)


def test_verification_shapes_default_to_batch_1_and_3_with_named_axes_halved():
    spec = _spec()
    assert spec.check_shapes() == [{"batch": 1, "sequence": 8}, {"batch": 3, "sequence": 4}]
    assert _spec(verify_shapes=()).check_shapes() == []
    assert _spec(verify_shapes=({"batch": 2}, {"sequence": 6})).check_shapes() == [{"batch": 2, "sequence": 6}]
