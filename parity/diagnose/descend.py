"""The descent: from the top of the model's own tree to the leaf layer where a path's drift begins.

Level by level, the children of the current scope are compared with the reference (the model's source in the golden's
dtype, from the golden weights; ``parity.diagnose.tree.descent``), and the descent goes into the first child over
tolerance whose error grew there *and whose own input agrees with the reference*: a child whose input already departs is
not blamed, the drift is in what its parent computes around its children. Only one child's subtree is opened per level,
so the cost grows with depth x branching, not with the number of modules. The descent stops at

* a leaf (a module with no children): the layer is named, typed by the catalogue and its causes tested there;
* a scope none of whose children departs, or whose first departing child reads an input that already departs: the
  drift is in the scope's own operations (functional ops between its modules), said so, with its own ONNX nodes;
* children that cannot be observed (fused by the exporter, no node of their own, unobservable): the smallest
  observed span that holds the divergence is reported, and no layer in it is named.

NumPy only; every framework runs in a worker.
"""

from __future__ import annotations

from parity.diagnose.tree import SOURCES
from parity.run import paths

DESCENT = "parity.diagnose.tree.descent:descent"
NO_TAP_DEPARTS = "the outputs differ but no tap does"  # chain.analyse's note, answered by the tree


def descend(run, pool, spec, path, artifact: dict | None, plain: dict | None = None) -> dict:
    """``{"descended", "levels", "first_divergent_path", "leaf", "verdict", "note", "cause_test"}`` for ``path``
    (see the module docstring), from one task in the source framework's worker, which says each level and module it
    reads through the run's progress; ``{"descended": False, "reason"}`` where the model's tree cannot be read.
    ``plain``: the path's outputs on the golden inputs where the caller has them (an exported graph is then not run
    plain again)."""
    framework = source_framework(spec, path)
    if framework not in SOURCES:
        return {"descended": False, "reason": f"the tree of a {framework} model is not read"}
    if artifact is None and path.exports:
        return {"descended": False, "reason": "no exported graph to descend into"}
    said = getattr(run, "progress", None)
    with pool.reporting(None if said is None else lambda line: said(f"{spec.name}: diagnose {path.id}: {line}")):
        return _descent(run, pool, spec, path, artifact, framework, plain)


def source_framework(spec, path) -> str:
    """The framework whose tree a diagnosis of ``path`` descends: the path's source, else the model's own."""
    return path.source if path.source in paths.NATIVE else spec.frameworks[0]


def tree_group(spec, path, artifact: dict | None) -> str:
    """The worker group where the descent of ``path`` runs: the source framework's (``_group``), or jax2tf's for a
    jax2tf SavedModel, whose levels are converted and run there (JAX and TensorFlow share only its worker)."""
    saved_model = artifact is not None and artifact["meta"].get("format") == "tf-savedmodel"
    return paths.JAX2TF.group if saved_model else _group(source_framework(spec, path))


def _descent(run, pool, spec, path, artifact, framework: str, plain: dict | None) -> dict:
    return pool.call(
        tree_group(spec, path, artifact),
        DESCENT,
        workspace=str(run.workspace.root),
        model=spec.name,
        golden_dir=str(run.workspace.golden_dir(spec.name)),
        precision=path.precision,
        threads=run.options.threads,
        framework=framework,
        path_id=path.id,
        artifact_dir=artifact and artifact["dir"],
        artifact_meta=artifact and artifact["meta"],
        device=path.device,
        weight_perturbation=run.options.weight_perturbation.get((spec.name, path.id)),
        tolerances=getattr(spec, "diagnosed_at", None),  # noise_floor.at_bound
        plain=plain if artifact is not None else None,
    )


def _group(framework: str) -> str:
    """The worker group that holds a source's tree: its native path's, or ONNX Runtime's for an ONNX file (no native
    path; onnx.reference and ONNX Runtime share that worker)."""
    return paths.by_id(framework).runtime.group if framework in paths.NATIVE else "onnx"


