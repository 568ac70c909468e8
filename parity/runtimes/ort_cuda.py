"""ONNX Runtime on the CUDA execution provider (onnxruntime-gpu)."""

from __future__ import annotations

import numpy as np

from parity.errors import Unavailable
from parity.runtimes.onnx_common import OnnxRunner


class OrtCudaRunner(OnnxRunner):
    """``ort`` on a GPU: an InferenceSession on ``CUDAExecutionProvider`` with TF32 set by the precision
    (``use_tf32`` 1 only at tf32), all graph optimisations on. A session that silently fell back to the
    CPU is refused (a skip with the reason), never timed as a GPU path."""

    optimization = "ORT_ENABLE_ALL"

    def __init__(self, spec, artifact_dir, meta, batch_size, threads, device="cuda:0", precision="fp32"):
        super().__init__(spec, artifact_dir, meta, batch_size, threads, device, precision)
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise Unavailable(f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (install onnxruntime-gpu "
                              "instead of onnxruntime: pip install parity[gpu])")
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, self.optimization)
        options.log_severity_level = 3
        cuda = {"device_id": 0, "use_tf32": 1 if precision == "tf32" else 0, "cudnn_conv_algo_search": "EXHAUSTIVE"}
        self.session = ort.InferenceSession(self.model_path, options, providers=[("CUDAExecutionProvider", cuda)])
        if self.session.get_providers()[0] != "CUDAExecutionProvider":
            raise Unavailable(f"onnxruntime did not start its CUDA provider (providers {self.session.get_providers()})")
        self.ort = ort
        self.numerics = {"provider": "CUDAExecutionProvider", "provider_options": cuda,
                         "graph_optimization_level": self.optimization, "device": device, "precision": precision,
                         "float16_model": "float16" in meta}

    def run_impl(self, x):
        return tuple(self.session.run(self.output_names, self.feed(x)))

    def device_compute(self, x):
        """IOBinding with the input already on the GPU and the outputs left there."""
        feed = self.feed(x)
        binding = self.session.io_binding()
        for name, value in feed.items():
            binding.bind_ortvalue_input(name, self.ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value), "cuda", 0))
        for name in self.output_names:
            binding.bind_output(name, "cuda", 0)

        def compute():
            self.session.run_with_iobinding(binding)
            binding.synchronize_outputs()

        return compute


class OrtCudaNoOptRunner(OrtCudaRunner):
    """``ort-noopt`` on a GPU: the CUDA provider with graph optimisations disabled."""

    optimization = "ORT_DISABLE_ALL"
