"""ONNX Runtime: one InferenceSession on one execution provider (here the CPU's; ``ort_cuda`` and ``ort_trt``
put the same session on the GPU providers)."""

from __future__ import annotations

import numpy as np

from parity.platform.errors import Unavailable
from parity.runtimes.onnx_common import OnnxRunner

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
        used = self.session.get_providers()
        if used[:1] != [self.provider]:
            raise Unavailable(f"ONNX Runtime did not start {self.provider} (its providers are {used}); see the worker log")
        self.numerics = {"onnxruntime": ort.__version__, "provider": self.provider, "provider_options": providers[0][1],
                         "graph_optimization_level": self.optimization, "device": device, "precision": precision,
                         "float16_model": "float16" in meta}

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
                raise RuntimeError(f"{type(error).__name__}: {error} (the model is opset {opset}; ONNX Runtime implements opset {MIN_OPSET} and "
                                  f"later: convert it with `parity init NAME --onnx FILE --opset 13 --force`, which runs "
                                  f"onnx.version_converter and records it)") from None
            raise

    def run_impl(self, x):
        return tuple(self.session.run(self.output_names, self.feed(x)))

    def device_compute(self, x):
        """On a GPU provider: I/O binding with the input already on the GPU and the outputs left there."""
        if self.device == "cpu":
            return None
        binding = self.session.io_binding()
        for name, value in self.feed(x).items():
            binding.bind_ortvalue_input(name, self.ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value), "cuda", 0))
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
