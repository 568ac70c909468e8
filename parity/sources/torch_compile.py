"""torch.compile: the torch source's module compiled by TorchInductor (``default`` and ``max-autotune-no-cudagraphs``
modes), with what the compiler did recorded: graphs, recompilations by shape and grad mode, graph breaks."""

from __future__ import annotations

import copy
import inspect
from collections import Counter

from parity.model import outputs
from parity.model.feeds import call_torch as call
from parity.sources.torch import TorchSource

_SHOWN = 5  # graph breaks and recompile reasons listed in the record (the counts are complete)
TAPS_NOTE = (
    "taps are read from a compiled copy of the module with forward hooks on the tapped layers, registered "
    "before its first run so that the compiled graphs return them (a hook added to a module already "
    "compiled never fires)"
)


class CompiledTorch(TorchSource):
    """``torch/compile``: the eager ``torch`` path's module compiled with ``torch.compile(backend="inductor")``,
    ``fullgraph=False``, shapes dynamic as torch decides (a shape first seen is specialised, a size that changes is
    recompiled dynamic). Forward, gradients, the training step and taps run compiled. Compilation happens on the
    first call at each new shape or grad mode, so a first result's first inference includes it.

    A region past torch's recompile limit raises instead of running eager: parity never reports eager values as
    compiled ones."""

    mode = "default"
    streams_reference = False  # the compiled module is cast whole, never streamed

    def __init__(
        self, spec, weights, batch_size: int, dtype: str = "float32", device: str = "cpu", precision: str = "fp32"
    ):
        super().__init__(spec, weights, batch_size, dtype, device, precision)
        import torch._dynamo

        torch = self.torch
        torch._dynamo.config.fail_on_recompile_limit_hit = True
        self._calls = 0
        self._shape: tuple[tuple[int, ...], ...] | None = (
            None  # the shapes of the inputs of the call being run (what a compile is recorded at)
        )
        self._shapes: dict = {}  # input shapes -> calls at them
        self._compiles: list[dict] = []
        self.numerics = {
            **self.numerics,
            "torch_compile": {"backend": "inductor", "mode": self.mode, "fullgraph": False, "dynamic": "automatic"},
        }
        self.compiled = self._compile(self.module, self._compiles)  # lazy: nothing compiles before the first call
        self._before = _dynamo_state(torch)
        self._tapped = None  # (compiled copy with hooks, its record), made by the first taps call
        self.tap_locations = {tap: {"found": "compiled", "reason": TAPS_NOTE} for tap in spec.taps}

    def _compile(self, module, record: list):
        """``module`` compiled in this runner's own region, so that torch's recompile limit counts this runner's
        recompilations only, each graph the backend gets recorded in ``record``. A torch without
        ``isolate_recompiles`` (before 2.12) starts from a reset of dynamo instead: another compiled runner of this
        worker then compiles again at its next call, which its own record counts."""
        torch = self.torch
        isolated = "isolate_recompiles" in inspect.signature(torch.compile).parameters
        if not isolated:
            torch._dynamo.reset()
        self.numerics["torch_compile"]["isolated_region"] = isolated
        return torch.compile(
            module,
            backend=_recording_backend(torch, self.mode, self, record),
            fullgraph=False,
            **({"isolate_recompiles": True} if isolated else {}),
        )

    def _forward(self, tensors: dict):
        self._calls += 1
        self._shape = tuple(tuple(t.shape) for t in tensors.values())
        self._shapes[self._shape] = self._shapes.get(self._shape, 0) + 1
        return call(self.compiled, tensors)

    def taps_impl(self, x):
        torch = self.torch
        if self._tapped is None:
            recorded: dict = {}
            tapped = copy.deepcopy(self.module)  # this module's weights as they are now, hooks of its own
            for name in self.spec.taps:
                tapped.get_submodule(name).register_forward_hook(
                    lambda _m, _i, out, n=name: recorded.__setitem__(n, out)
                )
            self._tapped = self._compile(tapped, []), recorded
        compiled, recorded = self._tapped
        recorded.clear()
        with torch.inference_mode():
            call(compiled, self._inputs(x))
        missing = [name for name in self.spec.taps if name not in recorded]
        if missing:
            raise RuntimeError(f"the compiled module ran without calling the hooks of {', '.join(missing)}")
        return {name: self._host(outputs.flatten(recorded[name], torch.is_tensor)[0][1]) for name in self.spec.taps}

    def runtime_record(self) -> dict:
        """What the compiler did for this runner: its mode, the graphs it compiled (at which input shapes, grad mode,
        static or dynamic), the recompilations after the first call and why, the graph breaks and why, the
        inductor cache's hits (a warm cache makes a first compile faster), how taps are read."""
        torch = self.torch
        from torch._dynamo.utils import guard_failures

        now = _dynamo_state(torch)
        first = min((c["call"] for c in self._compiles), default=None)
        recompiling_calls = sorted({c["call"] for c in self._compiles if c["call"] != first})
        breaks = now["graph_break"] - self._before["graph_break"]
        reasons = [
            reason
            for code, found in guard_failures.items()
            for reason in found[self._before["guard_failures"].get(code, 0) :]
        ]
        cache = now["inductor"] - self._before["inductor"]
        return {
            "mode": self.mode,
            "torch": torch.__version__,
            "graphs_compiled": len(self._compiles),
            "recompilations": len(recompiling_calls),
            "recompile_reasons": reasons[:_SHOWN],
            "graph_breaks": sum(breaks.values()),
            "graph_break_reasons": [reason for reason, _ in breaks.most_common(_SHOWN)],
            "graphs": [{k: c[k] for k in ("call", "input_shapes", "grad", "dynamic")} for c in self._compiles],
            "shapes_seen": [
                {
                    "input_shapes": [list(s) for s in shape],
                    "calls": n,
                    "compiled": any(c["input_shapes"] == [list(s) for s in shape] for c in self._compiles),
                }
                for shape, n in self._shapes.items()
            ],
            "inductor_cache": {"hits": cache["fxgraph_cache_hit"], "misses": cache["fxgraph_cache_miss"]},
            "taps": TAPS_NOTE,
            "summary": f"{len(self._compiles)} graphs compiled, {len(recompiling_calls)} recompilations"
            + (f" (first: {reasons[0]})" if reasons else "")
            + f", {sum(breaks.values())} graph breaks",
        }


