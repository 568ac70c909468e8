"""Diagnosis of a generation path at its first divergent step: the model's module tree at that step, through the
cache, against the float64 reference, down to the leaf that departs, with causes for the layers decoders are made
of.

At the step (of the verified batch) both sides are run teacher-forced as the check ran them: the prompt, then the
golden's tokens fed after each earlier step, the attention mask growing by one column per step, transformers'
positions, and each side's own cache from its own earlier calls. The reference is the float64 model with a hook on
every module; the path is the float32 model with the same hooks (``torch``) or the exported graph with every module's
output added as a graph output (``torch/onnx/ort``: torch.onnx's ``pkg.torch.onnx.name_scopes`` metadata names each
node's module, ``parity.diagnose.tree.onnx_tree``), run by the path's own decode loop. Only the step's call is compared.

A module's value is every floating tensor its first call returns (a rotary embedding's cosine and sine tables), its
graph tensors the boundary outputs of its scope of the same shape (else size); where a module returns several
tensors of one size, they are paired in the order that agrees best, so a correct path never reads as divergent for
the order its exporter computed them in. The descent starts at the root (the logits): at each level the first child,
in call order, whose value departs (``tol_units > 1`` at the tolerances the path's check used) is taken, down to a
module none of whose children departs: the leaf. On a left-padded batch's prefill the pad positions are left out.

Causes (``diagnose_causes``): a rotary embedding is recomputed in float64 at positions restarted at 0 in the call
and shifted by each offset; an attention module typed by the catalogue, at a call whose cache is still empty (a
prefill), is tested through ``parity.diagnose.causes.cause``; any transformers attention, at a decode step too, is
recomputed in float64 over the reference's key/value cache at the step (the reference runs with a plain cache that holds
every earlier position) with its variants (cache type, mask, grouped-query head order, window, softcap); Gemma's scaled
embedding and final logit softcap likewise (``diagnose_attention``).
"""

from __future__ import annotations

import time
from itertools import permutations
from pathlib import Path

import numpy as np

from parity.generation.prompts import positions
from parity.generation.verify import FLOAT32_TOLERANCES, tol_units
from parity.platform.errors import UsageError

PATHS = ("torch", "torch/onnx/ort")
MAX_PAIRED = 4  # a module with more same-sized outputs than this is compared on its first alone


# --------------------------------------------------------------------------- the step's inputs


def step_of(generation: dict) -> tuple[int, str, str, str | None]:
    """``(step, batch, mode, consistency check)`` to diagnose from a path's verified generation block: its first
    divergent step, else the step a failing consistency check reads (the first decode step for ``cache_vs_full``,
    the prefill otherwise, on the padded batch); ``step`` -1 where the path passed."""
    step = generation.get("first_divergent_step")
    if step is not None:
        batch = generation.get("batch") or "batch1"
        return int(step), batch, "prefill" if int(step) == 0 else "decode", None
    failing = [name for name, c in (generation.get("consistency") or {}).items() if c and c.get("ok") is False]
    if not failing:
        return -1, "batch1", "", None
    step = 1 if failing[0] == "cache_vs_full" and int(generation.get("steps") or 0) > 1 else 0
    return step, "padded", "prefill" if step == 0 else "decode", failing[0]


def call_inputs(ids: np.ndarray, mask: np.ndarray, forced: np.ndarray, step: int) -> dict:
    """What the model reads at ``step``'s call: the tokens, the mask so far and the positions."""
    if step == 0:
        tokens, full = ids, mask
    else:
        tokens = np.asarray(forced[step - 1], np.int64)[:, None]
        full = np.concatenate([mask, np.ones((mask.shape[0], step), np.int64)], 1)
    return {"input_ids": tokens, "attention_mask": full, "position_ids": positions(full, tokens.shape[1])}


# --------------------------------------------------------------------------- torch: hooks on every module


def _tensors(torch, value) -> list:
    """The floating tensors of a module's output, in order (a cache object and None left out)."""
    if torch.is_tensor(value):
        return [value] if value.is_floating_point() else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(torch, item)]
    return []


def _empty(cache, module) -> bool:
    """Whether ``cache`` holds nothing yet for ``module``'s layer (its call reads no earlier token)."""
    try:
        return int(cache.get_seq_length(getattr(module, "layer_idx", 0) or 0)) == 0
    except Exception:  # noqa: BLE001 - a cache parity cannot read counts as holding tokens
        return False


def _held(cache, module) -> tuple | None:
    """The (keys, values) ``cache`` holds for ``module``'s layer before its call, None where it holds none."""
    idx = getattr(module, "layer_idx", None)
    layers = getattr(cache, "layers", None)
    if cache is None or not isinstance(idx, int) or not layers or idx >= len(layers):
        return None
    keys, values = getattr(layers[idx], "keys", None), getattr(layers[idx], "values", None)
    if keys is None or values is None or keys.dim() != 4 or keys.shape[2] == 0:
        return None
    return keys, values


