"""A torch model's own module tree, one level at a time: the modules a scope calls, in call order, and their values.

The children of a scope are its direct submodules, and through any that is never called itself (a ``ModuleList``, a
``ModuleDict``, a holder whose parts the parent calls one by one) the submodules it holds, so ``encoder`` has the
children ``layer.0 … layer.11``. A child's value is the first tensor of what its first call returns (a Hugging Face
``ModelOutput`` or a ``(hidden, weights)`` tuple gives its first tensor), and its input the first tensor its first
call reads; a module called more than once (shared weights) is compared at its first call, and says so. A child is
typed by the layer catalogue (``parity.model.layer_types``) where its class is one the catalogue computes and it read
one tensor alone, or reads further inputs its kind computes from (``torch_further_inputs``: a self-attention's mask,
a rotary embedding's positions): those are recorded by argument name (``masks``), the layer's further inputs.

The reference side reads its levels through ``Levels``: the whole model runs once, at the root's level, and each
deeper level runs only the module it opens, on the arguments that module was called with in the run before (kept for
that level's children only), so a descent costs about one forward of the model, not one per level. A module run on
its own must give the value it gave inside the run before, bitwise, or its level is read by a whole run again.
Imports torch inside.
"""

from __future__ import annotations

import numpy as np

from parity.model import outputs as output_tree

MAX_ROUNDS = 4  # a scope whose parts are held by holders of holders that are never called: expanded this deep


class Levels:
    """A ``parity.diagnose.tree.torch_tree`` reader's levels on one ``TorchSource`` (see the module docstring):
    ``level(scope, names)`` as ``level_of`` returns it, with ``outputs`` of the model only where the whole model ran
    (``whole``: True). Each run looks one level ahead (``level``'s ``ahead``), so the level below is read without a
    run. ``runs`` counts the model's whole runs, ``own_runs`` the modules run on their own; ``progress(k, n, path)``
    hears each child of a level start (``_observe``)."""

    def __init__(self, runner, x: dict, progress=None):
        self.runner, self.x, self.progress = runner, x, progress
        self.called: dict[str, tuple] = {}  # the last run's modules: path -> (args, kwargs, value) of the first call
        self.ahead: dict[str, dict] = {}  # the last run's children's levels, read in that run
        self.runs = self.own_runs = 0

    def level(self, scope: str, names: list[str] | None = None) -> dict:
        runner = self.runner
        read = self.ahead.get(scope) if scope and names is None else None
        if read is not None:  # read ahead by the run before: no run, and its children may run on their own next
            self.ahead = {}
            return {**read, "outputs": {}, "whole": False}
        held = self.called.get(scope) if scope and names is None else None
        self.called, self.ahead = {}, {}
        if held is not None:
            found = self._own(scope, *held)
            if found is not None:
                return found
        fed = runner._inputs(runner.check_feed(self.x))
        self.runs += 1
        found = level(runner.module, lambda: runner._forward(fed), scope, names, self._keep, self.progress, True)
        self.ahead = found.pop("ahead", {})
        found.pop("returned", None)
        return {**found, "whole": True}

    def _keep(self, name: str, args, kwargs, value) -> None:
        self.called[name] = (args, kwargs, value)

    def _own(self, scope: str, args, kwargs, value) -> dict | None:
        """``scope``'s level from a run of ``scope`` alone on its first call's arguments; None where that run fails or
        does not give the value the module gave in the run before."""
        module = self.runner.module.get_submodule(scope)
        stream = getattr(self.runner, "_stream", None)

        def forward():
            if stream is None or getattr(stream, "casting_whole", True):
                return module(*args, **kwargs)
            return stream.run(lambda: module(*args, **kwargs))

        self.own_runs += 1
        try:
            found = level(self.runner.module, forward, scope, None, self._keep, self.progress, True)
        except Exception:  # noqa: BLE001 - a module that cannot run alone: the whole model runs again
            found = None
        if found is None or found["returned"] is None or not np.array_equal(found["returned"], value):
            self.called, self.ahead = {}, {}
            return None
        self.ahead = found.pop("ahead", {})
        found.pop("returned")
        return {**found, "outputs": {}, "whole": False}


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


