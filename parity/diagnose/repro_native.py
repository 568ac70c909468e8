"""A failing path that is no ONNX graph reduced to the leaf layer its diagnosis found, written as a bug report.

The descent into the model's tree (``parity.diagnose.descend``) names the leaf layer where the drift begins; here that
layer is taken alone from the model as the path builds it (float32, the golden weights) and written in the path's
own format, with the reference's float64 input and output of the leaf in the model (``input.npy``,
``expected.npy``), a standalone ``repro.py`` (exits 1 while the departure is present, 0 once fixed) and
``README.md``:

* ``tf/litert``: ``model.tflite``, the Keras layer alone in a ``keras.Input`` of its input's shape, converted with the
  path's own converter settings (``parity.exporters.tf_litert.convert``), run by ai_edge_litert's interpreter;
* ``tf/xla`` and ``tf``: ``saved_model/``, a ``tf.function`` of the layer alone with its weights (a SavedModel needs
  no Keras and none of the user's code to load), run under ``tf.function(jit_compile=True)`` and with TensorFlow's
  own kernels;
* ``jax``: ``leaf.jax_exported``, the Flax module alone applied to its own variables, serialised by ``jax.export``
  (StableHLO, float32, the weights as constants), run under ``jax.jit``.

Nothing is written unless it is verified first, in the worker: the layer alone must compute the expected output in
float64 (it is the same function as in the model: it reads one input and no state) and must depart from it over the
path's tolerance as the path runs it (the same failure the check saw, in one layer). NumPy at import.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from parity.platform import safefs

PATHS = ("tf/litert", "tf/xla", "tf", "jax")  # the paths a one-layer reproducer is made for
FILES = {"tf/litert": "model.tflite", "tf/xla": "saved_model", "tf": "saved_model", "jax": "leaf.jax_exported"}
RUNS = {
    "tf/litert": "LiteRT (ai_edge_litert's interpreter, default delegate)",
    "tf/xla": "XLA (tf.function(jit_compile=True))",
    "tf": "TensorFlow's kernels (tf.function, no XLA)",
    "jax": "jax.jit (the deserialised StableHLO, float32)",
}

HEAD = '''"""Runs @FILE@ (the layer @LAYER@ alone, as @PATH@ builds it) on input.npy and compares with expected.npy (the
float64 reference of the layer in the model): exits 1 while the error is over the path's tolerance, 0 once within."""
import sys
from pathlib import Path

import numpy as np

ATOL, RTOL, SCALED, THREADS = @ATOL@, @RTOL@, @SCALED@, @THREADS@
HERE = Path(__file__).resolve().parent
x = np.load(HERE / "input.npy")
x = x.astype(np.float32) if x.dtype.kind == "f" else x  # an integer input (token ids) is fed as it is
want = np.load(HERE / "expected.npy")


