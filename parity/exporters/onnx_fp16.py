"""float32 ONNX -> float16 ONNX with onnxconverter-common, the converter ONNX Runtime's own tools build on.

Inputs and outputs stay float32 (``keep_io_types``: the model casts at its edges), so every runtime is fed
and read the same way at every precision. The ops onnxconverter-common's block list names (no float16
kernels, or index/range arithmetic that float16 would break) are kept in float32 with casts around them;
the meta records which ops those were and how many nodes were converted.

A precision repair (``parity.diagnose.precision.float16_repair``) keeps named nodes in float32 too
(``node_block_list``): ``convert`` is the one conversion both use, so the repaired verdict is the verdict of the model
this exporter writes with the same list. onnxconverter-common (1.16) leaves float16 around a blocked node in three
places, which ``keep_float32`` undoes for the named nodes: a weight it reads is converted and cast back where the graph
declares the weight's type (a torch.onnx export does), a value passed between two blocked nodes goes through float16
where it has more than one reader, and a graph output a blocked node writes gets the float16 type despite
``keep_io_types``.
"""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np

from parity.exporters.common import ONNX_FILE, ExportJob, all_tensors, external_threshold, save_onnx, tensor_bytes
from parity.exporters.onnx_names import detach_outputs, free_names
from parity.platform.errors import ExportError

CONVERTER_MAX_FINITE = 1e4  # onnxconverter-common's default max_finite_val: larger weights are clipped to it
FLOAT16_MAX = 65504.0  # the largest finite float16


def convert(model, node_block_list=(), max_finite_val: float | None = None, strict: bool = True):
    """``model`` (float32 ONNX) as parity's float16 paths run it: ``convert_float_to_float16(model,
    keep_io_types=True, op_block_list=DEFAULT_OP_BLOCK_LIST, node_block_list=...)``, with ``max_finite_val`` when
    given (default: the converter's 1e4), then ``keep_float32`` for the blocked nodes (``strict=False``: the
    converter's model as it is). The converter warns once per weight it clips: ``clipped_weights`` counts them."""
    from onnx import ModelProto
    from onnxconverter_common import float16

    options = {} if max_finite_val is None else {"max_finite_val": float(max_finite_val)}
    model, original = ModelProto(), model
    model.CopyFrom(original)
    detach_outputs(model)  # the converter's output cast must not replace the value inner nodes read
    free_names(model, cast_names(model))  # the converter names its casts without looking at the graph's names
    large = tensor_bytes(model) > external_threshold()
    if large:  # the converter's own shape inference serialises the model: impossible past protobuf's 2 GiB
        infer_types(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted = float16.convert_float_to_float16(
            model,
            keep_io_types=True,
            op_block_list=float16.DEFAULT_OP_BLOCK_LIST,
            node_block_list=list(node_block_list),
            disable_shape_infer=large,
            **options,
        )
    return keep_float32(converted, model, node_block_list) if node_block_list and strict else converted


def infer_types(model) -> None:
    """ONNX shape inference on ``model`` in place (its ``value_info``), run with the bytes of its tensors set aside
    (they are marked external meanwhile, as ``infer_shapes_path`` sees a model with external data): a model past
    protobuf's 2 GiB cannot be serialised for the inference, and types and shapes do not depend on weights' values."""
    from onnx import TensorProto, shape_inference

    aside = []
    for tensor in all_tensors(model):
        if len(tensor.raw_data) > 1024 and tensor.data_location != TensorProto.EXTERNAL:
            aside.append((tensor, tensor.raw_data))
            tensor.ClearField("raw_data")
            tensor.data_location = TensorProto.EXTERNAL
            entry = tensor.external_data.add()
            entry.key, entry.value = "location", "set-aside"
    try:
        inferred = shape_inference.infer_shapes(model)
    finally:
        for tensor, data in aside:
            tensor.ClearField("external_data")
            tensor.data_location = TensorProto.DEFAULT
            tensor.raw_data = data
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)


def cast_names(model) -> set[str]:
    """The tensor names onnxconverter-common (1.16) gives the casts it adds: ``<input>_cast_to_<node>`` and
    ``<node>_cast_to_<output>`` at the graph's edges, ``<node>_input_cast_<k>`` and ``<node>_output_cast_<k>``
    around a node kept in float32."""
    graph = model.graph
    names = set()
    for node in graph.node:
        names |= {f"{node.name}_input_cast_{k}" for k in range(len(node.input))}
        names |= {f"{node.name}_output_cast_{k}" for k in range(len(node.output))}
        names |= {f"{i.name}_cast_to_{node.name}" for i in graph.input if i.name in node.input}
        names |= {f"{node.name}_cast_to_{o.name}" for o in graph.output if o.name in node.output}
    return names