def level(
    module, forward, scope: str, names: list[str] | None = None, keep=None, progress=None, ahead: bool = False
) -> dict:
    """Run ``forward()`` once (or a few times, see MAX_ROUNDS) with hooks under ``scope`` (a module path, ``''``:
    the root) and return ``{"children": [...], "values": {path: array}, "inputs": {path: array}}``.

    ``names`` given: exactly those module paths are observed (the path side of a level the reference side chose);
    else the scope's children as the module docstring says. Each child is ``{"path", "class", "calls", "leaf",
    "kind", "attrs", "single_input"}``; ``"masks"`` holds ``{path: {argument: array}}``, the further inputs of each
    typed child that reads a mask besides its input, in the order its kind reads them. ``keep(path, args, kwargs,
    value)`` hears each observed module's first call's arguments and value; ``progress(k, n, path)`` each child's
    first call (``n``: the children observed); ``returned``: the first tensor ``forward()`` returned. ``ahead``: the
    children's own children are observed in the same run, and ``"ahead"`` holds their levels (``{child: level}``,
    each as this returns it, for the children whose parts are all called)."""
    import torch

    root = module.get_submodule(scope) if scope else module
    prefix = f"{scope}." if scope else ""
    if names is not None:
        candidates = [(name, module.get_submodule(name)) for name in names]
    else:
        candidates = _callable([(prefix + n, child) for n, child in root.named_children()], torch)
    nested = {}
    if ahead and names is None:
        nested = {
            name: _callable([(f"{name}.{n}", c) for n, c in child.named_children()], torch)
            for name, child in candidates
            if list(child.children())
        }
    for _ in range(MAX_ROUNDS):
        further = [pair for parts in nested.values() for pair in parts]
        seen = _observe(torch, candidates, forward, keep, progress, further)
        uncalled = [(name, child) for name, child in candidates if name not in seen["calls"]]
        if names is not None or not any(list(child.children()) for _, child in uncalled):
            break
        nested = {}  # a holder found by the run: the level is read again, without looking ahead
        expanded = []
        for name, child in candidates:  # a holder never called: its parts take its place, in its order
            if name in seen["calls"] or not list(child.children()):
                expanded.append((name, child))
            else:
                expanded.extend((f"{name}.{n}", c) for n, c in child.named_children())
        candidates = expanded
    found = {**_level_of(module, candidates, seen), "outputs": seen["outputs"], "returned": seen["returned"]}
    if nested:
        found["ahead"] = {
            name: _level_of(module, parts, seen)
            for name, parts in nested.items()
            if name in seen["calls"] and not any(n not in seen["calls"] and list(c.children()) for n, c in parts)
        }
    return found


def _level_of(module, candidates: list, seen: dict) -> dict:
    """``{"children", "values", "inputs", "masks"}`` of ``candidates`` (``[(path, module)]``) as the run ``seen`` saw
    them."""
    from parity.model.layer_types import torch_layer

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
    return {
        "children": children,
        "values": {name: seen["values"][name] for name in called if name in seen["values"]},
        "inputs": {name: seen["inputs"][name] for name in called if name in seen["inputs"]},
        "masks": {name: seen["masked"][name][1] for name in called if name in seen["masked"]},
    }


def _callable(candidates: list, torch) -> list:
    """``candidates`` with every holder that cannot be called (a ``ModuleList``, a ``ModuleDict``: no ``forward`` of
    its own) replaced by its parts, in its order, before anything runs (a holder found only by a run costs a run)."""
    for _ in range(MAX_ROUNDS):
        expanded: list = []
        for name, child in candidates:
            if type(child).forward is torch.nn.Module.forward and list(child.children()):
                expanded.extend((f"{name}.{n}", c) for n, c in child.named_children())
            else:
                expanded.append((name, child))
        if len(expanded) == len(candidates):
            break
        candidates = expanded
    return candidates


def _observe(torch, candidates, forward, keep=None, progress=None, further=()) -> dict:
    """One run with hooks on ``candidates`` (``[(path, module)]``) and ``further`` (their parts, looked at ahead):
    call order, call counts, first values; ``progress(k, n, path)`` hears the ``k``-th of the ``n`` candidates start."""
    from parity.model.layer_types import torch_further_inputs

    calls: dict[str, int] = {}
    order, values, inputs, single, masked = [], {}, {}, {}, {}
    handles = []

    def before(name):
        def hook(module, args, kwargs):
            calls[name] = calls.get(name, 0) + 1
            if calls[name] == 1:
                order.append(name)
                if progress is not None and name in top:
                    started.append(name)
                    progress(len(started), len(top), name)
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
        def hook(_module, args, kwargs, output):
            if calls.get(name) == 1 and name not in values:
                first = _first_tensor(torch, output)
                if first is not None and first.is_floating_point():
                    values[name] = _host(torch, first)
                    if keep is not None:
                        keep(name, args, kwargs, values[name])

        return hook

    top = {name for name, _ in candidates}
    started: list = []
    for name, child in (*candidates, *further):
        handles.append(child.register_forward_pre_hook(before(name), with_kwargs=True))
        handles.append(child.register_forward_hook(after(name), with_kwargs=True))
    try:
        with torch.inference_mode():
            returned = forward()
    finally:
        for handle in handles:
            handle.remove()
    flat = {name: _host(torch, t) for name, t in output_tree.flatten(returned, torch.is_tensor)}
    first = _first_tensor(torch, returned)
    return {
        "returned": None if first is None else _host(torch, first),
        "order": order,
        "calls": calls,
        "values": values,
        "inputs": inputs,
        "single": single,
        "masked": masked,
        "outputs": flat,
    }
