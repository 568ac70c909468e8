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
(``parity.diagnose.tree_jax_tf``). Imports jax (and flax) inside.
"""

from __future__ import annotations

from typing import Any

from parity.diagnose.tree_jax_calls import (
    SEPARATOR,
    _children,
    _host,
    calls_recorder,
    kept_values,
    observed,
    run_traced,
)


def level_of(runner, x: dict, scope: str, names: list[str] | None = None) -> dict:
    """``level`` of a ``parity.sources.jax.JaxSource`` on the feeds ``x``: ``{"children": [...], "values": {path:
    array}, "inputs": {path: array}, "outputs": {name: array}}`` as ``parity.diagnose.tree_torch.level`` returns
    them. ``names`` given: exactly those paths are observed; else the children of ``scope`` (``''``: the root)."""
    from parity.diagnose import tree_nnx

    fed = runner._input(runner.check_feed(x))
    seen = _flax(runner, fed, scope, names)
    if seen is None:
        seen = tree_nnx.level(runner, fed, scope, names)
    if seen is None:
        seen = _named_scopes(runner, fed, scope, names)
    return seen


def _flax(runner, fed, scope: str, names) -> dict | None:
    """The level from Flax's module calls; None where the function calls no Flax module (or Flax is absent)."""
    try:
        import flax.linen as nn
    except ImportError:
        return None
    from parity.model.layer_types_flax import flax_layer
    from parity.sources.jax import forward_outputs

    jax, spec = runner.jax, runner.spec
    record: dict[str, Any] = {"order": [], "calls": {}, "modules": {}, "single": {}, "kept": []}

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

    return observed(runner, record, traced, fed, flax_layer)


def _scope_of(eqn) -> tuple[str, ...]:
    """The ``jax.named_scope`` names an equation was traced under, outermost first (transforms such as ``jvp``
    left out: JAX's name stack holds ``Scope`` and ``Transform`` entries)."""
    stack = getattr(eqn.source_info.name_stack, "stack", ())
    return tuple(str(e.name) for e in stack if type(e).__name__ == "Scope")


def _named_scopes(runner, fed, scope: str, names) -> dict:
    """The level from the named scopes of the function's jaxpr."""
    from jax.extend import core

    from parity.sources.jax import forward_outputs

    jax, spec = runner.jax, runner.spec
    closed = jax.make_jaxpr(lambda p, x: forward_outputs(spec, spec.jax_apply(p, x, None)))(runner.params, fed)
    jaxpr = closed.jaxpr
    weights = len(jax.tree_util.tree_leaves(runner.params))
    data = set(jaxpr.invars[weights:])  # values that depend on the model's input
    scopes = []
    for eqn in jaxpr.eqns:
        scopes.append(SEPARATOR.join(_scope_of(eqn)))
        if any(isinstance(v, core.Var) and v in data for v in eqn.invars):
            data.update(eqn.outvars)
    runs: dict[str, list[list[int]]] = {}  # scope path -> its runs of consecutive equations
    order = []
    for index, path in enumerate(scopes):
        parts = path.split(SEPARATOR) if path else []
        for depth in range(1, len(parts) + 1):
            prefix = SEPARATOR.join(parts[:depth])
            if prefix not in runs:
                runs[prefix] = []
                order.append(prefix)
            spans = runs[prefix]
            if spans and spans[-1][-1] == index - 1:
                spans[-1].append(index)
            else:
                spans.append([index])
    kept = list(names) if names is not None else _children(order, scope)
    wanted, inputs_of = {}, {}
    for path in kept:
        if path not in runs:
            continue
        first = runs[path][0]
        inside = {v for i in first for v in jaxpr.eqns[i].outvars}
        read_after = {v for eqn in jaxpr.eqns[first[-1] + 1 :] for v in eqn.invars if isinstance(v, core.Var)}
        read_after.update(v for v in jaxpr.outvars if isinstance(v, core.Var))
        boundary = [
            v
            for i in first
            for v in jaxpr.eqns[i].outvars
            if v in read_after and v in data and jax.numpy.issubdtype(v.aval.dtype, jax.numpy.floating)
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
    extra = [*wanted.values(), *inputs_of.values()]
    function = core.jaxpr_as_fun(core.ClosedJaxpr(jaxpr.replace(outvars=[*jaxpr.outvars, *extra]), closed.consts))
    returned = run_traced(runner, function, *jax.tree_util.tree_leaves((runner.params, fed)))
    outputs, found = returned[: len(jaxpr.outvars)], dict(zip(map(id, extra), returned[len(jaxpr.outvars) :]))
    children = [
        {
            "path": path,
            "class": "jax.named_scope",
            "calls": len(runs[path]),
            "leaf": not any(p.startswith(path + SEPARATOR) for p in runs),
            "kind": None,
            "attrs": None,
            "single_input": False,
            "has_value": path in wanted,
        }
        for path in kept
        if path in runs
    ]
    return {
        "children": children,
        "values": {p: _host(found[id(v)]) for p, v in wanted.items()},
        "inputs": {p: _host(found[id(v)]) for p, v in inputs_of.items()},
        "outputs": {n: _host(v) for n, v in zip(spec.outputs, outputs)},
    }
