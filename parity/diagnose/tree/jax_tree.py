"""A JAX model's own tree, one level at a time: the Flax modules (else the ``jax.named_scope`` scopes) a scope
calls, in call order, and their values.

Flax (``flax.linen``): the user's function runs under ``flax.linen.intercept_methods``, which sees every call of a
module's methods however the function calls ``apply``; a module's path is its scope path joined with ``/``
(``blocks_3/norm``, the names its parameters nest under). The children of a scope are the modules one level deeper
that are called, and through any that is never called itself, its called descendants. A child's value is the first
floating array of what its first call returns and its input the first array that call reads (a call of a method
of the module from inside another of its own is part of that call); a module called more than once is compared at
its first call. Under ``jax.jit`` the values are tracers returned out of the traced function; a value computed
inside a lifted transform (``nn.scan``, ``nn.remat``, ``nn.vmap``) belongs to an inner trace and is left out
(the module has no value). A child is typed by the layer catalogue (``parity.model.layer_types_flax.flax_layer``) where
its class is one the catalogue computes and it read one array alone.

A plain JAX function: the scopes of ``jax.named_scope`` as each equation of its jaxpr records them. A scope's value
is the last of its equations' results that an equation outside it (or the function's output) reads, its input the
first value it reads from outside that depends on the model's input, not on the weights alone; a scope entered
more than once under one name is split into its runs of consecutive equations and compared at the first. Scopes
entered inside a nested ``jax.jit`` are not seen (that call is one equation of the scope around it). Named scopes
are untyped. On ``jax/tf`` these functions run converted by jax2tf, on TensorFlow
(``parity.diagnose.tree.jax_tf_tree``).

A descent reads one side through ``Levels``: the reader that applies is found once, by tracing the function
(``jax.eval_shape``, ``jax.make_jaxpr``: nothing compiled), and one run of it returns every module's value and input
at all depths, from which each level is served; past ``TAP_BYTES`` of values, each level is read by a run of its
own. Imports jax (and flax) inside.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from parity.diagnose.tree.jax_calls import (
    SEPARATOR,
    _children,
    _host,
    calls_recorder,
    kept_values,
    observed,
    run_traced,
)
from parity.diagnose.tree.walk import TAP_BYTES


class Levels:
    """A JAX model's tree on one side (a ``parity.sources.jax.JaxSource``, or a side with its own ``run_traced``):
    the reader that applies (linen, nnx, else named scopes) found once by tracing the function, and every module's
    value and input at all depths computed by one run of it (one compile), each level then served from that run.
    Where the whole tree's values and inputs would take more than ``TAP_BYTES``, or ``per_level`` is called, each
    level is read by a run of its own, returning only its values."""

    def __init__(self, runner, x: dict):
        self.runner = runner
        self.fed = runner._input(runner.check_feed(x))
        self.read, whole_run, tap_bytes = _reader(runner, self.fed)
        self.order: list[str] = []
        self.whole: dict | None = None
        if tap_bytes <= TAP_BYTES:
            self.whole, self.order = whole_run()

    def per_level(self) -> None:
        """From now on each level is read by a run of its own (the whole tree's run is not trusted)."""
        self.whole = None

    def level(self, scope: str, names: list[str] | None = None) -> dict:
        """``level_of``'s result for ``scope`` (or exactly ``names``)."""
        if self.whole is None:
            return self.read(scope, names)
        kept = list(names) if names is not None else _children(self.order, scope)
        whole = self.whole
        by_path = {child["path"]: child for child in whole["children"]}
        return {
            "children": [by_path[p] for p in kept if p in by_path],
            "values": {p: whole["values"][p] for p in kept if p in whole["values"]},
            "inputs": {p: whole["inputs"][p] for p in kept if p in whole["inputs"]},
            "outputs": whole["outputs"],
        }


def level_of(runner, x: dict, scope: str, names: list[str] | None = None) -> dict:
    """``level`` of a ``parity.sources.jax.JaxSource`` on the feeds ``x``: ``{"children": [...], "values": {path:
    array}, "inputs": {path: array}, "outputs": {name: array}}`` as ``parity.diagnose.tree.torch_tree.level`` returns
    them. ``names`` given: exactly those paths are observed; else the children of ``scope`` (``''``: the root).
    A descent reads every level of one side from one ``Levels``."""
    return Levels(runner, x).level(scope, names)


def _reader(runner, fed):
    """``(read, whole, tap_bytes)`` of the reader that applies to the function, found by tracing it (no compile):
    ``read(scope, names)`` one level by a run of its own, ``whole()`` every module's level and the call order by
    one run, ``tap_bytes`` what that run's values and inputs take."""
    from parity.diagnose.tree import nnx_tree

    jax = runner.jax
    for make, typer in ((_linen, _linen_typer), (nnx_tree.traced, nnx_tree.typer)):
        record = _record()
        traced = make(runner, record, None, None)
        if traced is None:  # the framework is absent
            continue
        _, values, inputs = jax.eval_shape(traced, runner.params, fed)
        if not any(record["order"]):
            continue

        def read(scope, names, make=make, typer=typer):
            own = _record()
            return observed(runner, own, make(runner, own, scope, names), fed, typer)

        def whole(make=make, typer=typer):
            own = _record()
            return observed(runner, own, make(runner, own, None, None), fed, typer), list(own["order"])

        return read, whole, _bytes(jax, (values, inputs))
    table = _ScopeTable(runner, fed)
    return (
        lambda scope, names: table.level(list(names) if names is not None else _children(table.order, scope)),
        lambda: (table.level(table.order), table.order),
        table.tap_bytes(),
    )


def _bytes(jax, tree) -> int:
    return sum(int(leaf.size) * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(tree))


def _record() -> dict[str, Any]:
    return {"order": [], "calls": {}, "modules": {}, "single": {}, "kept": []}


def _linen_typer(module):
    from parity.model.layer_types_flax import flax_layer

    return flax_layer(module)


def _linen(runner, record: dict, scope: str | None, names):
    """The function's trace under Flax's module interception (``traced(params, x) -> (outputs, values, inputs)``,
    filling ``record``; ``scope`` None: every module), or None where Flax is absent."""
    try:
        import flax.linen as nn
    except ImportError:
        return None
    from parity.sources.jax import forward_outputs

    jax, spec = runner.jax, runner.spec

    def traced(params, x):
        values: dict = {}
        inputs: dict = {}
        record.update(order=[], calls={}, modules={}, single={})
        call = calls_recorder(jax, record, values, inputs)

        def interceptor(next_fun, args, kwargs, context):
            module = context.module
            path = SEPARATOR.join(str(part) for part in (module.path if module.scope is not None else ()))
            # ``setup`` (and a method of the module called from inside another of its own) is part of the call
            return call(None if context.method_name == "setup" else path, module, next_fun, args, kwargs)

        with nn.intercept_methods(interceptor):
            outputs = forward_outputs(spec, spec.jax_apply(params, x, None))
        return (outputs, *kept_values(jax, record, values, inputs, scope, names, x))

    return traced


def _scope_of(eqn) -> tuple[str, ...]:
    """The ``jax.named_scope`` names an equation was traced under, outermost first (transforms such as ``jvp``
    left out: JAX's name stack holds ``Scope`` and ``Transform`` entries)."""
    stack = getattr(eqn.source_info.name_stack, "stack", ())
    return tuple(str(e.name) for e in stack if type(e).__name__ == "Scope")


class _ScopeTable:
    """The named scopes of the function's jaxpr, traced once: their runs of equations in call order, and a level's
    values read by one run of the jaxpr with them as extra outputs."""

    def __init__(self, runner, fed):
        from jax.extend import core

        from parity.sources.jax import forward_outputs

        self.runner, self.fed, self.core = runner, fed, core
        jax, spec = runner.jax, runner.spec
        self.closed = jax.make_jaxpr(lambda p, x: forward_outputs(spec, spec.jax_apply(p, x, None)))(runner.params, fed)
        jaxpr = self.jaxpr = self.closed.jaxpr
        weights = len(jax.tree_util.tree_leaves(runner.params))
        self.data = set(jaxpr.invars[weights:])  # values that depend on the model's input
        scopes = []
        for eqn in jaxpr.eqns:
            scopes.append(SEPARATOR.join(_scope_of(eqn)))
            if any(isinstance(v, core.Var) and v in self.data for v in eqn.invars):
                self.data.update(eqn.outvars)
        self.runs: dict[str, list[list[int]]] = {}  # scope path -> its runs of consecutive equations
        self.order: list[str] = []
        for index, path in enumerate(scopes):
            parts = path.split(SEPARATOR) if path else []
            for depth in range(1, len(parts) + 1):
                prefix = SEPARATOR.join(parts[:depth])
                if prefix not in self.runs:
                    self.runs[prefix] = []
                    self.order.append(prefix)
                spans = self.runs[prefix]
                if spans and spans[-1][-1] == index - 1:
                    spans[-1].append(index)
                else:
                    spans.append([index])

    def _boundaries(self, kept: list[str]) -> tuple[dict, dict]:
        """Each scope's value (the last result of its first run read after it) and input variables."""
        core, jaxpr, data, jnp = self.core, self.jaxpr, self.data, self.runner.jax.numpy
        wanted, inputs_of = {}, {}
        for path in kept:
            if path not in self.runs:
                continue
            first = self.runs[path][0]
            inside = {v for i in first for v in jaxpr.eqns[i].outvars}
            read_after = {v for eqn in jaxpr.eqns[first[-1] + 1 :] for v in eqn.invars if isinstance(v, core.Var)}
            read_after.update(v for v in jaxpr.outvars if isinstance(v, core.Var))
            boundary = [
                v
                for i in first
                for v in jaxpr.eqns[i].outvars
                if v in read_after and v in data and jnp.issubdtype(v.aval.dtype, jnp.floating)
            ]
            if boundary:
                wanted[path] = boundary[-1]
            fed_var = next(
                (
                    v
                    for i in first
                    for v in jaxpr.eqns[i].invars
                    if isinstance(v, core.Var) and v not in inside and v in data
                ),
                None,
            )
            if fed_var is not None:
                inputs_of[path] = fed_var
        return wanted, inputs_of

    def tap_bytes(self) -> int:
        wanted, inputs_of = self._boundaries(self.order)
        return sum(
            int(np.prod(v.aval.shape)) * np.dtype(v.aval.dtype).itemsize
            for v in (*wanted.values(), *inputs_of.values())
        )

    def level(self, kept: list[str]) -> dict:
        """The level of the scope paths ``kept``, read by one run."""
        core, jaxpr, runner = self.core, self.jaxpr, self.runner
        jax, spec = runner.jax, runner.spec
        wanted, inputs_of = self._boundaries(kept)
        extra = [*wanted.values(), *inputs_of.values()]
        function = core.jaxpr_as_fun(
            core.ClosedJaxpr(jaxpr.replace(outvars=[*jaxpr.outvars, *extra]), self.closed.consts)
        )
        returned = run_traced(runner, function, *jax.tree_util.tree_leaves((runner.params, self.fed)))
        outputs, found = returned[: len(jaxpr.outvars)], dict(zip(map(id, extra), returned[len(jaxpr.outvars) :]))
        children = [
            {
                "path": path,
                "class": "jax.named_scope",
                "calls": len(self.runs[path]),
                "leaf": not any(p.startswith(path + SEPARATOR) for p in self.runs),
                "kind": None,
                "attrs": None,
                "single_input": False,
                "has_value": path in wanted,
            }
            for path in kept
            if path in self.runs
        ]
        return {
            "children": children,
            "values": {p: _host(found[id(v)]) for p, v in wanted.items()},
            "inputs": {p: _host(found[id(v)]) for p, v in inputs_of.items()},
            "outputs": {n: _host(v) for n, v in zip(spec.outputs, outputs)},
        }