class AutotunedTorch(CompiledTorch):
    """``torch/compile-autotune``: ``mode="max-autotune-no-cudagraphs"``: inductor benchmarks kernel choices (GEMM
    templates, tilings) while it compiles, which makes compiling much slower."""

    mode = "max-autotune-no-cudagraphs"


def _dynamo_state(torch) -> dict:
    """Copies of dynamo's process-wide counters this runner's record is the difference of."""
    from torch._dynamo import utils

    return {
        "graph_break": Counter(utils.counters["graph_break"]),
        "inductor": Counter(utils.counters["inductor"]),
        "guard_failures": {code: len(found) for code, found in utils.guard_failures.items()},
    }


def _recording_backend(torch, mode: str, runner, record: list):
    """Inductor in ``mode``, recording each graph it is given: the runner's call that asked for it, that call's
    input shapes, the grad mode, whether the graph is dynamic (takes symbolic sizes)."""

    class Recording(torch._TorchCompileInductorWrapper):
        def __call__(self, graph_module, example_inputs):
            symbolic = any(isinstance(value, torch.SymInt) for value in example_inputs) or any(
                isinstance(size, torch.SymInt)
                for node in graph_module.graph.nodes
                if node.op == "placeholder"
                for size in getattr(node.meta.get("example_value"), "shape", ())
            )
            record.append(
                {
                    "call": runner._calls,
                    "input_shapes": [list(s) for s in runner._shape or ()],
                    "grad": torch.is_grad_enabled(),
                    "dynamic": symbolic,
                }
            )
            return super().__call__(graph_module, example_inputs)

    return Recording(mode, None, None)
