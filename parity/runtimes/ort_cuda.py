"""ONNX Runtime on the CUDA execution provider (onnxruntime-gpu)."""

from __future__ import annotations

from parity.runtimes.ort import OrtRunner


class OrtCudaRunner(OrtRunner):
    """``ort`` on a GPU: the session on ``CUDAExecutionProvider`` with TF32 set by the precision (``use_tf32``
    1 only at tf32), all graph optimisations on."""

    provider = "CUDAExecutionProvider"
    missing = (
        "onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu instead of onnxruntime: "
        "pip install parity[gpu])"
    )

    def providers(self):
        return [
            (
                self.provider,
                {"device_id": 0, "use_tf32": int(self.precision == "tf32"), "cudnn_conv_algo_search": "EXHAUSTIVE"},
            )
        ]


class OrtCudaNoOptRunner(OrtCudaRunner):
    """``ort-noopt`` on a GPU: the CUDA provider with graph optimisations disabled."""

    optimization = "ORT_DISABLE_ALL"
