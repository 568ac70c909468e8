"""The environment manifest: versions, CPU, GPU, threads and flags, read without importing frameworks."""

from __future__ import annotations

import os
import sys

# importlib.metadata, platform and subprocess are imported where they are used: the CLI imports this module
# for ``default_threads`` and ``parity --help`` must start fast

PACKAGES = (
    "parity",
    "numpy",
    "click",
    "torch",
    "onnx",
    "onnxscript",
    "onnxruntime",
    "onnxruntime-gpu",
    "tensorflow",
    "tensorflow-cpu",
    "keras",
    "tf2onnx",
    "jax",
    "jaxlib",
    "jax2onnx",
    "tensorrt",
    "scikit-learn",
    "protobuf",
    "ml_dtypes",
)
# environment variables that change numerics or threading
FLAG_VARIABLES = (
    "TF_ENABLE_ONEDNN_OPTS",
    "TF_DETERMINISTIC_OPS",
    "XLA_FLAGS",
    "OMP_NUM_THREADS",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "ONEDNN_DEFAULT_FPMATH_MODE",
    "CUBLAS_WORKSPACE_CONFIG",
    "JAX_ENABLE_X64",
    "JAX_DEFAULT_MATMUL_PRECISION",
    "PARITY_CACHE_DIR",
)
CPUFREQ = "/sys/devices/system/cpu/cpu0/cpufreq"


def package_versions() -> dict[str, str]:
    """The installed versions of ``PACKAGES`` (those installed)."""
    from parity.platform.packages import installed, normalized

    found = installed()
    return {name: found[normalized(name)] for name in PACKAGES if normalized(name) in found}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def cpu_frequency() -> dict:
    """The frequency governor and current/max MHz of CPU 0, where the kernel exposes them (else None)."""

    def read(name: str):
        try:
            with open(f"{CPUFREQ}/{name}") as f:
                return f.read().strip()
        except OSError:
            return None

    khz = {name: read(name) for name in ("scaling_cur_freq", "cpuinfo_max_freq")}
    return {
        "governor": read("scaling_governor"),
        "mhz": int(khz["scaling_cur_freq"]) // 1000 if khz["scaling_cur_freq"] else None,
        "max_mhz": int(khz["cpuinfo_max_freq"]) // 1000 if khz["cpuinfo_max_freq"] else None,
    }


def gpu_info() -> dict | None:
    """The first GPU's name and driver, as ``devices.nvidia_gpus`` read them once from nvidia-smi; None where there
    is no NVIDIA GPU."""
    from parity.platform.devices import nvidia_gpus

    gpus = nvidia_gpus()
    return None if isinstance(gpus, str) else {"name": gpus[0]["name"], "driver": gpus[0]["driver"]}


THREADS_VARIABLE = "PARITY_THREADS"  # the thread count a command uses where none is given (default: every core)


def default_threads() -> int:
    """``PARITY_THREADS`` where set, else every core this process may run on; a value that is not a positive integer
    is a ``UsageError``."""
    text = os.environ.get(THREADS_VARIABLE, "").strip()
    if not text:
        return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
    if not text.isdigit() or int(text) < 1:
        from parity.platform.errors import UsageError

        raise UsageError(f"{THREADS_VARIABLE}={text!r}: give a thread count of 1 or more")
    return int(text)


def environment(threads: int, seed: int = 0) -> dict:
    """The manifest every result carries."""
    import platform

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_frequency": cpu_frequency(),
        "gpu": gpu_info(),
        "threads": threads,
        "flags": {name: os.environ[name] for name in FLAG_VARIABLES if name in os.environ},
        "seeds": {"training": seed},
        "executable": sys.executable,
    }
