"""A Keras model's own layer tree, one level at a time: the layers a scope calls, in call order, and their values.

A scope is a layer path, layer names joined by ``/`` (``encoder/norm``; ``''``: the model). Its children are the
layers it holds: a functional or ``Sequential`` (sub-)model's ``layers`` (its ``InputLayer`` left out), a custom
layer's tracked sub-layers (``self.fc = Dense(...)``, lists of layers too), in the order the scope calls them; a layer
it holds but never calls is left out, and operations that are no layer (``keras.ops`` between layers) are the scope's
own. Values are read by wrapping ``call`` of each child for one run of the model under ``tf.function``, as the
native ``tf`` path runs it (eagerly where a value cannot leave the traced function, e.g. inside a loop); the
reference side (``eager``: the model in the golden's dtype, whose taps the golden build reads eagerly too) runs
eagerly, with no function traced again at each level; on a runner
that compiles with XLA (``jit_compile``: ``tf/xla``) inside one XLA-compiled function returning them as extra
outputs, trusted only where its outputs are the path's own compiled forward's (``_xla``): a child's
value is the first tensor its first call returns, its input the first tensor that call reads, both in the canonical
layout (``KerasSource.taps_impl``'s conversion); a layer called more than once (shared) is compared at its first
call. A child is typed by the layer catalogue (``keras_layer``) where it read one tensor alone, and carries
``params``: the prefix of its weights' variable paths (a functional sub-model's layers own theirs without the
sub-model's name: ``norm/gamma`` for ``encoder/norm``). A descent reads one side through ``Levels``: every layer at
all depths wrapped for one run (one XLA compilation on ``tf/xla``), each level served from it. Imports keras and
tensorflow inside.
"""

from __future__ import annotations

import numpy as np

from parity.diagnose.tree.walk import TAP_BYTES
from parity.model import layouts

_UNSET = object()


def _children(keras, layer) -> list:
    """The layers ``layer`` holds, in the order it holds them (``InputLayer`` left out)."""
    held = (
        layer.layers if isinstance(layer, keras.Model) else layer._flatten_layers(include_self=False, recursive=False)
    )
    return [child for child in held if not isinstance(child, keras.layers.InputLayer)]


def resolve(keras, model, path: str):
    """The layer at ``path`` under ``model`` (``''``: the model itself), or None where no layer has that path."""
    layer = model
    for part in filter(None, path.split("/")):
        layer = next((child for child in _children(keras, layer) if child.name == part), None)
        if layer is None:
            return None
    return layer


def _params(layer) -> str | None:
    """The one variable-path prefix of the layer's own weights (``encoder/norm`` may own ``norm/gamma``), else None."""
    prefixes = {v.path.rpartition("/")[0] for v in layer.weights}
    return prefixes.pop() if len(prefixes) == 1 else None


class Levels:
    """A Keras model's tree on one side: every layer at all depths wrapped for one run of the model (eagerly on the
    reference side, one ``tf.function`` trace on ``tf``, one XLA compilation on ``tf/xla``), each level then served
    from that run. Each level is read by a run of its own (``level_of``) where the values would take more than
    ``TAP_BYTES``, or where the XLA compilation returning them all computes other outputs than the path's own."""

    def __init__(self, runner, x: dict, eager: bool = False):
        import keras

        self.runner, self.x, self.eager, self.keras = runner, x, eager, keras
        self.whole = _observe(runner, x, _every(keras, runner.model), eager, whole=True)

    def level(self, scope: str, names: list[str] | None = None) -> dict:
        """``level_of``'s result for ``scope`` (or exactly ``names``)."""
        candidates = _candidates(self.keras, self.runner, scope, names)
        seen = self.whole if self.whole is not None else _observe_level(self.runner, self.x, candidates, self.eager)
        return _level(self.keras, self.runner, candidates, seen)


def level_of(runner, x: dict, scope: str, names: list[str] | None = None, eager: bool = False) -> dict:
    """``{"children", "values", "inputs", "outputs"}`` of a ``parity.sources.tf.KerasSource`` on the feeds ``x``
    under ``scope`` (see the module docstring; ``torch_tree.level`` has the same contract). ``names`` given: exactly
    those layer paths are observed (the path side of a level the reference side chose). ``eager``: the model is run
    eagerly, not under ``tf.function`` (the reference side; a runner that compiles with XLA is always compiled).
    A descent reads every level of one side from one ``Levels``."""
    import keras

    candidates = _candidates(keras, runner, scope, names)
    return _level(keras, runner, candidates, _observe_level(runner, x, candidates, eager))


def _observe_level(runner, x: dict, candidates, eager: bool) -> dict:
    """``_observe`` of one level's candidates, which always answers (only a read of every layer may not)."""
    seen = _observe(runner, x, candidates, eager)
    if seen is None:
        raise RuntimeError("a level's layers could not be observed")
    return seen


def _every(keras, model) -> list[tuple[str, object]]:
    """Every layer under ``model`` at all depths with its path, parents before their children."""
    found, pending = [], [("", model)]
    while pending:
        prefix, layer = pending.pop(0)
        for child in _children(keras, layer):
            found.append((prefix + child.name, child))
            pending.append((f"{prefix}{child.name}/", child))
    return found


