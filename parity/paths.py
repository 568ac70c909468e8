"""The path matrix: every source -> export -> runtime chain parity knows, and why one is unavailable.

A path is declared once here as data; adding a runtime or exporter is one ``Step`` and one
line in ``PATHS``. Each step names the worker group (process) it runs in, so TensorFlow,
PyTorch and JAX never share a process; only the jax2tf conversion itself needs JAX and
TensorFlow together, and it gets its own group.
"""

from __future__ import annotations

import fnmatch
import importlib.util
from dataclasses import dataclass

from parity.errors import UsageError


@dataclass(frozen=True)
class Step:
    """One export or runtime step: where it runs and which packages it needs."""

    name: str
    group: str
    target: str  # "module:attribute" called in the worker
    packages: tuple[str, ...]
    differentiable: bool = False


@dataclass(frozen=True)
class PathDef:
    """A path: a source, its export chain, and the runtime that runs the final artifact."""

    id: str
    source: str
    exports: tuple[Step, ...]
    runtime: Step
    device: str = "cpu"
    precision: str = "fp32"

    @property
    def stages(self) -> list[str]:
        return self.id.split("/")

    @property
    def packages(self) -> tuple[str, ...]:
        names = [*SOURCE_PACKAGES[self.source]]
        for step in (*self.exports, self.runtime):
            names.extend(p for p in step.packages if p not in names)
        return tuple(names)

    @property
    def differentiable(self) -> bool:
        return self.runtime.differentiable

    @property
    def definition(self) -> str:
        """The path that computes the source model as its definition says: the native source, or for an ONNX
        file the ONNX reference evaluator (what the ONNX specification says the file computes)."""
        return self.source if self.source in NATIVE else f"{self.source}/onnxref"

    @property
    def baseline(self) -> str:
        """The path timings are compared with by default: the native source (ONNX Runtime for an ONNX file)."""
        return self.source if self.source in NATIVE else f"{self.source}/ort"


# package name as imported -> distribution to install
INSTALL_NAMES = {"tensorflow": "tensorflow-cpu", "jax": "jax", "torch": "torch", "onnx": "onnx",
                 "onnxruntime": "onnxruntime", "onnxscript": "onnxscript", "tf2onnx": "tf2onnx",
                 "jax2onnx": "jax2onnx", "keras": "keras"}
SOURCE_PACKAGES = {"torch": ("torch",), "tf": ("tensorflow", "keras"), "jax": ("jax",), "onnx": ("onnx",)}

# native runtimes: the source framework runs its own model
NATIVE = {
    "torch": Step("torch", "torch", "parity.sources.torch:TorchSource", ("torch",), differentiable=True),
    "tf": Step("tf", "tf", "parity.sources.tf:KerasSource", ("tensorflow", "keras"), differentiable=True),
    "jax": Step("jax", "jax", "parity.sources.jax:JaxSource", ("jax",), differentiable=True),
}
TORCH_ONNX = Step("torch.onnx", "torch", "parity.exporters.torch_onnx:export", ("torch", "onnx", "onnxscript"))
TF2ONNX = Step("tf2onnx", "tf", "parity.exporters.tf_onnx:export_keras", ("tensorflow", "tf2onnx", "onnx"))
JAX2ONNX = Step("jax2onnx", "jax", "parity.exporters.jax_onnx:export", ("jax", "jax2onnx", "onnx"))
JAX2TF = Step("jax2tf", "jax+tf", "parity.exporters.jax_tf:export", ("jax", "tensorflow"))
SAVEDMODEL2ONNX = Step("tf2onnx", "tf", "parity.exporters.tf_onnx:export_saved_model", ("tensorflow", "tf2onnx", "onnx"))
ONNX_FILE = Step("onnx file", "onnx", "parity.exporters.onnx_file:export", ("onnx",))
ORT = Step("ort", "onnx", "parity.runtimes.ort:OrtRunner", ("onnxruntime",))
ORT_NOOPT = Step("ort-noopt", "onnx", "parity.runtimes.ort:OrtNoOptRunner", ("onnxruntime",))
ONNXREF = Step("onnxref", "onnx", "parity.runtimes.onnxref:OnnxRefRunner", ("onnx",))
TF_SAVEDMODEL = Step("tf", "tf", "parity.runtimes.tf_savedmodel:SavedModelRunner", ("tensorflow",), differentiable=True)

PATHS: tuple[PathDef, ...] = (
    PathDef("torch", "torch", (), NATIVE["torch"]),
    PathDef("torch/onnx/ort", "torch", (TORCH_ONNX,), ORT),
    PathDef("torch/onnx/onnxref", "torch", (TORCH_ONNX,), ONNXREF),
    PathDef("tf", "tf", (), NATIVE["tf"]),
    PathDef("tf/onnx/ort", "tf", (TF2ONNX,), ORT),
    PathDef("tf/onnx/onnxref", "tf", (TF2ONNX,), ONNXREF),
    PathDef("jax", "jax", (), NATIVE["jax"]),
    PathDef("jax/onnx/ort", "jax", (JAX2ONNX,), ORT),
    PathDef("jax/onnx/onnxref", "jax", (JAX2ONNX,), ONNXREF),
    PathDef("jax/tf", "jax", (JAX2TF,), TF_SAVEDMODEL),
    PathDef("jax/tf/onnx/ort", "jax", (JAX2TF, SAVEDMODEL2ONNX), ORT),
    # an ONNX file as the source: the file as it is, under each runtime
    PathDef("onnx/ort", "onnx", (ONNX_FILE,), ORT),
    PathDef("onnx/ort-noopt", "onnx", (ONNX_FILE,), ORT_NOOPT),
    PathDef("onnx/onnxref", "onnx", (ONNX_FILE,), ONNXREF),
)


def missing_packages(path: PathDef) -> list[str]:
    """Packages the path needs that are not installed (found without importing them)."""
    return [name for name in path.packages if importlib.util.find_spec(name) is None]


def unavailable_reason(path: PathDef) -> str | None:
    """Why the path cannot run here, or None. A missing framework is a skip, never an ImportError."""
    missing = missing_packages(path)
    if missing:
        installs = " ".join(INSTALL_NAMES.get(m, m) for m in missing)
        return f"{', '.join(missing)} not installed (pip install {installs}, or parity[cpu])"
    if path.device != "cpu":
        return f"device {path.device} not available"
    return None


def select(patterns=(), frameworks=None, device: str | None = None, precision: str | None = None) -> list[PathDef]:
    """Paths matching any of the glob ``patterns`` (all if none), for the given source frameworks."""
    chosen = [
        p for p in PATHS
        if (frameworks is None or p.source in frameworks)
        and (device is None or p.device == device)
        and (precision is None or p.precision == precision)
    ]
    if patterns:
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(p.id, pattern) for p in PATHS):
                raise UsageError(f"--path {pattern!r} matches no path; known paths: {', '.join(p.id for p in PATHS)}")
        chosen = [p for p in chosen if any(fnmatch.fnmatchcase(p.id, pat) for pat in patterns)]
    return chosen


def by_id(path_id: str) -> PathDef:
    for p in PATHS:
        if p.id == path_id:
            return p
    raise UsageError(f"unknown path {path_id!r}; known paths: {', '.join(p.id for p in PATHS)}")


def load_target(target: str):
    module_name, attribute = target.split(":")
    return getattr(importlib.import_module(module_name), attribute)
