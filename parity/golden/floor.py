"""The float32 noise floor of a user model, measured by its golden build (a worker task of the model's framework).

The floor of an output is the error of the model run in float32 (its own framework's float32 source; an ONNX file
under ``onnx.reference`` as it is) against the float64 reference, on the golden inputs: what float32 arithmetic
costs this model. Tolerances declared as a factor of it (``Tolerances.floor``) are derived from it
(``parity.model.user.resolve_floor``); the same source paths give each run's floor (``parity.check.noise_floor``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from parity.golden import store as golden
from parity.model import feeds, values
from parity.model.user import native_params
from parity.model.workspace import Workspace


def float32_floor(workspace: str, model: str, scratch: str, shapes: dict, params: dict) -> dict:
    """``{output: {"max_abs", "scale"}}``: each floating output of the model run in float32 on ``inputs.npz``
    against ``reference-source.npz`` (the float64 reference) in ``scratch``, over the elements finite in both;
    ``scale`` is the reference's largest finite magnitude. Outputs the float32 run does not give in float32 (an
    integer, a float16 output, a sequence) have none."""
    spec = Workspace(workspace).load_spec(model, attach_golden=False)
    spec.params = native_params(shapes, params)
    folder = Path(scratch)
    inputs = feeds.from_arrays(spec, golden.load_arrays(folder, "inputs.npz"))
    reference = golden.load_arrays(folder, "reference-source.npz")
    framework = spec.frameworks[0]
    if framework == "onnx":
        computed = _onnx_float32(spec, inputs)
    else:
        from parity import sources
        from parity.golden import weights as golden_weights

        weights = golden_weights.for_build(spec, golden_weights.ModelWeights(spec, folder))  # the model's own
        computed = sources.native(framework)(spec, weights, spec.batch_size, "float32").run(inputs)
    floors = {}
    for name in spec.outputs:
        value, want = computed.get(name), reference.get(name)
        if not isinstance(value, np.ndarray) or value.dtype != np.float32 or want is None:
            continue
        if want.shape != value.shape or want.dtype.kind != "f":
            continue
        both = np.isfinite(value) & np.isfinite(want)
        error = np.abs(value[both].astype(np.float64) - want[both])
        floors[name] = {
            "max_abs": float(error.max(initial=0.0)),
            "scale": float(np.abs(want[np.isfinite(want)]).max(initial=0.0)),
        }
    return floors


def _onnx_float32(spec, x: dict) -> dict:
    """The ONNX graph's outputs under ``onnx.reference``, as the graph is (the ``onnx/onnxref`` path's
    arithmetic); a graph with sequences or optionals gives none."""
    from parity.interop import onnx_file as onnx_source

    if spec.containers:
        return {}
    model = onnx_source.load_checked(spec.onnx_model_path)
    return onnx_source.reference_outputs(model, values.typed_inputs(spec, x), "float32")
