"""What the Flax readers of a JAX model's tree share (``parity.diagnose.tree.jax_tree`` for linen and named scopes,
``parity.diagnose.tree.nnx_tree`` for nnx): the children of a scope, one module call recorded (its value, its input,
how often it is called) and the level built from the calls one traced run recorded. Imports jax inside.
"""

from __future__ import annotations

import numpy as np

SEPARATOR = "/"


def _host(value) -> np.ndarray:
    array = np.asarray(value)
    return array.astype(np.float32) if array.dtype.name in ("float16", "bfloat16") else array


def _floating(jax, value) -> bool:
    return isinstance(value, jax.Array) and jax.numpy.issubdtype(value.dtype, jax.numpy.floating)


def _children(called: list[str], scope: str) -> list[str]:
    """The paths of ``called`` one level under ``scope``, and in place of one never called, its called descendants
    nearest to it (call order kept)."""
    head = f"{scope}{SEPARATOR}" if scope else ""
    under = [p for p in called if p and p.startswith(head) and p != scope]
    return [p for p in under if not any(p.startswith(q + SEPARATOR) for q in under if q != p)]


def _first_array(jax, tree):
    for leaf in jax.tree_util.tree_leaves(tree):
        if isinstance(leaf, jax.Array):
            return leaf
    return None


def _first_computed(jax, returned, given):
    """The first floating array of what a call ``returned`` that is not one of the arrays it was ``given``, passed
    through (a pyramid's coarsest level, returned as it came in), or None."""
    passed = {id(leaf) for leaf in jax.tree_util.tree_leaves(given)}
    for leaf in jax.tree_util.tree_leaves(returned):
        if _floating(jax, leaf) and id(leaf) not in passed:
            return leaf
    return None


def calls_recorder(jax, record: dict, values: dict, inputs: dict):
    """``call(path, module, next_fun, args, kwargs)``: runs one call of the module at ``path`` and records it in
    ``record`` (``order``, ``calls``, ``modules``, ``single``) and, at its first call, its value and input (the
    Flax and nnx readers share it). ``path`` None: a call inside a call of the same module, part of that call."""
    active: list[str] = []

    def call(path, module, next_fun, args, kwargs):
        if path is None or path in active:
            return next_fun(*args, **kwargs)
        calls = record["calls"][path] = record["calls"].get(path, 0) + 1
        if calls == 1:
            record["order"].append(path)
            record["modules"][path] = module
            fed_array = _first_array(jax, (args, kwargs))
            if fed_array is not None:
                inputs[path] = fed_array
            record["single"][path] = (
                len(args) == 1
                and isinstance(args[0], jax.Array)
                and all(v is None or isinstance(v, bool) for v in kwargs.values())
            )
        active.append(path)
        try:
            returned = next_fun(*args, **kwargs)
        finally:
            active.pop()
        if calls == 1:
            first = _first_computed(jax, returned, (args, kwargs))
            if first is not None:
                values[path] = first
        return returned

    return call


def run_traced(runner, function, *args):
    """``function(*args)`` as the side ``runner`` computes it: under ``jax.jit`` (a ``parity.sources.jax.JaxSource``),
    or converted and run by the path's own converter and runtime where the side has its own ``run_traced``
    (``parity.diagnose.tree.jax_tf_tree``)."""
    own = getattr(runner, "run_traced", None)
    return own(function, *args) if own is not None else runner.jax.jit(function)(*args)


def observed(runner, record: dict, traced, fed, typer) -> dict | None:
    """Run ``traced`` (``(params, x) -> (outputs, values, inputs)``, filling ``record``) on ``runner``'s weights
    (``run_traced``) and build the level from what it recorded: None where no module below the root was called.
    ``typer(module)``: ``(kind, attrs)`` or None."""
    spec = runner.spec
    outputs, values, inputs = run_traced(runner, traced, runner.params, fed)
    if not any(record["order"]):
        return None
    children = []
    for path in record["kept"]:
        if path not in record["calls"]:
            continue
        module, single = record["modules"][path], record["single"][path]
        typed = typer(module) if single else None
        leaf = not any(p.startswith(path + SEPARATOR) for p in record["calls"])
        children.append(
            {
                "path": path,
                "class": f"{type(module).__module__}.{type(module).__qualname__}",
                "calls": record["calls"][path],
                "leaf": leaf,
                "kind": typed[0] if typed else None,
                "attrs": typed[1] if typed else None,
                "single_input": single,
                "has_value": path in values,
            }
        )
    return {
        "children": children,
        "values": {p: _host(v) for p, v in values.items()},
        "inputs": {p: _host(v) for p, v in inputs.items()},
        "outputs": {n: _host(v) for n, v in zip(spec.outputs, outputs)},
    }


def kept_values(jax, record: dict, values: dict, inputs: dict, scope: str, names, x) -> tuple[dict, dict]:
    """The values and inputs of the level's paths (``names``, else the children of ``scope``; ``scope`` None: every
    module called), set as
    ``record["kept"]``: those of this trace only (a value computed inside a lifted transform, ``nn.scan``,
    ``nnx.scan``, belongs to an inner trace and cannot leave it)."""
    trace = getattr(jax.tree_util.tree_leaves(x)[0], "_trace", None)
    if names is not None:
        kept = list(names)
    else:
        kept = [p for p in record["order"] if p] if scope is None else _children(record["order"], scope)
    record["kept"] = kept

    def ours(value):
        return trace is None or getattr(value, "_trace", trace) is trace

    return (
        {p: values[p] for p in kept if p in values and ours(values[p])},
        {p: inputs[p] for p in kept if p in inputs and ours(inputs[p])},
    )
