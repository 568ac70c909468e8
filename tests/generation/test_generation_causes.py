"""Causes for the layers decoders are made of, named by the diagnosis at the first divergent step of an ONNX path:
tiny models whose export alone carries one fault each (tests/lmmodels.py), checked on torch/onnx/ort, then diagnosed
down to the leaf, whose recomputation in float64 with the variant reproduces the path where the declared form does
not."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from parity.generation import diagnose, diagnose_attention, onnx_export, tasks

ROOT = Path(__file__).resolve().parents[2]
ATTENTION = "model.layers.0.self_attn"
# fault -> (first divergent step, mode, batch, leaf, cause)
FAULTS = {
    "faulty_cache_float16": (1, "decode", "batch1", ATTENTION, "cache_float16"),
    "faulty_decode_mask": (1, "decode", "padded", ATTENTION, "mask_dropped"),
    "faulty_gqa_tiled": (0, "prefill", "batch1", ATTENTION, "kv_heads_tiled"),
    "faulty_mistral_window": (0, "prefill", "batch1", ATTENTION, "window_dropped"),
    "faulty_gemma2_attention_softcap": (0, "prefill", "batch1", ATTENTION, "softcap_dropped"),
    "faulty_gemma2_logit_softcap": (0, "prefill", "batch1", "(root)", "logit_softcap_dropped"),
    "faulty_gemma2_embedding_scale": (0, "prefill", "batch1", "model.embed_tokens", "embed_scale_dropped"),
}
FAST = ("faulty_decode_mask",)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Per factory of tests/lmmodels.py: the source, its golden (prompts 7 and 4, 4 steps), the ONNX export."""
    base = tmp_path_factory.mktemp("generation-causes")
    made: dict = {}

    def get(name: str) -> dict:
        if name not in made:
            source = {"torch": f"tests/lmmodels.py:{name}", "root": str(ROOT)}
            golden = base / f"{name}.npz"
            tasks.golden(source, str(golden), 4, [7, 4], 0)
            folder = str(base / f"{name}-onnx")
            made[name] = {
                "source": source,
                "golden": str(golden),
                "dir": folder,
                "meta": onnx_export.export_task(source, folder),
            }
        return made[name]

    return get


def _check(entry) -> dict:
    return tasks.check(entry["source"], entry["golden"], "torch/onnx/ort", entry["dir"], entry["meta"], 1)["generation"]


def _diagnose(entry, generation) -> dict:
    result = diagnose.diagnose(
        entry["source"], entry["golden"], "torch/onnx/ort", entry["dir"], entry["meta"], generation, 1
    )
    json.dumps(result, allow_nan=False)
    return result


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in FAULTS])
def test_each_fault_is_named_at_its_first_divergent_step(exported, name):
    step, mode, batch, leaf, variant = FAULTS[name]
    entry = exported(name)
    generation = _check(entry)
    assert (generation["first_divergent_step"], generation["mode"], generation["batch"]) == (step, mode, batch)
    result = _diagnose(entry, generation)
    assert (result["step"], result["mode"], result["batch"]) == (step, mode, batch)
    assert result["leaf"]["path"] == leaf and result["first_divergent_path"][-1] == leaf, result["note"]
    assert result["leaf"]["tol_units"] > 1
    cause = result["cause"]
    assert cause is not None and cause["variant"] == variant, result["note"]
    assert cause["after"]["tol_units"] <= 1 < cause["before"]["tol_units"]
    assert cause["description"] in result["note"]


@pytest.mark.slow
def test_tiled_heads_are_named_at_a_decode_step_too(exported):
    """At a decode step the attention reads the cache: the recomputation takes the reference's cached keys and
    values, and the tiled head order still reproduces the path."""
    entry = exported("faulty_gqa_tiled")
    for batch in ("batch1", "padded"):
        result = _diagnose(entry, {"first_divergent_step": 2, "batch": batch})
        assert result["leaf"]["path"] == ATTENTION and result["mode"] == "decode", result["note"]
        assert result["cause"]["variant"] == "kv_heads_tiled", result["note"]


def test_a_dropped_decode_mask_leaves_batch_1_and_the_prefill_alone(exported):
    entry = exported("faulty_decode_mask")
    for step, batch in ((1, "batch1"), (0, "padded")):
        result = _diagnose(entry, {"first_divergent_step": step, "batch": batch})
        assert result["leaf"] is None and result["cause"] is None, result["note"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemma2_capped", "mistral_window"])
def test_a_correct_model_names_no_cause(exported, name):
    entry = exported(name)
    generation = _check(entry)
    assert generation["first_divergent_step"] is None, generation
    for step, batch in ((0, "padded"), (2, "padded"), (3, "batch1")):
        result = _diagnose(entry, {"first_divergent_step": step, "batch": batch})
        assert result["leaf"] is None and result["cause"] is None, result["note"]
        assert result["unmapped"] == 0


def test_the_float64_attention_matches_transformers_at_a_decode_step():
    """``attend`` over a cache, with Gemma-2's softcap and a window of 3, against the float64 eager module itself;
    each variant departs from the declared form."""
    import torch
    from lmmodels import _build
    from transformers import DynamicCache

    model = _build("gemma2", 5, attn="eager", head_dim=16, sliding_window=3, attn_logit_softcapping=1.0).double()
    with torch.no_grad():  # scores of a few units, where the softcap bites
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
            layer.self_attn.k_proj.weight.mul_(8.0)
    ids = torch.tensor([[0, 0, 5, 9, 3, 7], [1, 2, 3, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    hooks = diagnose.Hooks(model)
    try:
        cache = DynamicCache()
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
            full = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], 1)
            pos = (full.cumsum(-1) - 1)[:, -1:]
            model(input_ids=torch.tensor([[4], [8]]), attention_mask=full, position_ids=pos, past_key_values=cache)
    finally:
        hooks.remove()
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    for layer in ("model.layers.0.self_attn", "model.layers.1.self_attn"):
        params = diagnose_attention.declared(model.get_submodule(layer))
        cos, sin = hooks.values["model.rotary_emb"]
        got = diagnose_attention.attend(hooks.inputs[layer], weights, layer, cos, sin, hooks.past[layer], full, params)
        np.testing.assert_allclose(got, hooks.values[layer][0], rtol=1e-6, atol=1e-8)  # eager softmax: float32
        for name, _text, variant in diagnose_attention.attention_variants(params):
            other = diagnose_attention.attend(
                hooks.inputs[layer], weights, layer, cos, sin, hooks.past[layer], full, variant
            )
            # the window of 3 already hides the pads from the decode step: dropping the mask changes nothing there
            unseen = (layer, name) == ("model.layers.0.self_attn", "mask_dropped")
            assert (not np.allclose(other, got, rtol=0, atol=1e-6)) != unseen, (layer, name)