def relative(path: str, parent: str | None) -> str:
    """``blocks.5.norm`` under ``blocks.5`` is ``norm`` (``/`` separates a Keras or Flax path); an index keeps the names
    that hold it (``blocks.5``, ``layer.1``, ``features.1.3``)."""
    separator = next((s for s in ("/", ".") if parent and path.startswith(f"{parent}{s}")), None)
    if separator is None or parent is None:
        return path
    held, name = parent.split(separator), path[len(parent) + 1 :]
    while held and name.split(separator)[0].isdigit():
        name = f"{held.pop()}{separator}{name}"
    return name


def display(trail: list[str]) -> str:
    """A first divergent path as a user reads it: ``transformer › layer.1 › output_layer_norm``."""
    return " › ".join(relative(p, trail[i - 1] if i else None) for i, p in enumerate(trail))


def merge_tree(spec, result: dict, tree: dict) -> None:
    """The descent into a diagnosis: ``tree`` and ``first_divergent_path``; the leaf's cause test where the leaf is
    deeper than the spec's taps (or the top-level tap has no type); and where the tree puts the divergence in another
    top-level module than the spec's taps do (one that is not a tap), the tap is no longer named."""
    result["tree"] = tree
    trail = result["first_divergent_path"] = list(tree.get("first_divergent_path") or [])
    if not tree.get("descended"):
        result["notes"].append(f"not descended into the model's tree: {tree['reason']}")
        return
    if tree.get("note"):
        result["notes"].append(tree["note"])
    result["notes"].extend(f"in the model's tree, {w['path']}: {w['reason']}" for w in tree.get("withdrawn", ()))
    if not trail:
        return
    result["notes"] = [n for n in result["notes"] if not n.startswith(NO_TAP_DEPARTS)]
    links = result.get("links") or {}
    if links.get("enters_at") in ("definition", "converter") and tree.get("verdict") != "span":
        links["explanation"] += f"; in the model's tree, first at {display(trail)}"
    spec_first = result.get("first_divergent_tap")
    if spec_first is not None and spec_first != trail[0]:
        for row in result["taps"]:
            row["first_divergent"] = row["tap"] == trail[0]
        result["first_divergent_tap"] = trail[0] if trail[0] in spec.taps else None
        result["notes"].append(
            f"the spec's taps put the first divergence at {spec_first}; the model's own tree puts it "
            f"in {trail[0]}{'' if trail[0] in spec.taps else ', which is not a tap'}: {spec_first} "
            f"computes what it is given"
        )
        result["cause"], result["cause_test"] = None, None
        for check in links.get("checks", []):  # a link's first tap from the spec's taps is not named either
            if check.get("first_divergent_tap") == spec_first:
                check["first_divergent_tap"] = trail[0]
        if links.get("explanation"):
            links["explanation"] = links["explanation"].replace(f"first at {spec_first}", f"first at {trail[0]}")
    tested = tree.get("cause_test")
    if tested and (len(trail) > 1 or not (result.get("cause_test") or {}).get("kind")):
        result["cause_test"] = tested
        result["cause"] = {"tap": tested["tap"], **tested["cause"]} if tested.get("cause") else None
    elif tree.get("verdict") != "leaf" and len(trail) > 1:
        result["cause"], result["cause_test"] = None, None


def leaf_known(pool, spec, path, workspace: str, golden_dir: str, threads: int, diagnosis: dict) -> dict:
    """The reference's values at the tensors that bound the last module of the diagnosis's first divergent path in
    the path's graph (its output and, where found, its input): ``{tensor: array}``, for ``parity repro`` to cut the
    graph there; ``{}`` when the descent found no module with a tensor of its own."""
    tree = diagnosis.get("tree") or {}
    leaf = tree.get("leaf") or {}
    if not leaf.get("tensor") or tree.get("verdict") == "span":
        return {}
    framework = path.source if path.source in paths.NATIVE else spec.frameworks[0]
    reference = pool.call(
        _group(framework),
        "parity.diagnose.tree.descent:reference_at",
        workspace=workspace,
        model=spec.name,
        golden_dir=golden_dir,
        precision=path.precision,
        threads=threads,
        framework=framework,
        names=[leaf["tap"]],
    )
    if not reference["reproduces"] or leaf["tap"] not in reference["values"]:
        return {}
    known = {leaf["tensor"]: reference["values"][leaf["tap"]]}
    if leaf.get("input_tensor") and leaf["tap"] in reference["inputs"]:
        known[leaf["input_tensor"]] = reference["inputs"][leaf["tap"]]
    return known
