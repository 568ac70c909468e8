"""ONNX Runtime with the TensorRT execution provider (the CUDA provider behind it for nodes TensorRT does not take).

ONNX Runtime names a cached engine after the model's file name and its node names, not its weights, shapes or
build options, so each model file (by content) and precision gets an engine cache folder of its own; the timing
cache, keyed on layer configurations, is shared. The provider has no TF32 switch: the worker sets
``NVIDIA_TF32_OVERRIDE=0`` for every precision but tf32, and TensorRT honours it while it builds.
"""

from __future__ import annotations

import os

from parity.platform.cache_dir import cache_root, named_lock
from parity.platform.errors import Unavailable, one_line
from parity.platform.safefs import sha256_file
from parity.runtimes.ort import OrtRunner

# what ONNX Runtime says when it cannot create the TensorRT provider or does not know one of its options
PROVIDER_PROBLEMS = ("Invalid TensorRT EP option", "install TensorRT libraries", "providers_tensorrt", "libnvinfer")


class OrtTrtRunner(OrtRunner):
    """``ort-trt``: an InferenceSession whose first provider is TensorRT; falling back to another is a skip."""

    provider = "TensorrtExecutionProvider"
    missing = (
        "onnxruntime has no TensorrtExecutionProvider (install onnxruntime-gpu and TensorRT: pip install parity[gpu])"
    )

    def __init__(self, spec, artifact_dir, meta, batch_size, threads, device="cpu", precision="fp32"):
        super().__init__(spec, artifact_dir, meta, batch_size, threads, device, precision)
        override = os.environ.get("NVIDIA_TF32_OVERRIDE")
        self.numerics.update(
            {
                "providers": dict(self.providers()),
                "NVIDIA_TF32_OVERRIDE": override,
                "tf32": override != "0",
                "tf32_note": "the TensorRT provider has no TF32 option: TensorRT's default (on) applies "
                "unless NVIDIA_TF32_OVERRIDE=0",
            }
        )

    def _folders(self):
        """(this model's engine cache at this precision, the shared timing cache)."""
        shared = cache_root() / "tensorrt" / "ort-trt"
        return shared / f"{sha256_file(self.model_path)[:16]}-{self.precision}-ort{self.ort.__version__}", shared

    def providers(self):
        engines, shared = self._folders()
        trt_options = {
            "device_id": 0,
            "trt_fp16_enable": self.precision == "fp16",
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": str(engines),
            "trt_timing_cache_enable": True,
            "trt_timing_cache_path": str(shared),
        }
        if self.precision == "bf16":  # asked for only when needed: older onnxruntime does not know the option
            trt_options["trt_bf16_enable"] = True
        return [
            (self.provider, trt_options),
            ("CUDAExecutionProvider", {"device_id": 0, "use_tf32": int(self.precision == "tf32")}),
        ]

    def open_session(self, options, providers):
        """The session, built under a lock on its engine cache; a provider that cannot be created is a skip.
        Fallback is off: ONNX Runtime would otherwise retry on CUDA alone, at session creation and at run time."""
        engines, _ = self._folders()
        engines.mkdir(parents=True, exist_ok=True)
        try:
            with named_lock(f"ort-trt-engines:{engines}"):
                return self.ort.InferenceSession(self.model_path, options, providers=providers, enable_fallback=0)
        except Exception as error:
            message = str(error)
            if "Invalid TensorRT EP option: trt_bf16_enable" in message:
                raise Unavailable(
                    f"onnxruntime {self.ort.__version__} does not accept the TensorRT option "
                    "trt_bf16_enable (bf16 needs a newer onnxruntime-gpu)"
                ) from None
            if any(problem in message for problem in PROVIDER_PROBLEMS):
                raise Unavailable(
                    f"ONNX Runtime could not create the TensorRT provider: {one_line(message, 300)}"
                ) from None
            raise
