"""onnx.reference: the ONNX specification's own Python evaluator (slow, an independent oracle)."""

from __future__ import annotations

from parity.runtimes.onnx_common import OnnxRunner, low_precision_types


class OnnxRefRunner(OnnxRunner):
    """``onnxref``: ``onnx.reference.ReferenceEvaluator``."""

    def __init__(self, spec, artifact_dir, meta, batch_size, threads, device="cpu", precision="fp32"):
        super().__init__(spec, artifact_dir, meta, batch_size, threads, device, precision)
        from onnx.reference import ReferenceEvaluator

        self.evaluator = ReferenceEvaluator(self.model_path)
        # the evaluator takes bfloat16, float8 and 4-bit inputs as ml_dtypes arrays
        self.graph_dtypes = low_precision_types(self.evaluator.input_names, self.evaluator.input_types)
        self.numerics = {
            "evaluator": "onnx.reference",
            "device": device,
            "precision": precision,
            "float16_model": "float16" in meta,
        }

    def run_impl(self, x):
        return tuple(self.evaluator.run(self.output_names, self.feed(x)))
