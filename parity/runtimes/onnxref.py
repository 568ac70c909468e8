"""onnx.reference: the ONNX specification's own Python evaluator (slow, an independent oracle)."""

from __future__ import annotations

from parity.runtimes.onnx_common import OnnxRunner


class OnnxRefRunner(OnnxRunner):
    """``onnxref``: ``onnx.reference.ReferenceEvaluator``."""

    def __init__(self, spec, artifact_dir, meta, batch_size, threads):
        super().__init__(spec, artifact_dir, meta, batch_size, threads)
        from onnx.reference import ReferenceEvaluator

        self.evaluator = ReferenceEvaluator(self.model_path)

    def run_impl(self, x):
        return tuple(self.evaluator.run(self.output_names, self.feed(x)))
