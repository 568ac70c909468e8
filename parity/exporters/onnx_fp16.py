"""float32 ONNX -> float16 ONNX with onnxconverter-common, the converter ONNX Runtime's own tools build on.

Inputs and outputs stay float32 (``keep_io_types``: the model casts at its edges), so every runtime is fed
and read the same way at every precision. The ops onnxconverter-common's block list names (no float16
kernels, or index/range arithmetic that float16 would break) are kept in float32 with casts around them;
the meta records which ops those were and how many nodes were converted.
"""

from __future__ import annotations

from collections import Counter

from parity.exporters.common import ONNX_FILE, ExportJob, save_onnx
from parity.platform.errors import ExportError


def export(job: ExportJob) -> dict:
    import onnx
    from onnxconverter_common import float16

    if job.precision != "fp16":
        raise ExportError(f"the float16 conversion runs for fp16 paths only, not {job.precision}")
    model = onnx.load(str(job.parent_dir / job.parent_meta["file"]))
    ops = Counter(node.op_type for node in model.graph.node)
    blocked = sorted(op for op in ops if op in float16.DEFAULT_OP_BLOCK_LIST)
    try:
        converted = float16.convert_float_to_float16(model, keep_io_types=True, op_block_list=float16.DEFAULT_OP_BLOCK_LIST)
    except Exception as error:  # noqa: BLE001 - the converter's own reason is the export's reason
        raise ExportError(f"onnxconverter-common float16: {type(error).__name__}: {error}") from None
    save_onnx(converted, job.out_dir)
    casts = sum(1 for node in converted.graph.node if node.op_type == "Cast") - ops.get("Cast", 0)
    return {**job.parent_meta, "file": ONNX_FILE,
            "float16": {"converter": "onnxconverter-common convert_float_to_float16", "keep_io_types": True,
                        "kept_float32_ops": blocked, "casts_added": casts, "nodes": sum(ops.values())}}
