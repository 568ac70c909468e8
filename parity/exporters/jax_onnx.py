"""JAX -> ONNX with jax2onnx (weights are folded into the graph as initializers).

The spec's named axes are traced as jax2onnx symbolic dimensions (a shape entry that is a string: one
symbol per axis name, shared across the inputs), which the graph keeps as ``dim_param``; where JAX's
shape polymorphism refuses them, the export is static and ``meta["axes"]["reason"]`` says why.
"""

from __future__ import annotations

from parity.exporters.axes import REASON_CHARS, onnx_axes, short_reason
from parity.exporters.common import ExportJob, check_onnx_ops, graph_input_names, onnx_meta, save_onnx
from parity.exporters.onnx_names import name_graph
from parity.model import layouts
from parity.platform.errors import one_line
from parity.sources.jax import forward_outputs, packed


def export(job: ExportJob) -> dict:
    import jax
    from jax2onnx import to_onnx

    spec = job.spec
    # jax arrays, not NumPy ones: a definition may index a weight with a traced array (an embedding lookup)
    params = {
        name: jax.numpy.asarray(layouts.held_array(p, job.weights[name], "float32")) for name, p in spec.params.items()
    }

    names = [i.name for i in spec.model_inputs]

    def forward(*xs):
        return forward_outputs(spec, spec.jax_apply(params, packed(dict(zip(names, xs))), None))

    def shapes(dynamic: bool) -> list:
        """Each input's shape (a named axis as its name where ``dynamic``) and dtype."""
        result = []
        for i in spec.model_inputs:
            shape: tuple[int | str, ...] = spec.input_shape(i.name, job.batch_size)
            if dynamic:
                shape = tuple(axis or size for axis, size in zip(i.axis_names, shape))
            result.append(jax.ShapeDtypeStruct(shape, "float32" if i.floating else i.dtype))
        return result

    def convert(dynamic: bool):
        # named here, not by jax2onnx, which refuses a key that names an inner value or one array under two keys
        model = to_onnx(forward, shapes(dynamic), model_name=spec.name, opset=job.opset)
        name_graph(model, names, list(spec.outputs))
        return model

    reason = None
    model = None
    if any(axis for i in spec.model_inputs for axis in i.axis_names):
        try:
            model = convert(True)
            check_onnx_ops(model, "jax2onnx")
        except Exception as error:  # noqa: BLE001 - converted static below; a static failure is the one raised
            reason = one_line(f"jax2onnx could not export the dynamic axes: {short_reason(error)}", REASON_CHARS)
            model = None
    if model is None:
        model = convert(False)
        check_onnx_ops(model, "jax2onnx")
    save_onnx(model, job.out_dir)
    layout = spec.model_inputs[0].layout
    return {
        **onnx_meta(spec, graph_input_names(model), [o.name for o in model.graph.output], layout),
        "axes": onnx_axes(spec, model, layout, reason),
    }
