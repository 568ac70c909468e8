"""The path matrix: every source -> export -> runtime chain parity knows, and why one is unavailable.

A path is declared once here as data; adding a runtime or exporter is one ``Step`` and one
line in ``CHAINS``; ``matrix`` puts each chain on every device and precision. Each step names the
worker group (process) it runs in, so TensorFlow, PyTorch and JAX never share a process; only the
jax2tf conversion itself needs JAX and TensorFlow together, and it gets its own group.
"""

from __future__ import annotations

import fnmatch
import importlib.util
from dataclasses import dataclass
from typing import Any

from parity.platform import devices
from parity.platform.errors import UsageError
from parity.platform.precision import PRECISIONS
from parity.run.install_names import GPU_INSTALL_NAMES, INSTALL_NAMES, SOURCE_PACKAGES, WONT_INSTALL

ALL = tuple(PRECISIONS)
NOT_ON_CPU = "TF32 is a tensor-core mode of NVIDIA GPUs (Ampere or newer); run it with --device cuda"


@dataclass(frozen=True)
class Step:
    """One export or runtime step: where it runs, which packages it needs, on which devices and at which
    precisions. ``targets`` maps a device kind (``cpu``, ``cuda``) to the ``module:attribute`` called in
    the worker; a step runs on the devices it names. ``precisions`` are those it can do at all; ``why_not``
    says why it cannot do the others. ``keyed_on`` names what besides its inputs its artifact depends on
    (``precision``, ``device``), so the export cache keys it on that too."""

    name: str
    group: str
    targets: dict
    packages: tuple[str, ...]
    differentiable: bool = False
    precisions: tuple[str, ...] = ALL
    why_not: str = ""
    keyed_on: tuple[str, ...] = ()
    cuda_packages: tuple[str, ...] = ()  # needed on a GPU only
    note: str = ""  # shown by `parity paths`
    extra: str = "cpu"  # the extra that installs its packages: pip install 'parity[<extra>]'
    quantizes: bool = False  # writes an int8 model: its path is judged by the accuracy gate, not elementwise
    # ``module:function`` importing what the step's first task in a worker imports: a template that has already
    # forked a worker for the step runs it once, so that the workers forked after it start with it imported
    warm: str = ""

    @property
    def target(self) -> str:
        return next(iter(self.targets.values()))


@dataclass(frozen=True)
class PathDef:
    """A path: a source, its export chain, and the runtime that runs the final artifact, on a device at a
    precision. The id names the chain only (``torch/onnx/ort``); device and precision are separate fields.
    A reduced-precision ONNX path has one more export step than its id shows: the float16 conversion."""

    id: str
    source: str
    exports: tuple[Step, ...]
    runtime: Step
    device: str = "cpu"
    precision: str = "fp32"
    opt_in: str = ""  # why it runs only where a --path names it (a compile that costs more than seconds per model)
    float_path: str = ""  # a quantized path: the float path it is quantized from (its speed-up is over that path)

    @property
    def stages(self) -> list[str]:
        return self.id.split("/")

    @property
    def device_kind(self) -> str:
        return self.device.partition(":")[0]

    @property
    def runtime_target(self) -> str:
        return self.runtime.targets[self.device_kind]

    @property
    def packages(self) -> tuple[str, ...]:
        names = [*SOURCE_PACKAGES[self.source]]
        for step in (*self.exports, self.runtime):
            extra = step.cuda_packages if self.device_kind == "cuda" else ()
            names.extend(p for p in (*step.packages, *extra) if p not in names)
        return tuple(names)

    @property
    def differentiable(self) -> bool:
        return self.runtime.differentiable and not self.quantized

    @property
    def quantized(self) -> bool:
        """An int8 path: judged by the spec's accuracy ``Gate`` on the eval split, not by elementwise tolerances."""
        return any(step.quantizes for step in self.exports)

    @property
    def definition(self) -> str:
        """The path that computes the source model as its definition says: the native source, or for an ONNX
        file the ONNX reference evaluator (what the ONNX specification says the file computes)."""
        return self.source if self.source in NATIVE else f"{self.source}/onnxref"

    @property
    def baseline(self) -> str:
        """The path timings are compared with by default: the native source (ONNX Runtime for an ONNX file)."""
        return self.source if self.source in NATIVE else f"{self.source}/ort"


