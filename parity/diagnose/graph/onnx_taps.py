"""Layer taps inside an exported ONNX graph (the graph plumbing, and ONNX Runtime against
``onnx.reference``, are in ``onnx_graph``).

A spec's taps are top-level layers. In an exported graph they are found, in this order:

* ``metadata`` (torch.onnx, dynamo): every node carries its module path in the metadata key
  ``pkg.torch.onnx.name_scopes`` (a Python list literal such as ``['', 'block0_attn',
  'block0_attn.query', 'linear_1']``); the top-level scope is the tap;
* ``name`` (tf2onnx from Keras): node names keep the Keras layer names
  (``cnn_1/conv1_1/BiasAdd``); a path component equal to the tap, or the tap plus ``_<digits>``; a layer path
  into nested models (``encoder/norm``) matches consecutive components (``cnn_1/encoder_1/norm_1/Mean``);
* ``value`` (jax2onnx, jax2tf graphs, or a tap whose nodes lost their names): the candidate
  tensor of a compatible shape closest to the golden activation, keeping network order (an
  optimal monotone alignment of the taps onto the tensors' topological positions).

For ``metadata`` and ``name`` the tap's tensor is the *boundary output* of its scope: an output
of one of its nodes that a node outside the scope reads, or a graph output (the last in
topological order when there are several). That mapping never looks at values, so a faulty
path's taps are still found; values only break layout ties (an ``NCHW`` shape that is also the
``NHWC`` permutation of the golden shape) and drive the value fallback.

A tap without nodes of its own is, in this order: the same tensor as its input tap when the
golden data says it is the identity (dropout at inference); ``value``-matched between its mapped
neighbours; ``fused`` into the next mapped tap when no tensor of a compatible shape lies between
them (a BatchNorm folded into the preceding Conv leaves the Conv carrying the BatchNorm's scope);
else ``unmapped`` with a one-line reason.

Every function imports onnx / onnxruntime inside; this module imports only NumPy.
"""

from __future__ import annotations

import ast
import functools

import numpy as np

from parity.diagnose.graph import axis_order
from parity.diagnose.graph.onnx_graph import _Graph
from parity.model import layouts

TORCH_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
WRAPPED = "model"  # the attribute of torch_onnx's wrapper that holds the module
EXPORTERS = ("torch.onnx", "tf2onnx", "jax2onnx", "onnx file")  # an ONNX source's taps are its tensors' names
# an alignment cost above this (relative L2 error) is no match: the tap is left out instead
VALUE_SKIP_COST = 0.5
_TIE_BREAK = 1e-12  # per topological position: among equally close tensors, the earliest wins
_NHWC = (0, 2, 3, 1)


# --------------------------------------------------------------------------- scopes (metadata / names)


def torch_module_paths(node) -> list[str]:
    """The module paths a torch.onnx node was computed under, outermost first (the root and the op's own name left
    out): ``['blocks', 'blocks.0', 'blocks.0.norm']``."""
    for prop in node.metadata_props:
        if prop.key == TORCH_SCOPES_KEY:
            return list(_module_paths(prop.value))
    return []


@functools.lru_cache(maxsize=1 << 16)
def _module_paths(value: str) -> tuple[str, ...]:
    """``torch_module_paths`` of one metadata value, parsed once (a descent reads every node's at each level)."""
    try:
        scopes = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        scopes = [s.strip(" '\"") for s in value.strip("[]").split(",")]
    # the last entry names the op (``linear_1``), not a module; the exporter's wrapper
    # (parity.exporters.torch_onnx) holds the user's module as ``model``
    return tuple(s.removeprefix(f"{WRAPPED}.") for s in scopes[:-1] if isinstance(s, str) and s and s != WRAPPED)


def torch_scope(node, taps) -> str | None:
    """The tap (a module path at any depth) a torch.onnx node belongs to: the tap that is one of its module paths or
    holds one (``layers`` holds ``layers.0``), or None."""
    for scope in torch_module_paths(node):
        for tap in taps:
            if scope == tap or scope.startswith(f"{tap}."):
                return tap
    return None


