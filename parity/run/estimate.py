"""How much memory, and roughly how long, each step of a model's work takes: estimated before it starts, from the
size of the model's float32 weights and the path, so that a step that cannot fit is refused in one line instead of
being killed by the kernel half-way (``refuse``), and ``parity plan`` can say it for a model of any size.

A step's peak is ``copies`` x the float32 weights (the model built, a float64 copy, an exporter's graph, a runtime's
session) plus its activations (the outputs and taps at the batch, float64 in a reference). The factors are peak RSS
over the worker's baseline once its frameworks are imported, measured with ``scripts/memory_factors.py`` on
transformers Llama models of random weights (221 MB and 501 MB of float32 weights, inputs of 2 x 64 tokens) on a
2-core, 23 GB machine with torch 2.13, onnxscript 0.7.2, onnxruntime 1.31, and the peaks of a 1.1B-parameter Llama's
golden build (``scripts/scale_models.py``); ``scripts/memory_factors.json`` keeps every measurement and
``tests/run/test_memory.py`` holds the table to it. Each row's comment gives the factors measured; the table keeps the
largest. Rows marked *derived* are sums of measured ones. The seconds per GB are from the same runs; a machine busy
with other work is slower (an export of a 135M-parameter Llama took 172 s per GB there).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from parity.platform.errors import NotEnoughMemory
from parity.platform.memory import LIMIT_VARIABLE, Available, gb


@dataclass(frozen=True)
class Cost:
    """One step: its peak in float32 weights (``copies``), in activations (``activations``), seconds per GB."""

    label: str
    copies: float
    activations: float
    seconds_per_gb: float


# measured on the two Llamas above (factor at 221 MB / at 501 MB of weights; building a model of random weights
# peaks over the weights themselves: the initialisers' temporaries) and at 1.1B (4,196 MiB of weights: each golden
# build step's peak RSS of its largest process, the worker's baseline included)
COSTS = {
    "load": Cost("model built in float32", 2.0, 0.0, 25.0),  # 1.90 / 1.40, 1.09 at 1.1B; 25 / 11 s per GB
    "reference": Cost("float64 reference (a whole float64 copy)", 4.1, 1.0, 26.0),  # 4.03 / 3.53; 26 / 7 s per GB
    # 1.36 at 1.1B (6.0 GB: the build's reference and its shape references alike); time: not measured
    "streamed": Cost("float64 reference, streamed module by module", 1.4, 1.0, 40.0),
    "run": Cost("float32 run", 2.0, 0.5, 25.0),  # the model built, then run at the batch; 1.11 at 1.1B
    "export": Cost("torch.onnx (dynamo) export", 2.2, 0.5, 31.0),  # 2.18 / 1.54; 31 / 20 s per GB
    "ort": Cost("ONNX Runtime session", 1.1, 0.5, 3.0),  # 1.05 / 1.03 over the .onnx file's size; 2.4 / 2.0 s/GB
    "onnxref": Cost("onnx.reference evaluator (the graph in NumPy)", 2.6, 1.0, 45.0),  # 2.52 at 221 MB; 43 s per GB
}
# derived from the measured rows: gradients cast the model whole and add a float64 gradient of every weight (2x); a
# diagnosis holds the reference model in float32 (one unit of it in float64, ``peak``) beside the path's session
DERIVED = {
    "gradients": Cost(
        "float64 reference with gradients (the whole model)",
        COSTS["reference"].copies + 2.0,
        COSTS["reference"].activations,
        COSTS["reference"].seconds_per_gb,
    ),
    # a model mapped from its safetensors files (``parity.model.weight_files``): its float32 weights are pages of the
    # files, which the kernel reads as they are touched and drops again under pressure, so they need no memory of
    # their own; what a step holds is the rest (one unit in float64, ``peak``; a tensor at a time as it is read)
    # its time: the weights' digest read a tensor at a time, 12.8 s for a 1.1B Llama's 4.4 GB (``--mapped`` workspace)
    "load_files": Cost("model mapped from its weight files", 0.0, 0.0, 3.0),
    "streamed_files": Cost(
        "float64 reference streamed from the weight files",
        COSTS["streamed"].copies - 1.0,
        COSTS["streamed"].activations,
        COSTS["streamed"].seconds_per_gb,
    ),
    **{
        key: Cost(
            f"diagnosis beside an {COSTS[session].label}",
            1.0 + COSTS[session].copies,
            1.0,
            COSTS["run"].seconds_per_gb + COSTS[session].seconds_per_gb,
        )
        for key, session in (("diagnose", "ort"), ("diagnose_onnxref", "onnxref"))
    },
}
COSTS.update(DERIVED)
# a worker's own memory before it builds anything: Python with torch, onnx, onnxscript, onnxruntime and transformers
# imported (0.46 GB, measured on this 2-core machine); the factors above are over it, except the 1.1B figures
WORKER_BYTES = int(0.5e9)
# a Llama's shape from its size alone (``parity plan --params``): 12 h^2 weights per layer of width h, h^2 ~ params
# / 350 (TinyLlama 1.1B: h 2048, 22 layers; Llama-2 7B: h 4096, 32 layers; SmolLM 135M: h 576, 30 layers)
LLAMA_WIDTH_DIVISOR = 350.0
LLAMA_VOCAB = 32000
# the steps of a user model's golden build, of a check of ``torch`` and ``torch/onnx/ort``, and of the diagnosis of
# ``torch/onnx/ort``, in order
GOLDEN_STEPS = ("load", "reference", "run")
CHECK_STEPS = ("load", "run", "export", "ort")
DIAGNOSIS_STEPS = ("diagnose",)
# worker tasks of a layer-by-layer diagnosis, by module of ``parity.diagnose`` (a later stage: named, not imported):
# the reference model beside the path's session (``diagnose``)
DIAGNOSIS_TASKS = {
    "collect": ("collect", "runtime_link"),
    "tree.descent": ("descent", "reference_at"),
    "eval_split": ("failing_rows",),
}
# what the check of a path holds, by its last runtime
CHECK_RUNTIMES = {"ort": "ort", "ort-noopt": "ort", "onnxref": "onnxref", "torch": "run"}


def step_of(task: str, kwargs: dict) -> str | None:
    """The ``COSTS`` key of worker task ``task`` called with ``kwargs``; None where none is estimated."""
    module, _, function = task.partition(":")
    runtime = str(kwargs.get("path_id", "")).rsplit("/", 1)[-1]
    if task in (
        "parity.golden.user_tasks:describe_weights",
        "parity.golden.user_tasks:read_weights",
        "parity.model.identity:model_identity",
    ):
        return "load"
    if task == "parity.golden.user_tasks:reference" and kwargs.get("gradients"):
        return "gradients"
    diagnosis_module = module.removeprefix("parity.diagnose.") if module.startswith("parity.diagnose.") else None
    if task in ("parity.golden.user_tasks:reference", "parity.golden.tasks:fp64_reference") or (
        module == "parity.golden.shapes" or (diagnosis_module == "eval_split" and function == "reference_rows")
    ):
        return "reference"
    if task == "parity.golden.floor:float32_floor":
        return "run"
    if task == "parity.run.tasks:export_step":
        return "export" if "torch_onnx" in str(kwargs.get("target", "")) else None
    if task == "parity.run.tasks:check_path":
        return CHECK_RUNTIMES.get(runtime)
    if function in DIAGNOSIS_TASKS.get(diagnosis_module or "", ()):
        return "diagnose_onnxref" if runtime == "onnxref" else "diagnose"
    return None


def reference_mode(weights: int) -> str:
    """``streamed`` or ``whole``: how a torch model's float64 reference of ``weights`` bytes is computed."""
    from parity.sources import torch_streamed

    return torch_streamed.choose(weights)[0]