def _on(cpu: str | None, cuda: str | None) -> dict:
    return {kind: target for kind, target in (("cpu", cpu), ("cuda", cuda)) if target}


def _native(name: str, group: str, target: str, packages) -> Step:
    return Step(name, group, _on(target, target), packages, differentiable=True)


# native runtimes: the source framework runs its own model
NATIVE = {
    "torch": _native("torch", "torch", "parity.sources.torch:TorchSource", ("torch",)),
    "tf": _native("tf", "tf", "parity.sources.tf:KerasSource", ("tensorflow", "keras")),
    "jax": _native("jax", "jax", "parity.sources.jax:JaxSource", ("jax",)),
}
_ONNX_CPU = ("fp32", "fp16")
UNVERIFIED = (
    "written against TensorRT's documented Python API (10/11); TensorRT cannot be installed on parity's "
    "own development and CI machines, so this runtime is unverified there"
)
_NO_ONNX_BF16 = (
    "no well-kept float32 -> bfloat16 ONNX converter exists and ONNX Runtime has few bfloat16 kernels; "
    "bf16 ONNX paths run on TensorRT (--device cuda)"
)
TORCH_ONNX = Step(
    "torch.onnx",
    "torch",
    _on("parity.exporters.torch_onnx:export", None),
    ("torch", "onnx", "onnxscript"),
    warm="parity.exporters.torch_onnx:warm",
)
TF2ONNX = Step("tf2onnx", "tf", _on("parity.exporters.tf_onnx:export_keras", None), ("tensorflow", "tf2onnx", "onnx"))
JAX2ONNX = Step("jax2onnx", "jax", _on("parity.exporters.jax_onnx:export", None), ("jax", "jax2onnx", "onnx"))
JAX2TF = Step("jax2tf", "jax+tf", _on("parity.exporters.jax_tf:export", None), ("jax", "tensorflow"))
SAVEDMODEL2ONNX = Step(
    "tf2onnx", "tf", _on("parity.exporters.tf_onnx:export_saved_model", None), ("tensorflow", "tf2onnx", "onnx")
)
ONNX_FILE = Step("onnx file", "onnx", _on("parity.exporters.onnx_file:export", None), ("onnx",))
# reduced precision of an ONNX model: float32 -> float16, ops that must stay float32 kept in float32
ONNX_FP16 = Step(
    "float16",
    "onnx",
    _on("parity.exporters.onnx_fp16:export", None),
    ("onnx", "onnxconverter_common"),
    keyed_on=("precision",),
)
TRT_ENGINE = Step(
    "trt build",
    "trt",
    _on(None, "parity.exporters.trt_engine:export"),
    ("tensorrt", "cuda", "onnx"),
    keyed_on=("precision", "device"),
    note=UNVERIFIED,
)
ORT = Step(
    "ort",
    "onnx",
    _on("parity.runtimes.ort:OrtRunner", "parity.runtimes.ort_cuda:OrtCudaRunner"),
    ("onnxruntime",),
    precisions=("fp32", "tf32", "fp16"),
    why_not=_NO_ONNX_BF16,
)
ORT_NOOPT = Step(
    "ort-noopt",
    "onnx",
    _on("parity.runtimes.ort:OrtNoOptRunner", "parity.runtimes.ort_cuda:OrtCudaNoOptRunner"),
    ("onnxruntime",),
    precisions=("fp32", "tf32", "fp16"),
    why_not=_NO_ONNX_BF16,
)
ORT_TRT = Step(
    "ort-trt",
    "onnx",
    _on(None, "parity.runtimes.ort_trt:OrtTrtRunner"),
    ("onnxruntime",),
    cuda_packages=("tensorrt",),
    note=UNVERIFIED,
)
ONNXREF = Step(
    "onnxref",
    "onnx",
    _on("parity.runtimes.onnxref:OnnxRefRunner", None),
    ("onnx",),
    precisions=_ONNX_CPU,
    why_not="the ONNX reference evaluator runs float32 and float16 models only",
)
TRT = Step("trt", "trt", _on(None, "parity.runtimes.trt:TrtRunner"), ("tensorrt", "cuda"), note=UNVERIFIED)
# the runtimes models are deployed to
TORCH_EXPORT = Step("torch.export", "torch", _on("parity.exporters.torch_export:export", None), ("torch",))
TORCH_EXECUTORCH = Step(
    "executorch",
    "torch",
    _on("parity.exporters.torch_executorch:export", None),
    ("torch", "executorch"),
    extra="executorch",
)
TORCH_OPENVINO = Step(
    "openvino.convert_model",
    "torch",
    _on("parity.exporters.torch_openvino:export", None),
    ("torch", "openvino"),
    extra="openvino",
)
TF_LITERT = Step("tflite converter", "tf", _on("parity.exporters.tf_litert:export", None), ("tensorflow",))
TORCH_LITERT = Step(
    "litert-torch",
    "torch",
    _on("parity.exporters.torch_litert:export", None),
    ("torch", "litert_torch"),
    extra="litert",
    note="written against litert-torch's documented API; unverified where it cannot be installed",
)
_FP32_ONLY = ("fp32",)
COMPILED = Step(
    "torch.compile",
    "torch",
    _on("parity.sources.torch_compile:CompiledTorch", None),
    ("torch",),
    differentiable=True,
    precisions=_FP32_ONLY,
    why_not="parity compiles the float32 module",
)
COMPILED_AUTOTUNE = Step(
    "torch.compile max-autotune",
    "torch",
    _on("parity.sources.torch_compile:AutotunedTorch", None),
    ("torch",),
    differentiable=True,
    precisions=_FP32_ONLY,
    why_not="parity compiles the float32 module",
)
PT2 = Step(
    "exported program",
    "torch",
    _on("parity.runtimes.torch_export:ExportedProgramRunner", None),
    ("torch",),
    differentiable=True,
    precisions=_FP32_ONLY,
    why_not="the program is exported at float32",
)
EXECUTORCH = Step(
    "executorch",
    "torch",
    _on("parity.runtimes.executorch:ExecuTorchRunner", None),
    ("executorch",),
    precisions=_FP32_ONLY,
    why_not="the .pte program is lowered at float32",
    extra="executorch",
)
OPENVINO = Step(
    "openvino",
    "openvino",
    _on("parity.runtimes.openvino:OpenVinoRunner", None),
    ("openvino",),
    precisions=("fp32", "fp16", "bf16"),
    extra="openvino",
    why_not="OpenVINO's CPU plugin has inference precision hints f32, f16 and bf16 only",
)
LITERT = Step(
    "litert",
    "litert",
    _on("parity.runtimes.litert:LiteRtRunner", None),
    ("ai_edge_litert",),
    precisions=_FP32_ONLY,
    why_not="the .tflite model is converted at float32",
    extra="litert",
)
TF_XLA = Step(
    "tf xla",
    "tf",
    _on("parity.sources.tf_xla:KerasXlaSource", None),
    ("tensorflow", "keras"),
    differentiable=True,
    precisions=_FP32_ONLY,
    why_not="parity compiles the float32 Keras model with XLA",
)
_COMPILE_COST = "torch.compile compiles for tens of seconds per model and shape"
# int8: built from the verified float path, calibrated on the training split, gated by the task metric
_INT8_ONLY = ("fp32",)
_INT8_WHY = "an int8 model is quantized from the float32 one and fed float32 (its precision is int8 inside)"
_INT8: dict[str, Any] = {"precisions": _INT8_ONLY, "why_not": _INT8_WHY, "quantizes": True}
ORT_INT8 = Step(
    "ort quantize_static",
    "onnx",
    _on("parity.exporters.onnx_int8:export_static", None),
    ("onnx", "onnxruntime"),
    **_INT8,
)
ORT_INT8DYN = Step(
    "ort quantize_dynamic",
    "onnx",
    _on("parity.exporters.onnx_int8:export_dynamic", None),
    ("onnx", "onnxruntime"),
    **_INT8,
)
TF_LITERT_INT8 = Step(
    "tflite converter int8", "tf", _on("parity.exporters.tf_litert_int8:export", None), ("tensorflow",), **_INT8
)
OPENVINO_INT8 = Step(
    "nncf quantize",
    "openvino",
    _on("parity.exporters.openvino_int8:export", None),
    ("openvino", "nncf"),
    extra="openvino",
    **_INT8,
)
TORCH_PT2E = Step(
    "pt2e quantize (x86 inductor)",
    "torch",
    _on("parity.exporters.torch_pt2e:export", None),
    ("torch", "torchao"),
    **_INT8,
)
PT2E = Step(
    "pt2e int8 program",
    "torch",
    _on("parity.runtimes.torch_pt2e:Pt2eRunner", None),
    ("torch", "torchao"),
    precisions=_INT8_ONLY,
    why_not=_INT8_WHY,
)
_INT8_COST = "an int8 path calibrates and is gated on the whole eval split; name it: --path '*int8*'"