def judged(label, got):
    """Prints the error of ``got`` against the float64 expected output; True where it is over the tolerance."""
    got = np.asarray(got, np.float64)
    if got.shape != want.shape:
        print(f"{label}: shape {got.shape} where {want.shape} is expected")
        return True
    error, magnitude = np.abs(got - want), np.abs(want)
    allowance = ATOL + RTOL * magnitude + SCALED * magnitude.max(initial=0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        units = float(np.max(np.where(error == 0, 0.0, error / allowance), initial=0.0))
        relative = float(np.max(error / np.maximum(magnitude, 1e-30), initial=0.0))
    bad = not np.isfinite(got).all() or not units <= 1
    print(f"{label}: max abs error {error.max(initial=0.0):.3g}, max relative error {relative:.3g}, {units:.3g} "
          f"tolerance units (atol {ATOL:g} + rtol {RTOL:g} * |expected| + {SCALED:g} * max |expected|): "
          f"{'over' if bad else 'within'} the path's tolerance")
    return bad


'''
BODY = {
    "tf/litert": """from ai_edge_litert import interpreter as litert

interpreter = litert.Interpreter(model_path=str(HERE / "model.tflite"), num_threads=THREADS)
interpreter.allocate_tensors()
detail = interpreter.get_input_details()[0]
interpreter.set_tensor(detail["index"], x.astype(detail["dtype"]))
interpreter.invoke()
bad = judged("LiteRT (model.tflite)", interpreter.get_tensor(interpreter.get_output_details()[0]["index"]))
""",
    "tf/xla": """import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(THREADS)
leaf = tf.saved_model.load(str(HERE / "saved_model"))
eager = judged("TensorFlow's kernels (no XLA)", leaf.serve(x))
xla = judged("XLA (tf.function(jit_compile=True))", tf.function(leaf.serve, jit_compile=True)(x))
bad = @BAD@
""",
    "jax": """import jax

exported = jax.export.deserialize(bytearray((HERE / "leaf.jax_exported").read_bytes()))
bad = judged("jax.jit (StableHLO, float32)", jax.jit(exported.call)(x))
""",
}
PLAIN = {"tf/litert": "float32", "tf/xla": "eager"}  # the plain float32 run a path's own departure is told from
OTHERS = {  # what each other run of the layer shows beside the path's
    "float32": "the same layer in Keras at float32 (TensorFlow's kernels)",
    "eager": "the same function with TensorFlow's kernels (no XLA)",
    "xla": "the same function under XLA (jit_compile=True)",
}
TAIL = """print("the departure is present" if bad else "within the tolerance: fixed")
sys.exit(1 if bad else 0)
"""


class NotReproduced(Exception):
    """Why no one-layer reproducer could be made (its message is the reason)."""


def leaf_of(diagnosis: dict) -> str | None:
    """The leaf layer the diagnosis's descent named (its path in the model's tree), or None where it named none."""
    tree = diagnosis.get("tree") or {}
    leaf = tree.get("leaf") or {}
    return leaf.get("tap") if tree.get("verdict") == "leaf" and leaf.get("tap") else None


def script(path_id: str, layer: str, tolerance, threads: int) -> str:
    """``repro.py`` of ``path_id``'s reproducer."""
    body = BODY["tf/xla" if path_id == "tf" else path_id].replace("@BAD@", "xla" if path_id == "tf/xla" else "eager")
    text = HEAD + body + TAIL
    for key, value in {
        "@FILE@": FILES[path_id],
        "@LAYER@": layer,
        "@PATH@": path_id,
        "@ATOL@": repr(float(tolerance.atol)),
        "@RTOL@": repr(float(tolerance.rtol)),
        "@SCALED@": repr(float(tolerance.scaled)),
        "@THREADS@": str(int(threads)),
    }.items():
        text = text.replace(key, value)
    return text


def write(
    workspace: str,
    model: str,
    path_id: str,
    golden_dir: str,
    precision: str,
    threads: int,
    diagnosis: dict,
    out_dir: str,
    environment: dict,
    command: str,
    weight_perturbation: dict | None = None,
) -> dict:
    """Worker task (the source framework's): the leaf of ``diagnosis`` alone in ``path_id``'s format, verified, then
    written at ``out_dir`` (atomically). ``{"written": True, "layer", "class", "file", "shape", "stats"}``, or
    ``{"written": False, "reason"}`` where no one-layer reproducer fails as the path does."""
    from parity.golden import store as golden
    from parity.golden import weights as kept_weights
    from parity.model import feeds
    from parity.model.workspace import Workspace
    from parity.run.tasks import perturbed

    layer = leaf_of(diagnosis)
    if path_id not in PATHS or layer is None:
        return {"written": False, "reason": f"no one-layer reproducer is made for {path_id} without a leaf layer"}
    if path_id == "tf/litert" and (diagnosis.get("links") or {}).get("enters_at") == "definition":
        return {
            "written": False,
            "reason": "its diagnosis finds the drift entering at the definition (tf at float32 departs from the "
            "golden as tf/litert does): it is not LiteRT's (`parity repro --path tf` reduces it)",
        }
    spec = Workspace(workspace).load_spec(model)
    verified = golden.load(Path(golden_dir), spec)
    x = feeds.from_arrays(spec, verified.arrays["inputs.npz"])
    weights = kept_weights.for_build(spec, verified.arrays["weights.npz"])  # a user model's: its builder's own
    dtype = verified.manifest.get("reference", {}).get("dtype", "float64")
    tolerance = spec.output_tolerances(precision).for_name(layer)
    path_weights = perturbed(verified.arrays["weights.npz"], weight_perturbation) if weight_perturbation else weights
    built = {"weights": path_weights, "dtype": dtype, "threads": threads}
    try:
        if path_id == "jax":
            leaf = _jax_leaf(spec, x, weights, layer, **built)
        else:
            leaf = _keras_leaf(spec, x, weights, layer, path_id, **built)
        stats = _verified(leaf, tolerance, path_id)
    except NotReproduced as error:
        return {"written": False, "reason": str(error)}
    _write_folder(Path(out_dir), leaf, path_id, tolerance, threads, stats, diagnosis, environment, command)
    return {
        "written": True,
        "layer": layer,
        "class": leaf["class"],
        "file": FILES[path_id],
        "shape": list(leaf["input"].shape),
        "stats": stats,
    }


def _verified(leaf: dict, tolerance, path_id: str) -> dict:
    """The errors of the one-layer reproducer against the expected output; raises ``NotReproduced`` where the layer
    alone does not compute the expected output in float64, or does not depart over the tolerance on the path."""
    from parity.check.closeness import error_stats

    expected = leaf["expected"]
    stats = {label: error_stats(np.asarray(value), expected, tolerance) for label, value in leaf["runs"].items()}
    own = stats["float64"]
    if not own.get("ok"):
        raise NotReproduced(
            f"{leaf['layer']} alone does not compute its output in the model from its first input, even in float64 "
            f"({own.get('reason') or format(own['tol_units'], '.3g') + ' tolerance units'}): it reads more than "
            f"that input (a second input, a mask, state)"
        )
    if stats["path"].get("ok"):
        raise NotReproduced(
            f"{leaf['layer']} alone, as {path_id} runs it, stays within the tolerance "
            f"({stats['path']['tol_units']:.3g} tolerance units): the path's failure needs more of the model "
            f"than this layer"
        )
    other = PLAIN.get(path_id)
    if other is not None and not stats[other].get("ok"):
        raise NotReproduced(
            f"{leaf['layer']} alone departs as much in {OTHERS[other]} "
            f"({stats[other].get('reason') or format(stats[other]['tol_units'], '.3g') + ' tolerance units'}): "
            f"the departure is float32's own, not {RUNS[path_id]}'s (`parity repro --path tf` reduces it)"
        )
    return {label: {k: v for k, v in s.items() if isinstance(v, (int, float, str, bool))} for label, s in stats.items()}


# --------------------------------------------------------------------------- Keras: tf/litert, tf/xla, tf


def _keras_leaf(spec, x, golden_weights, layer, path_id, *, weights, dtype, threads) -> dict:
    """The Keras leaf alone: its float64 input and output in the model (the layer's own layout), and its value in
    float64 (the reference's layer), in TensorFlow's float32 and as the path runs it, with the artifact's bytes or
    folder."""
    import keras
    import tensorflow as tf

    from parity.diagnose.tree import keras_tree
    from parity.model import layouts
    from parity.sources.tf import KerasSource, build_model

    reference = KerasSource(spec, golden_weights, spec.batch_size, dtype, "cpu", "fp32")
    found = keras_tree.level_of(reference, x, "", [layer])
    child = _one_input(layer, next((c for c in found["children"] if c["path"] == layer), None), found)
    canonical = spec.model_inputs[0].layout
    fed = layouts.to_layout(_kept(found["inputs"][layer]), canonical, reference.layout)
    expected = layouts.to_layout(np.asarray(found["values"][layer], np.float64), canonical, reference.layout)
    floating = fed.dtype.kind == "f"
    with tf.device("/CPU:0"):
        path_model = build_model(spec, weights, "float32")  # as the exporter and the native source build it
        path_layer = keras_tree.resolve(keras, path_model, layer)
        own = keras_tree.resolve(keras, reference.model, layer)
        if own is None or path_layer is None:
            raise NotReproduced(f"{layer} is not a layer of the model as built for the reference and the path")
        as_path = tf.float32 if floating else tf.as_dtype(fed.dtype)
        runs = {
            "float64": _keras_value(tf, own(tf.constant(fed, own.compute_dtype if floating else fed.dtype)), layer),
            "float32": _keras_value(tf, path_layer(tf.constant(fed, as_path)), layer),
        }
        signature = tf.TensorSpec(fed.shape, as_path)
        leaf = {"layer": layer, "class": child["class"], "input": fed, "expected": expected, "runs": runs}
        if path_id == "tf/litert":
            from parity.exporters.tf_litert import convert

            inp = keras.Input(batch_shape=fed.shape, dtype=as_path.name)
            one = keras.Model(inp, path_layer(inp), name=path_model.name)
            data = convert(tf, tf.function(one), [signature], one)
            runs["path"] = _litert_value(data, fed, threads, layer)
            leaf["artifact"] = data
        else:
            function = tf.function(path_layer, input_signature=[signature])
            holder = tf.Module()
            holder.layer, holder.serve = path_layer, function
            leaf["artifact"] = holder
            eager = _keras_value(tf, function(tf.constant(fed, as_path)), layer)
            xla = _keras_value(tf, tf.function(function, jit_compile=True)(tf.constant(fed, as_path)), layer)
            runs.update(eager=eager, xla=xla, path=xla if path_id == "tf/xla" else eager)
    return leaf


def _kept(value) -> np.ndarray:
    """A leaf's input as the reproducer keeps it: floating values in float64 (fed at float32), integers (token ids)
    in their own dtype."""
    value = np.asarray(value)
    return value.astype(np.float64) if value.dtype.kind == "f" else value


def _keras_value(tf, returned, layer: str) -> np.ndarray:
    """The one tensor a Keras layer returns; ``NotReproduced`` where it returns several (which of them the
    diagnosis compared is not known here)."""
    out = [t for t in tf.nest.flatten(returned) if tf.is_tensor(t)]
    if len(out) != 1:
        raise NotReproduced(
            f"{layer} returns {len(out)} tensors: a one-layer reproducer compares a layer of one output"
        )
    return np.asarray(out[0])


def _litert_value(data: bytes, fed: np.ndarray, threads: int, layer: str) -> np.ndarray:
    try:
        from ai_edge_litert import interpreter as litert
    except ImportError as error:
        raise NotReproduced(
            f"ai_edge_litert is not installed here ({error}): the .tflite layer cannot be run"
        ) from None
    interpreter = litert.Interpreter(model_content=data, num_threads=int(threads))
    interpreter.allocate_tensors()
    inputs, outputs = interpreter.get_input_details(), interpreter.get_output_details()
    if len(inputs) != 1 or len(outputs) != 1:
        raise NotReproduced(
            f"{layer} alone converts to a .tflite of {len(inputs)} inputs and {len(outputs)} outputs, not one each"
        )
    interpreter.set_tensor(inputs[0]["index"], fed.astype(inputs[0]["dtype"]))
    interpreter.invoke()
    return np.array(interpreter.get_tensor(outputs[0]["index"]))


def _one_input(layer: str, child: dict | None, found: dict) -> dict:
    """The leaf's row, where it was observed reading one input; else why it cannot be run alone."""
    if child is None or layer not in found["values"] or layer not in found["inputs"]:
        raise NotReproduced(f"{layer} is not observed in the reference (no value or input of its own)")
    if not child.get("single_input"):
        raise NotReproduced(f"{layer} reads more than one input tensor: it cannot be run alone on one input")
    return child


# --------------------------------------------------------------------------- Flax: jax


def _jax_leaf(spec, x, golden_weights, layer, *, weights, dtype, threads) -> dict:
    """The Flax leaf module alone: its float64 input and output in the model, its own variables, its value in float64
    and as the path runs it (the module exported for float32 and run under ``jax.jit``)."""
    import jax

    from parity.sources.jax import JaxSource

    reference = JaxSource(spec, golden_weights, spec.batch_size, dtype, "cpu", "fp32")
    path_runner = JaxSource(spec, weights, spec.batch_size, "float32", "cpu", "fp32")
    module, own, fed, expected = _flax_call(reference, x, layer)
    _, variables, _, _ = _flax_call(path_runner, x, layer)
    fed, expected = _kept(fed), np.asarray(expected, np.float64)
    as_path = np.float32 if fed.dtype.kind == "f" else fed.dtype
    held = jax.tree_util.tree_map(
        lambda v: np.asarray(v, np.float32) if np.asarray(v).dtype.kind == "f" else v, variables
    )
    function = jax.jit(lambda t: module.apply(held, t))
    exported = jax.export.export(function)(jax.ShapeDtypeStruct(fed.shape, as_path))
    data = bytes(exported.serialize())
    back = jax.export.deserialize(bytearray(data))
    runs = {
        "float64": _one_array(jax, module.apply(own, jax.numpy.asarray(fed)), layer),
        "path": _one_array(jax, jax.jit(back.call)(fed.astype(as_path)), layer),
    }
    return {
        "layer": layer,
        "class": f"{type(module).__module__}.{type(module).__qualname__}",
        "input": fed,
        "expected": expected,
        "runs": runs,
        "artifact": data,
    }


def _one_array(jax, returned, layer: str) -> np.ndarray:
    """The one floating array a module returns; ``NotReproduced`` where it returns several."""
    arrays = [leaf for leaf in jax.tree_util.tree_leaves(returned) if np.asarray(leaf).dtype.kind == "f"]
    if len(arrays) != 1:
        raise NotReproduced(
            f"{layer} returns {len(arrays)} arrays: a one-layer reproducer compares a module of one output"
        )
    return np.asarray(arrays[0])


def _flax_call(runner, x: dict, layer: str):
    """The first call of the linen module at ``layer`` in one eager run of the model, recorded as the descent
    records it (``jax_calls.calls_recorder``: the input and value it compared): ``(the module unbound, its
    variables, its input, its output)``; ``NotReproduced`` where no linen module has that path, it reads more
    than one array, or returns several."""
    try:
        import flax.linen as nn
    except ImportError:
        raise NotReproduced(f"{layer} is not a Flax module (Flax is not installed)") from None
    from parity.diagnose.tree.jax_calls import SEPARATOR, calls_recorder

    jax = runner.jax
    record: dict = {"order": [], "calls": {}, "modules": {}, "single": {}}
    values: dict = {}
    inputs: dict = {}
    call = calls_recorder(jax, record, values, inputs)
    returned: dict = {}

    def interceptor(next_fun, args, kwargs, context):
        module = context.module
        path = SEPARATOR.join(str(p) for p in (module.path if module.scope is not None else ()))
        if context.method_name == "setup":
            return call(None, module, next_fun, args, kwargs)
        if path == layer and not record["calls"].get(layer):  # its first call, not one inside it

            def kept(*a, **k):
                returned["value"], returned["module"] = next_fun(*a, **k), module.unbind()
                return returned["value"]

            return call(path, module, kept, args, kwargs)
        return call(path, module, next_fun, args, kwargs)

    with nn.intercept_methods(interceptor):
        runner.spec.jax_apply(runner.params, runner._input(runner.check_feed(x)), None)
    if not any(record["order"]):
        raise NotReproduced(
            f"the model calls no flax.linen module (a flax.nnx model or a plain JAX function): one-layer "
            f"reproducers on jax are made of linen modules only, and {layer} is not one"
        )
    if "module" not in returned:
        raise NotReproduced(f"{layer} is not a Flax module the model calls (a named scope is not cut out alone)")
    if not record["single"].get(layer):
        raise NotReproduced(f"{layer} reads more than one array: it cannot be run alone on one input")
    computed = [
        leaf
        for leaf in jax.tree_util.tree_leaves(returned["value"])
        if isinstance(leaf, jax.Array) and jax.numpy.issubdtype(leaf.dtype, jax.numpy.floating)
    ]
    if len(computed) != 1 or layer not in values:
        raise NotReproduced(
            f"{layer} returns {len(computed)} floating arrays: a one-layer reproducer compares a module of one output"
        )
    module, variables = returned["module"]
    return module, variables, inputs[layer], values[layer]


# --------------------------------------------------------------------------- the folder


def _write_folder(out: Path, leaf: dict, path_id, tolerance, threads, stats, diagnosis, environment, command) -> None:
    """The reproducer's folder at ``out``, replacing what is there: written in a scratch folder beside it, then
    exchanged with ``out`` at once (a symlink at ``out`` is followed)."""
    out = safefs.resolve_target(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = safefs.owned_tempdir(out.parent, f".{out.name}.tmp-")
    try:
        np.save(scratch / "input.npy", leaf["input"])
        np.save(scratch / "expected.npy", leaf["expected"])
        artifact = leaf["artifact"]
        if isinstance(artifact, bytes):
            (scratch / FILES[path_id]).write_bytes(artifact)
        else:
            import tensorflow as tf

            tf.saved_model.save(artifact, str(scratch / FILES[path_id]))
        (scratch / "repro.py").write_text(script(path_id, leaf["layer"], tolerance, threads))
        (scratch / "README.md").write_text(_readme(leaf, path_id, tolerance, stats, diagnosis, environment, command))
        safefs.replace_dir(scratch, out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _runtime(path_id: str) -> dict:
    """The version of the runtime a reproducer runs on where the environment's packages leave it out."""
    from importlib import metadata

    if path_id != "tf/litert":
        return {}
    try:
        return {"ai-edge-litert": metadata.version("ai-edge-litert")}
    except metadata.PackageNotFoundError:
        return {}


def _readme(leaf, path_id, tol, stats, diagnosis, environment, command) -> str:
    from parity.diagnose.descend import display
    from parity.diagnose.repro import _first_tap, environment_lines

    def said(label: str) -> str:
        s = stats[label]
        if "reason" in s:
            return s["reason"]
        return (
            f"max abs error {s['max_abs']:.3g}, max relative {s['max_rel']:.3g} = {s['tol_units']:.3g} tolerance units"
        )

    versions = environment.get("packages", {})
    cause = diagnosis.get("cause") or {}
    trail = diagnosis.get("first_divergent_path") or [leaf["layer"]]
    title = " ".join(str(p) for p in (diagnosis.get("model"), diagnosis.get("path") or path_id) if p)
    shape = "x".join(map(str, leaf["input"].shape))
    other = {**PLAIN, "tf": "xla"}.get(path_id)
    others = [f"- {OTHERS[other]}: {said(other)}"] if other is not None and other in stats else []
    artifact = {
        "tf/litert": "`model.tflite`: the layer alone in a `keras.Input` of its input's shape, with its weights, "
        "converted as the path converts (TFLite builtins only, no optimizations, float32, variables frozen)",
        "tf/xla": "`saved_model/`: a `tf.function` of the layer alone with its weights (`serve`); loading it needs "
        "TensorFlow only",
        "tf": "`saved_model/`: a `tf.function` of the layer alone with its weights (`serve`); loading it needs "
        "TensorFlow only",
        "jax": "`leaf.jax_exported`: the Flax module alone applied to its own variables, serialised by `jax.export` "
        "(StableHLO, float32 input, the weights as constants)",
    }[path_id]
    lines = [
        f"# {title}: {leaf['layer']} departs from float64 in one layer ({RUNS[path_id]})",
        "",
        *environment_lines({**versions, **_runtime(path_id)}, environment),
        "",
        "## What diverges",
        "",
        f"- layer: {display(trail)} ({leaf['class']}), alone on its input in the model ({shape})",
        f"- on the path, {RUNS[path_id]}: {said('path')} (atol {tol.atol:g}, rtol {tol.rtol:g}"
        + (f", {tol.scaled:g} of the largest |expected|" if tol.scaled else "")
        + "): over the tolerance",
        f"- the same layer in float64: {said('float64')}: the layer alone computes its output in the model",
        *others,
        f"- first divergent tap of the diagnosis: {_first_tap(diagnosis)}",
        f"- tested cause: {cause.get('description') or 'none confirmed'}",
        *([f"- fix: {cause['fix']}"] if cause.get("fix") else []),
        "",
        "## Files",
        "",
        f"- {artifact}",
        (
            "- `input.npy`: the layer's input in the model, float64, from the reference (the model's source in "
            "float64 with the golden weights); the script feeds it as float32"
        ),
        "- `expected.npy`: the layer's output in the model from the same reference, float64",
        "",
        "## Reproduce",
        "",
        "    python repro.py    # exits 1 while the departure is present, 0 once fixed",
        "",
        *([f"Made by `{command}`.", ""] if command else []),
    ]
    return "\n".join(lines)
