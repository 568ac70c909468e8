"""Software stacks and hardware as cluster resources: what a path needs from a node, what a node can advertise.

A stack is a set of packages a path's steps import (``parity-torch``: torch; ``parity-tf``: tensorflow, keras,
tf2onnx; ``parity-jax``: jax, jax2onnx; ``parity-onnx``: onnx, onnxruntime, onnxscript, onnxconverter_common;
``parity-trt``: tensorrt, cuda-python). A node advertises a stack when every package of it is installed there
(found without importing it), its GPUs (Ray detects those itself, with ``accelerator_type:<model>``), and one
``parity-bench`` unit so that no two timing cells share it. NumPy only; nothing here imports a framework.
"""

from __future__ import annotations

import importlib.util

STACKS = {
    "parity-torch": ("torch",),
    "parity-tf": ("tensorflow", "keras", "tf2onnx"),
    "parity-jax": ("jax", "jax2onnx"),
    "parity-onnx": ("onnx", "onnxruntime", "onnxscript", "onnxconverter_common"),
    "parity-trt": ("tensorrt", "cuda"),
}
BENCH = "parity-bench"


def _stack_of(package: str) -> str | None:
    return next((name for name, packages in STACKS.items() if package in packages), None)


def needed(path) -> dict[str, float]:
    """The custom resources a cell of ``path`` requests: one unit of each stack its steps import."""
    return {stack: 1.0 for stack in dict.fromkeys(_stack_of(p) for p in path.packages) if stack}


def installed(stack: str) -> bool:
    return all(importlib.util.find_spec(p) is not None for p in STACKS[stack])


def advertised() -> dict[str, float]:
    """What this node should advertise (``ray start --resources``): its complete stacks, and ``parity-bench`` 1.
    A stack counts once per node (cells request one unit; Ray's CPUs and GPUs bound how many run at once)."""
    found = {stack: 1000.0 for stack in STACKS if installed(stack)}
    return {**found, BENCH: 1.0}