def _candidates(keras, runner, scope: str, names) -> list[tuple[str, object]]:
    if names is not None:
        candidates = [(name, resolve(keras, runner.model, name)) for name in names]
        return [(name, layer) for name, layer in candidates if layer is not None]
    root = resolve(keras, runner.model, scope)
    if root is None:
        raise ValueError(f"{runner.spec.name} has no layer {scope!r}")
    prefix = f"{scope}/" if scope else ""
    return [(prefix + child.name, child) for child in _children(keras, root)]


def _level(keras, runner, candidates, seen: dict) -> dict:
    """The level of ``candidates`` from the run ``seen`` (``_observe``'s, of them or of every layer)."""
    from parity.model.layer_types_keras import keras_layer

    canonical = runner.spec.model_inputs[0].layout
    children = []
    called = sorted(((n, c) for n, c in candidates if n in seen["calls"]), key=lambda p: seen["order"].index(p[0]))
    for name, layer in called:
        single = seen["single"].get(name, False)
        typed = keras_layer(layer) if single else None
        children.append(
            {
                "path": name,
                "class": f"{type(layer).__module__}.{type(layer).__qualname__}",
                "calls": seen["calls"][name],
                "leaf": not _children(keras, layer),
                "kind": typed[0] if typed else None,
                "attrs": typed[1] if typed else None,
                "single_input": single,
                "has_value": name in seen["values"],
                "params": _params(layer),
            }
        )
    names = {name for name, _ in candidates}

    def host(values: dict) -> dict:
        return {
            name: layouts.from_layout(_widened(value), canonical, runner.layout)
            for name, value in values.items()
            if name in names
        }

    return {
        "children": children,
        "values": host(seen["values"]),
        "inputs": host(seen["inputs"]),
        "outputs": {name: _widened(value) for name, value in seen["outputs"].items()},
        "located": {name: where for name, where in seen["located"].items() if name in names},
        "instrumentation": seen["instrumentation"],
    }


def _nbytes(tensor) -> int:
    elements = tensor.shape.num_elements()  # None where a size is known only at run time
    return (elements or 0) * tensor.dtype.size


def _widened(value: np.ndarray) -> np.ndarray:
    return value.astype(np.float32) if value.dtype.name in ("float16", "bfloat16") else value