class Hooks:
    """Hooks on every module of ``model``; what the last call of the root recorded: the modules in call order, each
    first call's output tensors, first floating input, and (for the catalogue's typed modules) further inputs."""

    def __init__(self, model):
        import torch

        from parity.model.layer_types import torch_further_inputs

        self.model, self.handles = model, []
        self.order: list[str] = []
        self.values: dict[str, list] = {}
        self.inputs: dict[str, np.ndarray] = {}
        self.further: dict[str, tuple] = {}
        self.past: dict[str, tuple] = {}  # an attention's cached (keys, values) before its call
        calls: dict[str, int] = {}

        def host(t):
            return t.detach().to(torch.float64).cpu().numpy()

        def before(name):
            def hook(module, args, kwargs):
                if name == "":
                    self.order, self.values, self.inputs, self.further, self.past = [], {}, {}, {}, {}
                    calls.clear()
                calls[name] = calls.get(name, 0) + 1
                if calls[name] > 1:
                    return
                self.order.append(name)
                fed = _tensors(torch, [*args, *kwargs.values()])
                if fed:
                    self.inputs[name] = host(fed[0])
                typed = torch_further_inputs(module, args, kwargs)
                cache = kwargs.get("past_key_values")
                held = _held(cache, module)
                if held is not None:
                    self.past[name] = tuple(host(t) for t in held)
                if typed is None and cache is not None and _empty(cache, module):  # a prefill: as without a cache
                    typed = torch_further_inputs(module, args, {**kwargs, "past_key_values": None})
                if typed is not None:
                    self.further[name] = (typed[0], {k: host(v) for k, v in typed[1].items()})

            return hook

        def after(name):
            def hook(_module, _args, output):
                if calls.get(name) == 1 and name not in self.values:
                    self.values[name] = [host(t) for t in _tensors(torch, output)]

            return hook

        for name, module in model.named_modules():
            self.handles.append(module.register_forward_pre_hook(before(name), with_kwargs=True))
            self.handles.append(module.register_forward_hook(after(name)))

    def remove(self):
        for handle in self.handles:
            handle.remove()


def torch_step(model, ids, mask, forced, step: int, plain: bool = False) -> Hooks:
    """``model`` run teacher-forced up to ``step`` (its own cache); the hooks of that step's call. ``plain``: a cache
    that holds every earlier position in every layer (a sliding window applied by the mask, as the ONNX export's), so
    the attention causes read the whole past."""
    from parity.generation.torch_decoder import TorchDecoder

    class Plain(TorchDecoder):
        def _cache(self):
            from transformers import DynamicCache

            return DynamicCache()

    hooks = Hooks(model)
    try:
        (Plain if plain else TorchDecoder)(model).steps(ids, mask, step + 1, forced=forced)
    finally:
        hooks.remove()
    return hooks


# --------------------------------------------------------------------------- ONNX: every module's boundary outputs


def onnx_step(onnx_file, meta: dict, names: list[str], ids, mask, forced, step: int, threads: int) -> dict:
    """The exported graph with every module of ``names`` (the reference's paths) tapped, run by the path's decode
    loop up to ``step``: ``{"values": {path: [(tensor, array)]}, "inputs": {path: array}}`` at the step's call."""
    import onnx

    from parity.diagnose.graph import onnx_graph, onnx_taps
    from parity.diagnose.tree import onnx_tree
    from parity.generation.ort_decoder import tapped_step

    model = onnx.load(str(onnx_file))
    graph = onnx_graph._Graph(model)
    kind = onnx_tree.scope_kind(graph)
    if kind != onnx_tree.METADATA:
        raise UsageError(f"{onnx_file} carries no torch.onnx module scopes: its module tree cannot be read")
    found = onnx_tree.nodes_of(graph, kind, names)
    outputs = {path: onnx_taps._boundary_outputs(graph, nodes) for path, nodes in found.items()}
    outputs[""] = ["logits"]
    sources = {path: onnx_tree.input_of(model, graph, nodes) for path, nodes in found.items()}
    tapped = [t for ts in outputs.values() for t in ts] + [t for t in sources.values() if t in graph.position]
    _, last = tapped_step(model, tapped, graph.infos, meta, ids, mask, forced, step, threads)
    return {
        "values": {path: [(t, np.asarray(last[t])) for t in ts if t in last] for path, ts in outputs.items()},
        "inputs": {path: np.asarray(last[t], np.float64) for path, t in sources.items() if t in last},
    }


# --------------------------------------------------------------------------- comparison


