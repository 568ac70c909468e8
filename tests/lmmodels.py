"""Tiny random-weight causal language models for the generation tests (transformers configs, no download).

``llama()`` / ``qwen2()`` build them; ``save(model, folder)`` writes a ``save_pretrained`` folder; ``faulty_llama()``
is the Llama whose ONNX export computes rotary positions from 0 at every call: right in a prefill (rotary attention
depends only on position differences), wrong in every decode step, which reads a cache written at other positions.
The fault is injected only while ``torch.onnx`` exports, so the eager model is correct.
"""

from __future__ import annotations

from pathlib import Path

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
}


def _build(model_type: str, seed: int, attn: str = "sdpa", **extra):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **{**TINY, **extra})
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attn).eval()


def llama():
    return _build("llama", 42)


def qwen2():
    return _build("qwen2", 43)


def gemma2():
    """Gemma-2 (softcapping, embedding scale, a head size that is not hidden/heads): eager attention only."""
    return _build("gemma2", 45, attn="eager", head_dim=16, sliding_window=32)


def faulty_llama():
    """The tiny Llama (same weights as ``llama()``) with positions restarting at 0 in every exported call."""
    import torch

    model = llama()
    rotary = model.model.rotary_emb
    base = type(rotary)

    class RestartingRotary(base):
        def forward(self, x, position_ids):
            if torch.onnx.is_in_onnx_export():  # the fault: each call's positions counted from 0
                batch, length = position_ids.shape
                position_ids = torch.arange(length, device=position_ids.device).unsqueeze(0).expand(batch, length)
            return super().forward(x, position_ids)

    rotary.__class__ = RestartingRotary
    return model


def save(model, folder) -> Path:
    """``model.save_pretrained(folder)``; returns the folder."""
    folder = Path(folder)
    model.save_pretrained(folder)
    return folder


def wide_llama():
    """A Llama with a vocabulary above the golden's full-logits limit (the golden keeps the top k per step)."""
    return _build("llama", 44, vocab_size=5000, hidden_size=32, intermediate_size=64)


# Faults in the export alone (``torch.onnx.is_in_onnx_export()``), each in one of the layers decoders are made of;
# the eager model is correct. The diagnosis names each at the first divergent step (tests/generation/test_generation_causes.py).


def _exporting() -> bool:
    import torch

    return bool(torch.onnx.is_in_onnx_export())


def _faulty_forward(model, change):
    """``model`` whose forward, while exporting, runs inside ``change(model, kwargs)`` (a context manager)."""
    base = type(model)

    class Faulty(base):
        def forward(self, *args, **kwargs):
            if not _exporting():
                return super().forward(*args, **kwargs)
            with change(self, kwargs):
                return super().forward(*args, **kwargs)

    model.__class__ = Faulty
    return model


def faulty_cache_float16():
    """The tiny Llama whose export reads its key/value cache rounded to float16 (a prefill reads none: right)."""
    from contextlib import contextmanager

    import torch

    @contextmanager
    def rounded(_model, kwargs):
        cache = kwargs.get("past_key_values")
        for layer in getattr(cache, "layers", []):
            if getattr(layer, "keys", None) is not None:
                layer.keys = layer.keys.to(torch.float16).to(layer.keys.dtype)
                layer.values = layer.values.to(torch.float16).to(layer.values.dtype)
        yield

    model = llama()
    with torch.no_grad():  # scores and values an order larger: float16 rounding of the cache shows
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(4.0)
            layer.self_attn.k_proj.weight.mul_(16.0)
            layer.self_attn.v_proj.weight.mul_(64.0)
    return _faulty_forward(model, rounded)


def faulty_decode_mask():
    """The tiny Llama whose export drops the attention mask in decode steps (a call with a cache): the pads of a
    left-padded prompt are attended; a prefill, and batch 1, are right."""
    from contextlib import contextmanager

    import torch

    @contextmanager
    def dropped(_model, kwargs):
        mask = kwargs["attention_mask"]
        held = mask.new_full((mask.shape[0], 1), mask.shape[1] - kwargs["input_ids"].shape[1])  # 0 in a prefill
        kwargs["attention_mask"] = torch.where(held > 0, torch.ones_like(mask), mask)
        yield

    return _faulty_forward(llama(), dropped)


def faulty_gqa_tiled():
    """The tiny Llama (4 heads, 2 key/value heads) whose export tiles the key/value heads across the query heads
    (query head i reads key/value head i % 2) instead of repeating them (i // 2), in every call."""
    from contextlib import contextmanager

    import torch
    from transformers.integrations import sdpa_attention

    @contextmanager
    def tiled(_model, _kwargs):
        saved = sdpa_attention.repeat_kv, sdpa_attention.use_gqa_in_sdpa
        sdpa_attention.repeat_kv = lambda x, n: x if n == 1 else torch.cat([x] * n, 1)
        sdpa_attention.use_gqa_in_sdpa = lambda *a, **k: False
        try:
            yield
        finally:
            sdpa_attention.repeat_kv, sdpa_attention.use_gqa_in_sdpa = saved

    return _faulty_forward(llama(), tiled)


def mistral_window():
    """Mistral with a sliding window of 4, shorter than the test prompts."""
    return _build("mistral", 46, sliding_window=4)


def faulty_mistral_window():
    """``mistral_window()`` whose export drops the sliding window (every earlier position attended)."""
    from contextlib import contextmanager

    @contextmanager
    def unwindowed(model, _kwargs):
        saved = model.config.sliding_window
        model.config.sliding_window = None
        try:
            yield
        finally:
            model.config.sliding_window = saved

    return _faulty_forward(mistral_window(), unwindowed)


def gemma2_capped():
    """Gemma-2 with softcaps that bite on tiny random weights (attention 2, final logits 3)."""
    import torch

    model = _build(
        "gemma2",
        47,
        attn="eager",
        head_dim=16,
        sliding_window=32,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0,
    )
    with torch.no_grad():  # scores of a few units, where the softcap of 2 bites
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
            layer.self_attn.k_proj.weight.mul_(8.0)
    return model


def faulty_gemma2_attention_softcap():
    """``gemma2_capped()`` whose export drops the attention's softcap."""
    from contextlib import contextmanager

    @contextmanager
    def uncapped(model, _kwargs):
        layers = [layer.self_attn for layer in model.model.layers]
        saved = [a.attn_logit_softcapping for a in layers]
        for a in layers:
            a.attn_logit_softcapping = None
        try:
            yield
        finally:
            for a, cap in zip(layers, saved):
                a.attn_logit_softcapping = cap

    return _faulty_forward(gemma2_capped(), uncapped)


def faulty_gemma2_logit_softcap():
    """``gemma2_capped()`` whose export drops the final logit softcap."""
    from contextlib import contextmanager

    @contextmanager
    def uncapped(model, _kwargs):
        saved = model.config.final_logit_softcapping
        model.config.final_logit_softcapping = None
        try:
            yield
        finally:
            model.config.final_logit_softcapping = saved

    return _faulty_forward(gemma2_capped(), uncapped)


def faulty_gemma2_embedding_scale():
    """``gemma2_capped()`` whose export drops the embedding's sqrt(hidden) scale."""
    import torch

    model = gemma2_capped()
    embed = model.model.embed_tokens
    base = type(embed)

    class Unscaled(base):
        def forward(self, input_ids):
            if _exporting():
                return torch.nn.Embedding.forward(self, input_ids)
            return super().forward(input_ids)

    embed.__class__ = Unscaled
    return model
