"""A torch model's float64 reference computed module by module: the model stays in float32 in memory, and each unit's
parameters and buffers are cast to float64 only while it runs.

Units are chosen by size, walking down from the root: a callable module whose subtree holds at most ``budget`` bytes
of floating tensors (or that has no children) is one unit, its whole subtree cast when its call starts (a forward
pre-hook) and put back when it returns (a forward hook that also runs on an exception). A bigger one is *split*: its
children are planned in turn, and for its whole call it holds in float64 its own direct tensors, those of any holder
it reads its parts from (a ``ModuleList``, a ``ParameterList``: never called themselves) and its first floating
parameter (what ``module.dtype`` and ``next(module.parameters())`` read: a Hugging Face model builds its masks in
that dtype). A tensor held by several modules (tied embeddings) or a module called more than once is counted per
holder: cast at its first holder's entry, put back at its last holder's exit.

Casting back restores the very float32 tensor the module held, so the model after a run is bitwise the model before.
A model may read a weight outside its module's call (``self.child.weight`` in a parent's ``forward``): it would meet
the float32 tensor, and an operation on it alone (``softmax``) would run in float32 with nothing to say so once type
promotion mixes the result with float64. While a run streams, a ``TorchFunctionMode`` (``_guard``) therefore refuses
every operation that reads a float32 original, or a view of its storage, other than its shape or device
(``OutsideRead``, a dtype error); a dtype error of torch's own is taken the same way. ``coarsen`` then makes the
innermost split module running at the failure one unit, and the run is repeated, up to the whole model as one unit
(``whole``); a read the whole model as one unit still makes (an alias of a weight kept outside its module) is raised.

``PARITY_REFERENCE`` (``streamed``, ``whole``, ``auto``: the default) chooses the mode; ``auto`` streams a model whose
float32 weights are over ``STREAMED_ABOVE`` bytes (``choose``). Imports torch inside.
"""

from __future__ import annotations

import os
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from parity.model.size import torch_weight_bytes
from parity.platform.errors import UsageError, one_line

ENV = "PARITY_REFERENCE"
MODES = ("auto", "streamed", "whole")
STREAMED_ABOVE = 512 * 2**20  # float32 bytes of weights above which ``auto`` streams (its float64 copy: 1 GiB)
MIN_UNIT = 64 * 2**20  # a unit's float32 bytes are at most the largest of this and a sixteenth of the model
_DTYPE_ERROR = re.compile(r"dtype|double|float|scalar type", re.IGNORECASE)


# what an operation may read of a float32 original while a run streams: nothing that depends on its dtype or values
_SHAPE_ONLY = frozenset(
    {"shape", "ndim", "device", "layout", "is_cuda", "is_meta", "is_sparse", "is_quantized", "requires_grad"}
    | {"is_leaf", "grad_fn", "size", "dim", "numel", "stride", "is_floating_point", "is_complex", "is_contiguous"}
    | {"__len__", "__hash__", "data_ptr"}
)


class StreamingError(UsageError):
    """A ``PARITY_REFERENCE`` that is not one of ``MODES``."""


class OutsideRead(TypeError):
    """An operation of a streamed run read a float32 weight outside its module's call (its dtype differs from the
    whole float64 model's): the run is repeated with coarser units, or the model cast whole."""


def asked() -> str:
    """``PARITY_REFERENCE`` (``auto`` where unset); a value it does not know is a ``StreamingError``."""
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise StreamingError(f"{ENV}={os.environ[ENV]!r} is not one of {', '.join(MODES)}")
    return value


def choose(weight_bytes: int) -> tuple[str, str]:
    """``("streamed" | "whole", why)`` for a model holding ``weight_bytes`` of floating weights, as ``PARITY_REFERENCE``
    says (``auto``: streamed above ``STREAMED_ABOVE``)."""
    asked_for = asked()
    if asked_for != "auto":
        return asked_for, f"{ENV}={asked_for}"
    size = f"{weight_bytes / 2**20:.0f} MiB of weights"
    if weight_bytes > STREAMED_ABOVE:
        return "streamed", f"{size}, over the {STREAMED_ABOVE // 2**20} MiB a whole float64 copy is made for"
    return "whole", f"{size}, at most the {STREAMED_ABOVE // 2**20} MiB a whole float64 copy is made for"