def keras_scope(node_name: str, taps, model_name: str | None = None) -> str | None:
    """The tap a converter's node or tensor name belongs to: a tap (a layer name, or a layer path ``sub/dense_2``
    into nested models and layers) whose names are consecutive scope components of the node name
    (``model_1/sub_1/dense_2_1/MatMul``; the last component names the op), each the layer's name plus as many
    ``_<digits>`` as the model's own scope carries beyond ``model_name`` (one where it is not known: Keras 3 under
    tf.function), the rule ``parity.runtimes.litert.scope_layer`` reads a ``.tflite`` tensor's name by. The
    earliest component wins."""
    from parity.runtimes.litert import scope_layer, scope_suffixes

    scopes = node_name.split("/")[:-1]
    if not scopes:
        return None
    suffixes = scope_suffixes(scopes[0], model_name)
    paths = [(tap, tap.split("/")) for tap in taps]
    for start in range(len(scopes)):
        for tap, names in paths:
            window = scopes[start : start + len(names)]
            if len(window) == len(names) and all(
                scope_layer(scope, (name,), suffixes) == name for name, scope in zip(names, window)
            ):
                return tap
    return None


def _scopes(graph: _Graph, taps, kind: str | None) -> dict[str, list[int]]:
    """tap -> indices of its nodes, by ``kind`` (``metadata`` or ``name``)."""
    found: dict[str, list[int]] = {}
    tap_set = set(taps)
    for index, node in enumerate(graph.nodes):
        tap = torch_scope(node, tap_set) if kind == "metadata" else keras_scope(node.name, taps)
        if tap is not None and tap in tap_set:
            found.setdefault(tap, []).append(index)
    return found


def _boundary_outputs(graph: _Graph, node_indices: list[int]) -> list[str]:
    """Float outputs of a scope that a node outside it reads, or that are graph outputs, in
    topological order."""
    inside = set(node_indices)
    out = []
    for index in node_indices:
        for name in graph.nodes[index].output:
            if name not in graph.position:
                continue
            outside = any(c not in inside for c in graph.consumers.get(name, ()))
            if outside or name in graph.graph_outputs:
                out.append(name)
    return sorted(out, key=graph.position.__getitem__)


def _scope_kind(exporter: str) -> str | None:
    if exporter == "torch.onnx":
        return "metadata"
    if exporter == "tf2onnx":
        return "name"
    if exporter in ("jax2onnx", "onnx file"):
        return None
    raise ValueError(f"exporter {exporter!r} is not one of {EXPORTERS}")


# --------------------------------------------------------------------------- layouts and values


def _golden(golden_taps: dict) -> dict[str, np.ndarray]:
    """Golden activations keyed by tap name (as in ``spec.taps``, not the ``tap/<name>`` npz key)."""
    return {k: np.asarray(v) for k, v in golden_taps.items()}


def _layouts_for(shape: tuple | None, golden_shape: tuple, canonical: str) -> list[str]:
    """Layouts in which a tensor of static ``shape`` holds the golden activation (exact shapes)."""
    if shape is None:
        return []
    fits = []
    if tuple(shape) == tuple(golden_shape):
        fits.append(canonical)
    if len(golden_shape) == 4 and tuple(shape) == tuple(golden_shape[i] for i in _NHWC):
        fits.append("nhwc")
    return list(dict.fromkeys(fits))


