"""JAX -> TensorFlow with jax2tf, saved as a SavedModel whose weights stay tf.Variables.

The saved function keeps its gradient (``with_gradient=True`` and custom gradients saved),
so the ``jax/tf`` path can be differentiated in TensorFlow. Current JAX serialises through
the ``XlaCallModule`` op.

The spec's named axes are shape-polymorphic (``polymorphic_shapes`` with the axis names as symbols) and
None in the saved ``input_signature``; where JAX's shape polymorphism refuses them, the SavedModel is saved
static and ``meta["axes"]["reason"]`` says why.

JAX serialises the StableHLO it hands to ``XlaCallModule`` at a version about four weeks old; a TensorFlow built
against an older StableHLO cannot load what it does not know (a CHLO op such as ``erf``, ``sinh`` or ``top_k``
serialised as a ``vhlo.composite_v2``). The export serialises at the newer of what both read instead: JAX's own
choice or the installed TensorFlow's StableHLO version, whichever is older, with each composite op replaced by a
call of its decomposition, whose shapes TensorFlow refines at every batch size (``meta["stablehlo"]`` records the
version and the composites).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from parity.exporters import tf_onnx
from parity.exporters.axes import REASON_CHARS, axes_record, declared_dynamic, short_reason
from parity.exporters.common import ExportJob
from parity.model import layouts
from parity.platform.errors import ExportError, one_line
from parity.sources.jax import forward_outputs, packed

SAVED_ENTRIES = ("saved_model.pb", "fingerprint.pb", "variables", "assets")  # what a failed save may leave


def export(job: ExportJob) -> dict:
    spec = job.spec
    layout = spec.model_inputs[0].layout
    wanted = declared_dynamic(spec, layout)
    reason = None
    forward = None
    with serialised_for_tensorflow() as stablehlo:
        if any(wanted.values()):
            try:
                forward, names = _save(job, wanted)
            except Exception as error:  # noqa: BLE001 - saved static below; a static failure is the one raised
                reason = one_line(f"jax2tf could not save the dynamic axes: {short_reason(error)}", REASON_CHARS)
                _clear(job.out_dir)
                forward = None
        if forward is None:
            forward, names = _save(job, None)
    shapes = {
        i.name: (None if s.shape.rank is None else s.shape.as_list())
        for i, s in zip(spec.model_inputs, forward.input_signature)
    }
    return {
        "format": "tf-savedmodel",
        "param_names": names,
        "input_layout": layout,
        "canonical_layout": spec.model_inputs[0].layout,
        "output_names": list(spec.outputs),
        "axes": axes_record(spec, shapes, layout, reason),
        "stablehlo": stablehlo,
    }


@contextlib.contextmanager
def serialised_for_tensorflow():
    """JAX exports serialised, while inside, at a StableHLO version the installed TensorFlow reads. Yields
    ``{"version", "jax", "tensorflow"}``: the version used and each side's own (None where one cannot be read:
    then JAX's own choice is kept, and a module TensorFlow cannot load fails when it runs) and ``"composites"``, the
    names of the composite ops replaced by calls of their decompositions. A model JAX cannot serialise at that
    version raises ``ExportError`` saying it is the installed pair's limit."""
    from jax._src.export import _export
    from jax._src.lib.mlir.dialects import hlo

    ours = str(hlo.get_version_from_compatibility_requirement(hlo.StablehloCompatibilityRequirement.WEEK_4))
    theirs = tensorflow_stablehlo_version()
    record: dict = {"version": ours, "jax": ours, "tensorflow": theirs, "composites": []}
    serialise = getattr(_export, "_module_to_bytecode", None)
    if theirs is None or serialise is None:
        yield record
        return
    import jax
    from jax._src import xla_bridge
    from jax._src.lib import _jax
    from jax._src.lib.mlir import passmanager

    if _version(theirs) < _version(ours):
        record["version"] = theirs

    sdy = xla_bridge.get_backend().serialize_with_sdy

    def to_bytecode(module) -> bytes:
        try:
            data = _jax.mlir.serialize_portable_artifact(module, record["version"], sdy)
        except Exception as error:
            if record["version"] == ours:  # JAX's own version: TensorFlow is not what limits it
                raise
            raise ExportError(
                f"a limit of the installed JAX and TensorFlow, not of the model: JAX {jax.__version__} cannot "
                f"serialise this model at StableHLO {record['version']}, the newest TensorFlow "
                f"{tf_version()} reads ({one_line(str(error), 200)}); install a TensorFlow built on StableHLO "
                f"{ours} or later"
            ) from None
        with module.context:
            portable = _jax.mlir.deserialize_portable_artifact(data)
            found = _calls_for_composites(portable)
            if not found:
                return data
            record["composites"] = sorted({*record["composites"], *found})
            passmanager.PassManager.parse("builtin.module(inline,symbol-dce)").run(portable.operation)
            return _jax.mlir.serialize_portable_artifact(portable, record["version"], sdy)

    _export._module_to_bytecode = to_bytecode
    try:
        yield record
    finally:
        _export._module_to_bytecode = serialise


