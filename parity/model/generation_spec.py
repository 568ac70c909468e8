"""The spec of a language model checked as it is deployed: greedy generation with a key/value cache.

``models/<name>.py`` defines ``SPEC = GenerationSpec(...)`` (``parity init NAME --hf FOLDER --task text-generation``
writes one). The model comes from a ``save_pretrained`` folder (config and safetensors, loaded with transformers'
``AutoModelForCausalLM``; no download) or from a factory returning a causal LM module. The golden data is the
float64 model's greedy generation on a fixed prompt set, step by step (``parity.generation``); every path runs the
same prompts through its own prefill and decode steps and is compared step by step. NumPy-free at import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from parity.platform.errors import SpecError

TASK = "text-generation"
# the paths a generation model runs through, in the order they are checked
PATHS = ("torch", "torch/onnx/ort", "torch/onnx/openvino", "torch/genai", "torch/export", "torch/executorch")


@dataclass
class GenerationSpec:
    """A causal language model generating greedily with a key/value cache.

    Args:
        name: model name (the file name in ``models/`` without ``.py``).
        description: one line.
        hf: a ``save_pretrained`` folder (relative to the workspace, or absolute).
        torch_factory: ``file.py:function`` or ``module:function`` returning the causal LM (instead of ``hf``).
        new_tokens: greedy steps after the prompt (step 0 is the prefill's last position).
        prompt_lengths: one prompt per length, random token ids from ``seed``; batch 1 runs the first alone, the
            left-padded batch runs them all.
        seed: seed of the prompts' token ids.
        prompts: a ``.npz`` (relative to the workspace, or absolute) of your own prompts instead: ``input_ids`` and
            ``attention_mask``, int64 ``(prompts, length)``, left-padded (mask 0 then 1 on each row).
        tolerances: ``{"atol": ..., "rtol": ...}`` of a step's float32 logits against the float64 golden's
            (default: what ``golden build`` sets, rtol 1e-4 and atol 1e-4 or 32 times the model's own float32 error
            in eager torch, whichever is larger).
        paths: the paths to check (default ``PATHS``; ``torch/genai`` needs a tokenizer in the folder).
        bench_batch_sizes, bench_prompt_length, bench_new_tokens: what ``parity run`` times on each path that passed:
            time to first token and decode tokens per second at each batch size, on prompts of that many tokens.
    """

    name: str
    description: str = ""
    hf: str | None = None
    torch_factory: str | None = None
    new_tokens: int = 8
    prompt_lengths: tuple[int, ...] = (7, 4)
    seed: int = 0
    prompts: str | None = None
    tolerances: dict[str, float] = field(default_factory=dict)
    paths: tuple[str, ...] = PATHS
    bench_batch_sizes: tuple[int, ...] = (1, 4)
    bench_prompt_length: int = 64
    bench_new_tokens: int = 32
    task: str = TASK
    frameworks: tuple[str, ...] = ("torch",)
    source_file: str | None = None

    def validate(self) -> None:
        if (self.hf is None) == (self.torch_factory is None):
            raise SpecError(f"{self.name}: give exactly one of hf= (a save_pretrained folder) or torch_factory=")
        if self.task != TASK:
            raise SpecError(f"{self.name}: task {self.task!r} is not {TASK!r}")
        if not 1 <= self.new_tokens <= 4096:
            raise SpecError(f"{self.name}: new_tokens {self.new_tokens} is not between 1 and 4096")
        if not self.prompt_lengths or any(int(n) < 2 for n in self.prompt_lengths):
            raise SpecError(f"{self.name}: prompt_lengths {self.prompt_lengths} needs one or more lengths of 2 or more")
        unknown = set(self.paths) - set(PATHS)
        if unknown:
            raise SpecError(f"{self.name}: unknown path(s) {', '.join(sorted(unknown))}; known: {', '.join(PATHS)}")
        if not self.bench_batch_sizes or min(self.bench_batch_sizes) < 1 or self.bench_prompt_length < 1:
            raise SpecError(f"{self.name}: bench_batch_sizes and bench_prompt_length must be positive")
        if self.bench_new_tokens < 2:
            raise SpecError(f"{self.name}: bench_new_tokens must be 2 or more (a prefill and a decode step)")
        bad = set(self.tolerances) - {"atol", "rtol"}
        if bad or any(not isinstance(v, (int, float)) or not v >= 0 for v in self.tolerances.values()):
            raise SpecError(f"{self.name}: tolerances take non-negative atol and rtol only, not {self.tolerances}")
        if "atol" in self.tolerances and not self.tolerances["atol"] > 0:
            raise SpecError(f"{self.name}: atol must be positive (float32 logits never match float64 exactly)")

    def prompts_file(self, workspace_root: str | Path) -> str | None:
        """The prompts file's absolute path, or None for seeded random prompts."""
        if self.prompts is None:
            return None
        path = Path(self.prompts)
        return str(path if path.is_absolute() else Path(workspace_root).resolve() / path)

    def source(self, workspace_root: str | Path) -> dict:
        """The model source as ``parity.generation.model.load`` takes it (paths made absolute)."""
        root = Path(workspace_root).resolve()
        if self.hf is not None:
            folder = Path(self.hf)
            return {"hf": str(folder if folder.is_absolute() else root / folder)}
        return {"torch": self.torch_factory, "root": str(root)}
