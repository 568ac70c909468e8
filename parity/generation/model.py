"""Load a causal language model for generation checks, in float64 (the reference) or float32.

A source is ``{"hf": "/abs/folder"}`` (a ``save_pretrained`` folder; nothing is downloaded) or
``{"torch": "file.py:factory" | "module:factory", "root": "/abs/workspace"}`` (a factory returning a
transformers-style causal LM).
"""

from __future__ import annotations

from pathlib import Path

from parity.platform.errors import UsageError

DTYPES = ("float64", "float32")
# Attention kernels by model type: Gemma-2 softcaps its attention scores, which only the eager kernel does. SDPA is
# used elsewhere: on CPU it computes in the model's dtype. transformers' eager kernel takes its softmax in float32
# whatever the dtype (errors of 4e-8 in a float64 model, and NaN where a left pad's query row is fully masked: the
# float64 mask's minimum becomes -inf), so a float64 model that needs eager runs ``EAGER64``, the same kernel with
# its softmax in the model's dtype.
EAGER_ONLY = ("gemma2", "gemma3", "gemma3_text")
EAGER64 = "parity_eager_float64"


def _eager_float64(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kwargs):
    """transformers' eager attention (with Gemma-2's softcapping) with the softmax in the query's dtype."""
    import torch
    from transformers.integrations.sdpa_attention import repeat_kv

    if scaling is None:
        scaling = module.head_dim**-0.5
    groups = getattr(module, "num_key_value_groups", 1)
    keys, values = repeat_kv(key, groups), repeat_kv(value, groups)
    weights = torch.matmul(query, keys.transpose(2, 3)) * scaling
    if softcap is not None:
        weights = torch.tanh(weights / softcap) * softcap
    if attention_mask is not None:
        weights = weights + attention_mask[:, :, :, : keys.shape[-2]]
    weights = torch.nn.functional.softmax(weights, dim=-1)
    return torch.matmul(weights, values).transpose(1, 2).contiguous(), weights


def _attention(model_type: str, dtype: str) -> str:
    if model_type not in EAGER_ONLY:
        return "sdpa"
    if dtype != "float64":
        return "eager"
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    AttentionInterface.register(EAGER64, _eager_float64)
    AttentionMaskInterface.register(EAGER64, eager_mask)  # an additive float mask, as the eager kernel takes
    return EAGER64


def load(source: dict, dtype: str):
    """The model of ``source`` in ``dtype``, in eval mode."""
    import torch

    if dtype not in DTYPES:
        raise UsageError(f"dtype {dtype!r} is not one of {DTYPES}")
    torch_dtype = getattr(torch, dtype)
    if "hf" in source:
        from transformers import AutoConfig, AutoModelForCausalLM

        folder = Path(source["hf"])
        if not (folder / "config.json").is_file():
            raise UsageError(f"{folder} is not a save_pretrained folder (no config.json)")
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        text = config.get_text_config(decoder=True)
        attn = _attention(getattr(text, "model_type", config.model_type), dtype)
        model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch_dtype, attn_implementation=attn, local_files_only=True
        )
    elif "torch" in source:
        from parity.model.user import resolve

        factory = resolve(source["torch"], source.get("root", "."))
        model = factory()
        if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
            raise UsageError(f"{source['torch']} did not return a transformers-style causal LM (a module with .config)")
        model = model.to(torch_dtype)
        if dtype == "float64" and getattr(model.config, "_attn_implementation", None) == "eager":
            model.set_attn_implementation(_attention(EAGER_ONLY[0], dtype))  # eager's float32 softmax, see EAGER64
    else:
        raise UsageError(f"a model source needs 'hf' or 'torch', got {sorted(source)}")
    return model.eval()


def text_config(model):
    """The decoder's config (a multimodal model's text config, or the model's own)."""
    return model.config.get_text_config(decoder=True)


def kv_shape(model) -> tuple[int, int, int]:
    """(layers, key/value heads, head size) of the model's cache."""
    text = text_config(model)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    return int(text.num_hidden_layers), int(kv_heads), int(head_dim)
