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
