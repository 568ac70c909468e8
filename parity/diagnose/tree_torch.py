"""A torch model's own module tree, one level at a time: the modules a scope calls, in call order, and their values.

The children of a scope are its direct submodules, and through any that is never called itself (a ``ModuleList``, a
``ModuleDict``, a holder whose parts the parent calls one by one) the submodules it holds, so ``encoder`` has the
children ``layer.0 … layer.11``. A child's value is the first tensor of what its first call returns (a Hugging Face
``ModelOutput`` or a ``(hidden, weights)`` tuple gives its first tensor), and its input the first tensor its first
call reads; a module called more than once (shared weights) is compared at its first call, and says so. A child is
typed by the layer catalogue (``parity.model.layer_types``) where its class is one the catalogue computes and it read
one tensor alone, or reads further inputs its kind computes from (``torch_further_inputs``: a self-attention's mask,
a rotary embedding's positions): those are recorded by argument name (``masks``), the layer's further inputs. Imports torch inside.
"""

from __future__ import annotations

import numpy as np

from parity.model import outputs as output_tree

MAX_ROUNDS = 4  # a scope whose parts are held by holders of holders that are never called: expanded this deep


def _host(torch, tensor) -> np.ndarray:
    tensor = tensor.detach()
    if tensor.dtype in (torch.float16, torch.bfloat16):
        tensor = tensor.float()
    return tensor.cpu().numpy()


def _first_tensor(torch, value):
    if torch.is_tensor(value):
        return value
    try:
        leaves = output_tree.flatten(value, torch.is_tensor)
    except Exception:  # noqa: BLE001 - an output parity cannot name: no tensor to compare
        return None
    return leaves[0][1] if leaves else None


def _tensor_args(torch, args, kwargs) -> list:
    return [a for a in (*args, *kwargs.values()) if torch.is_tensor(a)]


def level_of(runner, x: dict, scope: str, names: list[str] | None = None) -> dict:
    """``level`` of a ``parity.sources.torch.TorchSource`` on the feeds ``x``."""
    fed = runner._inputs(runner.check_feed(x))
    return level(runner.module, lambda: runner._forward(fed), scope, names)


def level(module, forward, scope: str, names: list[str] | None = None) -> dict:
    """Run ``forward()`` once (or a few times, see MAX_ROUNDS) with hooks under ``scope`` (a module path, ``''``:
    the root) and return ``{"children": [...], "values": {path: array}, "inputs": {path: array}}``.

    ``names`` given: exactly those module paths are observed (the path side of a level the reference side chose);
    else the scope's children as the module docstring says. Each child is ``{"path", "class", "calls", "leaf",
    "kind", "attrs", "single_input"}``; ``"masks"`` holds ``{path: {argument: array}}``, the further inputs of each
    typed child that reads a mask besides its input, in the order its kind reads them."""
    import torch

    from parity.model.layer_types import torch_layer

    root = module.get_submodule(scope) if scope else module
    prefix = f"{scope}." if scope else ""
    if names is not None:
        candidates = [(name, module.get_submodule(name)) for name in names]
    else:
        candidates = [(prefix + n, child) for n, child in root.named_children()]
    for _ in range(MAX_ROUNDS):
        seen = _observe(torch, candidates, forward)
        uncalled = [(name, child) for name, child in candidates if name not in seen["calls"]]
        if names is not None or not any(list(child.children()) for _, child in uncalled):
            break
        expanded = []
        for name, child in candidates:  # a holder never called: its parts take its place, in its order
            if name in seen["calls"] or not list(child.children()):
                expanded.append((name, child))
            else:
                expanded.extend((f"{name}.{n}", c) for n, c in child.named_children())
        candidates = expanded
    called = sorted((name for name, _ in candidates if name in seen["calls"]), key=seen["order"].index)
    children = []
    for name in called:
        child = module.get_submodule(name)
        typed = torch_layer(child)
        single = seen["single"].get(name, False)
        masked = seen["masked"].get(name)
        if typed and masked and not single:
            typed = (typed[0], {**typed[1], **masked[0]})
        children.append(
            {
                "path": name,
                "class": f"{type(child).__module__}.{type(child).__qualname__}",
                "calls": seen["calls"][name],
                "leaf": not list(child.children()),
                "kind": typed[0] if typed and (single or masked) else None,
                "attrs": typed[1] if typed and (single or masked) else None,
                "single_input": single,
                "has_value": name in seen["values"],
            }
        )
    masks = {name: seen["masked"][name][1] for name in called if name in seen["masked"]}
    return {
        "children": children,
        "values": seen["values"],
        "inputs": seen["inputs"],
        "outputs": seen["outputs"],
        "masks": masks,
    }


def _observe(torch, candidates, forward) -> dict:
    """One run with hooks on ``candidates`` (``[(path, module)]``): call order, call counts, first values."""
    from parity.model.layer_types import torch_further_inputs

    calls: dict[str, int] = {}
    order, values, inputs, single, masked = [], {}, {}, {}, {}
    handles = []

    def before(name):
        def hook(module, args, kwargs):
            calls[name] = calls.get(name, 0) + 1
            if calls[name] == 1:
                order.append(name)
                fed = _tensor_args(torch, args, kwargs)
                if fed:
                    inputs[name] = _host(torch, fed[0])
                single[name] = (
                    len(args) == 1
                    and torch.is_tensor(args[0])
                    and all(v is None or isinstance(v, bool) for v in kwargs.values())
                )
                typed = None if single[name] else torch_further_inputs(module, args, kwargs)
                if typed is not None:
                    masked[name] = (typed[0], {arg: _host(torch, m) for arg, m in typed[1].items()})

        return hook

    def after(name):
        def hook(_module, _args, output):
            if calls.get(name) == 1 and name not in values:
                first = _first_tensor(torch, output)
                if first is not None and first.is_floating_point():
                    values[name] = _host(torch, first)

        return hook

    for name, child in candidates:
        handles.append(child.register_forward_pre_hook(before(name), with_kwargs=True))
        handles.append(child.register_forward_hook(after(name)))
    try:
        with torch.inference_mode():
            returned = forward()
    finally:
        for handle in handles:
            handle.remove()
    flat = {name: _host(torch, t) for name, t in output_tree.flatten(returned, torch.is_tensor)}
    return {
        "order": order,
        "calls": calls,
        "values": values,
        "inputs": inputs,
        "single": single,
        "masked": masked,
        "outputs": flat,
    }
