"""Today's transformer layers in users' models, each with ONE RMSNorm that computes something else in the export only
(as ``tests/nestedmodels.py`` builds its faulty leaves: triggered by ``torch.onnx.is_in_onnx_export()``, so every
native run is correct, and the leaf is still an instance of the class it replaces).

Frameworks are imported inside the factories: this file is imported by worker processes by path.
"""

from __future__ import annotations

VOCAB = 64


def _random_rms_weights(model, seed: int = 1, offset: float = 0.0):
    """Every RMSNorm's weight drawn at random (around 1 - ``offset``, so that the scale ``offset + w`` is near 1)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                module.weight.copy_(torch.rand(module.weight.shape, generator=generator) + 0.5 - offset)
    return model


def make_llama_export_eps():
    """A ``transformers.LlamaForCausalLM`` with random weights (2 layers, hidden 32, vocab 64, 4 heads of which 2
    key/value heads, no cache): input_ids -> logits.

    Fault: ``model.layers.1.post_attention_layernorm`` (a ``LlamaRMSNorm``, eps 1e-6) is exported with eps 1e-5;
    triggered by ``torch.onnx.is_in_onnx_export()``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    class ExportEpsRMSNorm(LlamaRMSNorm):
        """``LlamaRMSNorm``; exported with ``export_eps`` instead of its own epsilon."""

        export_eps = 1e-5

        def forward(self, hidden_states):
            if not torch.onnx.is_in_onnx_export():
                return super().forward(hidden_states)
            variance = hidden_states.pow(2).mean(-1, keepdim=True)
            return self.weight * (hidden_states * torch.rsqrt(variance + self.export_eps))

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        use_cache=False,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    model = _random_rms_weights(LlamaForCausalLM(config))
    layer = model.model.layers[1]
    norm = ExportEpsRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
    norm.load_state_dict(layer.post_attention_layernorm.state_dict())
    layer.post_attention_layernorm = norm
    return model.eval()


def make_gemma_norm_without_offset():
    """A small pre-norm residual MLP whose norms are ``transformers``' ``GemmaRMSNorm`` (the scale is ``1 + w``):
    x (2x8x32) -> output (2x8x32).

    Fault: ``blocks.1.norm`` is exported without Gemma's offset (scaled by ``w``, as a Llama norm is);
    triggered by ``torch.onnx.is_in_onnx_export()``."""
    import torch
    from torch import nn
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    class ExportNoOffsetRMSNorm(GemmaRMSNorm):
        def forward(self, x):
            if not torch.onnx.is_in_onnx_export():
                return super().forward(x)
            return self._norm(x.float()) * self.weight.float()

    class Block(nn.Module):
        def __init__(self, width: int, faulty: bool):
            super().__init__()
            self.norm = (ExportNoOffsetRMSNorm if faulty else GemmaRMSNorm)(width)
            self.fc = nn.Linear(width, width)

        def forward(self, x):
            return x + torch.tanh(self.fc(self.norm(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.Sequential(Block(32, False), Block(32, True), Block(32, False))
            self.head = nn.Linear(32, 32)

        def forward(self, x):
            return self.head(self.blocks(x))

    torch.manual_seed(0)
    return _random_rms_weights(Net(), offset=1.0).eval()


def make_llama_mlp_halves_swapped():
    """A small pre-norm residual stack of ``transformers``' ``LlamaMLP`` (SwiGLU: ``down(silu(gate(x)) * up(x))``):
    x (2x8x32) -> output (2x8x32).

    Fault: ``blocks.1.mlp`` is exported with the halves swapped (``up`` gates, ``gate`` is the linear half), as a
    converter that splits a fused gate/up weight the wrong way round computes it; triggered by
    ``torch.onnx.is_in_onnx_export()``. None of the MLP's children departs on its own."""
    import torch
    from torch import nn
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    class ExportSwappedMLP(LlamaMLP):
        def forward(self, x):
            if not torch.onnx.is_in_onnx_export():
                return super().forward(x)
            return self.down_proj(self.act_fn(self.up_proj(x)) * self.gate_proj(x))

    config = LlamaConfig(hidden_size=32, intermediate_size=64, hidden_act="silu")

    class Block(nn.Module):
        def __init__(self, faulty: bool):
            super().__init__()
            self.norm = LlamaRMSNorm(32)
            self.mlp = (ExportSwappedMLP if faulty else LlamaMLP)(config)

        def forward(self, x):
            return x + self.mlp(self.norm(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.Sequential(Block(False), Block(True), Block(False))

        def forward(self, x):
            return self.blocks(x)

    torch.manual_seed(0)
    return _random_rms_weights(Net()).eval()


def _llama_stack(attention=None, layers: int = 3, faulty: int = 1):
    """A small Llama decoder (``transformers``' ``LlamaDecoderLayer``s with their rotary embedding, SDPA attention with
    4 heads of which 2 key/value heads, no cache): x (2x8x32) -> output (2x8x32). ``attention`` given, layer
    ``faulty``'s ``self_attn`` is an instance of it, with the same weights."""
    import torch
    from torch import nn
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=layers,
        use_cache=False,
    )
    config._attn_implementation = "sdpa"

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.rotary = LlamaRotaryEmbedding(config)
            self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(layers))
            self.norm = LlamaRMSNorm(32)

        def forward(self, x):
            positions = torch.arange(x.shape[1], device=x.device)[None]
            tables = self.rotary(x, positions)
            for layer in self.layers:
                x = layer(x, attention_mask=None, position_ids=positions, position_embeddings=tables)
            return self.norm(x)

    torch.manual_seed(0)
    net = _random_rms_weights(Net())
    if attention is not None:
        replaced = attention(config, faulty)
        replaced.load_state_dict(net.layers[faulty].self_attn.state_dict())
        net.layers[faulty].self_attn = replaced
    return net.eval()


def make_llama_gqa():
    """``_llama_stack`` as transformers computes it: grouped-query attention with each key/value head repeated."""
    return _llama_stack()


def make_llama_gqa_tiled_export():
    """``_llama_stack`` whose ``layers.1.self_attn`` is exported with the key/value heads tiled (query head h reads
    key/value head h % 2, ``kv.repeat(1, 2, 1, 1)``, where transformers' ``repeat_kv`` gives it head h // 2: a port's
    head order); triggered by ``torch.onnx.is_in_onnx_export()``."""
    import torch
    import torch.nn.functional as F
    from transformers.models.llama.modeling_llama import LlamaAttention, apply_rotary_pos_emb

    class ExportTiledAttention(LlamaAttention):
        def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
            if not torch.onnx.is_in_onnx_export():
                return super().forward(hidden_states, position_embeddings, attention_mask, **kwargs)
            b, t, _ = hidden_states.shape
            q, k, v = (
                proj(hidden_states).view(b, t, -1, self.head_dim).transpose(1, 2)
                for proj in (self.q_proj, self.k_proj, self.v_proj)
            )
            q, k = apply_rotary_pos_emb(q, k, *position_embeddings)
            group = self.num_key_value_groups
            k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling)
            return self.o_proj(out.transpose(1, 2).reshape(b, t, -1)), None

    return _llama_stack(ExportTiledAttention)