def to_canonical(value: np.ndarray, location: dict, golden_shape: tuple) -> np.ndarray:
    """A tap tensor in canonical layout and the golden shape (``nhwc`` transposed back, then a
    reshape when only the static shape differs, e.g. a flattened ``(batch*tokens, d)`` matmul).

    Raises ``ValueError`` with a one-line reason when the tensor's size does not fit the golden
    shape; a caller marks the tap unmapped with that reason."""
    value = np.asarray(value)
    golden_shape = tuple(int(d) for d in golden_shape)
    expected = int(np.prod(golden_shape, dtype=np.int64))
    if value.size != expected:
        name = location.get("tensor")
        what = f"tensor {name!r}" if name is not None else "the tensor"
        raise ValueError(
            f"{what} of shape {tuple(value.shape)} ({value.size} elements) cannot hold the tap's "
            f"golden shape {golden_shape} ({expected} elements)"
        )
    if location.get("order") is not None and len(location["order"]) == value.ndim:
        value = np.transpose(value, location["order"])  # the axis order the graph's structure proves
    elif location.get("layout") == "nhwc" and value.ndim == 4:
        value = layouts.from_layout(value, "nchw", "nhwc")
    if value.shape != golden_shape:
        value = value.reshape(golden_shape)
    return value


def _norm(array: np.ndarray) -> float:
    """L2 norm without BLAS (``np.linalg.norm`` goes through a threaded dot, slow on a busy machine)."""
    return float(np.sqrt(np.sum(np.square(array))))


def _relative_error(value: np.ndarray, golden: np.ndarray, layout: str) -> float:
    value = to_canonical(value, {"layout": layout}, golden.shape).astype(np.float64)
    if not np.all(np.isfinite(value)):
        return float("inf")
    scale = _norm(golden)
    return _norm(value - golden) / (scale if scale > 0 else 1.0)


def candidate_names(model, spec, golden_taps: dict[str, np.ndarray], input_layout: str, graph=None) -> list[str]:
    """Tensors worth one run: every intermediate whose static shape fits some tap's golden shape
    (canonical or ``NHWC``), plus every scope boundary output that metadata or names point at (``graph``: the
    model's ``_Graph``, when the caller has it)."""
    graph = graph or _Graph(model)
    golden = _golden(golden_taps)
    canonical = spec.model_inputs[0].layout
    shapes = {tuple(g.shape) for g in golden.values()}
    chosen = set()
    for name in graph.names:
        shape = graph.shapes[name]
        if shape is None or any(_layouts_for(shape, s, canonical) for s in shapes):
            chosen.add(name)
    for kind in ("metadata", "name"):
        for nodes in _scopes(graph, spec.taps, kind).values():
            chosen.update(_boundary_outputs(graph, nodes))
    return [n for n in graph.names if n in chosen]


# --------------------------------------------------------------------------- mapping


def _entry(tensor=None, how="unmapped", fused_into=None, layout=None, reason=None) -> dict:
    return {"tensor": tensor, "how": how, "fused_into": fused_into, "layout": layout, "reason": reason}


def _read_by_layers(graph: _Graph, outputs: list[str]) -> list[str]:
    """The boundary outputs that are graph outputs or read by a node a layer's scope names (``block_1/add``): those
    read only by tf2onnx's own unscoped nodes (``Unsqueeze__375``, its rewriting of an einsum) are the layer's
    internals, e.g. an attention's key projection, whatever their size."""
    return [
        name
        for name in outputs
        if name in graph.graph_outputs or any("/" in graph.nodes[i].name for i in graph.consumers.get(name, ()))
    ]


def _pick_boundary(graph: _Graph, outputs: list[str], golden: np.ndarray | None) -> str:
    """The last boundary output, preferring those that can hold the golden activation (by size)."""
    if golden is not None:
        sized = [n for n in outputs if (shape := graph.shapes[n]) is not None and int(np.prod(shape)) == golden.size]
        if sized:
            return sized[-1]
    return outputs[-1]


