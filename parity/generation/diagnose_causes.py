"""Causes at the leaf of a generation diagnosis (``diagnose``): what the departing module computes instead.

* A rotary embedding typed by the catalogue (``rotary``: transformers' default RoPE) is recomputed in float64 from
  the call's positions as transformers does (a float32 product of positions and frequencies), at positions restarted
  at 0 in the call (an export that counts each call's positions from 0: right in a prefill, wrong in every decode
  step that reads a cache written at other positions) and at the positions shifted by each offset ``k``; the variant
  that reproduces the path's cosine and sine tables, where the declared positions do not, is the cause. A restart is
  named before an offset that gives the same tables (at batch 1 a decode step's restart is the offset ``-position``).
* An attention module typed by the catalogue, at a call without a cache (a prefill), is tested through
  ``parity.diagnose.causes.cause.test_layer`` on the path's own input and rotary tables (grouped-query head order,
  rotary pairs, scale, mask conventions).
* Any transformers attention (q/k/v/o projections: Llama, Qwen2, Mistral, Gemma-2, ...) where the catalogue names
  nothing, a decode step's above all (it reads the cache), is recomputed by ``attend``: one float64 attention of the
  path's input and rotary tables over the reference's key/value cache at that step (recorded by the diagnosis from
  a plain cache that holds every earlier position), with the module's heads, scale, softcap and window, the mask
  built from the call's attention mask. Its variants (``attention_variants``): the cache read in float16 or
  bfloat16, the padding mask dropped or inverted, the key/value heads tiled instead of repeated, the sliding window
  dropped or one off, the softcap dropped, the scale of the head size.
* Gemma's scaled embedding (``embed_scale``): the lookup recomputed from the call's tokens, with the scale dropped
  or rounded in bfloat16 (the normalizer cast to the model's type).
* The root of a model that softcaps its logits (``final_logit_softcapping``): recomputed from the path's
  ``lm_head`` output, with the softcap dropped.

A cause is named only where the declared form does not reproduce the path's value (``tol_units > 1``) and the
variant does (``<= 1``); the declared form must first reproduce the reference's own value from the reference's
inputs, else no cause is tested there.

Every result is ``{"kind", "variant", "description", "before", "after", "also", "explanation"}`` (``variant`` None
where nothing reproduces), or None for a module of no tested kind.
"""

from __future__ import annotations

from itertools import permutations

import numpy as np

from parity.generation.verify import tol_units

MAX_OFFSETS = 2048  # the shifts nearest 0 a rotary test tries


def _tables(attrs: dict, pos: np.ndarray) -> list[np.ndarray]:
    """transformers' default rotary ``(cos, sin)`` at positions ``pos`` (B, S): a float32 angle, then float64."""
    freq = np.asarray(attrs["inv_freq"], np.float32)
    angles = (np.asarray(pos, np.float64).astype(np.float32)[..., None] * freq).astype(np.float64)
    table = np.concatenate([angles, angles], -1)
    return [np.cos(table), np.sin(table)]


def _fit(expected: list, observed: list, keep, tol: dict) -> tuple[float, float]:
    """(tol_units, max_abs) of ``observed`` against ``expected`` tables, in the pairing that agrees best."""

    def one(e, o):
        o = np.asarray(o, np.float64)
        if o.size != e.size:
            return float("inf"), float("inf")
        o = o.reshape(e.shape)
        if keep is not None and e.shape[:2] == keep.shape:
            e, o = e[keep], o[keep]
        u = tol_units(e, o, tol)
        return u, float(np.abs(o - e).max()) if np.isfinite(u) and o.size else float("inf")

    best = (float("inf"), float("inf"))
    for chosen in permutations(expected, len(observed)):
        worst = max(one(e, o) for e, o in zip(chosen, observed))
        best = min(best, worst)
    return best


def _stats(units: float, max_abs: float) -> dict:
    return {
        "tol_units": round(units, 6) if np.isfinite(units) else None,
        "max_abs": max_abs if np.isfinite(max_abs) else None,
    }