def onnx_prefix(source: str) -> str:
    """The id prefix of ``source``'s paths through its ONNX file: ``torch/onnx``, or ``onnx`` for an ONNX file."""
    return source if source == "onnx" else f"{source}/onnx"


def _int8_chains(source: str, to_onnx: tuple) -> tuple[PathDef, ...]:
    """``source``'s int8 paths from its ONNX file: ONNX Runtime static (QDQ) and dynamic, and NNCF to OpenVINO."""
    base = onnx_prefix(source)
    return (
        PathDef(f"{base}/ort-int8", source, (*to_onnx, ORT_INT8), ORT, opt_in=_INT8_COST, float_path=f"{base}/ort"),
        PathDef(
            f"{base}/ort-int8dyn", source, (*to_onnx, ORT_INT8DYN), ORT, opt_in=_INT8_COST, float_path=f"{base}/ort"
        ),
        PathDef(
            f"{base}/openvino-int8",
            source,
            (*to_onnx, OPENVINO_INT8),
            OPENVINO,
            opt_in=_INT8_COST,
            float_path=f"{base}/openvino",
        ),
    )


TF_SAVEDMODEL = Step(
    "tf",
    "tf",
    _on("parity.runtimes.tf_savedmodel:SavedModelRunner", "parity.runtimes.tf_savedmodel:SavedModelRunner"),
    ("tensorflow",),
    differentiable=True,
    precisions=("fp32", "tf32"),
    why_not="the jax2tf SavedModel is exported at float32: parity runs it at fp32 (and tf32 on a GPU)",
)