def _align(taps: list[str], candidates: dict[str, list[tuple[int, str, str, float]]]):
    """Optimal monotone alignment: each tap gets a candidate (position, tensor, layout, cost) at a
    strictly later position than the previous tap's, or is skipped at ``VALUE_SKIP_COST``;
    the total cost is minimal. Returns tap -> (tensor, layout, cost) or None."""
    # states: last position -> (total cost, choices); position -1 before anything
    states: dict[int, tuple[float, tuple]] = {-1: (0.0, ())}
    for tap in taps:
        new_states: dict[int, tuple[float, tuple]] = {}
        ordered = sorted(states.items())
        for position, (cost, choices) in ordered:  # skip the tap
            candidate = (cost + VALUE_SKIP_COST, choices + (None,))
            if position not in new_states or candidate[0] < new_states[position][0]:
                new_states[position] = candidate
        prefix, best, i = [], None, 0
        for position, state in ordered:
            if best is None or state[0] < best[1][0]:
                best = (position, state)
            prefix.append((position, best))
        for position, tensor, layout, cost in sorted(candidates.get(tap, ())):
            while i < len(prefix) and prefix[i][0] < position:
                i += 1
            if i == 0:
                continue
            _, (total, choices) = prefix[i - 1][1]
            candidate = (total + cost + _TIE_BREAK * position, choices + ((tensor, layout, cost),))
            if position not in new_states or candidate[0] < new_states[position][0]:
                new_states[position] = candidate
        states = new_states
    _, choices = min(states.values(), key=lambda s: s[0])
    return dict(zip(taps, choices))


def _identity_source(spec, golden: dict, tap: str) -> str | None:
    """The input tap this tap's golden activation is bitwise equal to (an identity layer), or None."""
    inputs = spec.layer_inputs(tap)
    if len(inputs) != 1 or inputs[0] == "input" or tap not in golden or inputs[0] not in golden:
        return None
    a, b = golden[tap], golden[inputs[0]]
    return inputs[0] if a.shape == b.shape and np.array_equal(a, b) else None


def _permutes(shape, golden_shape) -> bool:
    """Whether a tensor of ``shape`` (the golden's rank, not its shape) holds the golden's axes in another order."""
    return (
        shape is not None
        and len(shape) == len(golden_shape)
        and tuple(shape) != tuple(golden_shape)
        and sorted(shape) == sorted(golden_shape)
    )


def _choose_layout(graph, name, golden, values, canonical) -> tuple[str | None, str | bool | None]:
    """(layout, how a tie was settled): None without a tie, False for a tie no value could settle."""
    fits = _layouts_for(graph.shapes.get(name), golden.shape, canonical)
    if len(fits) == 1:
        return fits[0], None
    if not fits:  # a reshaped view (same size) or an unknown shape: canonical order, reshaped
        return canonical, None
    if name in values:
        try:
            errors = {layout: _relative_error(values[name], golden, layout) for layout in fits}
        except ValueError:
            errors = {}
        if errors:
            return min(fits, key=lambda layout: errors[layout]), "decided by value"
    return None, False