def rotary(attrs: dict, pos: np.ndarray, observed: list, keep, tol: dict) -> dict:
    """The rotary test of the module docstring on the call's positions ``pos`` (B, S)."""
    before = _fit(_tables(attrs, pos), observed, keep, tol)
    result: dict = {"kind": "rotary", "variant": None, "before": _stats(*before)}
    if before[0] <= 1.0:
        result["explanation"] = (
            f"the rotary tables are those of the call's positions ({before[0]:.3g} tolerance units): the departure "
            "is inherited or arises elsewhere"
        )
        return result
    restart = np.broadcast_to(np.arange(pos.shape[1]), pos.shape)
    tried = [("positions_restart", "positions restart at 0 in each call", restart)]
    low, high = -int(pos.min()), int(pos.max()) + 1
    shifts = sorted((k for k in range(low, high + 1) if k), key=lambda k: (abs(k), k))[:MAX_OFFSETS]
    tried += [(f"position_offset{k:+d}", f"positions shifted by {k:+d}", pos + k) for k in shifts]
    found = []
    for name, description, at in tried:
        units, max_abs = _fit(_tables(attrs, at), observed, keep, tol)
        if units <= 1.0:
            found.append((name, description, units, max_abs))
    if not found:
        result["explanation"] = (
            f"the rotary tables depart from the call's positions by {before[0]:.3g} tolerance units and no restart "
            f"or shift of the positions (of {len(tried)} tried) reproduces them"
        )
        return result
    name, description, units, max_abs = found[0]
    result.update(
        variant=name,
        description=description,
        after=_stats(units, max_abs),
        also=[f[0] for f in found[1:]],
        explanation=f"{description}: this reproduces the path's rotary tables ({units:.3g} tolerance units; the "
        f"call's positions give {before[0]:.3g})",
    )
    return result


def _rotary_before(context: dict) -> str | None:
    """The rotary module called last before the leaf (whose tables the attention reads)."""
    from parity.model.layer_types import torch_layer

    order = context["reference"].order
    for name in reversed(order[: order.index(context["path"])]):
        typed = torch_layer(context["root"].get_submodule(name))
        if typed and typed[0] == "rotary":
            return name
    return None


def attention(attrs: dict, context: dict) -> dict:
    """The catalogue's attention test on the path's input and rotary tables, at a call without a cache."""
    from parity.diagnose.causes import cause
    from parity.model.spec import Layer, Tolerance

    path, ref = context["path"], context["reference"]
    if path not in ref.further:
        return {
            "kind": "attention",
            "variant": None,
            "explanation": "no cause tested: the attention reads the key/value cache at this step, which the "
            "catalogue's attention form does not",
        }
    ref_attrs, ref_further = ref.further[path]
    layer = Layer("attention", {**attrs, **ref_attrs})
    tol = Tolerance(**context["tolerances"])
    ref_inputs = [ref.inputs[path], *ref_further.values()]
    refused = cause.not_its_kind(
        layer, ref_inputs, context["weights"], ref.values[path][0], tol, path, f"the module {path}"
    )
    if refused:
        return {**refused, "variant": None}
    if path in context["path_further"]:
        inputs = [context["path_inputs"][path], *context["path_further"][path][1].values()]
    else:
        rotary_name = _rotary_before(context)
        x = context["path_inputs"].get(path)
        tables = context["path_values"].get(rotary_name) if rotary_name else None
        if x is None or tables is None or len(tables) != 2 or x.size != ref.inputs[path].size:
            return {
                "kind": "attention",
                "variant": None,
                "explanation": "no cause tested: the path's input or rotary tables of the attention are not mapped",
            }
        cos, sin = (np.asarray(t, np.float64).reshape(ref_further["cos"].shape) for t in tables)
        rest = [v for k, v in ref_further.items() if k not in ("cos", "sin")]
        inputs = [np.asarray(x, np.float64).reshape(ref.inputs[path].shape), cos, sin, *rest]
    observed = np.asarray(context["observed"][0], np.float64).reshape(ref.values[path][0].shape)
    tested = cause.test_layer(layer, inputs, context["weights"], observed, tol, prefix=path)
    found = tested.get("cause")
    result = {
        "kind": "attention",
        "attrs": tested.get("attrs"),
        "variant": found["variant"] if found else None,
        "before": tested.get("declared"),
        "explanation": tested.get("explanation"),
    }
    if found:
        result.update(description=found["description"], after=found["after"], also=found["also"])
    return result


def test(context: dict) -> dict | None:
    """The cause test for the leaf module ``context["module"]`` (see ``diagnose``), None for an untested kind."""
    from parity.generation import diagnose_attention as local
    from parity.model.layer_types import torch_layer

    module = context["module"]
    typed = torch_layer(module)
    if typed is not None and typed[0] == "rotary":
        pos = context["feed"]["position_ids"]
        return rotary(typed[1], pos, context["observed"], context["keep"], context["tolerances"])
    if local.is_attention(module):
        found = attention(typed[1], context) if typed is not None and typed[0] == "attention" else None
        if found and found.get("variant"):
            return found
        return local.attention_cause(context) or found
    if hasattr(module, "embed_scale") and hasattr(module, "weight"):
        return local.embedding_cause(context)
    if context["path"] == "" and getattr(getattr(module, "config", None), "final_logit_softcapping", None):
        return local.logit_softcap_cause(context)
    return None


test.__test__ = False  # type: ignore[attr-defined]  # not a pytest test
