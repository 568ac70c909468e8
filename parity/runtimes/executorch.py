"""ExecuTorch: the ``.pte`` program run by ExecuTorch's runtime (XNNPACK delegates and portable kernels), through
its Python bindings, as an app embedding the runtime would run it."""

from __future__ import annotations

import io
import os
import re
from contextlib import contextmanager, redirect_stderr
from importlib.metadata import version
from pathlib import Path

import numpy as np

from parity.runtimes.base import Runner


@contextmanager
def quiet_stderr():
    """Standard error discarded while ExecuTorch's native code starts: its CPU probe writes lines of cpuinfo noise
    that are not parity's output, to file descriptor 2 or, through its bindings, to ``sys.stderr``; both are
    diverted."""
    saved = os.dup(2)
    with open(os.devnull, "wb") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            with redirect_stderr(io.StringIO()):
                yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


class ExecuTorchRunner(Runner):
    """``torch/executorch``: ``Runtime.get().load_program(path).load_method("forward")``, executed on the feeds as
    CPU tensors in the spec's input order; outputs by the spec's names. Forward only: a ``.pte`` program has no
    autograd."""

    no_taps_reason = (
        "a .pte program exposes only its method's outputs; its layers run inside XNNPACK delegates "
        "and portable kernels (diagnose the torch/export path for the layers)"
    )

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
        super().__init__(spec, batch_size, "float32", device, precision)
        import torch

        self.torch = torch
        self.meta = meta
        with quiet_stderr():
            from executorch.runtime import Runtime

            self.program = Runtime.get().load_program(str(Path(artifact_dir) / meta["file"]))
            self.method = self.program.load_method("forward")
        self.numerics = {
            "executorch": version("executorch"),
            "device": device,
            "precision": precision,
            "backend": (meta.get("delegation") or {}).get("backend"),
        }

    def run_impl(self, x):
        torch = self.torch
        try:
            returned = self.method.execute(
                [torch.from_numpy(np.ascontiguousarray(x[i.name])) for i in self.spec.model_inputs]
            )
        except RuntimeError as error:
            raise RuntimeError(f"{_named(error)}{self._beyond_bounds(x)}") from None
        return tuple(value.numpy() if torch.is_tensor(value) else np.asarray(value) for value in returned)

    def _beyond_bounds(self, x: dict) -> str:
        """Why ExecuTorch refused the inputs where it is their size (its own message is an error code): ``; axis
        'batch' of input 'x' is 65, the program takes 1 to 64``."""
        bounds = (self.meta.get("axes") or {}).get("bounds") or {}
        for i in self.spec.model_inputs:
            for axis, size in zip(i.axis_names, x[i.name].shape):
                low, high = bounds.get(axis, (None, None))
                if high is not None and not low <= size <= high:
                    return f"; axis {axis!r} of input {i.name!r} is {size}, the program takes {low} to {high}"
        return ""

    def runtime_record(self) -> dict:
        """The operators XNNPACK ran and those left to portable kernels, and the axes the program takes."""
        axes = self.meta.get("axes") or {}
        delegation = self.meta.get("delegation") or {}
        portable = ", ".join(sorted(delegation.get("portable_ops") or {})) or "none"
        return {
            "executorch": self.numerics["executorch"],
            "delegation": self.meta.get("delegation"),
            "dynamic_axes": bool(axes.get("dynamic")),
            "bounds": axes.get("bounds"),
            "static_reason": axes.get("reason"),
            "summary": f"XNNPACK ran {delegation.get('delegated_nodes')} nodes in "
            f"{delegation.get('delegated_subgraphs')} subgraphs; portable kernels ran "
            f"{delegation.get('portable_nodes')} ({portable})",
        }


# ExecuTorch's error codes (runtime/core/error.h), for its messages that give the number only
ERRORS = {
    0x01: "Internal",
    0x02: "InvalidState",
    0x10: "NotSupported",
    0x11: "NotImplemented",
    0x12: "InvalidArgument: the runtime refused the inputs",
    0x13: "InvalidType",
    0x14: "OperatorMissing",
    0x20: "NotFound",
    0x21: "MemoryAllocationFailed",
    0x22: "AccessFailed",
    0x23: "InvalidProgram",
    0x25: "OutOfResources",
    0x30: "DelegateInvalidCompatibility",
    0x31: "DelegateMemoryAllocationFailed",
    0x32: "DelegateInvalidHandle",
}


def _named(error: RuntimeError) -> str:
    """``method->execute() failed with error 0x12 (InvalidArgument: ...)``: ExecuTorch's code with its name."""
    text = str(error)
    found = re.search(r"error (0x[0-9a-fA-F]+)", text)
    name = ERRORS.get(int(found[1], 16)) if found else None
    return f"{text} ({name})" if name else text