# every chain, once; ``matrix`` puts each on the devices its runtime runs on, at every precision
CHAINS: tuple[PathDef, ...] = (
    PathDef("torch", "torch", (), NATIVE["torch"]),
    PathDef("torch/onnx/ort", "torch", (TORCH_ONNX,), ORT),
    PathDef("torch/onnx/ort-trt", "torch", (TORCH_ONNX,), ORT_TRT),
    PathDef("torch/onnx/trt", "torch", (TORCH_ONNX,), TRT),
    PathDef("torch/onnx/onnxref", "torch", (TORCH_ONNX,), ONNXREF),
    PathDef("torch/compile", "torch", (), COMPILED, opt_in=_COMPILE_COST),
    PathDef("torch/compile-autotune", "torch", (), COMPILED_AUTOTUNE, opt_in=_COMPILE_COST),
    PathDef("torch/export", "torch", (TORCH_EXPORT,), PT2),
    PathDef(
        "torch/executorch",
        "torch",
        (TORCH_EXECUTORCH,),
        EXECUTORCH,
        opt_in="lowering to XNNPACK takes seconds per model and shape",
    ),
    PathDef("torch/openvino", "torch", (TORCH_OPENVINO,), OPENVINO),
    PathDef("torch/onnx/openvino", "torch", (TORCH_ONNX,), OPENVINO),
    PathDef("torch/litert", "torch", (TORCH_LITERT,), LITERT),
    *_int8_chains("torch", (TORCH_ONNX,)),
    PathDef(
        "torch/openvino-int8",
        "torch",
        (TORCH_OPENVINO, OPENVINO_INT8),
        OPENVINO,
        opt_in=_INT8_COST,
        float_path="torch/openvino",
    ),
    # timed against the float module compiled by the same Inductor: the speed-up is int8's, not the compiler's
    PathDef("torch/pt2e-int8", "torch", (TORCH_PT2E,), PT2E, opt_in=_INT8_COST, float_path="torch/compile"),
    PathDef("tf", "tf", (), NATIVE["tf"]),
    PathDef("tf/xla", "tf", (), TF_XLA),
    PathDef("tf/litert", "tf", (TF_LITERT,), LITERT),
    PathDef("tf/onnx/openvino", "tf", (TF2ONNX,), OPENVINO),
    PathDef("tf/litert-int8", "tf", (TF_LITERT_INT8,), LITERT, opt_in=_INT8_COST, float_path="tf/litert"),
    *_int8_chains("tf", (TF2ONNX,)),
    PathDef("tf/onnx/ort", "tf", (TF2ONNX,), ORT),
    PathDef("tf/onnx/ort-trt", "tf", (TF2ONNX,), ORT_TRT),
    PathDef("tf/onnx/trt", "tf", (TF2ONNX,), TRT),
    PathDef("tf/onnx/onnxref", "tf", (TF2ONNX,), ONNXREF),
    PathDef("jax", "jax", (), NATIVE["jax"]),
    PathDef("jax/onnx/ort", "jax", (JAX2ONNX,), ORT),
    PathDef("jax/onnx/ort-trt", "jax", (JAX2ONNX,), ORT_TRT),
    PathDef("jax/onnx/trt", "jax", (JAX2ONNX,), TRT),
    PathDef("jax/onnx/onnxref", "jax", (JAX2ONNX,), ONNXREF),
    PathDef("jax/onnx/openvino", "jax", (JAX2ONNX,), OPENVINO),
    *_int8_chains("jax", (JAX2ONNX,)),
    PathDef("jax/tf", "jax", (JAX2TF,), TF_SAVEDMODEL),
    PathDef("jax/tf/onnx/ort", "jax", (JAX2TF, SAVEDMODEL2ONNX), ORT),
    # an ONNX file as the source: the file as it is, under each runtime
    PathDef("onnx/ort", "onnx", (ONNX_FILE,), ORT),
    PathDef("onnx/ort-noopt", "onnx", (ONNX_FILE,), ORT_NOOPT),
    PathDef("onnx/ort-trt", "onnx", (ONNX_FILE,), ORT_TRT),
    PathDef("onnx/trt", "onnx", (ONNX_FILE,), TRT),
    PathDef("onnx/onnxref", "onnx", (ONNX_FILE,), ONNXREF),
    PathDef("onnx/openvino", "onnx", (ONNX_FILE,), OPENVINO),
    *_int8_chains("onnx", (ONNX_FILE,)),
)
CHAIN_IDS = {chain.id: chain for chain in CHAINS}


