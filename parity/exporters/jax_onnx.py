"""JAX -> ONNX with jax2onnx (weights are folded into the graph as initializers)."""

from __future__ import annotations

from parity.exporters.common import ExportJob, check_onnx_ops, onnx_meta, save_onnx
from parity.model import layouts
from parity.runtimes.base import as_tuple


def export(job: ExportJob) -> dict:
    import jax
    from jax2onnx import to_onnx

    spec = job.spec
    params = {name: layouts.held_array(p, job.weights[name], "float32") for name, p in spec.params.items()}

    def forward(x):
        return as_tuple(spec.jax_apply(params, x, None))

    model = to_onnx(
        forward, [jax.ShapeDtypeStruct((job.batch_size, *spec.input.shape), spec.input.dtype)], model_name=spec.name, opset=job.opset,
        input_names=[spec.input.name], output_names=list(spec.outputs),
    )
    check_onnx_ops(model, "jax2onnx")
    save_onnx(model, job.out_dir)
    return onnx_meta(spec, model.graph.input[0].name, [o.name for o in model.graph.output], spec.input.layout)


