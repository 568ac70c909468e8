"""Which devices exist here and which installed builds can use a GPU, found without importing a framework.

``parity paths`` and the orchestrator ask these questions before any worker starts, so a path that
cannot run says why (no NVIDIA GPU, a CPU-only torch, jaxlib without its CUDA plugin, the CPU build of
ONNX Runtime, no TensorRT) instead of failing. Inside a worker the runners check again with the
framework itself and raise ``parity.platform.errors.Unavailable``, which is a skip too.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path


@functools.lru_cache(maxsize=1)
def nvidia_gpus() -> tuple[dict, ...] | str:
    """The NVIDIA GPUs nvidia-smi lists (index, name, driver, compute capability), or why there are none."""
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU here (nvidia-smi not found)"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,driver_version,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as error:
        return f"no usable NVIDIA GPU here (nvidia-smi failed: {error})"
    gpus = []
    for line in out.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 4 and fields[0].isdigit():
            gpus.append(
                {"index": int(fields[0]), "name": fields[1], "driver": fields[2], "compute_capability": fields[3]}
            )
    return tuple(gpus) or "no NVIDIA GPU here (nvidia-smi lists none)"


def gpu(device: str) -> dict | str:
    """The GPU a ``cuda:N`` device names, or why it is not here."""
    gpus = nvidia_gpus()
    if isinstance(gpus, str):
        return gpus
    index = int(device.partition(":")[2] or 0)
    for found in gpus:
        if found["index"] == index:
            return found
    return f"{device} does not exist here (nvidia-smi lists {len(gpus)} GPU{'s' if len(gpus) != 1 else ''})"


def _version(distribution: str) -> str | None:
    from parity.platform.packages import installed, normalized

    return installed().get(normalized(distribution))


def _package_file(package: str, relative: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / relative


def _torch() -> str | None:
    version_file = _package_file("torch", "version.py")
    text = version_file.read_text() if version_file and version_file.exists() else ""
    if re.search(r"^cuda\s*(:[^=]*)?=\s*None", text, flags=re.MULTILINE):
        return (
            f"torch {_version('torch')} is a CPU-only build (install a CUDA build, e.g. pip install torch "
            "--index-url https://download.pytorch.org/whl/cu128)"
        )
    return None


def _jax() -> str | None:
    plugins = [
        d for d in ("jax-cuda13-plugin", "jax-cuda12-plugin", "jax_cuda13_plugin", "jax_cuda12_plugin") if _version(d)
    ]
    if not plugins:
        return f"jaxlib {_version('jaxlib')} has no CUDA plugin (pip install 'jax[cuda12]')"
    return None


def _onnxruntime() -> str | None:
    if _version("onnxruntime-gpu") is None:
        return (
            "onnxruntime is the CPU build (pip uninstall onnxruntime, then pip install onnxruntime-gpu, or parity[gpu])"
        )
    return None


def _tensorflow() -> str | None:
    if _version("tensorflow-cpu") is not None:
        return f"tensorflow-cpu {_version('tensorflow-cpu')} has no GPU support (pip install 'tensorflow[and-cuda]')"
    build_info = _package_file("tensorflow", "python/platform/build_info.py")
    if build_info and build_info.exists() and "'is_cuda_build': True" not in build_info.read_text():
        return f"tensorflow {_version('tensorflow')} is not a CUDA build (pip install 'tensorflow[and-cuda]')"
    return None


# import name -> why the installed build cannot use a GPU (None: it can, as far as files tell)
_CUDA_BUILD = {"torch": _torch, "jax": _jax, "onnxruntime": _onnxruntime, "tensorflow": _tensorflow}


def cuda_build_problems(packages) -> list[str]:
    """For each installed package that a GPU path runs on, why its build cannot use CUDA."""
    return [reason for reason in (_CUDA_BUILD[p]() for p in packages if p in _CUDA_BUILD) if reason]


def engine_identity(device: str) -> dict:
    """What a TensorRT engine is only valid for: TensorRT version, GPU name and compute capability."""
    found = gpu(device)
    return {
        "tensorrt": _version("tensorrt") or _version("tensorrt-cu12") or _version("tensorrt-cu13"),
        "gpu": found.get("name") if isinstance(found, dict) else None,
        "compute_capability": found.get("compute_capability") if isinstance(found, dict) else None,
    }
