"""Diagnosis of a generation path at its first divergent step: the module tree through the cache against the float64
reference, the leaf, and the rotary position cause of a model whose export restarts positions at every call."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from parity.generation import diagnose, onnx_export, tasks
from parity.generation.diagnose_causes import rotary
from parity.platform.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"llama": "tests/lmmodels.py:llama", "faulty": "tests/lmmodels.py:faulty_llama"}
TOL = {"atol": 1e-4, "rtol": 1e-4}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Per model: the source, the golden file, and (on first use) the ONNX export and its meta."""
    base = tmp_path_factory.mktemp("generation-diagnose")
    made: dict = {}

    def get(name: str, onnx: bool = False):
        if name not in made:
            source = {"torch": SOURCES[name], "root": str(ROOT)}
            golden = base / f"{name}.npz"
            tasks.golden(source, str(golden), 4, [7, 4], 0)
            made[name] = {"source": source, "golden": str(golden), "dir": None, "meta": None}
        entry = made[name]
        if onnx and entry["meta"] is None:
            entry["dir"] = str(base / f"{name}-onnx")
            entry["meta"] = onnx_export.export_task(entry["source"], entry["dir"])
        return entry

    return get


def _diagnose(entry, path_id, generation):
    result = diagnose.diagnose(entry["source"], entry["golden"], path_id, entry["dir"], entry["meta"], generation, 1)
    json.dumps(result, allow_nan=False)
    return result


def _verified(entry, path_id):
    return tasks.check(entry["source"], entry["golden"], path_id, entry["dir"], entry["meta"], 1)["generation"]


@pytest.mark.slow  # a second proof of the rotary restart named at step 1 on ort; the fast set keeps its diagnosis in
# test_generation_repro.py::test_the_decode_step_is_cut_to_the_rotary_embedding_and_its_repro_shows_the_departure, and
# a generation cause at its first divergent step test_generation_causes.py (faulty_decode_mask)
def test_rotary_restart_is_named_at_the_first_divergent_step_on_ort(tiny):
    entry = tiny("faulty", onnx=True)
    generation = _verified(entry, "torch/onnx/ort")
    assert generation["first_divergent_step"] == 1 and generation["mode"] == "decode"
    result = _diagnose(entry, "torch/onnx/ort", generation)
    assert (result["step"], result["mode"]) == (1, "decode")
    assert result["first_divergent_path"] == ["(root)", "model", "model.rotary_emb"]
    assert result["leaf"]["path"] == "model.rotary_emb" and result["leaf"]["tol_units"] > 1
    assert [row["path"] for row in result["rows"]] == result["first_divergent_path"]
    assert all(row["tol_units"] > 1 for row in result["rows"])
    assert result["cause"]["variant"] == "positions_restart"
    assert result["cause"]["description"] == "positions restart at 0 in each call"
    assert result["cause"]["after"]["tol_units"] <= 1 < result["cause"]["before"]["tol_units"]
    assert "positions restart at 0" in result["note"]


@pytest.mark.slow
def test_rotary_restart_on_the_padded_batch(tiny):
    """The padded batch's rows sit at different positions: only the restart reproduces, no single offset."""
    entry = tiny("faulty", onnx=True)
    result = _diagnose(entry, "torch/onnx/ort", {"first_divergent_step": 2, "batch": "padded"})
    assert result["leaf"]["path"] == "model.rotary_emb"
    assert result["cause"]["variant"] == "positions_restart" and result["cause"]["also"] == []


@pytest.mark.slow
def test_prefill_of_the_faulty_export_names_nothing(tiny):
    """Rotary attention reads only position differences: a prefill from 0 is right, the tables themselves differ
    only on the padded rows' pads, which are left out."""
    entry = tiny("faulty", onnx=True)
    result = _diagnose(entry, "torch/onnx/ort", {"first_divergent_step": 0, "batch": "batch1"})
    assert result["first_divergent_path"] == [] and result["leaf"] is None and result["cause"] is None
    assert result["compared"] > 20


@pytest.mark.parametrize("path_id", ["torch", pytest.param("torch/onnx/ort", marks=pytest.mark.slow)])
def test_a_correct_llama_names_nothing(tiny, path_id):
    entry = tiny("llama", onnx=path_id != "torch")
    for step, batch in ((1, "batch1"), (0, "padded"), (3, "padded")):
        result = _diagnose(entry, path_id, {"first_divergent_step": step, "batch": batch})
        assert result["first_divergent_path"] == [] and result["leaf"] is None and result["cause"] is None, result
        assert result["step"] == step and result["unmapped"] == 0 and result["compared"] > 20


