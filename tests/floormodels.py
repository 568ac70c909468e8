"""A model whose export leaves a float16 island, for the float32 noise floor (tests/check/test_noise_floor.py).

Frameworks are imported inside the factories: this file is imported by worker processes by path.
"""

from __future__ import annotations

VOCAB = 50


def make_gpt2_float16_island():
    """A small ``transformers.GPT2Model`` without its key/value cache (2 layers, 32 wide): input_ids,
    attention_mask -> last_hidden_state.

    Fault: ``h.1.mlp.c_proj`` (``transformers.pytorch_utils.Conv1D``) computes its matmul in float16 in the export
    only (``torch.onnx.is_in_onnx_export()``), as a converter that leaves a float16 island does; every native run
    computes it in float32."""
    import torch
    from transformers.pytorch_utils import Conv1D

    class Float16Conv1D(Conv1D):
        def forward(self, x):
            if not torch.onnx.is_in_onnx_export():
                return super().forward(x)
            flat = x.reshape(-1, x.shape[-1]).to(torch.float16) @ self.weight.to(torch.float16)
            return (flat.to(torch.float32) + self.bias).reshape(*x.shape[:-1], self.nf)

    model = make_gpt2_float32()
    old = model.h[1].mlp.c_proj
    island = Float16Conv1D(old.nf, old.weight.shape[0])
    island.load_state_dict(old.state_dict())
    model.h[1].mlp.c_proj = island
    return model.eval()


def make_gpt2_float32():
    """The same GPT-2 with no fault: every path computes it in float32."""
    import torch
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    return GPT2Model(config).eval()
