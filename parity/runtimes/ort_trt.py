"""ONNX Runtime with the TensorRT execution provider (the CUDA provider behind it for nodes TensorRT does not take).

ONNX Runtime names a cached engine after the model's file name and its node names, not its weights, shapes or
build options, so each model file (by content) and precision gets an engine cache folder of its own; the timing
cache, keyed on layer configurations, is shared. The provider has no TF32 switch: the worker sets
``NVIDIA_TF32_OVERRIDE=0`` for every precision but tf32, and TensorRT honours it while it builds.
"""

from __future__ import annotations

import os

from parity.cache import cache_root, lock_path
from parity.errors import Unavailable, one_line
from parity.runtimes.onnx_common import OnnxRunner
from parity.safefs import sha256_file

TRT_EP = "TensorrtExecutionProvider"
CUDA_EP = "CUDAExecutionProvider"
NO_TRT_EP = ("onnxruntime has no TensorrtExecutionProvider (install onnxruntime-gpu and TensorRT: "
             "pip install parity[gpu])")
# what ONNX Runtime says when it cannot create the TensorRT provider or does not know one of its options
PROVIDER_PROBLEMS = ("Invalid TensorRT EP option", "install TensorRT libraries", "providers_tensorrt", "libnvinfer")


class OrtTrtRunner(OnnxRunner):
    """``ort-trt``: an InferenceSession whose first provider is TensorRT; falling back to another is a skip."""

    def __init__(self, spec, artifact_dir, meta, batch_size, threads, device="cpu", precision="fp32"):
        super().__init__(spec, artifact_dir, meta, batch_size, threads, device, precision)
        import onnxruntime as ort

        self.ort = ort
        if TRT_EP not in ort.get_available_providers():
            raise Unavailable(NO_TRT_EP)
        shared = cache_root() / "tensorrt" / "ort-trt"
        engines = shared / f"{sha256_file(self.model_path)[:16]}-{precision}-ort{ort.__version__}"
        engines.mkdir(parents=True, exist_ok=True)
        trt_options = {"device_id": 0, "trt_fp16_enable": precision == "fp16",
                       "trt_engine_cache_enable": True, "trt_engine_cache_path": str(engines),
                       "trt_timing_cache_enable": True, "trt_timing_cache_path": str(shared)}
        if precision == "bf16":  # asked for only when needed: older onnxruntime does not know the option
            trt_options["trt_bf16_enable"] = True
        cuda_options = {"device_id": 0, "use_tf32": int(precision == "tf32")}
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = self._session(options, [(TRT_EP, trt_options), (CUDA_EP, cuda_options)], engines)
        used = self.session.get_providers()
        if not used or used[0] != TRT_EP:
            raise Unavailable(f"ONNX Runtime did not use TensorRT (its providers are {used}): TensorRT's libraries "
                              "could not be loaded or the provider could not be created; see the worker log")
        override = os.environ.get("NVIDIA_TF32_OVERRIDE")
        self.numerics = {"onnxruntime": ort.__version__, "precision": precision, "device": device,
                         "providers": {TRT_EP: trt_options, CUDA_EP: cuda_options},
                         "NVIDIA_TF32_OVERRIDE": override, "tf32": override != "0",
                         "tf32_note": "the TensorRT provider has no TF32 option: TensorRT's default (on) applies "
                                      "unless NVIDIA_TF32_OVERRIDE=0"}

    def _session(self, options, providers, engines):
        """The session, built under a lock on its engine cache; a provider that cannot be created is a skip.
        Fallback is off: ONNX Runtime would otherwise retry on CUDA alone, at session creation and at run time."""
        from filelock import FileLock

        try:
            with FileLock(str(lock_path(f"ort-trt-engines:{engines}"))):
                return self.ort.InferenceSession(self.model_path, options, providers=providers, enable_fallback=0)
        except Exception as error:
            message = str(error)
            if "Invalid TensorRT EP option: trt_bf16_enable" in message:
                raise Unavailable(f"onnxruntime {self.ort.__version__} does not accept the TensorRT option "
                                  "trt_bf16_enable (bf16 needs a newer onnxruntime-gpu)") from None
            if any(problem in message for problem in PROVIDER_PROBLEMS):
                raise Unavailable(f"ONNX Runtime could not create the TensorRT provider: {one_line(message, 300)}") from None
            raise

    def run_impl(self, x):
        return tuple(self.session.run(self.output_names, self.feed(x)))

    def device_compute(self, x):
        binding = self.session.io_binding()
        value = self.ort.OrtValue.ortvalue_from_numpy(self.feed(self.check_feed(x))[self.input_name], "cuda", 0)
        binding.bind_ortvalue_input(self.input_name, value)
        for name in self.output_names:
            binding.bind_output(name, "cuda")

        def compute():
            self.session.run_with_iobinding(binding)
            binding.synchronize_outputs()

        return compute
