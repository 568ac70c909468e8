"""The ONNX Runtime decoder: parity drives prefill and decode of an ONNX graph with a flat KV cache.

The graph takes ``past_key_values.{i}.key`` / ``.value`` (B, KV, P, D) and returns ``present.{i}.key`` / ``.value``
(this package's export and Optimum's); ``position_ids`` is fed where the graph has it. ``FlatCacheDecoder`` holds the
loop any runtime with such a graph shares; a runtime supplies ``run``.
"""

from __future__ import annotations

import numpy as np

from parity.generation.decoder import CachedDecoder
from parity.generation.prompts import positions


class FlatCacheDecoder(CachedDecoder):
    """Prefill and decode over a graph with flat cache inputs and outputs; subclasses implement ``run``."""

    def __init__(self, meta: dict):
        self.n_layers, self.kv_heads, self.head_dim = (
            int(meta["n_layers"]),
            int(meta["kv_heads"]),
            int(meta["head_dim"]),
        )
        self.cache_shape = (self.n_layers, self.kv_heads, self.head_dim)

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One call of the graph: outputs by name."""
        raise NotImplementedError

    def takes_positions(self) -> bool:
        return True

    def start(self, batch: int) -> dict[str, np.ndarray]:
        shape = (batch, self.kv_heads, 0, self.head_dim)
        return {
            f"past_key_values.{i}.{kind}": np.zeros(shape, np.float32)
            for i in range(self.n_layers)
            for kind in ("key", "value")
        }

    def call_raw(self, ids, mask, cache):
        feed = {"input_ids": ids, "attention_mask": mask, **cache}
        if self.takes_positions():
            feed["position_ids"] = positions(mask, ids.shape[1])
        outs = self.run(feed)
        present = {
            name.replace("present", "past_key_values", 1): value
            for name, value in outs.items()
            if name.startswith("present")
        }
        if len(present) != 2 * self.n_layers:
            raise RuntimeError(f"the graph returned {len(present)} cache tensors, not {2 * self.n_layers}")
        return outs["logits"], present


class OrtDecoder(FlatCacheDecoder):
    """``onnx_file`` on ONNX Runtime's CPU provider with ``threads`` intra-op threads."""

    def __init__(self, onnx_file, meta: dict, threads: int = 1):
        import onnxruntime as ort

        super().__init__(meta)
        options = ort.SessionOptions()
        options.intra_op_num_threads = max(1, int(threads))
        self.session = ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.outputs = [o.name for o in self.session.get_outputs()]

    def takes_positions(self) -> bool:
        return "position_ids" in self.inputs

    def run(self, feed):
        feed = {name: value for name, value in feed.items() if name in self.inputs}
        return dict(zip(self.outputs, self.session.run(None, feed)))


def open_decoder(artifact_dir, meta: dict, threads: int = 1) -> OrtDecoder:
    """The ``torch/onnx/ort`` path: the exported graph in ``artifact_dir`` on ONNX Runtime."""
    from pathlib import Path

    from parity.generation.onnx_export import ONNX_FILE
    from parity.platform.errors import UsageError

    if not artifact_dir or "n_layers" not in meta:
        raise UsageError("the torch/onnx/ort path needs the exported ONNX folder and its meta")
    return OrtDecoder(Path(artifact_dir) / ONNX_FILE, meta, threads)


def tapped_step(model, tapped: list[str], infos, meta: dict, ids, mask, forced, step: int, threads: int):
    """The path's decode loop (teacher-forced) up to ``step`` on ``model`` with ``tapped`` added as outputs:
    ``(the step's feed, every output of the step's call)``."""
    from parity.diagnose.graph import onnx_graph

    extended = onnx_graph.with_outputs(model, tapped, infos)
    session = onnx_graph._ort_session(extended, max(1, int(threads)))
    names_in = {i.name for i in session.get_inputs()}
    names_out = [o.name for o in session.get_outputs()]
    last: dict = {}

    class Tapped(FlatCacheDecoder):
        def takes_positions(self):
            return "position_ids" in names_in

        def run(self, feed):
            fed = {k: v for k, v in feed.items() if k in names_in}
            values = session.run(None, fed)
            last.clear()
            last.update(feed=fed, outputs=dict(zip(names_out, values)))
            return dict(last["outputs"])

    Tapped(meta).steps(ids, mask, step + 1, forced=forced)
    return last["feed"], last["outputs"]
