"""ONNX Runtime (CPU execution provider)."""

from __future__ import annotations

from parity.runtimes.onnx_common import OnnxRunner


class OrtRunner(OnnxRunner):
    """``ort``: an ONNX Runtime InferenceSession with aligned intra-op threads, all graph optimisations on."""

    optimization = "ORT_ENABLE_ALL"

    def __init__(self, spec, artifact_dir, meta, batch_size, threads, device="cpu", precision="fp32"):
        super().__init__(spec, artifact_dir, meta, batch_size, threads, device, precision)
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, self.optimization)
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(self.model_path, options, providers=["CPUExecutionProvider"])
        self.numerics = {"provider": "CPUExecutionProvider", "graph_optimization_level": self.optimization,
                         "device": device, "precision": precision, "float16_model": "float16" in meta}

    def run_impl(self, x):
        return tuple(self.session.run(self.output_names, self.feed(x)))


class OrtNoOptRunner(OrtRunner):
    """``ort-noopt``: the same session with graph optimisations disabled (no fusion, no constant folding),
    so a drift that only the optimised graph shows is told apart from one in the kernels."""

    optimization = "ORT_DISABLE_ALL"