def variant(chain: PathDef, device: str, precision: str) -> PathDef:
    """``chain`` on ``device`` at ``precision``: a reduced-precision ONNX runtime gets its float16 conversion,
    native TensorRT its engine build."""
    exports = chain.exports
    if chain.runtime is TRT:
        exports = (*exports, TRT_ENGINE)
    elif precision == "fp16" and chain.runtime.group == "onnx" and chain.runtime is not ORT_TRT and not chain.quantized:
        exports = (*exports, ONNX_FP16)
    return PathDef(chain.id, chain.source, exports, chain.runtime, device, precision, chain.opt_in, chain.float_path)


def matrix(devices=("cpu", "cuda:0"), precisions=ALL) -> list[PathDef]:
    """Every chain on every device its runtime runs on, at every precision (available or not)."""
    return [
        variant(chain, device, precision)
        for device in devices
        for chain in CHAINS
        if device.partition(":")[0] in chain.runtime.targets
        for precision in precisions
    ]


def missing_packages(path: PathDef) -> list[str]:
    """Packages the path needs that are not installed (found without importing them)."""
    return [name for name in path.packages if importlib.util.find_spec(name) is None]


def unavailable_reason(path: PathDef) -> str | None:
    """Why the path cannot run here, or None: missing packages, no such device, a CPU-only build, a precision
    the runtime cannot do. A missing framework is a skip, never an ImportError."""
    reasons = []
    if path.device_kind == "cuda":
        found = devices.gpu(path.device)
        if isinstance(found, str):
            reasons.append(found)
        elif path.precision in ("tf32", "bf16") and float(found["compute_capability"]) < 8.0:
            reasons.append(
                f"{path.precision} needs compute capability 8.0 or newer ({found['name']} is "
                f"{found['compute_capability']})"
            )
    missing = missing_packages(path)
    refused = [m for m in missing if m in WONT_INSTALL]
    reasons.extend(f"{m} not installed: {WONT_INSTALL[m]}" for m in refused)
    missing = [m for m in missing if m not in refused]
    if missing:
        names = {**INSTALL_NAMES, **(GPU_INSTALL_NAMES if path.device_kind == "cuda" else {})}
        extras = [s.extra for s in (*path.exports, path.runtime) if set(s.packages) & set(missing)]
        extra = "gpu" if path.device_kind == "cuda" else ",".join(dict.fromkeys(extras)) or "cpu"
        reasons.append(
            f"{', '.join(missing)} not installed (pip install {' '.join(names.get(m, m) for m in missing)}, "
            f"or parity[{extra}])"
        )
    if path.device_kind == "cuda":  # only the runtime runs on the GPU: exporters run on the CPU
        reasons.extend(devices.cuda_build_problems([p for p in path.runtime.packages if p not in missing]))
    if "tensorrt" in missing:
        reasons.append("TensorRT's wheels fetch its libraries from NVIDIA's package index (pypi.nvidia.com)")
    if path.device_kind == "cpu" and PRECISIONS[path.precision].gpu_only:
        reasons.append(NOT_ON_CPU)
    else:
        refusing = next((s for s in (*path.exports, path.runtime) if path.precision not in s.precisions), None)
        if refusing is not None:
            reasons.append(f"{refusing.name} at {path.precision}: {refusing.why_not}")
    return "; ".join(reasons) or None


