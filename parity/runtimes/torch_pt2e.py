"""``torch/pt2e-int8``: the int8 program pt2e quantization saved, loaded as ``torch/export`` loads a ``.pt2`` (never a
pickle) and run compiled by TorchInductor with freezing, which lowers its quantize / dequantize pairs into oneDNN's
int8 convolutions and matmuls: what a user deploys, so what is checked and timed."""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

from parity.runtimes.torch_export import ExportedProgramRunner

MODE = "inductor, freezing, static shapes"
# run eagerly, the program's quantize / dequantize are reference ops around float kernels: its int8 numerics, not its
# speed (3x slower than the float program on the zoo's cnn); inductor lowers them to int8 kernels only with freezing
EAGER_NOTE = (
    "read from the program run eagerly (its quantize / dequantize as reference ops): the compiled program "
    "fuses the layers into int8 kernels that expose no layer outputs"
)


class Pt2eRunner(ExportedProgramRunner):
    """The quantized ExportedProgram's ``.module()`` compiled with ``torch.compile`` (inductor) under
    ``freezing=True``: weights become constants, so inductor prepacks the int8 weights and fuses each
    dequantize-conv/linear-quantize into one oneDNN int8 kernel. Each input shape compiles once (static: inductor's
    int8 convolution does not lower with a symbolic batch here); the compile is part of that shape's first run and is
    recorded. A compile that fails raises: parity never reports the eager program's values as the compiled ones.
    Forward only: an int8 program has no gradients parity checks."""

    differentiable = False

    def __init__(
        self,
        spec,
        artifact_dir: Path,
        meta: dict,
        batch_size: int,
        threads: int,
        device: str = "cpu",
        precision: str = "fp32",
    ):
        import inspect

        import torch._dynamo
        import torch.ao.quantization.fx._decomposed  # defines the quantize / dequantize ops it loads

        super().__init__(spec, artifact_dir, meta, batch_size, threads, device, precision)

        torch = self.torch
        self.differentiable = False
        torch._dynamo.config.fail_on_recompile_limit_hit = True  # past the limit: an error, never eager
        isolated = "isolate_recompiles" in inspect.signature(torch.compile).parameters
        options: dict[str, Any] = {"isolate_recompiles": True} if isolated else {}
        self.compiled = torch.compile(self.module, backend="inductor", dynamic=False, fullgraph=True, **options)
        self._compiles: dict[tuple, float] = {}  # input shapes -> seconds of the first run there (compile included)
        self._steady: dict[tuple, float] = {}  # input shapes -> seconds of the second run there
        quantization = meta.get("quantization") or {}
        self.numerics = {
            **self.numerics,
            "int8": {
                k: quantization.get(k)
                for k in ("tool", "quantizer", "activations", "weights", "kept_float", "quantized_layers")
            },
            "torch_compile": {
                "backend": "inductor",
                "freezing": True,
                "dynamic": False,
                "fullgraph": True,
                "isolated_region": isolated,
            },
        }
        self.tap_locations = {}

    def run_impl(self, x):
        from torch._inductor import config

        torch = self.torch
        args = [torch.from_numpy(x[i.name]) for i in self.spec.model_inputs]
        shape = tuple(tuple(a.shape) for a in args)
        started = time.perf_counter()
        # freezing is read when the graph compiles, at this call for a new shape; patched for this module only
        with torch.inference_mode(), config.patch(freezing=True), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # inductor's int8 lowering warns about its own tensor copies
            returned = tuple(t.numpy() for t in self.compiled(*args))
        elapsed = time.perf_counter() - started
        if shape not in self._compiles:
            self._compiles[shape] = elapsed
        elif shape not in self._steady:
            self._steady[shape] = elapsed
        return returned

    def taps_impl(self, x):
        """Each tapped layer's output: the value of the last op its module's call produced in the program's graph,
        recorded while the program runs eagerly. ``torch.export.unflatten`` (``torch/export``'s way) cannot cut this
        program at its modules: pt2e computes the int8 weights' dequantize outside the layers, and the unflattened
        layers are handed them in the wrong argument order. A BatchNorm pt2e folded into its conv is read at that
        conv's output (which now returns the norm's values), and the conv is reported as fused into it."""
        import torch

        folded = (self.meta.get("quantization") or {}).get("folded") or {}
        convs = {conv: bn for bn, conv in folded.items()}
        last = {}
        for node in self.module.graph.nodes:
            stack = node.meta.get("nn_module_stack") or {}
            for path, _ in stack.values():
                if path.startswith("model."):  # the exporter's wrapper holds the model as ``model``
                    last[path[len("model.") :]] = node
        self.tap_locations, wanted = {}, {}
        for tap in self.spec.taps:
            read_at = folded.get(tap, tap)
            if tap in convs:
                self.tap_locations[tap] = {
                    "found": "fused",
                    "fused_into": convs[tap],
                    "tensor": last.get(tap) and last[tap].name,
                    "reason": f"pt2e folded {convs[tap]!r} into {tap!r}: its output holds {convs[tap]!r}'s values",
                }
            elif read_at not in last:
                self.tap_locations[tap] = {"found": "unmapped", "reason": "the program records no op of this module"}
            else:
                wanted[tap] = last[read_at]
                self.tap_locations[tap] = {
                    "found": "module",
                    "tensor": last[read_at].name,
                    "reason": EAGER_NOTE
                    if read_at == tap
                    else f"pt2e folded {tap!r} into {read_at!r}: read at {read_at!r}'s output; {EAGER_NOTE}",
                }
        recorded = {}
        nodes = set(wanted.values())

        class Recorder(torch.fx.Interpreter):
            def run_node(self, node):
                value = super().run_node(node)
                if node in nodes:
                    recorded[node] = value
                return value

        args = [torch.from_numpy(x[i.name]) for i in self.spec.model_inputs]
        with torch.inference_mode():
            Recorder(self.module).run(*args)
        return {tap: recorded[node].detach().numpy() for tap, node in wanted.items()}

    def runtime_record(self) -> dict:
        """What ran (the compiled program, its mode), each shape's first run (compile included) beside its second,
        the program's int8 layers and those left float, and the torch.export record of its axes."""
        record = super().runtime_record()
        record.pop("not_differentiable", None)
        quantization = self.meta.get("quantization") or {}
        shapes: list[dict[str, Any]] = [
            {
                "input_shapes": [list(s) for s in shape],
                "first_run_s": round(first, 3),
                "second_run_s": None if shape not in self._steady else round(self._steady[shape], 6),
            }
            for shape, first in self._compiles.items()
        ]
        compile_s = sum(entry["first_run_s"] - (entry["second_run_s"] or 0.0) for entry in shapes)
        record.update(
            ran="compiled",
            mode=MODE,
            graphs_compiled=len(shapes),
            compile_s=round(compile_s, 3),
            shapes=shapes,
            quantized_layers=quantization.get("quantized_layers"),
            not_quantized=quantization.get("not_quantized") or [],
            kept_float=quantization.get("kept_float") or [],
        )
        left = record["not_quantized"]
        record["summary"] = (
            f"int8 program compiled by inductor (freezing) at {len(shapes)} input shapes, "
            f"{compile_s:.1f} s compiling; {quantization.get('quantized_layers', '?')} int8 layers"
            + (f", {', '.join(left)} left float by the quantizer" if left else "")
            + ("" if not record["static_axes"] else f"; exported static: {record['static_reason']}")
        )
        return record