def peak(step: str, weights: int, activations: int = 0) -> int:
    """The estimated peak in bytes of ``step`` for a model of ``weights`` bytes of float32 weights and ``activations``
    bytes of outputs and taps at the batch (float64)."""
    cost = COSTS[step]
    copies = cost.copies
    if step in ("streamed", "streamed_files", "diagnose", "diagnose_onnxref"):  # one unit in float64 (beside the model)
        from parity.sources import torch_streamed  # (``parity.sources.torch_streamed``)

        unit = 2.0 * max(torch_streamed.MIN_UNIT, weights / 16) / max(weights, 1)
        copies = max(copies, 1.0 + unit) if step == "streamed" else copies + unit
    return int(WORKER_BYTES + weights * copies + activations * cost.activations)


def torch_step(step: str, weights: int, mapped: bool = False) -> str:
    """The ``COSTS`` key of ``step`` of a torch model of ``weights`` bytes: its float64 reference streamed where
    ``reference_mode`` says so; ``mapped``: the model mapped from its weight files (its load and its streamed
    reference hold no float32 copy)."""
    if step == "load" and mapped:
        return "load_files"
    if step == "reference" and reference_mode(weights) == "streamed":
        return "streamed_files" if mapped else "streamed"
    return step


def label(step: str) -> str:
    return COSTS[step].label


