"""PyTorch pieces shared by the torch source (eager and compiled) and the torch.export runtime: the loss every path
differentiates, its gradients in canonical layout, and one plain-SGD step."""

from __future__ import annotations

from parity.model import layouts, outputs


def loss(torch, spec, returned, labels):
    """Mean cross-entropy of the first output against ``labels``; reduced-precision logits in float32, as
    mixed-precision training computes it."""
    logits = outputs.first(spec.outputs, returned, torch.is_tensor)
    return torch.nn.functional.cross_entropy(
        logits.to(torch.promote_types(logits.dtype, torch.float32)), torch.from_numpy(labels).to(logits.device)
    )


def gradients(torch, spec, forward, trainable: dict, inputs: dict, labels, host) -> dict:
    """Gradients of ``loss`` w.r.t. the ``trainable`` parameters (canonical name -> tensor; canonical layout) and
    the floating inputs (``input:<name>``), on host as ``host`` returns them; ``forward`` takes ``inputs`` (tensors,
    by name)."""
    differentiated = {name: inputs[name].requires_grad_(True) for name in spec.input_grad_names}
    wrt = [*trainable.values(), *differentiated.values()]
    grads = torch.autograd.grad(loss(torch, spec, forward(inputs), labels), wrt, allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g for t, g in zip(wrt, grads)]
    result = {
        name: layouts.param_from_framework("torch", spec.params[name].kind, host(g))
        for name, g in zip(trainable, grads)
    }
    for name, g in zip(differentiated, grads[len(trainable) :]):
        result[spec.input_grad_names[name]] = host(g)
    return result


def sgd_step(torch, optimizer, params: list, lr: float, step_loss):
    """One plain-SGD step of ``step_loss()`` over ``params`` at ``lr``, on ``optimizer`` (made here on the first
    step: pass None); returns the optimizer for the next step."""
    if optimizer is None:
        optimizer = torch.optim.SGD(params, lr=lr)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    step_loss().backward()
    optimizer.step()
    return optimizer
