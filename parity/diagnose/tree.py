"""The worker task of a descent into the model's own tree: one level's values, on the reference or on a path.

The reference side builds the model's source in the golden's dtype (float64 where the golden was made in it) from
the golden weights, finds the children of a scope (``parity.diagnose.tree_torch``: the modules it calls, in call
order) and returns their values and inputs; its outputs must reproduce the golden outputs, or nothing it says is
trusted. The path side returns the values of the module paths the reference side chose: a native source by the same
hooks in the path's dtype; an exported ONNX graph by the exporter's own records of where each node came from
(torch.onnx's ``pkg.torch.onnx.name_scopes`` metadata: the module path of every node), else by value
(``parity.diagnose.onnx_taps``), each tensor added as a graph output for one run. A module called more than once
maps to the nodes of its first call (the first connected group of its nodes). NumPy at import.
"""

from __future__ import annotations

from pathlib import Path

from parity.check import closeness
from parity.golden import store as golden
from parity.model import feeds
from parity.model.workspace import Workspace
from parity.run import paths

# the module that reads each source framework's tree: ``level_of(runner, x, scope, names)`` (see tree_torch)
TREE_MODULES = {"torch": "parity.diagnose.tree_torch", "jax": "parity.diagnose.tree_jax",
                "tf": "parity.diagnose.tree_keras"}
TREE_SOURCES = tuple(TREE_MODULES)
NOT_READ = {"onnx": "an ONNX file is its own graph: its taps are its tensors"}


def level(workspace: str, model: str, golden_dir: str, precision: str, threads: int, scope: str, framework: str,
          reference: bool = False, path_id: str | None = None, names: list[str] | None = None,
          calls: dict | None = None, expected: dict | None = None, expected_inputs: dict | None = None,
          artifact_dir: str | None = None, artifact_meta: dict | None = None, device: str = "cpu",
          weight_perturbation: dict | None = None) -> dict:
    """One level of the tree under ``scope`` (``''``: the root).

    ``reference``: the source in the golden's dtype, children found here (or the ``names`` given): ``{"children", "values", "inputs",
    "reproduces"}``. Else the path ``path_id``'s values at ``names`` (``calls``: how often each is called;
    ``expected`` / ``expected_inputs``: the reference's values and inputs there, for shapes and value mapping):
    ``{"values", "inputs", "located"}``, ``located[name]`` as a diagnosis's tap rows have it, with the ``nodes`` of
    an exported graph. ``weight_perturbation``: the deliberate drift a check adds to a native path's weights."""
    spec = Workspace(workspace).load_spec(model)
    verified = golden.load(Path(golden_dir), spec)
    x = feeds.from_arrays(spec, verified.arrays["inputs.npz"])
    if framework not in TREE_SOURCES:
        raise ValueError(NOT_READ.get(framework, f"the tree of a {framework} model is not read"))
    if reference:
        dtype = verified.manifest.get("reference", {}).get("dtype", "float64")
        found = _native(spec, framework, verified, dtype, "cpu", "fp32", x, scope, names)
        reference_outputs = verified.arrays["reference.npz"]
        tolerances = spec.output_tolerances("fp32")
        stats = closeness.compare_named({n: found["outputs"][n] for n in spec.outputs if n in found["outputs"]},
                                        {n: reference_outputs[n] for n in spec.outputs}, tolerances.for_name)
        found["reproduces"] = len(stats) == len(spec.outputs) and all(s["ok"] for s in stats.values())
        return found
    path = paths.by_id(path_id, device, precision)
    if artifact_dir is None:
        found = _native(spec, framework, verified, "float32", device, precision, x, scope, names, weight_perturbation)  # compute dtype: the precision's
        return {"values": found["values"], "inputs": found["inputs"],
                "located": {n: {"found": "native"} if n in found["values"] else
                            {"found": "unmapped", "reason": "its first call returned no floating tensor"}
                            for n in names}}
    from parity.diagnose import tree_graph

    return tree_graph.level(spec, path, artifact_dir, artifact_meta, x, names, calls or {}, expected or {},
                            expected_inputs or {}, threads)


def _native(spec, framework, verified, dtype, device, precision, x, scope, names, perturbation=None) -> dict:
    """The source built from the golden weights in ``dtype`` on ``device``, one level under ``scope``."""
    import importlib

    from parity.run.tasks import perturbed
    from parity.sources import native

    weights = perturbed(verified.arrays["weights.npz"], perturbation)
    runner = native(framework)(spec, weights, spec.batch_size, dtype, device, precision)
    return importlib.import_module(TREE_MODULES[framework]).level_of(runner, x, scope, names)