def _real(value: np.ndarray, keep: np.ndarray | None) -> np.ndarray:
    """``value`` without the pad positions where its leading axes are the call's (batch, tokens)."""
    if keep is None or value.ndim < 2 or value.shape[:2] != keep.shape:
        return value
    return value[keep]


def _units(ref: np.ndarray, got: np.ndarray, keep, tol: dict) -> tuple[float, float]:
    got = np.asarray(got, np.float64)
    if got.size != ref.size:
        return float("inf"), float("inf")
    ref, got = _real(ref, keep), _real(got.reshape(ref.shape), keep)
    units = tol_units(ref, got, tol)
    return units, float(np.abs(got - ref).max()) if np.isfinite(units) and got.size else float("inf")


def pair(ref: list, candidates: list, keep, tol: dict) -> tuple[list | None, float, float]:
    """The path's arrays for the reference's ``ref`` tensors among ``candidates`` (``[(name, array)]``, in
    topological order): one output, the last of its shape (else size); several, the pairing of same-sized
    candidates that agrees best. ``(arrays, tol_units, max_abs)``; arrays None where none fits."""
    if not ref or not candidates:
        return None, float("nan"), float("nan")
    sizes = {r.size for r in ref}
    if len(ref) > 1 and len(ref) <= MAX_PAIRED:
        sized = [c[1] for c in candidates if c[1].size in sizes][:MAX_PAIRED]
        best = None
        for chosen in permutations(sized, len(ref)):
            if all(c.size == r.size for c, r in zip(chosen, ref)):
                scores = [_units(r, c, keep, tol) for r, c in zip(ref, chosen)]
                worst = max(scores)
                if best is None or worst[0] < best[1]:
                    best = (list(chosen), worst[0], worst[1])
        if best is not None:
            return best
    shaped = [c[1] for c in candidates if c[1].shape == ref[0].shape] or [
        c[1] for c in candidates if c[1].size == ref[0].size
    ]
    if not shaped:
        return None, float("nan"), float("nan")
    units, max_abs = _units(ref[0], shaped[-1], keep, tol)
    return [shaped[-1]], units, max_abs