def test_the_faulty_model_in_eager_float32_names_nothing(tiny):
    entry = tiny("faulty")
    result = _diagnose(entry, "torch", {"first_divergent_step": 1, "batch": "batch1"})
    assert result["leaf"] is None and "every module agrees" in result["note"]


def test_a_passing_path_or_an_unread_one_is_not_diagnosed(tiny):
    entry = tiny("llama")
    passing = _diagnose(
        entry, "torch", {"first_divergent_step": None, "consistency": {"chunked_prefill": {"ok": True}}}
    )
    assert passing["step"] is None and passing["leaf"] is None and "nothing to diagnose" in passing["note"]
    genai = _diagnose(entry, "torch/genai", {"first_divergent_step": 1, "batch": "batch1"})
    assert genai["unavailable"] and genai["leaf"] is None


def test_a_failing_consistency_check_is_diagnosed_at_its_step():
    assert diagnose.step_of(
        {"first_divergent_step": None, "steps": 4, "consistency": {"cache_vs_full": {"ok": False}}}
    )[:3] == (1, "padded", "decode")
    assert diagnose.step_of({"consistency": {"chunked_prefill": {"ok": False}}})[:2] == (0, "padded")


def test_bad_requests_are_usage_errors(tiny):
    entry = tiny("llama")
    with pytest.raises(UsageError, match="outside"):
        _diagnose(entry, "torch", {"first_divergent_step": 9, "batch": "batch1"})
    with pytest.raises(UsageError, match="no batch"):
        _diagnose(entry, "torch", {"first_divergent_step": 1, "batch": "batch7"})
    with pytest.raises(UsageError, match="ONNX folder"):
        _diagnose(
            {**entry, "dir": None, "meta": None}, "torch/onnx/ort", {"first_divergent_step": 1, "batch": "batch1"}
        )


def test_rotary_cause_names_an_offset_and_nothing_on_right_tables():
    inv_freq = (1.0 / 10000.0 ** (np.arange(0, 8, 2) / 8)).astype(np.float32).tolist()
    attrs = {"inv_freq": inv_freq}
    pos = np.array([[5, 6, 7]])
    from parity.generation.diagnose_causes import _tables

    shifted = rotary(attrs, pos, _tables(attrs, pos + 1), None, TOL)
    assert shifted["variant"] == "position_offset+1"
    right = rotary(attrs, pos, _tables(attrs, pos)[::-1], None, TOL)  # sine first: the pairing does not matter
    assert right["variant"] is None and right["before"]["tol_units"] <= 1
    noise = rotary(attrs, pos, [t + 0.5 for t in _tables(attrs, pos)], None, TOL)
    assert noise["variant"] is None and "no restart" in noise["explanation"]


def test_attention_at_a_prefill_is_tested_through_the_catalogue(tiny):
    """The leaf typed attention at a prefill (its cache still empty): a head order that tiles the key/value heads is
    named from the path's own input and rotary tables."""
    from parity.diagnose.causes.layers.native import bind, canonical_weights
    from parity.generation import diagnose_causes
    from parity.generation.model import load
    from parity.generation.tasks import read_golden

    entry = tiny("llama")
    sets, gold = read_golden(entry["golden"])
    ids, mask = sets["padded"]["input_ids"], sets["padded"]["attention_mask"]
    model = load(entry["source"], "float64")
    ref = diagnose.torch_step(model, ids, mask, gold["padded"]["tokens"], 0)
    leaf = "model.layers.0.self_attn"
    attrs, further = ref.further[leaf]
    attrs = {"heads": 4, "kv_heads": 2, "rotary": "half", **attrs}
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    inputs = [ref.inputs[leaf], *further.values()]
    bound = bind("attention", attrs)
    tiled = next(v for v in bound.variants if v.name == "kv_heads_tiled")
    observed = tiled.compute(inputs, canonical_weights(weights, leaf, "attention", attrs), attrs, None)
    feed = diagnose.call_inputs(ids, mask, gold["padded"]["tokens"], 0)
    context = {
        "module": model.get_submodule(leaf),
        "root": model,
        "path": leaf,
        "observed": [observed],
        "feed": feed,
        "reference": ref,
        "path_further": {},
        "path_inputs": {leaf: ref.inputs[leaf]},
        "path_values": ref.values,
        "weights": weights,
        "tolerances": TOL,
        "keep": feed["attention_mask"].astype(bool),
    }
    found = diagnose_causes.test(context)
    assert found["kind"] == "attention" and found["variant"] == "kv_heads_tiled", found
    context["observed"] = ref.values[leaf]
    assert diagnose_causes.test(context)["variant"] is None
