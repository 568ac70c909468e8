"""OpenVINO: its CPU plugin, on an IR made by ``openvino.convert_model`` or on an ONNX file read by its ONNX frontend.

The CPU plugin picks its own inference precision: bf16 (or f16) on CPUs with such instructions, f32 elsewhere. A
model deployed without a hint therefore computes at another precision on another machine. parity sets the hint to
the path's precision (f32 at fp32; bf16 and f16 at bf16 and fp16, what such a CPU runs by default), refuses a
compile that reports another, and records beside it the plugin's default on this machine.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from parity.model import values
from parity.platform.errors import Unavailable
from parity.runtimes.base import Runner
from parity.runtimes.onnx_common import onnx_feed

F32 = "f32"
HINTS = {"fp32": F32, "bf16": "bf16", "fp16": "f16"}  # parity's precision -> the CPU plugin's inference precision
IR_TAPS_REASON = (
    "an OpenVINO IR converted from torch names its operations by TorchScript's module scopes, which "
    "parity does not map to layers: outputs are compared (diagnose torch/onnx/openvino to read the "
    "layers)"
)
INT8_TAPS_REASON = (
    "an int8 IR quantized by NNCF computes its layers inside fused int8 kernels, which parity does not "
    "read: outputs are compared (the float path's diagnosis reads the layers)"
)
LOW_PRECISION = {"i8", "u8"}
# element types NumPy holds only through ml_dtypes, by OpenVINO's name: OpenVINO hands their bits over in a NumPy
# dtype of the same width (bf16 as float16), so they are fed and read as ml_dtypes arrays of the graph's own type
ML_DTYPES = {"bf16": "bfloat16", "f8e4m3": "float8_e4m3fn", "f8e5m2": "float8_e5m2"}


class OpenVinoRunner(Runner):
    """``openvino``: one model compiled by OpenVINO's CPU plugin with ``INFERENCE_PRECISION_HINT`` f32 and
    ``INFERENCE_NUM_THREADS`` aligned with the other runtimes; feeds and outputs by the artifact's tensor names.

    ``artifact_dir / meta["file"]`` is the IR's ``model.xml`` or an ``model.onnx``; the inputs' dynamic axes stay
    dynamic (one compile runs every verification shape); an axis the artifact fixed refuses other sizes, which the
    check reports with the axes the export baked in. Taps of an ONNX artifact are read by the diagnosis from the graph
    (``parity.diagnose.collect``, through ``run_tensors``); an IR has none (``no_taps_reason``). An int8 IR (NNCF's,
    ``meta["quantization"]``) runs its quantized layers in int8 under the f32 hint; ``runtime_record`` counts them."""

    no_taps_reason = IR_TAPS_REASON

    def __init__(
        self,
        spec,
        artifact_dir: Path,
        meta: dict,
        batch_size: int,
        threads: int,
        device: str = "cpu",
        precision: str = "fp32",
    ):
        super().__init__(spec, batch_size, "float32", device, precision)
        import openvino as ov

        self.ov = ov
        self.meta = meta
        self.model_path = Path(artifact_dir) / meta["file"]
        self.output_names = list(meta["output_names"])
        self.threads = threads
        self.core = ov.Core()
        if "CPU" not in self.core.available_devices:
            raise Unavailable(f"OpenVINO {ov.__version__} finds no CPU device (it finds {self.core.available_devices})")
        if meta.get("quantization"):
            self.no_taps_reason = INT8_TAPS_REASON
        self.hint = HINTS[precision]
        self.config = compile_config(threads, self.hint)
        self.compiled = self.core.compile_model(self.core.read_model(str(self.model_path)), "CPU", self.config)
        ran = _type_name(self.compiled.get_property("INFERENCE_PRECISION_HINT"))
        if ran != self.hint and self.hint != F32:  # the CPU has no such instructions: the plugin runs f32
            raise Unavailable(
                f"OpenVINO's CPU plugin compiles at {ran} here when asked for {self.hint}: this CPU "
                f"has no {self.hint} inference"
            )
        if ran != self.hint:  # never timed or judged as fp32 when the plugin ran something else
            raise RuntimeError(
                f"OpenVINO's CPU plugin was asked for INFERENCE_PRECISION_HINT f32 and compiled at {ran}"
            )
        self.request = self.compiled.create_infer_request()
        self._outputs = [self.compiled.output(name) for name in self.output_names]
        self.graph_dtypes = _ml_dtypes(self.compiled.inputs)
        self._output_dtypes = [
            values.ml_dtype(ML_DTYPES[name]) if name in ML_DTYPES else None
            for name in (_type_name(port.get_element_type()) for port in self._outputs)
        ]
        self.default_hint = _type_name(self.core.get_property("CPU", "INFERENCE_PRECISION_HINT"))
        self.numerics = {
            "openvino": ov.__version__,
            "device": "CPU",
            "precision": precision,
            "inference_precision_hint": self.hint,
            "ran_at": ran,
            "cpu_default_hint": self.default_hint,
            "default_here": _default_note(self.default_hint),
            "execution_mode": str(self.compiled.get_property("EXECUTION_MODE_HINT")).rpartition(".")[2],
            "dynamic_quantization_group_size": self.compiled.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE"),
            "threads": self.compiled.get_property("INFERENCE_NUM_THREADS"),
            "artifact": meta.get("format"),
        }

    def feed(self, x: dict) -> dict:
        """Feeds by the artifact's input names, a single input in its layout (``onnx_common.onnx_feed``)."""
        return onnx_feed(self.spec, self.meta, x, self.graph_dtypes)

    def run_impl(self, x):
        results = self.request.infer(self.feed(x), share_inputs=True)  # outputs copied out (share_outputs=False)
        return tuple(
            results[port] if dtype is None else results[port].view(dtype)
            for port, dtype in zip(self._outputs, self._output_dtypes)
        )

    def runtime_record(self) -> dict:
        """The OpenVINO version, the device and its name, the precision hint set, the plugin's default here and what
        ran, the threads and streams the compiled model uses, and which inputs stayed dynamic."""
        return {
            "runtime": "openvino",
            "openvino": self.ov.__version__,
            "device": "CPU",
            "device_name": self.core.get_property("CPU", "FULL_DEVICE_NAME"),
            "inference_precision": {
                "set": self.hint,
                "ran": self.numerics["ran_at"],
                "cpu_default": self.default_hint,
                "note": self.numerics["default_here"],
            },
            "threads": self.compiled.get_property("INFERENCE_NUM_THREADS"),
            "streams": self.compiled.get_property("NUM_STREAMS"),
            "performance_hint": str(self.compiled.get_property("PERFORMANCE_HINT")).rpartition(".")[2],
            "dynamic_inputs": [port.any_name for port in self.compiled.inputs if port.get_partial_shape().is_dynamic],
            "summary": f"inference precision {self.hint} (ran {self.numerics['ran_at']}); "
            f"{self.numerics['default_here']}",
            **self._int8_record(),
        }

    def _int8_record(self) -> dict:
        """For an int8 IR: the compiled graph's layers that run in int8 (``runtimePrecision`` i8 / u8), by kind."""
        if not self.meta.get("quantization"):
            return {}
        kinds: dict[str, int] = {}
        for op in self.compiled.get_runtime_model().get_ops():
            info = op.get_rt_info()
            kind, ran = str(info["layerType"].astype(str)), str(info["runtimePrecision"].astype(str))
            if ran in LOW_PRECISION and kind != "Const":
                kinds[kind] = kinds.get(kind, 0) + 1
        return {"int8_layers": dict(sorted(kinds.items()))}


