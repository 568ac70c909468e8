"""The OpenVINO decoder: the package's ONNX export with its KV cache, made stateful as OpenVINO deploys it.

optimum-intel's stateful export turns each ``past_key_values.*`` input and its ``present.*`` output into an internal
state of the compiled model (``apply_make_stateful_transformation``): the cache never leaves the plugin, and each call
feeds only ``input_ids``, ``attention_mask`` and ``position_ids``. This decoder applies the same transformation to the
same ONNX graph ONNX Runtime runs, so the two paths differ only in the runtime. The states are set to an empty cache
(B, KV, 0, D) at the start of every sequence (a plain ``reset`` would leave the dynamic batch axis at 0); optimum's
``beam_idx`` input (the cache reordered between beams) is not added: greedy decoding never reorders.

OpenVINO's CPU plugin computes in bf16 on CPUs that have it unless told otherwise: the model is compiled with
``INFERENCE_PRECISION_HINT`` f32 (``parity.runtimes.openvino.compile_config``) and refused if the compiled model
reports another precision.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from parity.generation.decoder import CachedDecoder
from parity.generation.onnx_export import ONNX_FILE
from parity.generation.prompts import positions

PAST, PRESENT = "past_key_values.", "present."


def _type_name(value) -> str:
    name = getattr(value, "get_type_name", None)
    return name() if name else str(value).rpartition(".")[2]


class OpenVINODecoder(CachedDecoder):
    """``onnx_file`` (``parity.generation.onnx_export``: flat ``past_key_values.{i}.key/.value`` in,
    ``present.{i}.key/.value`` out) read by OpenVINO, made stateful and compiled for its CPU plugin at f32 with
    ``threads`` inference threads. ``meta`` is the export's meta (``n_layers``, ``kv_heads``, ``head_dim``)."""

    def __init__(self, onnx_file, meta: dict, threads: int = 1):
        import openvino as ov
        from openvino._offline_transformations import apply_make_stateful_transformation

        from parity.platform.errors import Unavailable
        from parity.runtimes.openvino import F32, compile_config

        self.ov = ov
        self.n_layers, self.kv_heads, self.head_dim = (
            int(meta["n_layers"]),
            int(meta["kv_heads"]),
            int(meta["head_dim"]),
        )
        self.cache_shape = (self.n_layers, self.kv_heads, self.head_dim)
        self.core = ov.Core()
        if "CPU" not in self.core.available_devices:
            raise Unavailable(f"OpenVINO {ov.__version__} finds no CPU device (it finds {self.core.available_devices})")
        model = self.core.read_model(str(Path(onnx_file)))
        names = {port.get_any_name() for port in model.inputs}
        pairs = {name: PRESENT + name[len(PAST) :] for name in sorted(names) if name.startswith(PAST)}
        outputs = {name for port in model.outputs for name in port.get_names()}
        missing = sorted(set(pairs.values()) - outputs)
        if len(pairs) != 2 * self.n_layers or missing:
            raise RuntimeError(
                f"{onnx_file} has {len(pairs)} cache inputs for {self.n_layers} layers"
                + (f" and lacks the outputs {missing}" if missing else "")
                + ": not a graph with a flat past_key_values -> present cache"
            )
        apply_make_stateful_transformation(model, pairs)
        self.compiled = self.core.compile_model(model, "CPU", compile_config(threads, F32))
        self.ran_at = _type_name(self.compiled.get_property("INFERENCE_PRECISION_HINT"))
        if self.ran_at != F32:
            raise RuntimeError(
                f"OpenVINO's CPU plugin was asked for INFERENCE_PRECISION_HINT f32 and compiled at {self.ran_at}"
            )
        self.cpu_default = _type_name(self.core.get_property("CPU", "INFERENCE_PRECISION_HINT"))
        self.inputs = {port.get_any_name() for port in self.compiled.inputs}
        self.logits = self.compiled.output("logits")
        self.request = self.compiled.create_infer_request()
        self.states = len(self.request.query_state())
        if self.states != 2 * self.n_layers:
            raise RuntimeError(f"the stateful model holds {self.states} states, not {2 * self.n_layers}")

    def record(self) -> dict:
        """What ran: the OpenVINO version, the stateful form, the precision set and compiled, the plugin's default."""
        return {
            "runtime": "openvino",
            "openvino": self.ov.__version__,
            "form": "stateful (past_key_values -> present as internal states)",
            "states": self.states,
            "inference_precision": {"set": "f32", "ran": self.ran_at, "cpu_default": self.cpu_default},
            "threads": self.compiled.get_property("INFERENCE_NUM_THREADS"),
        }

    def start(self, batch: int) -> None:
        """Every state to an empty cache of ``batch`` rows: a new sequence (the cache lives in the states)."""
        empty = self.ov.Tensor(np.zeros((batch, self.kv_heads, 0, self.head_dim), np.float32))
        for state in self.request.query_state():
            state.state = empty

    def call_raw(self, ids, mask, cache):
        """One call on the current states, which it extends by ``ids``' columns (the logits: a view of the request's
        output, valid until its next call)."""
        feed = {"input_ids": ids, "attention_mask": mask}
        if "position_ids" in self.inputs:
            feed["position_ids"] = positions(mask, ids.shape[1])
        self.request.infer(feed)
        return self.request.get_tensor(self.logits).data, None


def open_decoder(artifact_dir, meta: dict, threads: int = 1) -> OpenVINODecoder:
    """The ``torch/onnx/openvino`` path: the ``model.onnx`` the ONNX Runtime path runs, in ``artifact_dir``."""
    from parity.platform.errors import UsageError

    if not artifact_dir or "n_layers" not in meta:
        raise UsageError("the torch/onnx/openvino path needs the exported ONNX folder and its meta")
    return OpenVINODecoder(Path(artifact_dir) / ONNX_FILE, meta, threads)
