"""The ONNX Runtime decoder: parity drives prefill and decode of an ONNX graph with a flat KV cache.

The graph takes ``past_key_values.{i}.key`` / ``.value`` (B, KV, P, D) and returns ``present.{i}.key`` / ``.value``
(this package's export and Optimum's); ``position_ids`` is fed where the graph has it. ``FlatCacheDecoder`` holds the
loop any runtime with such a graph shares; a runtime supplies ``run``.
"""

from __future__ import annotations

import numpy as np

from parity.generation.prompts import positions


class FlatCacheDecoder:
    """Prefill and decode over a graph with flat cache inputs and outputs; subclasses implement ``run``."""

    def __init__(self, meta: dict):
        self.n_layers, self.kv_heads, self.head_dim = (
            int(meta["n_layers"]),
            int(meta["kv_heads"]),
            int(meta["head_dim"]),
        )

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One call of the graph: outputs by name."""
        raise NotImplementedError

    def takes_positions(self) -> bool:
        return True

    def _empty(self, batch: int) -> dict[str, np.ndarray]:
        shape = (batch, self.kv_heads, 0, self.head_dim)
        return {
            f"past_key_values.{i}.{kind}": np.zeros(shape, np.float32)
            for i in range(self.n_layers)
            for kind in ("key", "value")
        }

    def _call(self, ids, mask, past):
        feed = {
            "input_ids": np.ascontiguousarray(ids, np.int64),
            "attention_mask": np.ascontiguousarray(mask, np.int64),
        }
        if self.takes_positions():
            feed["position_ids"] = positions(mask, ids.shape[1])
        feed.update(past)
        outs = self.run(feed)
        present = {
            name.replace("present", "past_key_values", 1): value
            for name, value in outs.items()
            if name.startswith("present")
        }
        if len(present) != 2 * self.n_layers:
            raise RuntimeError(f"the graph returned {len(present)} cache tensors, not {2 * self.n_layers}")
        return np.asarray(outs["logits"], np.float64), present

    def steps(self, ids, mask, new_tokens: int, forced=None):
        cur, m = np.asarray(ids, np.int64), np.asarray(mask, np.int64)
        past = self._empty(cur.shape[0])
        logits, tokens = [], []
        for step in range(new_tokens):
            out, past = self._call(cur, m, past)
            last = out[:, -1]
            logits.append(last)
            tokens.append(last.argmax(-1))
            fed = tokens[-1] if forced is None else np.asarray(forced[step], np.int64)
            cur = fed[:, None].astype(np.int64)
            m = np.concatenate([m, np.ones((m.shape[0], 1), np.int64)], 1)
        return np.stack(logits), np.stack(tokens).astype(np.int64)

    def full(self, ids, mask):
        ids = np.asarray(ids, np.int64)
        out, _ = self._call(ids, np.asarray(mask, np.int64), self._empty(ids.shape[0]))
        return out

    def chunked(self, ids, mask, split: int):
        ids, mask = np.asarray(ids, np.int64), np.asarray(mask, np.int64)
        _, past = self._call(ids[:, :split], mask[:, :split], self._empty(ids.shape[0]))
        out, _ = self._call(ids[:, split:], mask, past)
        return out[:, -1]


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
