"""Export a causal LM to ONNX with its KV cache as graph inputs and outputs (torch.onnx, dynamo exporter).

Inputs : ``input_ids`` (B, S) int64, ``attention_mask`` (B, P+S) int64, ``position_ids`` (B, S) int64,
``past_key_values.{i}.key`` / ``.value`` (B, KV, P, D) float32 (P = 0 at prefill).
Outputs: ``logits`` (B, S, V), ``present.{i}.key`` / ``.value`` (B, KV, P+S, D).
"""

from __future__ import annotations

import time
from pathlib import Path

from parity.exporters.torch_onnx import kept_registry
from parity.platform.safefs import owned_tempdir

ONNX_FILE = "model.onnx"  # the export's file in its folder


def _wrapper(model):
    import torch
    from transformers import DynamicCache

    from parity.generation.model import kv_shape

    class FlatCacheLM(torch.nn.Module):
        """Takes the cache as flat tensors and returns the logits and the flat new cache. Every layer's cache is a
        plain one (past + new, sliding-window layers too: the window is applied by the attention mask), so the
        graph's cache grows by the new tokens at every call whatever the layer."""

        def __init__(self, model):
            super().__init__()
            self.model = model
            self.n_layers = kv_shape(model)[0]

        def forward(self, input_ids, attention_mask, position_ids, past):
            pairs = [(past[2 * i], past[2 * i + 1]) for i in range(self.n_layers)]
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=DynamicCache(ddp_cache_data=pairs, config=None),
                use_cache=True,
                return_dict=True,
            )
            flat = []
            for layer in out.past_key_values.layers:
                flat += [layer.keys, layer.values]
            return (out.logits, *flat)

    return FlatCacheLM(model).eval()


def export(model, out_file, opset: int = 18) -> dict:
    """Write ``model`` (float32, eval mode) to ``out_file`` (atomically: a scratch folder beside it, then a
    rename) and return its meta: input and output names, ``n_layers``, ``kv_heads``, ``head_dim``, ``export_s``."""
    import torch

    from parity.generation.model import kv_shape, text_config

    out_file = Path(out_file)
    n_layers, kv_heads, head_dim = kv_shape(model)
    wrapper = _wrapper(model)
    b, s, p = 2, 3, 5
    input_ids = torch.randint(0, int(text_config(model).vocab_size), (b, s))
    attention_mask = torch.ones(b, p + s, dtype=torch.int64)
    position_ids = torch.arange(p, p + s).unsqueeze(0).expand(b, s).contiguous()
    past = tuple(torch.randn(b, kv_heads, p, head_dim) for _ in range(2 * n_layers))
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence")
    past_seq, total = torch.export.Dim("past_sequence"), torch.export.Dim("total_sequence")
    dynamic_shapes = {
        "input_ids": {0: batch, 1: seq},
        "attention_mask": {0: batch, 1: total},
        "position_ids": {0: batch, 1: seq},
        "past": tuple({0: batch, 2: past_seq} for _ in range(2 * n_layers)),
    }
    inputs = ["input_ids", "attention_mask", "position_ids"]
    outputs = ["logits"]
    for i in range(n_layers):
        inputs += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        outputs += [f"present.{i}.key", f"present.{i}.value"]
    out_file.parent.mkdir(parents=True, exist_ok=True)
    scratch = owned_tempdir(out_file.parent, f".{out_file.name}.export-")
    started = time.perf_counter()
    try:
        with torch.no_grad(), kept_registry():
            torch.onnx.export(
                wrapper,
                (input_ids, attention_mask, position_ids, past),
                str(scratch / out_file.name),
                input_names=inputs,
                output_names=outputs,
                dynamic_shapes=dynamic_shapes,
                opset_version=opset,
                dynamo=True,
                optimize=True,
                external_data=False,
            )
        (scratch / out_file.name).replace(out_file)
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "inputs": inputs,
        "outputs": outputs,
        "n_layers": n_layers,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "opset": opset,
        "export_s": round(time.perf_counter() - started, 3),
    }


def export_task(source: dict, out_dir: str) -> dict:
    """Worker task: the float32 model of ``source`` exported to ``out_dir/model.onnx`` with its cache; its meta."""
    from parity.generation.model import load

    return export(load(source, "float32"), Path(out_dir) / ONNX_FILE)
