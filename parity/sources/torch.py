"""PyTorch source: an ``nn.Module`` from the spec, loaded with canonical weights."""

from __future__ import annotations

from typing import Any

import numpy as np

from parity.model import layouts, outputs, weight_files
from parity.model.feeds import call_torch as call
from parity.model.identity import SKIPPED_TORCH_STATE
from parity.model.size import torch_weight_bytes
from parity.platform.errors import Unavailable
from parity.platform.precision import torch_flags
from parity.runtimes import torch_common
from parity.runtimes.base import Runner
from parity.sources import torch_streamed

_TORCH_DTYPES = {"float32": "float32", "float64": "float64"}


def build_module(spec, weights: dict[str, np.ndarray] | None, dtype: str = "float32", mapped: bool = False):
    """The spec's torch module in eval mode, holding ``weights`` (canonical) if given; ``mapped``: a model mapped from
    its weight files keeps their tensors in the files' dtypes (``parity.model.weight_files``)."""
    import torch

    torch.manual_seed(spec.training.seed)
    built = weight_files.build_mapped(spec) if mapped else spec.torch_module()
    module = hold_in(torch, built, getattr(torch, _TORCH_DTYPES[dtype]))
    by_torch_name = {layouts.torch_param_name(name): name for name in spec.params}
    state = {
        k: v for k, v in module.state_dict().items() if not k.endswith(SKIPPED_TORCH_STATE) and v.is_floating_point()
    }
    found = {by_torch_name.get(key, key): tuple(value.shape) for key, value in state.items()}
    layouts.check_names_and_shapes("torch", spec.params, found)
    if weights is not None:
        layouts.check_weights(spec.params, weights)
        new_state = {  # each weight in the dtype the module holds it in (its own, or the run's)
            layouts.torch_param_name(name): torch.from_numpy(
                layouts.param_to_framework("torch", spec.params[name].kind, np.asarray(weights[name]))
            )
            for name in spec.params
        }
        module.load_state_dict(new_state, strict=False)
    return module.eval()


def hold_in(torch, module, dtype):
    """``module`` with its floating parameters and buffers held as ``layouts.held_dtype`` says: every one in
    float64 for the reference, else the float32 ones in ``dtype`` and the others (a float64 gain) as they are."""
    name = str(dtype).removeprefix("torch.")

    def cast(tensor):
        if not tensor.is_floating_point():
            return tensor
        return tensor.to(getattr(torch, layouts.held_dtype(str(tensor.dtype).removeprefix("torch."), name)))

    return module._apply(cast)


def canonical_state(spec, module) -> dict[str, np.ndarray]:
    """The module's parameters and buffers as canonical weights (float32)."""
    state = module.state_dict()
    return {
        name: layouts.param_from_framework(
            "torch", p.kind, state[layouts.torch_param_name(name)].detach().cpu().numpy()
        ).astype(np.float32)
        for name, p in spec.params.items()
    }


def torch_device(torch, device: str):
    """The torch device for ``cpu`` / ``cuda:N`` (inside a worker the chosen GPU is CUDA device 0)."""
    if device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise Unavailable(f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)")
    return torch.device("cuda", 0)


