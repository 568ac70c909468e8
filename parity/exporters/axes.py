"""Dynamic axes, shared by every exporter: which axes of the inputs are declared dynamic (``batch`` and named ones
such as ``sequence``), how an exported graph came out (``meta["axes"]``), and the exporters' reasons in one line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from parity.platform.errors import ParityError, one_line

NHWC_AXES = (0, 2, 3, 1)  # a single NCHW input's axes in the NHWC layout
REASON_CHARS = 300  # a recorded reason is one line of at most this many characters


def axis_names(spec, layout: str | None = None) -> dict[str, tuple[str, ...]]:
    """Input name -> the names of its full shape's axes (``batch`` first where batched, ``""`` for a fixed
    size), in ``layout``: a single input taken NHWC has its axes permuted as ``signature`` permutes them."""
    names = {}
    for i in spec.model_inputs:
        axes = tuple(i.axis_names)
        if layout == "nhwc" and len(spec.model_inputs) == 1 and len(axes) == 4:
            axes = tuple(axes[k] for k in NHWC_AXES)
        names[i.name] = axes
    return names


def declared_dynamic(spec, layout: str | None = None) -> dict[str, set[int]]:
    """Input name -> the indices (in ``layout``) of its named axes, the ones an export should keep dynamic."""
    return {name: {k for k, axis in enumerate(axes) if axis} for name, axes in axis_names(spec, layout).items()}


def short_reason(error: BaseException | str) -> str:
    """An exporter's error as one line of at most ``REASON_CHARS`` characters: the innermost cause (the
    converter's own message, not the wrapper's advice), with its type."""
    if isinstance(error, BaseException):
        inner = error
        while inner.__cause__ is not None and inner.__cause__ is not inner:
            inner = inner.__cause__
        text = str(inner).strip() or str(error).strip()
        error = text if isinstance(inner, ParityError) else f"{type(inner).__name__}: {text}".rstrip(": ")
    return one_line(error, REASON_CHARS)


def axes_record(
    spec, shapes: Mapping[str, Sequence[int | None] | None], layout: str | None = None, reason: str | None = None
) -> dict:
    """``meta["axes"]`` from the exported inputs' shapes (input name -> one entry per axis: its size, or None
    where it is dynamic; None for an unknown rank): every declared named axis, dynamic or baked in.

    ``{"dynamic": {input: {"<axis index>": axis name}}, "static": {input: {"<axis index>": {"axis": axis name,
    "size": int}}}, "reason": why some came out static, or None}``; axis indices are the artifact's own
    (``layout``), inputs without entries are left out."""
    dynamic: dict[str, dict[str, str]] = {}
    static: dict[str, dict[str, dict]] = {}
    for name, axes in axis_names(spec, layout).items():
        dims = shapes.get(name)
        for k, axis in enumerate(axes):
            if not axis:
                continue
            size = dims[k] if dims is not None and k < len(dims) else None
            if size is None:
                dynamic.setdefault(name, {})[str(k)] = axis
            else:
                static.setdefault(name, {})[str(k)] = {"axis": axis, "size": int(size)}
    if static and not reason:
        reason = "the exporter baked the declared axes' sizes into the graph"
    return {"dynamic": dynamic, "static": static, "reason": reason if static else None}


def onnx_input_shapes(spec, model) -> dict[str, list[int | None] | None]:
    """Spec input name -> its graph input's dims (``dim_value``, or None for a ``dim_param`` or an unknown
    size); the graph's non-initializer inputs are in the spec's order."""
    initializers = {t.name for t in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in initializers]
    shapes: dict[str, list[int | None] | None] = {}
    for i, graph_input in zip(spec.model_inputs, graph_inputs):
        tensor_type = graph_input.type.tensor_type
        if not tensor_type.HasField("shape"):
            shapes[i.name] = None
            continue
        shapes[i.name] = [int(d.dim_value) if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
    return shapes


def onnx_axes(spec, model, layout: str | None = None, reason: str | None = None) -> dict:
    """``meta["axes"]`` read back from the ONNX graph's inputs (``dim_param`` vs ``dim_value``)."""
    return axes_record(spec, onnx_input_shapes(spec, model), layout, reason)


def name_dims(model, spec, layout: str | None = None) -> None:
    """Name the graph inputs' dynamic dims by the spec's axis names (tf2onnx calls them ``unk__N``), and the
    same symbols wherever else the graph uses them (outputs, value infos)."""
    initializers = {t.name for t in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in initializers]
    renamed: dict[str, str] = {}
    for graph_input, axes in zip(graph_inputs, axis_names(spec, layout).values()):
        if not graph_input.type.tensor_type.HasField("shape"):
            continue
        for dim, axis in zip(graph_input.type.tensor_type.shape.dim, axes):
            if not axis or dim.HasField("dim_value"):
                continue
            if dim.dim_param:
                renamed.setdefault(dim.dim_param, axis)
            dim.dim_param = axis
    if not renamed:
        return
    for value in (*model.graph.output, *model.graph.value_info):
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            for dim in value.type.tensor_type.shape.dim:
                if dim.dim_param in renamed:
                    dim.dim_param = renamed[dim.dim_param]