def map_taps(
    model,
    spec,
    exporter: str,
    golden_taps: dict[str, np.ndarray],
    values: dict[str, np.ndarray],
    input_layout: str,
    graph=None,
) -> dict[str, dict]:
    """Where each tap of ``spec`` is in ``model``: ``{"tensor", "how", "fused_into", "layout",
    "reason"}`` for every tap, in ``spec.taps`` order (see the module docstring; ``graph``: the model's ``_Graph``,
    when the caller has it)."""
    graph = graph or _Graph(model)
    golden = _golden(golden_taps)
    values = values or {}
    canonical = spec.model_inputs[0].layout
    taps = list(spec.taps)
    kind = _scope_kind(exporter)
    result: dict[str, dict] = {}
    notes: dict[str, str] = {}

    # 0. an ONNX source's taps name its own tensors
    if exporter == "onnx file":
        for tap in taps:
            result[tap] = (
                _entry(tap, "name") if tap in graph.shapes else _entry(reason=f"the graph has no tensor {tap!r}")
            )
    # 1. metadata / names: the scope's boundary output, whatever the values
    if kind is not None:
        for tap, nodes in _scopes(graph, taps, kind).items():
            outputs = _boundary_outputs(graph, nodes)
            if kind == "name":
                outputs = _read_by_layers(graph, outputs) or outputs
            if outputs:
                result[tap] = _entry(_pick_boundary(graph, outputs, golden.get(tap)), kind)
            else:
                notes[tap] = f"its {len(nodes)} node(s) feed nothing outside the scope"
    # 2. identity taps with no node of their own resolve to their input tap, later
    identities = {tap: src for tap in taps if tap not in result and (src := _identity_source(spec, golden, tap))}
    # 3. the rest by value, between anchors (metadata/name-mapped taps), in network order
    pending = [t for t in taps if t not in result and t not in identities]
    no_candidates: set[str] = set()
    closest: dict[str, tuple[str, float]] = {}
    if pending:
        segment: list[str] = []
        lower = -1
        for tap in [*taps, None]:
            if tap is not None and tap in result:
                upper = graph.position.get(result[tap]["tensor"], len(graph.names))
            elif tap is None:
                upper = len(graph.names)
            else:
                if tap in pending:
                    segment.append(tap)
                continue
            _value_segment(graph, segment, lower, upper, golden, values, canonical, result, no_candidates, closest)
            segment = []
            if tap is not None:
                lower = max(lower, graph.position.get(result[tap]["tensor"], lower))
    # 4. fused or unmapped (identity taps come after, from their input tap)
    for index, tap in enumerate(taps):
        if tap in result or tap in identities:
            continue
        later = next(
            (
                t
                for t in taps[index + 1 :]
                if t in result and result[t]["tensor"] is not None and result[t]["how"] != "fused"
            ),
            None,
        )
        note = f" ({notes[tap]})" if tap in notes else ""
        own = "no node of its own" if kind is not None else f"no layer names in a {exporter} graph"
        if tap not in golden:
            result[tap] = _entry(reason=f"{own}{note} and no golden activation to match")
        elif tap in no_candidates and later is not None:
            result[tap] = _entry(
                how="fused",
                fused_into=later,
                reason=f"{own}{note} and no tensor of its shape between the previous tap and "
                f"{later!r}: folded into {later!r}",
            )
        elif tap in closest:
            tensor, error = closest[tap]
            result[tap] = _entry(
                reason=f"{own}{note}; the closest tensor {tensor!r} is off by {error:.3g} (relative L2)"
            )
        elif tap in no_candidates:
            result[tap] = _entry(reason=f"{own}{note} and no tensor of its shape {golden[tap].shape}")
        else:
            result[tap] = _entry(reason=f"{own}{note}; candidate tensors exist but no values to match")
    # 5. identities take their input tap's tensor
    for tap in taps:
        if tap in identities:
            source = identities[tap]
            base = result.get(source)
            if base is None or base["tensor"] is None:
                how = base["how"] if base else "unmapped"
                result[tap] = _entry(
                    None,
                    how,
                    base["fused_into"] if base else None,
                    None,
                    f"no node of its own (identity: golden equals {source!r}, which is {how})",
                )
            else:
                result[tap] = _entry(
                    base["tensor"],
                    base["how"],
                    None,
                    base["layout"],
                    f"no node of its own: the identity at inference (golden equals {source!r}), "
                    f"so the same tensor as {source!r}",
                )
            result[tap]["identity_of"] = source
    # 6. layouts of metadata/name-mapped tensors: the graph's structure proves the axis order where it can (a
    # Transpose after a layout change); values only settle what it leaves open
    orders = axis_order.axis_orders(model, graph, input_layout, canonical)
    undecided = []
    for tap in taps:
        entry = result[tap]
        if entry["tensor"] is None or entry["layout"] is not None or "identity_of" in entry:
            continue
        if tap not in golden or (exporter == "onnx file" and entry["how"] == "name"):
            entry["layout"] = canonical  # an ONNX source's own tensor holds its golden in the golden's order
            continue
        order = orders.get(entry["tensor"])
        proven = order and axis_order.to_golden(order, graph.shapes.get(entry["tensor"]), golden[tap].shape)
        if proven:
            entry["layout"], entry["order"] = canonical, list(proven)
            if list(proven) != sorted(proven):
                entry["reason"] = f"axes {tuple(proven)} put in the golden's order, as the graph's Transposes say"
            continue
        layout, tie = _choose_layout(graph, entry["tensor"], golden[tap], values, canonical)
        entry["layout"] = layout
        if tie is False:
            undecided.append(tap)
        elif tie:
            entry["unproven"] = True
            entry["reason"] = "layout tie (the NCHW and NHWC shapes agree) settled by value"
        elif _permutes(graph.shapes.get(entry["tensor"]), golden[tap].shape):
            entry["unproven"] = True
            entry["reason"] = "its shape is a permutation of the tap's and the graph's structure does not say which"
    for tap in undecided:  # a tie without values: the nearest decided 4-D tap's layout, else the input's
        index = taps.index(tap)
        nearest = sorted(range(len(taps)), key=lambda j: (abs(j - index), j > index))
        near = next(
            (
                result[taps[j]]["layout"]
                for j in nearest
                if taps[j] not in undecided
                and result[taps[j]]["layout"] in ("nchw", "nhwc")
                and taps[j] in golden
                and golden[taps[j]].ndim == 4
            ),
            None,
        )
        result[tap]["layout"] = near or (input_layout if input_layout in ("nchw", "nhwc") else canonical)
        result[tap]["unproven"] = True
        result[tap]["reason"] = "layout tie (NCHW and NHWC shapes agree) that the graph's structure does not settle"
    for tap in taps:
        if result[tap]["tensor"] is not None:
            for other in identities:
                if result[other].get("identity_of") == tap:
                    result[other]["layout"] = result[tap]["layout"]
                    for key in ("order", "unproven"):
                        if key in result[tap]:
                            result[other][key] = result[tap][key]
    keys = ("tensor", "how", "fused_into", "layout", "reason", "order", "unproven")
    return {tap: {k: result[tap][k] for k in keys if k in result[tap]} for tap in taps}


