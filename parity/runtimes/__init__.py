"""Runtimes: each implements the ``Runner`` contract of ``parity.runtimes.base`` (ONNX Runtime, onnx.reference,
TF SavedModel, TensorRT). Imports platform, interop and model; a framework only inside a runner.
"""
