"""The precision axis: what each precision means, its default tolerances, and the numerics flags set for it.

Every precision runs with the flags that change numerics set explicitly, never left to a framework's
defaults, and the runner records what it set (``Runner.numerics``), so a result says what it ran with:

* ``fp32``: float32 storage and arithmetic, TF32 off everywhere (torch matmul and cuDNN switches,
  JAX ``default_matmul_precision="highest"``, TensorFlow ``enable_tensor_float_32_execution(False)``,
  ONNX Runtime CUDA ``use_tf32=0``, TensorRT without ``BuilderFlag.TF32``, ``NVIDIA_TF32_OVERRIDE=0``).
* ``tf32``: float32 storage, matmuls and convolutions allowed on TF32 tensor cores (NVIDIA GPUs only).
* ``fp16`` / ``bf16``: weights and activations in that dtype (``model.half()`` style; an ONNX model is
  converted with onnxconverter-common, keeping the ops that must stay float32 in float32); inputs are
  cast at the model's edge and outputs compared in float64 against the float64 golden.

Default tolerances are derived from the dtype's machine epsilon, as JAX's test utilities derive theirs,
with gradients ten times looser than outputs (JAX's ratio). A spec overrides them per precision.
"""

from __future__ import annotations

from typing import NamedTuple

from parity.platform.errors import UsageError


class Precision(NamedTuple):  # not a dataclass: `parity --help` imports this module, and dataclasses costs start-up
    name: str
    dtype: str  # storage dtype of weights and activations
    mantissa_bits: int  # explicit fraction bits of the arithmetic (TF32 rounds matmul inputs to 10)
    gpu_only: bool = False
    description: str = ""

    @property
    def eps(self) -> float:
        return 2.0**-self.mantissa_bits


PRECISIONS = {
    "fp32": Precision("fp32", "float32", 23, description="float32, TF32 off"),
    "tf32": Precision("tf32", "float32", 10, gpu_only=True, description="float32 storage, TF32 tensor-core matmuls"),
    "fp16": Precision("fp16", "float16", 10, description="float16 weights and activations"),
    "bf16": Precision("bf16", "bfloat16", 7, description="bfloat16 weights and activations"),
}

# machine epsilon of each storage dtype (the spacing of numbers in [1, 2))
DTYPE_EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}
# smallest normal number of each (below it numbers are subnormal, with a fixed spacing of eps * min_normal)
DTYPE_MIN_NORMAL = {"float64": 2.0**-1022, "float32": 2.0**-126, "float16": 2.0**-14, "bfloat16": 2.0**-126}

# Default model-output tolerance: this many epsilons (atol and rtol). A network of a few layers
# accumulates the rounding of every layer: on a CPU the built-in models reach 0.2-0.53 of it at bf16
# (every native path) and 0.17-0.96 at fp16 (native and ONNX paths; the cnn, at 0.96, declares its own).
OUTPUT_EPS = 16
GRADIENT_FACTOR = 10  # gradients: ten times looser than outputs, as jax._src.public_test_util does


def get(name: str) -> Precision:
    try:
        return PRECISIONS[name]
    except KeyError:
        raise UsageError(f"unknown precision {name!r}; known: {', '.join(PRECISIONS)}") from None


def default_tolerance(name: str, gradients: bool = False) -> tuple[float, float]:
    """(atol, rtol) for a reduced precision, from its epsilon."""
    value = OUTPUT_EPS * get(name).eps * (GRADIENT_FACTOR if gradients else 1)
    return value, value


def torch_flags(torch, precision: str, device: str) -> dict:
    """Set every torch switch that changes float32 / reduced-precision numerics; return what was set.

    CUDA matmuls and cuDNN take the ``allow_tf32`` switches (torch >= 2.9 also has per-operator
    ``fp32_precision`` ones, but mixing the two is an error there, and torch.export reads the legacy
    ones); oneDNN on the CPU, which may otherwise run float32 matmuls in reduced precision, is pinned to
    ``"ieee"`` where torch has that switch.
    """
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    # a float16 / bfloat16 matmul accumulates in float32: no reduced-precision reductions
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    flags = {
        "torch.backends.cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "torch.backends.cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "torch.float32_matmul_precision": torch.get_float32_matmul_precision(),
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": False,
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": False,
    }
    for name in ("matmul", "conv", "rnn"):
        backend = getattr(torch.backends.mkldnn, name, None)
        if backend is not None and hasattr(backend, "fp32_precision"):
            backend.fp32_precision = "ieee"
            flags[f"torch.backends.mkldnn.{name}.fp32_precision"] = backend.fp32_precision
    return {**flags, "dtype": get(precision).dtype, "device": device}


def jax_flags(jax, precision: str, device: str) -> dict:
    """JAX's default matmul/convolution precision, explicit: full float32 unless TF32 is asked for."""
    matmul = "tensorfloat32" if precision == "tf32" else "highest"
    jax.config.update("jax_default_matmul_precision", matmul)
    return {"jax_default_matmul_precision": matmul, "dtype": get(precision).dtype, "device": device}


def tf_flags(tf, precision: str, device: str) -> dict:
    tf32 = precision == "tf32"
    tf.config.experimental.enable_tensor_float_32_execution(tf32)
    return {
        "tf.config.experimental.enable_tensor_float_32_execution": tf32,
        "dtype": get(precision).dtype,
        "device": device,
    }


def worker_environment(device: str, precision: str) -> dict[str, str | None]:
    """Environment of a worker process for this device and precision (None: unset), set before any import.

    ``NVIDIA_TF32_OVERRIDE=0`` turns TF32 off in cuBLAS/cuDNN whatever a framework asks; a tf32 run unsets it
    so an inherited ``0`` cannot silently make it an fp32 run. Inside the worker the chosen GPU is device 0.
    """
    if device == "cpu":
        return {"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": "", **jax_compile_cache()}
    index = device.partition(":")[2] or "0"
    return {
        **jax_compile_cache(),
        "JAX_PLATFORMS": "cuda,cpu",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": index,
        "NVIDIA_TF32_OVERRIDE": None if precision == "tf32" else "0",
    }


def jax_compile_cache() -> dict[str, str]:
    """JAX's persistent compilation cache under parity's cache folder (``jax-compile``, at most 2 GiB, least
    recently used first out), so a worker that compiles a function another process compiled before loads it: a
    cache hit is the same executable, keyed by JAX on the program, the compile options, the backend and JAX's
    version. A ``JAX_COMPILATION_CACHE_DIR`` of the user's own is left as it is."""
    import os

    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return {}
    from parity.platform.cache_dir import cache_root

    return {
        "JAX_COMPILATION_CACHE_DIR": str(cache_root() / "jax-compile"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.1",
        "JAX_COMPILATION_CACHE_MAX_SIZE": str(2 << 30),
    }


def parse_device(text: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N`` (normalised: ``cuda`` is ``cuda:0``)."""
    if text == "cpu":
        return "cpu"
    kind, _, index = text.partition(":")
    if kind == "cuda" and (index == "" or index.isdigit()):
        return f"cuda:{int(index or 0)}"
    raise UsageError(f"unknown device {text!r}; use cpu, cuda or cuda:N")
