"""ONNX Runtime: one InferenceSession on one execution provider (here the CPU's; ``ort_cuda`` and ``ort_trt``
put the same session on the GPU providers)."""

from __future__ import annotations

import ctypes
import re

import numpy as np

from parity.model import values
from parity.platform.errors import Unavailable
from parity.runtimes.onnx_common import OnnxRunner

# ONNX Runtime's names (``tensor(<name>)``) of the element types NumPy holds only through ml_dtypes
_ORT_TYPE_NAMES = {
    "bfloat16": "bfloat16",
    "float8e4m3fn": "float8_e4m3fn",
    "float8e4m3fnuz": "float8_e4m3fnuz",
    "float8e5m2": "float8_e5m2",
    "float8e5m2fnuz": "float8_e5m2fnuz",
    "int4": "int4",
    "uint4": "uint4",
    "float4e2m1": "float4_e2m1fn",
    "float8e8m0": "float8_e8m0fnu",
}
_BY_ELEMENT = {element: name for name, element in values.ONNX_ELEMENT_TYPES.items()}

MIN_OPSET = 7  # ONNX Runtime has no kernels for the default domain below it


class OrtRunner(OnnxRunner):
    """``ort``: an ONNX Runtime InferenceSession with aligned intra-op threads, all graph optimisations on.

    A subclass names its ``provider`` and ``provider_options``; a provider that is not installed, or a session
    that silently fell back to another provider, is a skip with the reason, never timed as that provider."""

    optimization = "ORT_ENABLE_ALL"
    provider = "CPUExecutionProvider"
    missing = "onnxruntime has no CPUExecutionProvider"  # why a provider this onnxruntime lacks is unavailable

    def __init__(self, spec, artifact_dir, meta, batch_size, threads, device="cpu", precision="fp32"):
        super().__init__(spec, artifact_dir, meta, batch_size, threads, device, precision)
        import onnxruntime as ort

        self.ort = ort
        if self.provider not in ort.get_available_providers():
            raise Unavailable(self.missing)
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, self.optimization)
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        providers = self.providers()
        self.session = self.open_session(options, providers)
        self.graph_dtypes = _low_precision(self.session.get_inputs())
        # ONNX Runtime's Python API neither takes nor returns NumPy arrays of these: such a graph runs on OrtValues
        self.low_precision_io = bool(self.graph_dtypes or _low_precision(self.session.get_outputs()))
        used = self.session.get_providers()
        if used[:1] != [self.provider]:
            raise Unavailable(
                f"ONNX Runtime did not start {self.provider} (its providers are {used}); see the worker log"
            )
        self.numerics = {
            "onnxruntime": ort.__version__,
            "provider": self.provider,
            "provider_options": providers[0][1],
            "graph_optimization_level": self.optimization,
            "device": device,
            "precision": precision,
            "float16_model": "float16" in meta,
        }

    def providers(self) -> list[tuple[str, dict]]:
        """The session's providers and their options, this runner's own first."""
        return [(self.provider, {})]

    def open_session(self, options, providers):
        try:
            return self.ort.InferenceSession(self.model_path, options, providers=providers)
        except Exception as error:
            import onnx

            model = onnx.load(self.model_path, load_external_data=False)
            opset = next((e.version for e in model.opset_import if e.domain in ("", "ai.onnx")), None)
            if opset is not None and opset < MIN_OPSET:
                raise RuntimeError(
                    f"{type(error).__name__}: {error} (the model is opset {opset}; ONNX Runtime implements opset {MIN_OPSET} and "
                    f"later: convert it with `parity init NAME --onnx FILE --opset 13 --force`, which runs "
                    f"onnx.version_converter and records it)"
                ) from None
            raise

    def run_impl(self, x):
        if self.low_precision_io:
            feed = {name: to_ortvalue(self.ort, value) for name, value in self.feed(x).items()}
            return tuple(from_ortvalue(value) for value in self.session.run_with_ort_values(self.output_names, feed))
        return tuple(self.session.run(self.output_names, self.feed(x)))

    def device_compute(self, x):
        """On a GPU provider: I/O binding with the input already on the GPU and the outputs left there."""
        if self.device == "cpu":
            return None
        binding = self.session.io_binding()
        for name, value in self.feed(x).items():
            binding.bind_ortvalue_input(
                name, self.ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value), "cuda", 0)
            )
        for name in self.output_names:
            binding.bind_output(name, "cuda", 0)

        def compute():
            self.session.run_with_iobinding(binding)
            binding.synchronize_outputs()

        return compute


class OrtNoOptRunner(OrtRunner):
    """``ort-noopt``: the same session with graph optimisations disabled (no fusion, no constant folding),
    so a drift that only the optimised graph shows is told apart from one in the kernels."""

    optimization = "ORT_DISABLE_ALL"


def _low_precision(node_args) -> dict[str, str]:
    """``{name: dtype}`` of the session's inputs or outputs ONNX Runtime types as bfloat16, float8 or 4-bit."""
    found = {}
    for arg in node_args:
        match = re.fullmatch(r"tensor\((\w+)\)", arg.type or "")
        if match and match[1] in _ORT_TYPE_NAMES:
            found[arg.name] = _ORT_TYPE_NAMES[match[1]]
    return found


def to_ortvalue(ort, value: np.ndarray):
    """A CPU OrtValue holding ``value``; an ml_dtypes array (bfloat16, float8, int4 ...) copied in as its ONNX
    element type's raw bits, 4-bit ones packed two to a byte as ONNX Runtime lays them out."""
    name = values.low_precision_name(value)
    if name is None:
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value))
    ortvalue = ort.OrtValue.ortvalue_from_shape_and_type(list(value.shape), values.ONNX_ELEMENT_TYPES[name])
    raw = np.ascontiguousarray(values.pack4(value) if name in values.PACKED else values.to_bits(value))
    if raw.nbytes:
        ctypes.memmove(ortvalue.data_ptr(), raw.ctypes.data, raw.nbytes)
    return ortvalue


def from_ortvalue(ortvalue) -> np.ndarray:
    """A CPU OrtValue as NumPy; an element type NumPy holds only through ml_dtypes (whose ``numpy()`` ONNX Runtime
    refuses, or returns as bare bytes) read from its buffer as raw bits, as an ml_dtypes array."""
    name = _BY_ELEMENT.get(ortvalue.element_type()) if ortvalue.is_tensor() else None
    if name is None:
        return ortvalue.numpy()
    shape = tuple(ortvalue.shape())
    count = int(np.prod(shape, dtype=np.int64))
    width = values.ml_dtype(name).itemsize
    raw = np.empty((count + 1) // 2 if name in values.PACKED else count * width, dtype=np.uint8)
    if raw.nbytes:
        ctypes.memmove(raw.ctypes.data, ortvalue.data_ptr(), raw.nbytes)
    if name in values.PACKED:
        return values.unpack4(raw, name, shape)
    return values.from_bits(raw.view(np.uint16 if width == 2 else np.uint8), name).reshape(shape)