def _value_segment(graph, segment, lower, upper, golden, values, canonical, result, no_candidates, closest):
    """Value-map ``segment`` (taps in order) onto tensors strictly between positions lower and upper."""
    if not segment:
        return
    candidates: dict[str, list] = {}
    shaped: dict[str, list[int]] = {}
    cache: dict[tuple, np.ndarray] = {}
    for tap in segment:
        if tap not in golden:
            continue
        target = golden[tap].astype(np.float64)
        scale = _norm(target) or 1.0
        found, shaped[tap] = [], []
        for position in range(lower + 1, upper):
            name = graph.names[position]
            fits = _layouts_for(graph.shapes[name], target.shape, canonical)
            if fits:
                shaped[tap].append(position)
            if name not in values:
                continue
            for layout in fits:
                key = (name, layout)
                if key not in cache:
                    cache[key] = to_canonical(values[name], {"layout": layout}, target.shape).astype(np.float64)
                cost = _norm(cache[key] - target) / scale
                found.append((position, name, layout, min(cost, 1e3) if np.isfinite(cost) else 1e3))
        if found:
            candidates[tap] = found
    chosen = _align(segment, candidates)
    placed = {tap: graph.position[c[0]] for tap, c in chosen.items() if c is not None}
    for index, tap in enumerate(segment):
        choice = chosen.get(tap)
        if choice is not None:
            tensor, layout, cost = choice
            count = len({c[1] for c in candidates[tap]})
            result[tap] = _entry(
                tensor,
                "value",
                None,
                layout,
                f"closest of {count} tensor(s) of its shape in network order (relative L2 error {cost:.3g})",
            )
            continue
        if tap not in golden:
            continue
        # left out: what lies between its mapped neighbours decides fused / unmapped, and the reason
        low = max((placed[t] for t in segment[:index] if t in placed), default=lower)
        high = min((placed[t] for t in segment[index + 1 :] if t in placed), default=upper)
        if not any(low < p < high for p in shaped[tap]):
            no_candidates.add(tap)
        local = [c for c in candidates.get(tap, ()) if low < c[0] < high]
        if local:
            best = min(local, key=lambda c: (c[3], c[0]))
            closest[tap] = (best[1], best[3])