def keep_float32(converted, original, node_block_list):
    """``converted`` (``original`` converted with ``node_block_list``), its blocked nodes reading and writing float32
    values only (see the module docstring): a weight cast back to float32 for blocked readers only is read from a
    float32 copy of the original; a float16 -> float32 cast round trip into blocked readers is skipped; a graph output
    that was float32 and that a blocked node writes through a float16 cast is cast to float32 instead. Returns it."""
    from onnx import TensorProto

    blocked = set(node_block_list)
    graph = converted.graph
    read_before = _read(graph)
    producer = {name: node for node in graph.node for name in node.output}
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    weights = {t.name: t for t in original.graph.initializer if t.data_type == TensorProto.FLOAT}
    halved = {t.name for t in graph.initializer if t.data_type == TensorProto.FLOAT16}
    kept = {}
    for node in list(graph.node):
        users = readers.get(node.output[0], [])
        if not _is_cast(node, TensorProto.FLOAT) or not users or not all(r.name in blocked for r in users):
            continue
        source = node.input[0]
        if source in weights and source in halved:
            if source not in kept:
                kept[source] = TensorProto()
                kept[source].CopyFrom(weights[source])
                kept[source].name = f"{source}__float32"
                graph.initializer.append(kept[source])
            node.input[0] = kept[source].name
        elif source in producer and _is_cast(producer[source], TensorProto.FLOAT16):
            node.input[0] = producer[source].input[0]
    was_float = {o.name for o in original.graph.output if o.type.tensor_type.elem_type == TensorProto.FLOAT}
    for output in graph.output:
        cast = producer.get(output.name)
        if (
            output.name in was_float
            and cast is not None
            and _is_cast(cast, TensorProto.FLOAT16)
            and getattr(producer.get(cast.input[0]), "name", None) in blocked
        ):
            next(a for a in cast.attribute if a.name == "to").i = TensorProto.FLOAT
            output.type.tensor_type.elem_type = TensorProto.FLOAT
    _drop_unread(graph, read_before)
    return converted


def _is_cast(node, to: int) -> bool:
    return node.op_type == "Cast" and any(a.name == "to" and a.i == to for a in node.attribute)


def _read(graph) -> set[str]:
    """Every tensor a node reads or the graph outputs."""
    return {name for node in graph.node for name in node.input} | {o.name for o in graph.output}


def _drop_unread(graph, read_before: set[str]) -> None:
    """Remove the casts, then the initializers, that were read before and are read no more."""
    while True:
        read = _read(graph)
        dead = [node for node in graph.node if node.op_type == "Cast" and node.output[0] not in read]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    for tensor in [t for t in graph.initializer if t.name in read_before and t.name not in read]:
        graph.initializer.remove(tensor)


def clipped_weights(model, node_block_list=(), max_finite_val: float | None = None) -> int:
    """How many float32 weight elements the conversion clips to ``max_finite_val``: those beyond it, except the
    weights a blocked node or op reads (the converter leaves those in float32)."""
    from onnx import TensorProto, numpy_helper
    from onnxconverter_common import float16

    limit = CONVERTER_MAX_FINITE if max_finite_val is None else max_finite_val
    blocked = set(node_block_list)
    kept = {
        name
        for node in model.graph.node
        for name in node.input
        if node.name in blocked or node.op_type in float16.DEFAULT_OP_BLOCK_LIST
    }
    return sum(
        int(np.count_nonzero(np.abs(numpy_helper.to_array(t)) > limit))
        for t in model.graph.initializer
        if t.data_type == TensorProto.FLOAT and t.name not in kept
    )


def export(job: ExportJob, node_block_list=None, max_finite_val: float | None = None) -> dict:
    """The path's float16 model from its float32 parent; ``node_block_list`` (node names) kept in float32 and
    ``max_finite_val`` passed to the converter when given, both recorded in the meta. A run's export cache keys
    an artifact on the model's spec file and parity's code, not on call arguments: a caller that passes these
    writes its artifact outside that cache (as a repair does), or keys it on them itself."""
    import onnx

    if job.precision != "fp16":
        raise ExportError(f"the float16 conversion runs for fp16 paths only, not {job.precision}")
    parent_dir, parent_meta = job.parent()
    model = onnx.load(str(parent_dir / parent_meta["file"]))
    block = list(dict.fromkeys(node_block_list or ()))
    unknown = sorted(set(block) - {node.name for node in model.graph.node})
    if unknown:
        raise ExportError(
            f"node_block_list names {len(unknown)} node(s) the graph does not have: "
            f"{', '.join(unknown[:5])}{', ...' if len(unknown) > 5 else ''}"
        )
    from onnxconverter_common import float16

    ops = Counter(node.op_type for node in model.graph.node)
    blocked = sorted(op for op in ops if op in float16.DEFAULT_OP_BLOCK_LIST)
    try:
        converted = convert(model, block, max_finite_val)
    except Exception as error:  # noqa: BLE001 - the converter's own reason is the export's reason
        raise ExportError(f"onnxconverter-common float16: {type(error).__name__}: {error}") from None
    save_onnx(converted, job.out_dir)
    casts = sum(1 for node in converted.graph.node if node.op_type == "Cast") - ops.get("Cast", 0)
    return {
        **parent_meta,
        "file": ONNX_FILE,
        "float16": {
            "converter": "onnxconverter-common convert_float_to_float16",
            "keep_io_types": True,
            "kept_float32_ops": blocked,
            "kept_float32_nodes": block,
            "max_finite_val": CONVERTER_MAX_FINITE if max_finite_val is None else float(max_finite_val),
            "clipped_weights": clipped_weights(model, block, max_finite_val),
            "casts_added": casts,
            "nodes": sum(ops.values()),
        },
    }
