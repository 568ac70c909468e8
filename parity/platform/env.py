"""The environment manifest: versions, CPU, GPU, threads and flags, read without importing frameworks."""

from __future__ import annotations

import os
import re
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
    found = installed()
    return {name: found[normalized(name)] for name in PACKAGES if normalized(name) in found}


def normalized(name: str) -> str:
    """A distribution's name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


_INSTALLED: dict[str, str] | None = None
KEEP_INSTALLED = 32  # tables kept in the cache folder, the newest


def path_stamps() -> list:
    """``sys.path``, each folder that holds installed distributions with its modification time (an install, upgrade
    or removal adds or removes a ``.dist-info`` folder there); the others (a script's folder, a source tree) by name
    only, since every file written there changes theirs."""
    stamps = []
    for entry in sys.path:
        try:
            with os.scandir(entry or ".") as found:
                installs = any(item.name.endswith((".dist-info", ".egg-info")) for item in found)
            stamps.append([entry, os.stat(entry or ".").st_mtime_ns if installs else None])
        except OSError:  # a zip file, a folder that is gone
            stamps.append([entry, None])
    return stamps


def installed() -> dict[str, str]:
    """Every distribution on ``sys.path`` (normalized name -> version; the first found wins, as imports do).

    Reading them all takes a tenth of a second, so the table is kept in the cache folder under a key over the
    interpreter and ``path_stamps()``, and read back only as a JSON object of strings."""
    global _INSTALLED
    if _INSTALLED is not None:
        return _INSTALLED
    import hashlib
    import json

    from parity.platform.cache_dir import cache_root

    key = hashlib.sha256(json.dumps([sys.executable, sys.version, path_stamps()]).encode()).hexdigest()[:32]
    path = cache_root() / "installed" / f"{key}.json"
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(table, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in table.items()):
            _INSTALLED = table
            return table
    except (OSError, ValueError):
        pass
    from importlib import metadata

    table = {}
    for dist in metadata.distributions():
        name, version = dist.metadata["Name"], dist.version
        if isinstance(name, str) and isinstance(version, str):
            table.setdefault(normalized(name), version)
    try:
        from parity.platform.safefs import write_json_atomic

        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, table)
        kept = sorted(path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in kept[KEEP_INSTALLED:]:
            old.unlink(missing_ok=True)
    except OSError:  # a read-only cache: read every time
        pass
    _INSTALLED = table
    return table


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
    """GPU name and driver from nvidia-smi, or None where there is no NVIDIA GPU."""
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not out:
        return None
    name, _, driver = out.splitlines()[0].partition(",")
    return {"name": name.strip(), "driver": driver.strip()}


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


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
