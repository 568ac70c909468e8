"""PyTorch source: an ``nn.Module`` from the spec, loaded with canonical weights."""

from __future__ import annotations

import numpy as np

from parity.model import layouts, outputs
from parity.model.feeds import call_torch as call
from parity.platform.errors import Unavailable
from parity.platform.precision import torch_flags
from parity.runtimes import torch_common
from parity.runtimes.base import Runner

_TORCH_DTYPES = {"float32": "float32", "float64": "float64"}
_SKIPPED_STATE = ("num_batches_tracked",)


def build_module(spec, weights: dict[str, np.ndarray] | None, dtype: str = "float32"):
    """The spec's torch module in eval mode, holding ``weights`` (canonical) if given."""
    import torch

    torch.manual_seed(spec.training.seed)
    module = hold_in(torch, spec.torch_module(), getattr(torch, _TORCH_DTYPES[dtype]))
    by_torch_name = {layouts.torch_param_name(name): name for name in spec.params}
    state = {k: v for k, v in module.state_dict().items() if not k.endswith(_SKIPPED_STATE) and v.is_floating_point()}
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

    def __init__(
        self, spec, weights, batch_size: int, dtype: str = "float32", device: str = "cpu", precision: str = "fp32"
    ):
        super().__init__(spec, batch_size, dtype, device, precision)
        import torch

        self.torch = torch
        self.torch_device = torch_device(torch, device)
        self.numerics = torch_flags(torch, precision, device)
        self.torch_dtype = getattr(torch, self.compute_dtype)
        module = build_module(spec, weights, dtype)
        self.module = hold_in(torch, module, self.torch_dtype).to(self.torch_device)
        self._optimizer = None  # torch.optim.SGD over optimized_params(), made by the first train_step

    def _inputs(self, feeds: dict) -> dict:
        """Feeds as tensors on the device, floating ones in the compute dtype."""
        tensors = {}
        for name, x in feeds.items():
            tensor = self.torch.from_numpy(x).to(self.torch_device)
            tensors[name] = tensor.to(self.torch_dtype) if tensor.is_floating_point() else tensor
        return tensors

    def _forward(self, tensors: dict):
        return call(self.module, tensors)

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
        return {
            name: np.array(layouts.param_from_framework("torch", self.spec.params[name].kind, self._host(t)))
            for name, t in self._trainable_tensors(self.spec.trainable_params).items()
        }