def _type_name(element_type) -> str:
    """``f32``, ``bf16``, ``f16`` for an OpenVINO element type (or its string)."""
    name = getattr(element_type, "get_type_name", None)
    return name() if name else str(element_type)


def _ml_dtypes(ports) -> dict[str, str]:
    """``{name: ml_dtypes name}`` of the ``ports`` whose element type NumPy holds only through ml_dtypes."""
    found = {}
    for port in ports:
        dtype = ML_DTYPES.get(_type_name(port.get_element_type()))
        if dtype:
            found.update(dict.fromkeys(port.get_names(), dtype))
    return found


def _default_note(default: str) -> str:
    if default == F32:
        return "default here: f32 (models deployed without a hint run f32 on this CPU)"
    return f"default here: {default} (models deployed without a hint run {default})"


def compile_config(threads: int, hint: str = F32) -> dict:
    """The CPU plugin's settings for one of parity's paths: ``hint`` (f32 by default) at every layer, no int8
    quantization of activations at run time (the plugin's dynamic quantization), ``threads`` intra-op threads."""
    return {
        "INFERENCE_PRECISION_HINT": hint,
        "INFERENCE_NUM_THREADS": int(threads),
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
    }


def run_tensors(model, feed: dict, names: list[str], threads: int = 1, core=None) -> dict[str, np.ndarray]:
    """One inference of an ONNX ``model`` (a path, or bytes: ``ModelProto.SerializeToString()`` of a graph edited in
    memory) on OpenVINO's CPU plugin at f32 (``compile_config``), returning the tensors among ``names`` that its ONNX
    frontend keeps (each added as an output where it is not one), by name."""
    import openvino as ov

    core = core or ov.Core()
    model = core.read_model(io.BytesIO(model) if isinstance(model, bytes) else str(model))
    ports: dict[str, Any] = {}
    for op in model.get_ops():
        for port in op.outputs():
            for name in port.get_names():
                ports.setdefault(name, port)
    names = [name for name in dict.fromkeys(names) if name in ports]
    present = {name for port in model.outputs for name in port.get_names()}
    extra = [ports[name] for name in names if name not in present]
    if extra:
        model.add_outputs(extra)
    compiled = core.compile_model(model, "CPU", compile_config(threads))
    results = compiled.create_infer_request().infer(feed)
    values = {}
    for port, value in results.items():
        for name in port.get_names():
            if name in names:
                values[name] = np.array(value)
    return values
