"""Which distribution provides each package a path's steps import (on CPU, and on GPU where it differs), the packages
of each source framework, and the packages pip will not install beside parity's pinned stack, with its reason:
what ``parity.run.paths.unavailable_reason`` says in its install hints.
"""

# package name as imported -> distribution to install
INSTALL_NAMES = {
    "tensorflow": "tensorflow-cpu",
    "jax": "jax",
    "torch": "torch",
    "onnx": "onnx",
    "onnxruntime": "onnxruntime",
    "onnxscript": "onnxscript",
    "tf2onnx": "tf2onnx",
    "jax2onnx": "jax2onnx",
    "keras": "keras",
    "onnxconverter_common": "onnxconverter-common",
    "tensorrt": "tensorrt",
    "cuda": "cuda-python",
    "openvino": "openvino",
    "ai_edge_litert": "ai-edge-litert",
    "executorch": "executorch",
    "litert_torch": "litert-torch",
    "nncf": "nncf",
    "torchao": "torchao",
}
# packages the installer refuses beside parity's pinned stack: its own reason, said instead of an install hint
WONT_INSTALL = {
    "litert_torch": "pip refuses litert-torch 0.10 beside this stack: xdsl 0.28.0 (through litert-converter "
    "0.5.0) depends on typing-extensions<4.13 and >=4.7, and constraints.txt pins "
    "typing-extensions==4.16.0"
}
GPU_INSTALL_NAMES = {"tensorflow": "tensorflow[and-cuda]", "onnxruntime": "onnxruntime-gpu", "jax": "jax[cuda12]"}
SOURCE_PACKAGES = {"torch": ("torch",), "tf": ("tensorflow", "keras"), "jax": ("jax",), "onnx": ("onnx",)}
