"""A ``flax.nnx`` model's own tree, one level at a time (``parity.diagnose.tree.jax_tree`` reads linen and named scopes
and hands an nnx model here).

An nnx model is a graph of Python objects that the user's function may build inside itself (``nnx.merge`` of a
graphdef and the weights), so its modules cannot be hooked before it runs. While the function is traced, the
``__call__`` of every ``nnx.Module`` class that defines one is wrapped (those it defines as it runs too; restored
afterwards); the first module
called is the root, and its graph (``nnx.iter_graph``) names every module it holds by its path, the graph's keys
joined with ``/`` as the weights are (``blocks/0/norm``: a list's index is a path component). A module outside the
root's graph is part of the call that reaches it. The children of a scope, their values and inputs, and a module
called more than once (a shared one, compared at its first call) follow the linen reader's rules; a child is typed by
the layer catalogue (``parity.model.layer_types_flax.nnx_layer``, ``nnx_core_layer``). Imports jax and flax inside.
"""

from __future__ import annotations

import contextlib
import functools

from parity.diagnose.tree.jax_calls import SEPARATOR, calls_recorder, kept_values


def _module_classes(base) -> list[type]:
    """``base`` and its subclasses, loaded so far, that define their own ``__call__``."""
    found, pending = [], [base]
    while pending:
        cls = pending.pop()
        if "__call__" in cls.__dict__:
            found.append(cls)
        pending.extend(sub for sub in cls.__subclasses__() if sub not in found and sub not in pending)
    return list(dict.fromkeys(found))


@contextlib.contextmanager
def _wrapped(base: type, around):
    """The own ``__call__`` of ``base`` and of each of its subclasses, those loaded and those defined while inside
    (a function that defines its model's classes as it runs), replaced by ``around(original)``; restored however it
    ends."""
    originals = {cls: cls.__dict__["__call__"] for cls in _module_classes(base)}
    own_hook = base.__dict__.get("__init_subclass__")

    def hook(cls, **kwargs):
        if own_hook is None:
            super(base, cls).__init_subclass__(**kwargs)
        else:
            own_hook.__func__(cls, **kwargs)
        if "__call__" in cls.__dict__:
            originals[cls] = cls.__dict__["__call__"]
            cls.__call__ = around(originals[cls])

    try:
        for cls, original in list(originals.items()):
            cls.__call__ = around(original)  # type: ignore[method-assign]
        base.__init_subclass__ = classmethod(hook)  # type: ignore[assignment,method-assign]
        yield
    finally:
        if own_hook is None:
            del base.__init_subclass__
        else:
            base.__init_subclass__ = own_hook  # type: ignore[method-assign]
        for cls, original in originals.items():
            cls.__call__ = original  # type: ignore[method-assign]


def typer(module):
    from parity.model.layer_types_flax import nnx_core_layer, nnx_layer

    return nnx_layer(module) or nnx_core_layer(module)


def traced(runner, record: dict, scope: str | None, names):
    """The function's trace with every nnx module's call recorded (``traced(params, x) -> (outputs, values,
    inputs)``, filling ``record``; ``scope`` None: every module), or None where flax.nnx is absent;
    ``parity.diagnose.tree.jax_tree.Levels`` builds the levels from it."""
    try:
        from flax import nnx
    except ImportError:
        return None
    from parity.sources.jax import forward_outputs

    jax, spec = runner.jax, runner.spec

    def function(params, x):
        values: dict = {}
        inputs: dict = {}
        record.update(order=[], calls={}, modules={}, single={})
        call = calls_recorder(jax, record, values, inputs)
        paths: dict[int, str] = {}

        def around(original):
            @functools.wraps(original)
            def wrapper(self, *args, **kwargs):
                if not paths:  # the first module called is the root: its graph names every module it holds
                    for key, node in nnx.iter_graph(self):
                        if isinstance(node, nnx.Module):
                            paths.setdefault(id(node), SEPARATOR.join(str(k) for k in key))
                return call(paths.get(id(self)), self, functools.partial(original, self), args, kwargs)

            return wrapper

        with _wrapped(nnx.Module, around):
            outputs = forward_outputs(spec, spec.jax_apply(params, x, None))
        return (outputs, *kept_values(jax, record, values, inputs, scope, names, x))

    return function