def seconds(step: str, weights: int) -> float:
    return COSTS[step].seconds_per_gb * weights / 1e9


def activation_bytes(manifest: dict) -> int:
    """The float64 bytes of a golden's reference outputs, taps and eval outputs (what a reference holds at once)."""
    total = 0
    for entry in ((manifest.get("files") or {}).get("reference.npz") or {}).get("arrays", {}).values():
        total += math.prod(entry.get("shape") or ()) * 8
    return total


def refuse(model: str, step: str, need: int, available: Available) -> None:
    """``NotEnoughMemory`` with one line, where ``need`` bytes do not fit in ``available``."""
    if need <= available.nbytes:
        return
    options = ["a smaller batch", f"a machine (or a Ray node started with --memory={need}) with more memory"]
    if step == "reference" and os.environ.get("PARITY_REFERENCE", "").strip().lower() != "streamed":
        options.insert(0, "the streamed reference (PARITY_REFERENCE=streamed)")
    if step == "gradients":  # gradients need the whole model in float64: no streamed reference has them
        options.insert(0, "the spec without its loss (loss=None: no gradients in the golden data)")
    raise NotEnoughMemory(
        f"{model}: the {label(step)} needs about {gb(need)} of memory and there is {available.describe()}; "
        f"options: {', '.join(options)}, or {LIMIT_VARIABLE}=SIZE to go ahead anyway"
    )


def llama_activations(params: float, batch: int, seq: int) -> int:
    """Float64 bytes of a Llama-shaped model's logits and one hidden state per layer at ``batch`` x ``seq``."""
    width = math.sqrt(params / LLAMA_WIDTH_DIVISOR)
    layers = max(round(params / (12 * width * width)), 1)
    return int(batch * seq * (LLAMA_VOCAB + width * (layers + 1)) * 8)


def plan(weights: int, activations: int, available: Available, mapped: bool = False) -> list[dict]:
    """Each step of a golden build, of a check of ``torch`` and ``torch/onnx/ort`` and of the diagnosis of
    ``torch/onnx/ort``: its estimated peak and time, whether it fits in ``available``, and where it does not, the Ray
    resources of a node it would fit on (``mapped``: a model mapped from its weight files, whose load and
    reference are estimated so)."""
    rows = []
    for stage, steps in (("golden build", GOLDEN_STEPS), ("check", CHECK_STEPS), ("diagnosis", DIAGNOSIS_STEPS)):
        for step in steps:
            step = torch_step(step, weights, mapped)
            need = peak(step, weights, activations)
            rows.append(
                {
                    "stage": stage,
                    "step": step,
                    "label": label(step),
                    "peak_bytes": need,
                    "seconds": round(seconds(step, weights), 1),
                    "fits": need <= available.nbytes,
                    "ray_resources": None if need <= available.nbytes else {"memory": need},
                }
            )
    return rows
