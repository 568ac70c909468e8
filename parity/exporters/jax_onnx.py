"""JAX -> ONNX with jax2onnx (weights are folded into the graph as initializers)."""

from __future__ import annotations

from parity.exporters.common import ExportJob, check_onnx_ops, graph_input_names, onnx_meta, save_onnx
from parity.model import layouts
from parity.sources.jax import forward_outputs, packed


def export(job: ExportJob) -> dict:
    import jax
    from jax2onnx import to_onnx

    spec = job.spec
    params = {name: layouts.held_array(p, job.weights[name], "float32") for name, p in spec.params.items()}

    names = [i.name for i in spec.model_inputs]

    def forward(*xs):
        return forward_outputs(spec, spec.jax_apply(params, packed(dict(zip(names, xs))), None))

    shapes = [jax.ShapeDtypeStruct(spec.input_shape(i.name, job.batch_size), "float32" if i.floating else i.dtype)
              for i in spec.model_inputs]
    model = to_onnx(forward, shapes, model_name=spec.name, opset=job.opset, input_names=names,
                    output_names=list(spec.outputs))
    check_onnx_ops(model, "jax2onnx")
    save_onnx(model, job.out_dir)
    return onnx_meta(spec, graph_input_names(model), [o.name for o in model.graph.output], spec.model_inputs[0].layout)


