"""The worker task of a descent into the model's own tree: each level's values, on the reference and on a path.

The reference side builds the model's source in the golden's dtype (float64 where the golden was made in it) from
the golden weights, finds the children of a scope (``parity.diagnose.tree.torch_tree``: the modules it calls, in call
order) and returns their values and inputs; its outputs must reproduce the golden outputs, or nothing it says is
trusted. The path side returns the values of the module paths the reference side chose: a native source by the same
hooks in the path's dtype; an exported ONNX graph by the exporter's own records of where each node came from
(torch.onnx's ``pkg.torch.onnx.name_scopes`` metadata: the module path of every node), else by value
(``parity.diagnose.graph.onnx_taps``), each tensor added as a graph output for one run. A module called more than once
maps to the nodes of its first call (the first connected group of its nodes). The whole descent is one task in the
source framework's worker (ONNX Runtime runs there too), so neither side is built twice. NumPy at import.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from parity.check import closeness, noise_floor
from parity.diagnose.graph import mapping_check
from parity.diagnose.tree import READERS
from parity.diagnose.tree.walk import walk
from parity.golden import store as golden
from parity.model import feeds
from parity.model.workspace import Workspace
from parity.run import kept, paths


class Tree:
    """One model's tree on its reference and on one path, each side built once: the source in the golden's dtype
    from the golden weights, and the path (a native source in the path's precision, or the path's exported graph,
    ``graph_tree.GraphLevels``)."""

    def __init__(self, workspace: str, model: str, golden_dir: str, framework: str, precision: str, threads: int):
        if framework not in READERS:
            raise ValueError(f"the tree of a {framework} model is not read")
        self.spec = Workspace(workspace).load_spec(model)
        self.verified = golden.load(Path(golden_dir), self.spec)
        self.framework, self.precision, self.threads = framework, precision, threads
        self.x = feeds.from_arrays(self.spec, self.verified.arrays["inputs.npz"])
        self.reader = READERS[framework]
        self.path_side: Any = None  # the path's runner, or the ``GraphLevels`` of its exported graph
        self._reproduces = False  # whether the reference's last whole run gave the golden outputs
        self.levels_read = 0  # the levels the reference side has read (the level now read, for progress lines)

    @property
    def reference_runner(self):
        """The source in the golden's dtype from the golden weights (``onnx.reference`` on an ONNX file's own graph)."""
        return self._reference.runner

    @functools.cached_property
    def _reference(self) -> _Reference:
        """The reference side, kept by the worker for the next descent of the same model (another path's): it
        depends only on the model and its golden data (``parity.run.kept``)."""
        dtype = self.verified.manifest.get("reference", {}).get("dtype", "float64")
        key = (*kept.model_key(self.spec, self.verified.manifest), self.framework, dtype)
        return kept.kept("tree-reference", key, lambda: _Reference(self, dtype))

    def reference(self, scope: str, names: list[str] | None = None) -> dict:
        """``{"children", "values", "inputs", "reproduces"}`` under ``scope`` (or at ``names``): ``reproduces`` says
        whether the run's outputs are the golden's, without which nothing it shows is trusted."""
        levels = self._reference_levels
        if names is None:
            self.levels_read += 1
        if hasattr(levels, "progress"):  # a level's modules as the reference runs them (``torch_tree.Levels``)
            levels.progress = functools.partial(_module_progress, self.levels_read) if names is None else None
        found = levels.level(scope, names)
        skipped = tuple(self.spec.tree_skip)
        found["children"] = [
            c
            for c in found.get("children", [])
            if not any(c["path"] == s or c["path"].startswith((f"{s}.", f"{s}/")) for s in skipped)
        ]
        if found.pop("whole", True):  # a module run on its own (``torch_tree.Levels``) is judged by the whole run's
            golden_outputs = self.verified.arrays["reference.npz"]
            stats = closeness.compare_named(
                {n: found["outputs"][n] for n in self.spec.outputs if n in found["outputs"]},
                {n: golden_outputs[n] for n in self.spec.outputs},
                self.spec.output_tolerances("fp32").for_name,
            )
            self._reproduces = len(stats) == len(self.spec.outputs) and all(s["ok"] for s in stats.values())
        found["reproduces"] = self._reproduces
        return found

    def on_path(
        self,
        path_id: str,
        device: str = "cpu",
        artifact_dir: str | None = None,
        artifact_meta: dict | None = None,
        weight_perturbation: dict | None = None,
        plain: dict | None = None,
    ) -> None:
        """Build the path's side: a native runner (with the deliberate drift a check may add to its weights), the
        exported graph (``plain``: its plain outputs where the caller ran them), a ``.tflite`` file
        (``litert_tree.LiteRTLevels``), or a jax2tf SavedModel (``jax_tf_tree.Jax2TfLevels``)."""
        from parity.run.tasks import weights_for
        from parity.sources import native

        path = paths.by_id(path_id, device, self.precision)
        if artifact_dir is None:
            weights = weights_for(self.spec, self.verified, weight_perturbation)
            # a Keras path's own runner: ``tf/xla``'s compiles with XLA, and its tree is read inside that compilation
            runner = paths.load_target(path.runtime_target) if self.framework == "tf" else native(self.framework)
            self.path_side = runner(self.spec, weights, self.spec.batch_size, "float32", device, self.precision)
        elif str((artifact_meta or {}).get("file", "")).endswith(".tflite"):  # LiteRT: the converter's tensor names
            from parity.diagnose.tree.litert_tree import LiteRTLevels

            self.path_side = LiteRTLevels(self.spec, path, artifact_dir, artifact_meta, self.x, self.threads)
        elif (artifact_meta or {}).get("format") == "tf-savedmodel":  # jax2tf: the reader's function, converted alike
            from parity.diagnose.tree.jax_tf_tree import Jax2TfLevels

            weights = self.verified.arrays["weights.npz"]
            self.path_side = Jax2TfLevels(self.spec, path, artifact_dir, artifact_meta, self.x, self.threads, weights)
        else:
            from parity.diagnose.tree.graph_tree import graph_levels

            self.path_side = graph_levels(self.spec, path, artifact_dir, artifact_meta, self.x, self.threads, plain)

    def path(self, scope: str, names: list[str], calls: dict, expected: dict, expected_inputs: dict) -> dict:
        """``{"values", "inputs", "located"}`` of the path at ``names`` (``located[name]`` as a diagnosis's tap rows
        have it, with the ``nodes`` of an exported graph)."""
        if hasattr(self.path_side, "level"):
            found = self.path_side.level(names, calls, expected, expected_inputs)
            return {**found, "output_units": self._output_units}
        found = self._path_levels.level(scope, names)
        unseen = found.get("located") or {}  # a reader's own reasons (XLA: unobservable inside the compilation)
        return {
            "values": found["values"],
            "inputs": found["inputs"],
            "located": {
                n: {"found": "native"}
                if n in found["values"]
                else unseen.get(n) or {"found": "unmapped", "reason": "its first call returned no floating tensor"}
                for n in names
            },
            "instrumentation": found.get("instrumentation"),
        }

    @property
    def _reference_levels(self):
        """The reference side's levels: a reader's ``Levels`` (JAX, Keras: every module's value at all depths from
        one run), else one ``level_of`` per level."""
        return self._reference.levels

    @functools.cached_property
    def _path_levels(self):
        return _levels(self.reader, self.path_side, self.x, {})

    @functools.cached_property
    def _output_units(self) -> float | None:
        """The exported graph's worst output error against the golden, in tolerance units (what a graph-read
        module's divergence must not contradict, ``mapping_check.withdraw_contradicted``): the graph's outputs
        are the same at every level, so it is worked out once."""
        side = self.path_side
        by_name = dict(zip(side.outputs, self.spec.outputs))
        stats = closeness.compare_named(
            {by_name[n]: v for n, v in side.plain.items() if n in by_name},
            {n: self.verified.arrays["reference.npz"][n] for n in self.spec.outputs},
            self.spec.output_tolerances(self.precision).for_name,
        )
        return mapping_check.output_units(stats)


PROGRESS_S = 2.0  # a level's progress lines: its first module's, then one at most every this many seconds
_said = [0.0]  # when the last progress line was sent


def _module_progress(level: int, k: int, n: int, path: str) -> None:
    """``level N, module k of n (path)`` for the run's progress (``parity.run.worker.report``)."""
    import time

    from parity.run.worker import report

    now = time.monotonic()
    if k == 1 or now - _said[0] >= PROGRESS_S:
        _said[0] = now
        report(f"level {level}, module {k} of {n} ({path})")


class _Reference:
    """A tree's reference side: the source built in the golden's dtype from the golden weights, and its levels,
    read on first use."""

    def __init__(self, tree: Tree, dtype: str):
        if tree.framework == "onnx":  # the file itself under onnx.reference, as the golden was built
            from parity.diagnose.tree.onnx_tree import OnnxReference

            self.runner = OnnxReference(tree.spec, dtype, tree.x)
        else:
            from parity.run.tasks import weights_for
            from parity.sources import native

            self.runner = native(tree.framework)(
                tree.spec, weights_for(tree.spec, tree.verified), tree.spec.batch_size, dtype, "cpu", "fp32"
            )
        self.reader, self.x = tree.reader, tree.x
        self.options = {"eager": True} if tree.framework == "tf" else {}  # no tf.function traced at each level

    @functools.cached_property
    def levels(self):
        return _levels(self.reader, self.runner, self.x, self.options)


class _EachLevel:
    """A reader without ``Levels``: each level read by ``level_of`` on its own."""

    def __init__(self, reader, runner, x: dict, options: dict):
        self.reader, self.runner, self.x, self.options = reader, runner, x, options

    def level(self, scope: str, names: list[str] | None = None) -> dict:
        return self.reader.level_of(self.runner, self.x, scope, names, **self.options)


def _levels(reader, runner, x: dict, options: dict):
    make = getattr(reader, "Levels", None)
    return make(runner, x, **options) if make is not None else _EachLevel(reader, runner, x, options)


def descent(
    workspace: str,
    model: str,
    golden_dir: str,
    precision: str,
    threads: int,
    framework: str,
    path_id: str,
    artifact_dir: str | None = None,
    artifact_meta: dict | None = None,
    device: str = "cpu",
    weight_perturbation: dict | None = None,
    tolerances: dict | None = None,
    plain: dict | None = None,
) -> dict:
    """Worker task: the whole descent of ``path_id`` (``parity.diagnose.tree.walk.walk``), each side built once;
    ``tolerances``: the path's precision judged at these (``noise_floor.at_bound``); ``plain``: the exported graph's
    outputs on the golden inputs as the diagnosis's taps collection ran them (by the spec's output names)."""
    tree = Tree(workspace, model, golden_dir, framework, precision, threads)
    noise_floor.at_bound(tree.spec, precision, tolerances)
    from parity.diagnose.tree.litert_tree import NotRead

    try:
        tree.on_path(path_id, device, artifact_dir, artifact_meta, weight_perturbation, plain)
    except NotRead as error:  # a .tflite file whose tensors name no layers (litert-torch's): said, not read
        return {"descended": False, "reason": str(error)}
    result = walk(tree, framework)
    if hasattr(tree.path_side, "runs"):  # an exported graph's runs in this diagnosis: its plain one, instrumented ones
        result.setdefault("raw_tensors", {})["graph_runs"] = tree.path_side.runs
    linked = _runtime_link(tree, result)
    if linked is not None:
        result["runtime_link"] = linked
    return result


def _runtime_link(tree: Tree, result: dict) -> dict | None:
    """The runtime link on the module of an exported ONNX graph where the descent found the drift beginning
    (``parity.diagnose.graph.runtime_link``), fed what the descent's run read at its inputs, so the graph is not
    run again for them; None where the descent found no module with nodes of its own, the path is not on ONNX
    Runtime or the reference evaluator on the CPU, or the module cannot be cut out on its own (the diagnosis then
    links the runtimes in a task of its own)."""
    from parity.diagnose.graph import runtime_link
    from parity.diagnose.tree.graph_tree import GraphLevels

    side, scope = tree.path_side, runtime_link.leaf_scope(result)
    if not isinstance(side, GraphLevels) or side.path.runtime.name not in runtime_link.RUNTIMES:
        return None
    if side.path.device != "cpu" or scope is None:
        return None
    tolerances = tree.spec.output_tolerances(tree.precision)
    by_graph_name = dict(zip(side.outputs, tree.spec.outputs))
    reference = tree.verified.arrays["reference.npz"]
    try:
        return runtime_link.compare(
            side.model,
            side.feed,
            {name: reference[by_graph_name[name]] for name in side.outputs},
            lambda name: tolerances.for_name(by_graph_name.get(name, name)),
            tolerances.default,
            tree.threads,
            list(side.outputs),
            scope,
            side.folder,
            {**side.held, **side.plain},
        )
    except Exception:  # noqa: BLE001 - whatever stops the cut, the diagnosis's own task links the whole graph
        return None


def reference_at(
    workspace: str, model: str, golden_dir: str, precision: str, threads: int, framework: str, names: list[str]
) -> dict:
    """Worker task: the reference's values and inputs at the module paths ``names``, and whether it reproduces the
    golden outputs."""
    found = Tree(workspace, model, golden_dir, framework, precision, threads).reference("", names)
    return {key: found[key] for key in ("values", "inputs", "reproduces")}