def _calls_for_composites(module) -> list[str]:
    """Replace each ``stablehlo.composite`` op of ``module`` by a call of its decomposition (what XLA runs where it
    has no kernel of its own for the composite); returns their names. TensorFlow refines the shapes of a called
    function, not those of a composite's decomposition, so a composite left in runs at static shapes only."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import func

    found = []

    def walk(operation) -> None:
        for region in operation.regions:
            for block in region.blocks:
                for op in list(block.operations):
                    op = op.operation
                    walk(op)
                    if op.name != "stablehlo.composite":
                        continue
                    found.append(ir.StringAttr(op.attributes["name"]).value)
                    with ir.Location.unknown(), ir.InsertionPoint(op):
                        call = func.CallOp(
                            [r.type for r in op.results], op.attributes["decomposition"], list(op.operands)
                        )
                    for old, new in zip(op.results, call.results):
                        old.replace_all_uses_with(new)
                    op.erase()

    walk(module.operation)
    return found


def tensorflow_stablehlo_version() -> str | None:
    """The StableHLO version the installed TensorFlow reads up to (None where it does not say)."""
    try:
        from tensorflow.compiler.mlir.stablehlo import stablehlo

        return str(stablehlo.get_current_version())
    except (ImportError, AttributeError):
        return None


def tf_version() -> str:
    import tensorflow as tf

    return tf.__version__


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _save(job: ExportJob, dynamic: dict[str, set[int]] | None):
    """Convert and save; ``dynamic`` (input name -> axis indices) are polymorphic in jax2tf and None in the
    saved signature. Returns (the saved tf.function, the parameter names)."""
    import tensorflow as tf
    from jax.experimental import jax2tf

    spec = job.spec
    names = list(spec.params)
    module = tf.Module()
    module.param_list = [
        tf.Variable(
            layouts.held_array(spec.params[n], job.weights[n], "float32"),
            name=n.replace("/", "."),
            trainable=spec.params[n].trainable,
        )
        for n in names
    ]

    inputs = [i.name for i in spec.model_inputs]

    def apply(param_values, *xs):
        return forward_outputs(
            spec, spec.jax_apply(dict(zip(names, param_values)), packed(dict(zip(inputs, xs))), None)
        )

    layout = spec.model_inputs[0].layout
    options = {}
    if dynamic is not None:
        options["polymorphic_shapes"] = [None] + [
            _polymorphic(spec, i, job.batch_size, dynamic) for i in spec.model_inputs
        ]
    converted = jax2tf.convert(apply, with_gradient=True, **options)

    @tf.function(autograph=False, input_signature=tf_onnx.signature(tf, spec, job.batch_size, layout, dynamic))
    def forward(*xs):
        return converted(list(module.param_list), *xs)

    forward.get_concrete_function()  # traced here, so a refused polymorphic shape fails before anything is saved
    module.forward = forward
    tf.saved_model.save(
        module, str(job.out_dir), options=tf.saved_model.SaveOptions(experimental_custom_gradients=True)
    )
    return forward, names


def _polymorphic(spec, i, batch_size: int, dynamic: dict[str, set[int]]) -> str:
    """jax2tf's polymorphic shape of input ``i``: ``"(batch, 64)"``, an axis name where it is dynamic."""
    shape = spec.input_shape(i.name, batch_size)
    left = dynamic.get(i.name, ())
    dims = [axis if k in left else str(size) for k, (axis, size) in enumerate(zip(i.axis_names, shape))]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def _clear(out_dir) -> None:
    """Remove what a failed save may have written (the folder is the exporter's own)."""
    import shutil

    for name in SAVED_ENTRIES:
        path = Path(out_dir) / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink()