def parents(order: list[str]) -> dict[str, str | None]:
    """Each called module's nearest called ancestor (a ``ModuleList`` holder is never called)."""
    called = set(order)
    found: dict[str, str | None] = {}
    for name in order:
        if name == "":
            found[name] = None
            continue
        parts = name.split(".")
        up = next((".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1) if ".".join(parts[:i]) in called), "")
        found[name] = up
    return found


def descend(order: list[str], units: dict[str, float]) -> list[str]:
    """The chain from the root to the leaf: at each level the first child (call order) that departs; [] where the
    root does not."""
    if not units.get("", 0.0) > 1.0:
        return []
    up = parents(order)
    chain = [""]
    while True:
        child = next((n for n in order if up.get(n) == chain[-1] and units.get(n, 0.0) > 1.0), None)
        if child is None:
            return chain
        chain.append(child)


def _departs(name: str, ref_inputs: dict, got_inputs: dict, keep, tol: dict) -> bool:
    """Whether ``name``'s recorded input departs on the path (False where either side is not recorded)."""
    if name not in ref_inputs or name not in got_inputs:
        return False
    return bool(_units(ref_inputs[name], got_inputs[name], keep, tol)[0] > 1.0)


def _row(path: str, units: float, max_abs: float, module=None) -> dict:
    def number(x):
        return None if not np.isfinite(x) else round(float(x), 6)

    row = {"path": path or "(root)", "tol_units": number(units), "max_abs": number(max_abs)}
    if module is not None:
        row["class"] = type(module).__name__
    return row


# --------------------------------------------------------------------------- the task


def _nothing(step, batch, mode, note, **extra) -> dict:
    return {
        "step": step,
        "batch": batch,
        "mode": mode,
        "first_divergent_path": [],
        "leaf": None,
        "rows": [],
        "cause": None,
        "note": note,
        **extra,
    }


def diagnose(
    source: dict,
    golden_file: str,
    path_id: str,
    artifact_dir: str | None,
    meta: dict | None,
    generation: dict,
    threads: int,
) -> dict:
    """Worker task: the module tree of path ``path_id`` at the step its verified ``generation`` block names, against
    the float64 reference (see the module docstring)."""
    import torch

    from parity.generation import diagnose_causes as causes
    from parity.generation.model import load
    from parity.generation.onnx_export import ONNX_FILE
    from parity.generation.tasks import read_golden

    started = time.perf_counter()
    step, batch, mode, check = step_of(generation or {})
    if step < 0:
        return _nothing(None, None, None, "the path passes every step and consistency check: nothing to diagnose")
    if path_id not in PATHS:
        return _nothing(
            step,
            batch,
            mode,
            f"the module tree of {path_id} is not read (diagnosed: {', '.join(PATHS)})",
            unavailable=True,
        )
    sets, gold = read_golden(golden_file)
    if batch not in sets:
        raise UsageError(f"the golden has no batch {batch!r}; it has {', '.join(sets)}")
    steps = int(gold[batch]["tokens"].shape[0])
    if not 0 <= step < steps:
        raise UsageError(f"step {step} is outside the golden's {steps} steps")
    ids, mask = sets[batch]["input_ids"], sets[batch]["attention_mask"]
    forced = gold[batch]["tokens"]
    torch.set_num_threads(max(1, int(threads)))
    reference = load(source, "float64")
    ref = torch_step(reference, ids, mask, forced, step, plain=True)
    if path_id == "torch":
        path_hooks = torch_step(load(source, "float32"), ids, mask, forced, step)
        got = {n: [(str(i), v) for i, v in enumerate(vs)] for n, vs in path_hooks.values.items()}
        got_inputs, further = path_hooks.inputs, path_hooks.further
    else:
        if not artifact_dir or not meta or "n_layers" not in meta:
            raise UsageError("the torch/onnx/ort path needs the exported ONNX folder and its meta")
        onnx_file = Path(artifact_dir) / ONNX_FILE
        observed = onnx_step(onnx_file, meta, ref.order, ids, mask, forced, step, threads)
        got, got_inputs, further = observed["values"], observed["inputs"], {}
    feed = call_inputs(ids, mask, forced, step)
    keep = feed["attention_mask"].astype(bool) if step == 0 and not feed["attention_mask"].all() else None
    tol = dict(generation.get("tolerances") or FLOAT32_TOLERANCES)  # the path's, as its check judged it
    units, rows, arrays = {}, {}, {}
    for name in ref.order:
        if name not in got or not ref.values.get(name):
            continue
        matched, u, max_abs = pair(ref.values[name], got[name], keep, tol)
        if matched is None:
            continue
        units[name], arrays[name] = u, matched
        rows[name] = _row(name, u, max_abs, reference.get_submodule(name))
    chain = descend(ref.order, units)
    base = {"step": step, "batch": batch, "mode": mode, "compared": len(units), "unmapped": len(ref.order) - len(units)}
    if check:
        base["consistency"] = check
    if not chain:
        note = (
            f"every module agrees with the float64 reference at step {step} ({mode}, {batch}): "
            f"{len(units)} of {len(ref.order)} modules compared"
        )
        if check:
            note += f"; the failing {check} check is not a departure from the reference at this step"
        return {
            **_nothing(step, batch, mode, note),
            **base,
            "seconds": round(time.perf_counter() - started, 3),
        }
    # a leaf whose input already departs while its parent's does not computes right: the departure arises in the
    # parent's own computation between its children (an attention's scores and softmax between its projections)
    while (
        len(chain) > 1
        and _departs(chain[-1], ref.inputs, got_inputs, keep, tol)
        and not _departs(chain[-2], ref.inputs, got_inputs, keep, tol)
    ):
        chain.pop()
    leaf = chain[-1]
    module = reference.get_submodule(leaf)
    leaf_row = {"path": leaf or "(root)", "class": type(module).__name__, "tol_units": rows[leaf]["tol_units"]}
    inputs_agree = None
    if leaf in ref.inputs and leaf in got_inputs:
        inputs_agree = bool(_units(ref.inputs[leaf], got_inputs[leaf], keep, tol)[0] <= 1.0)
    leaf_row["inputs_agree"] = inputs_agree
    context = {
        "module": module,
        "root": reference,
        "path": leaf,
        "observed": arrays[leaf],
        "feed": feed,
        "reference": ref,
        "path_further": further,
        "path_inputs": got_inputs,
        "path_values": arrays,
        "weights": {k: v.detach().to(torch.float64).numpy() for k, v in reference.state_dict().items()},
        "tolerances": tol,
        "keep": keep,
    }
    cause = causes.test(context)
    where = " → ".join(p or "(root)" for p in chain)
    note = (
        f"step {step} ({mode}, {batch}): {where} departs first; the leaf {leaf or '(root)'} ({type(module).__name__}) "
    )
    note += f"is off by {leaf_row['tol_units']} tolerance units"
    if inputs_agree is not None:
        note += " while its input agrees" if inputs_agree else " and its input already departs"
    note += f"; {cause['explanation'] if cause else 'no cause tested for its kind'}"
    return {
        **base,
        "first_divergent_path": [p or "(root)" for p in chain],
        "leaf": leaf_row,
        "rows": [rows[p] for p in chain],
        "cause": cause if cause and cause.get("variant") else None,
        **({"cause_tested": cause} if cause and not cause.get("variant") else {}),
        "note": note,
        "seconds": round(time.perf_counter() - started, 3),
    }