class TorchSource(Runner):
    """The native ``torch`` path: eager PyTorch on the CPU or a CUDA GPU, in the precision's dtype."""

    differentiable = True
    streams_reference = True  # a float64 run on the CPU may be streamed (``parity.sources.torch_streamed``)
    any_batch = True  # one instance runs feeds of any batch size

    def __init__(
        self, spec, weights, batch_size: int, dtype: str = "float32", device: str = "cpu", precision: str = "fp32"
    ):
        super().__init__(spec, batch_size, dtype, device, precision)
        import torch

        self.torch = torch
        self.torch_device = torch_device(torch, device)
        self.numerics = torch_flags(torch, precision, device)
        self.torch_dtype = getattr(torch, self.compute_dtype)
        self._stream: Any = None  # the streamer of a streamed float64 reference, else None (the module is cast whole)
        self.reference_mode: dict | None = None  # a float64 run's ``{"mode", "why"}`` (``reference_record``)
        torch_streamed.asked()  # a PARITY_REFERENCE it does not know stops every torch run, not the reference alone
        if self.compute_dtype == "float64" and device == "cpu" and self.streams_reference:
            self._build_reference(spec, weights)
        else:
            module = build_module(spec, weights, dtype)
            self.module = hold_in(torch, module, self.torch_dtype).to(self.torch_device)
        self._optimizer = None  # torch.optim.SGD over optimized_params(), made by the first train_step

    def _build_reference(self, spec, weights) -> None:
        """The float64 reference's module: held in float32 and streamed, or cast whole, as ``choose`` says."""
        module = build_module(spec, weights, "float32", mapped=True)
        mode, why = torch_streamed.choose(torch_weight_bytes(module))
        files = weight_files.declared(spec)
        if files is not None:
            why = f"{why}; its weights memory-mapped from {files}"
        if mode == "streamed":
            self.module, self._stream = module, torch_streamed.Streamer(self.torch, module)
        else:
            self.module = hold_in(self.torch, module, self.torch_dtype)
        self.reference_mode = {"mode": mode, "why": why}

    def reference_record(self) -> dict | None:
        """How this float64 reference ran: ``{"mode": "streamed" | "whole", "why"}`` (a streamed run that had to
        cast a module whole says which and why; one that cast the root is ``whole``), None for other runs."""
        if self.reference_mode is None or self._stream is None:
            return self.reference_mode
        stream = self._stream
        if stream.reason is None:
            return self.reference_mode
        mode = "whole" if stream.whole else "streamed"
        return {"mode": mode, "why": f"{self.reference_mode['why']}; {stream.reason}"}

    def _inputs(self, feeds: dict) -> dict:
        """Feeds as tensors on the device, floating ones in the compute dtype."""
        tensors = {}
        for name, x in feeds.items():
            tensor = self.torch.from_numpy(x).to(self.torch_device)
            tensors[name] = tensor.to(self.torch_dtype) if tensor.is_floating_point() else tensor
        return tensors

    def _forward(self, tensors: dict):
        if self._stream is None or self._stream.casting_whole:
            return call(self.module, tensors)
        try:
            return self._stream.run(lambda: call(self.module, tensors))
        except torch_streamed.OutsideRead as error:  # read with the whole model as one unit: not streamable
            self._cast_whole(f"a streamed run read a weight outside its module even as one unit ({error})")
        return call(self.module, tensors)

    def _cast_whole(self, why: str) -> None:
        """Stop streaming: the module's weights cast to float64 in place from here on (``why``: the record's)."""
        torch = self.torch
        with torch.inference_mode(False):  # weights a later gradient or training step may use
            self.module = hold_in(torch, self.module, self.torch_dtype)
        self._stream = None
        before = (self.reference_mode or {}).get("why")
        self.reference_mode = {"mode": "whole", "why": f"{before}; {why}" if before else why}

    def _host(self, tensor) -> np.ndarray:
        """A result on the host: reduced-precision values widened to float32 (exact), others as they are."""
        tensor = tensor.detach()
        if tensor.dtype in (self.torch.float16, self.torch.bfloat16):
            tensor = tensor.float()
        return tensor.cpu().numpy()

    def run_impl(self, x):
        torch = self.torch
        with torch.inference_mode():
            return {name: self._host(t) for name, t in outputs.flatten(self._forward(self._inputs(x)), torch.is_tensor)}

    def device_compute(self, x):
        if self.device == "cpu":
            return None
        torch, x_t = self.torch, self._inputs(x)

        def compute():
            with torch.inference_mode():
                self._forward(x_t)
            torch.cuda.synchronize()

        return compute

    def device_memory_peak_mb(self):
        return None if self.device == "cpu" else self.torch.cuda.max_memory_allocated() / 2**20

    def taps_impl(self, x):
        torch = self.torch
        recorded, handles = {}, []
        for name in self.spec.taps:
            submodule = self.module.get_submodule(name)
            handles.append(submodule.register_forward_hook(lambda _m, _i, out, n=name: recorded.__setitem__(n, out)))
        try:
            with torch.inference_mode():
                self._forward(self._inputs(x))
        finally:
            for handle in handles:
                handle.remove()
        return {name: self._host(outputs.flatten(recorded[name], torch.is_tensor)[0][1]) for name in self.spec.taps}

    def gradients_impl(self, x, labels):
        if self._stream is not None:  # gradients through the whole model in float64, its parameters as leaves
            with self._stream.cast_whole():
                return self._gradients(x, labels)
        return self._gradients(x, labels)

    def _gradients(self, x, labels):
        for p in self.module.parameters():
            p.grad = None
        return torch_common.gradients(
            self.torch,
            self.spec,
            self._forward,
            self._trainable_tensors(self.spec.trainable_params),
            self._inputs(x),
            labels,
            self._host,
        )

    def _trainable_tensors(self, names) -> dict:
        params = dict(self.module.named_parameters())
        return {name: params[layouts.torch_param_name(name)] for name in names}

    def train_step_impl(self, x, labels, lr):
        torch = self.torch
        if self._stream is not None:  # training updates the float64 weights: the module is cast whole from here on
            self._cast_whole("a training step casts the whole model")
        params = list(self._trainable_tensors(self.optimized_params()).values()) if self._optimizer is None else None
        # eval mode: BatchNorm statistics stay as they are
        self._optimizer = torch_common.sgd_step(
            torch,
            self._optimizer,
            params,
            lr,
            lambda: torch_common.loss(torch, self.spec, self._forward(self._inputs(x)), labels),
        )
        if self.device != "cpu":
            torch.cuda.synchronize()

    def trainable_weights_impl(self):
        held = self.compute_dtype if self._stream is not None else None  # a streamed module holds float32
        return {
            name: np.array(layouts.param_from_framework("torch", self.spec.params[name].kind, self._host(t)), held)
            for name, t in self._trainable_tensors(self.spec.trainable_params).items()
        }
