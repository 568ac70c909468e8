"""The ``.pt2`` an ExportedProgram is saved as, loaded with ``torch.export.load`` and run as its ``.module()``;
never a pickle: custom objects are refused before loading and every ``torch.load`` inside is weights-only."""

from __future__ import annotations

import json
import os
import posixpath
import zipfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from parity.model import layouts, outputs
from parity.platform.errors import ParityError, one_line
from parity.runtimes import torch_common
from parity.runtimes.base import Runner

# the archive's constants whose loaders unpickle (torch/export/pt2_archive/_package.py, ``_load_constants``):
# a TorchScript object and an opaque object (plain ``pickle.loads``, which no weights_only switch reaches)
_OBJECT_PREFIXES = ("custom_obj_", "opaque_obj_")


class PickledArtifact(ParityError):
    """An artifact that can be loaded only by unpickling something other than tensors."""


@contextmanager
def weights_only_loads():
    """Every ``torch.load`` in the block weights-only, even one that asks for ``weights_only=False`` (torch reads
    ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` at each call): torch.export's loader falls back to a full unpickle where a
    weights-only load fails, and parity never loads pickles."""
    old = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = old


def refuse_pickled_objects(path: Path) -> None:
    """Raise ``PickledArtifact`` where the ``.pt2`` archive holds a constant its loader would unpickle (a custom or
    opaque object), read from the archive's own constants configs before torch sees the file."""
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                if posixpath.basename(member).startswith(_OBJECT_PREFIXES):
                    raise PickledArtifact(f"{path.name} holds a pickled object ({member}): parity never loads pickles")
                if member.endswith("_constants_config.json"):
                    try:
                        config = json.loads(archive.read(member)).get("config") or {}
                    except (ValueError, AttributeError) as error:
                        raise PickledArtifact(f"{path.name}: unreadable constants config {member} ({error})") from None
                    for fqn, entry in config.items():
                        name = str((entry or {}).get("path_name", ""))
                        if name.startswith(_OBJECT_PREFIXES) or "/" in name or "\\" in name:
                            raise PickledArtifact(
                                f"{path.name} holds constant {fqn!r} as a pickled object ({name}): "
                                f"parity never loads pickles"
                            )
    except zipfile.BadZipFile as error:
        raise PickledArtifact(f"{path.name} is not a .pt2 archive ({error})") from None


def load_program(path: Path):
    """The ExportedProgram saved at ``path``, loaded without unpickling anything but tensors."""
    import torch

    path = Path(path)
    refuse_pickled_objects(path)
    try:
        with weights_only_loads():
            return torch.export.load(str(path))
    except Exception as error:
        if "weights_only" in str(error) or type(error).__name__ == "UnpicklingError":
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise PickledArtifact(
                one_line(
                    f"{path.name} holds a pickle that is not plain tensors, refused by a weights-only load: {first}",
                    300,
                )
            ) from None
        raise


class ExportedProgramRunner(Runner):
    """``torch/export``: the saved ExportedProgram's ``.module()`` (the graph of aten ops that ships), in eager
    PyTorch on the CPU at float32. Gradients and the training step go through that module's own parameters."""

    differentiable = True

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
        self.program = load_program(Path(artifact_dir) / meta["file"])
        self.module = self.program.module()
        params = dict(self.module.named_parameters())
        # the exporter's wrapper holds the model as ``model``: parameters are ``model.<torch name>``
        self._params = {
            name: params[f"model.{layouts.torch_param_name(name)}"]
            for name in spec.trainable_params
            if f"model.{layouts.torch_param_name(name)}" in params
        }
        missing = [name for name in spec.trainable_params if name not in self._params]
        if missing:
            self.differentiable = False  # a program whose weights were lifted to constants: forward only
        self._optimizer = None
        self.numerics = {"torch": torch.__version__, "device": device, "precision": precision, "threads": threads}
        self._missing_params = missing

    def _forward(self, x: dict):
        torch = self.torch
        args = [torch.from_numpy(x[i.name]) for i in self.spec.model_inputs]
        return self.module(*args)

    def run_impl(self, x):
        with self.torch.inference_mode():
            return tuple(t.detach().numpy() for t in self._forward(x))

    def gradients_impl(self, x, labels):
        torch = self.torch
        inputs = {i.name: torch.from_numpy(x[i.name]) for i in self.spec.model_inputs}
        return torch_common.gradients(
            torch,
            self.spec,
            lambda tensors: self.module(*tensors.values()),
            self._params,
            inputs,
            labels,
            lambda g: g.detach().numpy(),
        )

    def train_step_impl(self, x, labels, lr):
        torch = self.torch
        params = [self._params[name] for name in self.optimized_params()] if self._optimizer is None else None
        self._optimizer = torch_common.sgd_step(
            torch, self._optimizer, params, lr, lambda: torch_common.loss(torch, self.spec, self._forward(x), labels)
        )

    def trainable_weights_impl(self):
        return {
            name: np.array(layouts.param_from_framework("torch", self.spec.params[name].kind, t.detach().numpy()))
            for name, t in self._params.items()
        }

    def taps_impl(self, x):
        """The layers' outputs from the program unflattened back into the model's module tree
        (``torch.export.unflatten``: the same graph, cut at the module calls it records), with a forward hook on each
        tapped module; where the unflattened program's outputs are not bitwise those of ``.module()``, each tap says
        its values come from that other partition of the graph."""
        torch = self.torch
        if getattr(self, "_unflattened", None) is None:
            self._unflattened = torch.export.unflatten(self.program)
        recorded, handles, self.tap_locations = {}, [], {}
        for tap in self.spec.taps:
            try:  # the exporter's wrapper holds the model as ``model``
                module = self._unflattened.get_submodule(f"model.{tap}")
            except AttributeError:
                self.tap_locations[tap] = {"found": "unmapped", "reason": "the program records no call of this module"}
                continue
            handles.append(module.register_forward_hook(lambda _m, _i, out, n=tap: recorded.__setitem__(n, out)))
            self.tap_locations[tap] = {"found": "module", "tensor": f"model.{tap}"}
        args = [torch.from_numpy(x[i.name]) for i in self.spec.model_inputs]
        try:
            with torch.inference_mode():
                returned = self._unflattened(*args)
                plain = self.module(*args)
        finally:
            for handle in handles:
                handle.remove()
        ours, theirs = ([t for _, t in outputs.flatten(r, torch.is_tensor)] for r in (returned, plain))
        if len(ours) != len(theirs) or not all(torch.equal(a, b) for a, b in zip(ours, theirs)):
            for where in self.tap_locations.values():
                where.setdefault("reason", "read from the unflattened program, whose outputs differ from .module()'s")
        return {tap: outputs.flatten(value, torch.is_tensor)[0][1].detach().numpy() for tap, value in recorded.items()}

    def runtime_record(self) -> dict:
        """The torch that ran the program, and whether its declared axes are dynamic in it."""
        axes = self.meta.get("axes") or {}
        record = {
            "torch": self.torch.__version__,
            "dynamic_axes": bool(axes.get("dynamic")),
            "static_axes": axes.get("static") or {},
            "static_reason": axes.get("reason"),
            "summary": "declared axes dynamic in the program"
            if not axes.get("static")
            else f"exported static: {axes.get('reason')}",
        }
        if self._missing_params:
            record["not_differentiable"] = (
                f"the program holds {', '.join(self._missing_params[:4])} as constants, not parameters"
            )
        return record