def _observe(runner, x: dict, candidates, eager: bool = False, whole: bool = False) -> dict | None:
    """One run of the model with ``call`` of each candidate wrapped: call order, call counts, first values. A runner
    that compiles with XLA (``jit_compile``, the ``tf/xla`` path) is read inside one XLA-compiled function that returns
    the values as extra outputs (``_xla``); else ``eager`` runs the model eagerly, not under ``tf.function``.
    ``whole`` (every layer of the model): None where the values would take more than ``TAP_BYTES`` or the XLA
    compilation returning them computes other outputs (each level is then read by a run of its own)."""
    import tensorflow as tf

    from parity.model.feeds import call_keras
    from parity.runtimes.tf_common import outputs_in_order

    xla = bool(getattr(runner, "jit_compile", None))
    calls: dict[str, int] = {}
    order, values, inputs, single = [], {}, {}, {}
    inner: list[str] = []  # XLA: first values computed in a loop's or branch's own graph, which cannot leave it
    traced: list = [None]  # the graph the model is traced into

    def leaves(tensor) -> bool:
        return not xla or getattr(tensor, "graph", None) is traced[0]

    def wrapped(names, original):
        """``call`` of one layer, recorded under each path that holds it."""

        def call(*args, **kwargs):
            first = []
            for name in names:
                calls[name] = calls.get(name, 0) + 1
                if calls[name] == 1:
                    first.append(name)
                    order.append(name)
                    fed = [t for t in tf.nest.flatten((args, kwargs)) if tf.is_tensor(t)]
                    if fed and leaves(fed[0]):
                        inputs[name] = fed[0]
                        held[0] += _nbytes(fed[0])
                    single[name] = (
                        len(args) == 1
                        and tf.is_tensor(args[0])
                        and all(v is None or isinstance(v, bool) for v in kwargs.values())
                    )
            returned = original(*args, **kwargs)
            if first:
                out = [t for t in tf.nest.flatten(returned) if tf.is_tensor(t)]
                if out and out[0].dtype.is_floating:
                    for name in first:
                        if leaves(out[0]):
                            values[name] = out[0]
                        else:
                            inner.append(name)
                    held[0] += _nbytes(out[0]) if leaves(out[0]) else 0
                if whole and held[0] > TAP_BYTES:  # each level by a run of its own: drop what is held
                    values.clear()
                    inputs.clear()
            return returned

        return call

    def forward(feeds, keep=None):
        """The model's outputs, and the first values and inputs (of the layers in ``keep``; None: all)."""
        for record in (order, calls, values, inputs, single, inner):
            record.clear()
        held[0] = 0
        traced[0] = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        returned = outputs_in_order(runner.spec, call_keras(runner.model, feeds))
        kept = [n for n in values if keep is None or n in keep]
        return returned, {n: values[n] for n in kept}, {n: inputs[n] for n in kept if n in inputs}

    fed = runner._to_tf(runner.check_feed(x))
    plain: dict = {}
    if xla:  # the path's own compiled forward, before any layer is wrapped: what the taps must not change
        with tf.device(runner.tf_device):
            plain = {n: t.numpy() for n, t in zip(runner.spec.outputs, runner._forward(fed))}
    held = [0]  # bytes of the values and inputs recorded
    named: dict[int, list[str]] = {}  # a layer held at several paths is recorded under each
    for name, layer in candidates:
        named.setdefault(id(layer), []).append(name)
    patched: list[tuple[object, object]] = []
    for _, layer in candidates:  # an instance attribute: Layer.__call__ reads self.call
        if any(layer is other for _, other in patched):
            continue
        patched.append((layer.__dict__.get("call", _UNSET), layer))
        layer.__dict__["call"] = wrapped(named[id(layer)], layer.call)
    located: dict[str, dict] = {}
    instrumentation = None
    try:
        with tf.device(runner.tf_device):
            if xla:
                seen = _xla(runner, fed, forward, plain, bisect=not whole)
                if seen is None:
                    return None
                found, read, instrumentation = seen["values"], seen["inputs"], seen["instrumentation"]
                returned = [seen["outputs"][n] for n in runner.spec.outputs]
                for item in (instrumentation or {}).get("disturbing", ()):
                    located[item["tap"]] = {
                        "found": "unobservable",
                        "reason": "read inside the XLA-compiled function, it changes the model's outputs "
                        "(XLA compiles the function differently with it as an output)",
                    }
                for name in inner:
                    located[name] = {
                        "found": "unobservable",
                        "reason": "computed inside a loop or a branch of the XLA-compiled function, whose values "
                        "cannot leave it",
                    }
            elif eager:  # tracing a tf.function of the model at each level would cost more than the run
                returned, found, read = forward(fed)
            else:
                try:
                    returned, found, read = tf.function(forward)(fed)
                except ValueError:  # a value computed inside a loop or a branch cannot leave the traced function
                    returned, found, read = forward(fed)
    finally:
        for before, layer in patched:
            if before is _UNSET:
                del layer.__dict__["call"]
            else:
                layer.__dict__["call"] = before
    if whole and held[0] > TAP_BYTES:
        return None
    return {
        "order": list(order),
        "calls": dict(calls),
        "single": dict(single),
        "values": {n: np.asarray(t) for n, t in found.items()},
        "inputs": {n: np.asarray(t) for n, t in read.items()},
        "outputs": {n: np.asarray(t) for n, t in zip(runner.spec.outputs, returned)},
        "located": located,
        "instrumentation": instrumentation,
    }


def _xla(runner, fed, forward, plain: dict, bisect: bool = True) -> dict | None:
    """The layers' first values and inputs computed inside one ``tf.function(jit_compile=True)`` of the model that
    returns them as extra outputs, as the ``tf/xla`` path compiles it; extra outputs can change what XLA fuses and
    so the outputs: where the outputs then differ from the path's own compiled forward (``plain``), the largest set
    of layers whose reading leaves them as they are is kept (``instrument.observe``), the others are disturbing.
    ``{"outputs", "values", "inputs", "instrumentation"}`` (numpy; ``instrumentation`` None where all are kept).
    ``bisect`` False: None where the outputs differ."""
    import tensorflow as tf

    from parity.diagnose.graph import instrument

    tolerance_for = runner.spec.output_tolerances(runner.precision).for_name

    def compiled(keep):
        returned, found, read = tf.function(lambda feeds: forward(feeds, keep), jit_compile=True)(fed)
        outputs = {n: t.numpy() for n, t in zip(runner.spec.outputs, returned)}
        return outputs, {n: t.numpy() for n, t in found.items()}, {n: t.numpy() for n, t in read.items()}

    outputs, found, read = compiled(None)
    if instrument.same_outputs(plain, outputs, tolerance_for):
        return {"outputs": outputs, "values": found, "inputs": read, "instrumentation": None}
    if not bisect:
        return None

    def run(names: list[str]) -> dict:
        keep = {n.removeprefix("tap:") for n in names if n.startswith("tap:")}
        outputs, found, read = compiled(keep)
        return {**outputs, **{f"tap:{n}": (v, read.get(n)) for n, v in found.items()}}

    seen = instrument.observe(run, plain, {n: f"tap:{n}" for n in found}, tolerance_for)
    kept = {n.removeprefix("tap:"): pair for n, pair in seen["values"].items() if n.startswith("tap:")}
    return {
        "outputs": {n: seen["values"].get(n, plain[n]) for n in plain},
        "values": {n: value for n, (value, _) in kept.items()},
        "inputs": {n: value for n, (_, value) in kept.items() if value is not None},
        "instrumentation": {
            "reproduces_with_every_tap": False,
            "observable": seen["observable"],
            "disturbing": seen["disturbing"],
            "runs": seen["runs"],
        },
    }
