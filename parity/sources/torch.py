"""PyTorch source: an ``nn.Module`` from the spec, loaded with canonical weights."""

from __future__ import annotations

import numpy as np

from parity import layouts
from parity.runtimes.base import Runner, as_tuple

_TORCH_DTYPES = {"float32": "float32", "float64": "float64"}
_SKIPPED_STATE = ("num_batches_tracked",)


def build_module(spec, weights: dict[str, np.ndarray] | None, dtype: str = "float32"):
    """The spec's torch module in eval mode, holding ``weights`` (canonical) if given."""
    import torch

    torch.manual_seed(spec.training.seed)
    module = spec.torch_module()
    torch_dtype = getattr(torch, _TORCH_DTYPES[dtype])
    module = module.to(torch_dtype)
    by_torch_name = {layouts.torch_param_name(name): name for name in spec.params}
    state = {k: v for k, v in module.state_dict().items() if not k.endswith(_SKIPPED_STATE) and v.is_floating_point()}
    found = {by_torch_name.get(key, key): tuple(value.shape) for key, value in state.items()}
    layouts.check_names_and_shapes("torch", spec.params, found)
    if weights is not None:
        layouts.check_weights(spec.params, weights)
        new_state = {
            layouts.torch_param_name(name): torch.from_numpy(
                layouts.param_to_framework("torch", spec.params[name].kind, np.asarray(weights[name], dtype=dtype))
            )
            for name in spec.params
        }
        module.load_state_dict(new_state, strict=False)
    return module.eval()


def canonical_state(spec, module) -> dict[str, np.ndarray]:
    """The module's parameters and buffers as canonical weights (float32)."""
    state = module.state_dict()
    return {
        name: layouts.param_from_framework(
            "torch", p.kind, state[layouts.torch_param_name(name)].detach().cpu().numpy()
        ).astype(np.float32)
        for name, p in spec.params.items()
    }


class TorchSource(Runner):
    """The native ``torch`` path: eager PyTorch on the CPU."""

    differentiable = True

    def __init__(self, spec, weights, batch_size: int, dtype: str = "float32"):
        super().__init__(spec, batch_size, dtype)
        import torch

        self.torch = torch
        self.module = build_module(spec, weights, dtype)
        self._optimizer = None  # torch.optim.SGD over optimized_params(), made by the first train_step

    def run_impl(self, x):
        torch = self.torch
        with torch.inference_mode():
            return tuple(t.numpy() for t in as_tuple(self.module(torch.from_numpy(x))))

    def taps_impl(self, x):
        torch = self.torch
        recorded, handles = {}, []
        for name in self.spec.taps:
            submodule = self.module.get_submodule(name)
            handles.append(submodule.register_forward_hook(lambda _m, _i, out, n=name: recorded.__setitem__(n, out)))
        try:
            with torch.inference_mode():
                self.module(torch.from_numpy(x))
        finally:
            for handle in handles:
                handle.remove()
        return {name: recorded[name].numpy() for name in self.spec.taps}

    def gradients_impl(self, x, labels):
        torch = self.torch
        spec = self.spec
        module = self.module
        params = dict(module.named_parameters())
        trainable = {name: params[layouts.torch_param_name(name)] for name in spec.trainable_params}
        for p in module.parameters():
            p.grad = None
        x_t = torch.from_numpy(x).requires_grad_(True)
        logits = as_tuple(module(x_t))[0]
        loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(labels))
        grads = torch.autograd.grad(loss, [*trainable.values(), x_t])
        result = {
            name: layouts.param_from_framework("torch", spec.params[name].kind, g.numpy())
            for name, g in zip(trainable, grads)
        }
        result[spec.input_grad_name] = grads[-1].numpy()
        return result

    def _trainable_tensors(self, names) -> dict:
        params = dict(self.module.named_parameters())
        return {name: params[layouts.torch_param_name(name)] for name in names}

    def train_step_impl(self, x, labels, lr):
        torch = self.torch
        if self._optimizer is None:
            self._optimizer = torch.optim.SGD(list(self._trainable_tensors(self.optimized_params()).values()), lr=lr)
        for group in self._optimizer.param_groups:
            group["lr"] = lr
        self._optimizer.zero_grad(set_to_none=True)
        logits = as_tuple(self.module(torch.from_numpy(x)))[0]  # eval mode: BatchNorm statistics stay as they are
        torch.nn.functional.cross_entropy(logits, torch.from_numpy(labels)).backward()
        self._optimizer.step()

    def trainable_weights_impl(self):
        return {
            name: np.array(layouts.param_from_framework("torch", self.spec.params[name].kind, t.detach().cpu().numpy()))
            for name, t in self._trainable_tensors(self.spec.trainable_params).items()
        }