def _holder(torch, module) -> bool:
    """A module that is never called itself: its parent reads its parts (``ModuleList``, ``ParameterDict`` ...)."""
    return type(module).forward is torch.nn.Module.forward


@dataclass
class _Entry:
    """A float64 copy of one tensor and how many holders have it now."""

    original: Any
    copy: Any
    holders: int = 0


@dataclass
class Stats:
    """What a streamer held: float64 bytes at once (``peak_bytes``, ``held_bytes`` now), hook calls, runs repeated."""

    held_bytes: int = 0
    peak_bytes: int = 0
    entries: int = 0
    retries: int = 0
    coarsened: list[str] = field(default_factory=list)


class Streamer:
    """Units of ``module`` (see the module docstring) and the hooks that cast them while a ``streaming()`` block
    runs. ``budget``: a unit's float32 bytes at most (default: the largest of ``MIN_UNIT`` and a sixteenth of the
    model's floating bytes)."""

    def __init__(self, torch, module, budget: int | None = None, dtype=None):
        self.torch = torch
        self.module = module
        self.dtype = dtype if dtype is not None else torch.float64
        self.total_bytes = torch_weight_bytes(module)
        self.budget = budget if budget is not None else max(MIN_UNIT, self.total_bytes // 16)
        self.names = {id(m): name for name, m in module.named_modules(remove_duplicate=False)}
        self._weight_names: dict[int, str] = {}
        for name, tensor in (*module.named_parameters(remove_duplicate=False), *module.named_buffers()):
            self._weight_names.setdefault(id(tensor), name)
        self.stats = Stats()
        self.casting_whole = False  # inside ``cast_whole``: no hooks needed
        self.reason: str | None = None  # why units were made coarser, where they were
        self._units: set[int] = set()
        self._live: dict[int, _Entry] = {}
        self._depth: dict[int, int] = {}
        self._saved: dict[int, list] = {}
        self._stack: list = []
        self._failed_in: list | None = None
        self._outside: str | None = None  # what the guard refused in this run (kept: a model may catch the error)
        self._hooking = False  # inside ``_enter`` / ``_exit``: their reads of the originals are the casts
        self.plan()

    # ---- the plan ----------------------------------------------------------------------------------------------

    def plan(self) -> None:
        """``units`` and ``splits`` (``[(path, module)]``) from the root down; the units in ``_units`` stay units."""
        self.units: list = []
        self.splits: list = []
        self._own: dict[int, list] = {}  # split module -> the slots it holds for its whole call
        self._walk(self.module)

    def _walk(self, module) -> None:
        torch = self.torch
        children = list(module.children())
        if id(module) in self._units or not children or torch_weight_bytes(module) <= self.budget:
            self.units.append((self.names.get(id(module), "?"), module))
            self._own[id(module)] = _slots(module.modules())
            return
        self.splits.append((self.names.get(id(module), "?"), module))
        held, callees = [module], []
        pending = children
        while pending:  # holders' parts are called by this module: planned as its children
            child = pending.pop(0)
            if _holder(torch, child):
                held.append(child)
                pending = list(child.children()) + pending
            else:
                callees.append(child)
        slots = _slots(held)
        first = next((p for p in module.parameters() if p.is_floating_point()), None)
        if first is not None and not any(_get(s) is first for s in slots):
            slots += next(([s] for s in _slots(module.modules()) if _get(s) is first), [])
        self._own[id(module)] = slots
        for child in callees:
            if id(child) not in self._own:  # a submodule reached twice is planned once
                self._walk(child)

    def unit_bytes(self) -> int:
        """The float32 bytes of the largest unit."""
        return max((torch_weight_bytes(m) for _, m in self.units), default=0)

    def pinned_bytes(self) -> int:
        """The float32 bytes the split modules hold for their calls (each floating tensor once)."""
        held = (_get(s) for m in self.splits for s in self._own[id(m[1])])
        seen = {id(t): 4 * t.numel() for t in held if t is not None and t.is_floating_point()}
        return sum(seen.values())

    @property
    def whole(self) -> bool:
        """The root is one unit: the whole model is cast for each call."""
        return id(self.module) in {id(m) for _, m in self.units}

    # ---- casting -----------------------------------------------------------------------------------------------

    def _enter(self, module, *_args, **_kwargs):
        self._hooking = True
        try:
            self._cast(module)
        finally:
            self._hooking = False

    def _cast(self, module) -> None:
        key = id(module)
        self._stack.append(module)
        self._depth[key] = self._depth.get(key, 0) + 1
        if self._depth[key] > 1:
            return
        stats, saved = self.stats, []
        stats.entries += 1
        for slot in self._own[key]:
            original = _get(slot)
            if original is None or not original.is_floating_point() or original.dtype == self.dtype:
                continue
            entry = self._live.get(id(original))
            if entry is None:
                entry = self._live[id(original)] = _Entry(original, original.detach().to(self.dtype))
                stats.held_bytes += entry.copy.nbytes
            entry.holders += 1
            _set(slot, entry.copy)
            saved.append((slot, entry))
        stats.peak_bytes = max(stats.peak_bytes, stats.held_bytes)
        self._saved[key] = saved

    def _exit(self, module, *_args, **_kwargs):
        key = id(module)
        if self._failed_in is None and sys.exc_info()[0] is not None:
            self._failed_in = list(self._stack)  # the modules running where the exception was raised
        if self._stack and self._stack[-1] is module:
            self._stack.pop()
        self._depth[key] = self._depth.get(key, 1) - 1
        if self._depth[key] > 0:
            return
        for slot, entry in self._saved.pop(key, []):
            if _get(slot) is entry.copy:  # else the module assigned a new tensor itself: it keeps it
                _set(slot, entry.original)
            entry.holders -= 1
            if entry.holders == 0:
                del self._live[id(entry.original)]
                self.stats.held_bytes -= entry.copy.nbytes

    def _restore(self) -> None:
        """Every slot back to its float32 tensor (after an exception that skipped a hook)."""
        for key in list(self._saved):
            for slot, entry in self._saved.pop(key):
                if _get(slot) is entry.copy:
                    _set(slot, entry.original)
        self._live.clear()
        self._depth.clear()
        self._stack.clear()
        self.stats.held_bytes = 0

    @contextmanager
    def streaming(self):
        """Hooks on every unit and split module for the block; everything back in float32 after, exception or not."""
        torch, handles, splits = self.torch, [], {id(m) for _, m in self.splits}
        for _, m in (*self.splits, *self.units):
            if id(m) not in splits and not self._own[id(m)]:  # a unit holding nothing (an activation) needs none
                continue
            handles.append(m.register_forward_pre_hook(self._enter, prepend=True))
            handles.append(m.register_forward_hook(self._exit, always_call=True))
        self._failed_in = self._outside = None
        try:
            with _guard(torch, self):
                yield self
        finally:
            for handle in handles:
                handle.remove()
            self._restore()

    def run(self, forward):
        """``forward()`` streamed; a dtype error in a split module's call makes that module one unit and runs it
        again, until the run passes or the root is one unit (then its error is raised)."""
        while True:
            try:
                with self.streaming():
                    result = forward()
                    if self._outside is not None:  # the model caught the guard's error itself: its result is not used
                        raise OutsideRead(self._outside)
                return result
            except Exception as error:  # the model's own failure is raised again, unless coarsening helps
                if not self.coarsen(error):
                    raise

    def coarsen(self, error: Exception) -> bool:
        """After ``error`` in a streamed run: make the innermost split module that was running one unit and say
        why (``reason``); False where that cannot help (not a dtype error, or the failure was not under a split)."""
        split_ids = {id(m) for _, m in self.splits}
        running = [m for m in self._failed_in or [] if id(m) in split_ids]
        if not running or not (isinstance(error, OutsideRead) or _DTYPE_ERROR.search(str(error))):
            return False
        scope = running[-1]
        path = self.names.get(id(scope), "?") or "the whole model"
        self._units.add(id(scope))
        self.plan()
        self.stats.retries += 1
        self.stats.coarsened.append(path)
        said = one_line(f"{type(error).__name__}: {error}", 200)
        where = "the whole model" if path == "the whole model" else f"module {path!r}"
        self.reason = f"{where} cast to float64 as one unit: a streamed run read a weight outside its module ({said})"
        return True

    def refuse(self, func, tensor) -> None:
        """The guard's verdict on an operation ``func`` reading the float32 original ``tensor``: an ``OutsideRead``
        (the innermost modules running are where ``coarsen`` looks)."""
        name = getattr(func, "__name__", "") or str(func)
        if name == "__get__":  # a property: the descriptor's own name
            name = getattr(getattr(func, "__self__", None), "__name__", name)
        if self._hooking or name in _SHAPE_ONLY:
            return
        path = self._weight_names.get(id(tensor)) or "a view of a weight"
        held, whole = (str(d).removeprefix("torch.") for d in (tensor.dtype, self.dtype))
        said = f"{name} read the {held} weight {path!r} outside its module's call (in the whole model: {whole})"
        if self._outside is None:
            self._outside, self._failed_in = said, list(self._stack)
        raise OutsideRead(said)

    @contextmanager
    def cast_whole(self):
        """Every floating parameter and buffer in float64 for the block (parameters as parameters, trainable as
        they were: gradients flow to them), each tied tensor one copy; all back as they were after."""
        torch, copies, saved = self.torch, {}, []
        self.casting_whole = True
        try:
            for slot in _slots(self.module.modules()):
                original = _get(slot)
                if original is None or not original.is_floating_point() or original.dtype == self.dtype:
                    continue
                if id(original) not in copies:
                    value = original.detach().to(self.dtype)
                    if isinstance(original, torch.nn.Parameter):
                        value = torch.nn.Parameter(value, requires_grad=original.requires_grad)
                    copies[id(original)] = value
                saved.append((slot, original))
                _set(slot, copies[id(original)])
            yield
        finally:
            self.casting_whole = False
            for slot, original in saved:
                _set(slot, original)


def _guard(torch, streamer):
    """A ``TorchFunctionMode`` handing ``streamer.refuse`` every operation whose tensor arguments (a list's too)
    include a floating original of the model not in ``streamer.dtype``, or a tensor on one's storage."""
    originals = [_get(s) for s in _slots(streamer.module.modules())]
    originals = [t for t in originals if t is not None and t.is_floating_point() and t.dtype != streamer.dtype]
    ids, dtypes = {id(t) for t in originals}, {t.dtype for t in originals}
    storages = {_storage(t) for t in originals} - {0}
    tensor_type = torch.Tensor

    def check(func, value) -> None:
        if (
            isinstance(value, tensor_type)
            and value.dtype in dtypes
            and (id(value) in ids or _storage(value) in storages)
        ):
            streamer.refuse(func, value)

    class Guard(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            for value in (*args, *kwargs.values()):
                if isinstance(value, list | tuple):
                    for item in value:
                        check(func, item)
                else:
                    check(func, value)
            return func(*args, **kwargs)

    return Guard()


def _storage(tensor) -> int:
    """The address of a tensor's storage (0 for one without: sparse, empty)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def _slots(modules) -> list:
    """``(module, "_parameters" | "_buffers", name)`` for every parameter and buffer each module holds directly."""
    slots: list = []
    seen: set[int] = set()
    for m in modules:
        if id(m) in seen:
            continue
        seen.add(id(m))
        for kind in ("_parameters", "_buffers"):
            slots.extend((m, kind, name) for name, value in getattr(m, kind).items() if value is not None)
    return slots


def _get(slot):
    module, kind, name = slot
    return getattr(module, kind).get(name)


def _set(slot, value) -> None:
    module, kind, name = slot
    getattr(module, kind)[name] = value