def select(patterns=(), frameworks=None, device: str = "cpu", precision: str = "fp32") -> list[PathDef]:
    """Paths on ``device`` at ``precision`` matching any of the glob ``patterns`` (all if none), for the given
    source frameworks. An opt-in path (``PathDef.opt_in``) is selected only by a pattern that spells its runtime; a
    quantized path brings the float path it is quantized from (``PathDef.float_path``)."""
    every = matrix((device,), (precision,))
    chosen = [p for p in every if frameworks is None or p.source in frameworks]
    if patterns:
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(p.id, pattern) for p in every):
                raise UsageError(
                    f"--path {pattern!r} matches no path on {device}; known paths: {', '.join(p.id for p in every)}"
                )
        picked = [
            p
            for p in chosen
            if any(fnmatch.fnmatchcase(p.id, pat) and (not p.opt_in or _spells(pat, p)) for pat in patterns)
        ]
        # a quantized path is built from its float path and timed against it: that path is checked and timed too
        wanted = {p.id for p in picked} | {p.float_path for p in picked if p.quantized}
        return [p for p in chosen if p.id in wanted]
    return [p for p in chosen if not p.opt_in]


def _spells(pattern: str, path: PathDef) -> bool:
    """Whether ``pattern`` spells the opt-in ``path``'s runtime (``compile`` in ``torch/compile*``; ``int8`` for a
    quantized path), not a wildcard only (``torch/*`` keeps it out)."""
    return ("int8" if path.quantized else path.stages[-1].split("-")[0]) in pattern


def by_id(path_id: str, device: str = "cpu", precision: str = "fp32") -> PathDef:
    chain = CHAIN_IDS.get(path_id)
    if chain is None:
        raise UsageError(f"unknown path {path_id!r}; known paths: {', '.join(CHAIN_IDS)}")
    if device.partition(":")[0] not in chain.runtime.targets:
        raise UsageError(f"path {path_id!r} does not run on {device} (it runs on {', '.join(chain.runtime.targets)})")
    return variant(chain, device, precision)


def load_target(target: str):
    module_name, attribute = target.split(":")
    return getattr(importlib.import_module(module_name), attribute)
