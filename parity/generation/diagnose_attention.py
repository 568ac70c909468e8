"""Causes for the layers decoders are made of, recomputed in float64 from what the diagnosis recorded at the step
(``diagnose_causes`` calls them; see its docstring): a transformers attention over the key/value cache (``attend``,
one function whose parameters are the variants: the cache's type, the mask, the grouped-query head order, the
window, the softcap, the scale), Gemma's scaled embedding, and a final logit softcap.

Every result is ``{"kind", "variant", "description", "before", "after", "also", "explanation"}`` (``variant`` None
where nothing reproduces), or None where the module's inputs were not recorded.
"""

from __future__ import annotations

import numpy as np

from parity.generation.verify import tol_units

LOWEST = np.finfo(np.float64).min  # a masked score: a fully masked row attends uniformly, as transformers' eager


def is_attention(module) -> bool:
    """A transformers self-attention: q/k/v/o projections, a head size and a config with its head counts."""
    config = getattr(module, "config", None)
    return (
        all(hasattr(module, f"{n}_proj") for n in "qkvo")
        and isinstance(getattr(module, "head_dim", None), int)
        and isinstance(getattr(config, "num_attention_heads", None), int)
    )


def declared(module) -> dict:
    """The attention's parameters as the module declares them."""
    config = module.config
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    window = getattr(module, "sliding_window", getattr(config, "sliding_window", None))
    softcap = getattr(module, "attn_logit_softcapping", None)
    return {
        "heads": heads,
        "kv_heads": kv,
        "head_dim": int(module.head_dim),
        "scale": float(getattr(module, "scaling", module.head_dim**-0.5)),
        "window": int(window) if window else None,
        "softcap": float(softcap) if softcap else None,
        "groups": "repeat",
        "mask": "declared",
        "cache_dtype": None,
    }


def _rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], -1)


def _linear(x, weights: dict, prefix: str):
    y = x @ np.asarray(weights[f"{prefix}.weight"], np.float64).T
    bias = weights.get(f"{prefix}.bias")
    return y if bias is None else y + np.asarray(bias, np.float64)


def _round(a, dtype_name: str | None):
    if dtype_name is None or a is None:
        return a
    if dtype_name == "bfloat16":
        import ml_dtypes

        return np.asarray(a).astype(ml_dtypes.bfloat16).astype(np.float64)
    return np.asarray(a).astype(np.float16).astype(np.float64)


def attend(x, weights: dict, prefix: str, cos, sin, past, keep, params: dict) -> np.ndarray:
    """The attention at ``prefix`` of ``x`` (B, S, hidden) in float64: rotary tables ``cos``/``sin`` (B, S, D),
    ``past`` the cached (keys, values) (B, KV, P, D), already rotated, or None; ``keep`` (B, P+S) the call's
    attention mask. ``params`` (``declared``): heads, kv_heads, head_dim, scale, window (a key at cache index j is
    seen from index i where i - window < j <= i), softcap, groups (``repeat``: each key/value head serves
    heads/kv_heads consecutive query heads, transformers' ``repeat_kv``; ``tile``: the key/value heads cycled),
    mask (``declared``, ``dropped``: the padding ignored, ``inverted``: only the pads seen), cache_dtype (the past
    rounded through it)."""
    b, s, _ = x.shape
    h, kvh, d = params["heads"], params["kv_heads"], params["head_dim"]
    q = _linear(x, weights, f"{prefix}.q_proj").reshape(b, s, h, d).transpose(0, 2, 1, 3)
    k = _linear(x, weights, f"{prefix}.k_proj").reshape(b, s, kvh, d).transpose(0, 2, 1, 3)
    v = _linear(x, weights, f"{prefix}.v_proj").reshape(b, s, kvh, d).transpose(0, 2, 1, 3)
    c, n = np.asarray(cos, np.float64)[:, None], np.asarray(sin, np.float64)[:, None]
    q, k = q * c + _rotate_half(q) * n, k * c + _rotate_half(k) * n
    if past is not None:
        k = np.concatenate([_round(past[0], params["cache_dtype"]), k], 2)
        v = np.concatenate([_round(past[1], params["cache_dtype"]), v], 2)
    total = k.shape[2]
    rep = h // kvh
    if params["groups"] == "tile":
        k, v = np.tile(k, (1, rep, 1, 1)), np.tile(v, (1, rep, 1, 1))
    else:
        k, v = np.repeat(k, rep, 1), np.repeat(v, rep, 1)
    scores = q @ k.transpose(0, 1, 3, 2) * params["scale"]
    if params["softcap"]:
        scores = params["softcap"] * np.tanh(scores / params["softcap"])
    qi = np.arange(total - s, total)[:, None]
    kj = np.arange(total)[None, :]
    allowed = kj <= qi
    if params["window"]:
        allowed = allowed & (kj > qi - params["window"])
    pads = np.asarray(keep, bool)[:, -total:]
    if params["mask"] == "dropped":
        pads = np.ones_like(pads)
    elif params["mask"] == "inverted":
        pads = ~pads
    allowed = allowed[None, None] & pads[:, None, None, :]
    scores = np.where(allowed, scores, LOWEST)
    scores = scores - scores.max(-1, keepdims=True)
    weights_ = np.exp(scores)
    out = (weights_ / weights_.sum(-1, keepdims=True)) @ v
    out = out.transpose(0, 2, 1, 3).reshape(b, s, h * d)
    return _linear(out, weights, f"{prefix}.o_proj")


def attention_variants(params: dict) -> list[tuple[str, str, dict]]:
    """``(name, description, params)`` of what an export may compute instead of ``params`` (``declared``)."""
    found: list[tuple[str, str, dict]] = [
        ("cache_float16", "the key/value cache stored or read in float16", {"cache_dtype": "float16"}),
        ("cache_bfloat16", "the key/value cache stored or read in bfloat16", {"cache_dtype": "bfloat16"}),
        ("mask_dropped", "the attention mask dropped (the pads attended)", {"mask": "dropped"}),
        ("mask_inverted", "the attention mask inverted (only the pads attended)", {"mask": "inverted"}),
    ]
    if params["heads"] != params["kv_heads"]:
        found.append(
            (
                "kv_heads_tiled",
                "the key/value heads tiled across the query heads instead of repeated",
                {"groups": "tile"},
            )
        )
    if params["window"]:
        w = params["window"]
        found += [
            (
                "window_dropped",
                f"the sliding window of {w} dropped (every earlier position attended)",
                {"window": None},
            ),
            ("window_minus_one", f"a sliding window of {w - 1} instead of {w}", {"window": w - 1}),
            ("window_plus_one", f"a sliding window of {w + 1} instead of {w}", {"window": w + 1}),
        ]
    if params["softcap"]:
        found.append(
            ("softcap_dropped", f"the attention's softcap of {params['softcap']:g} dropped", {"softcap": None})
        )
    plain = params["head_dim"] ** -0.5
    if not np.isclose(params["scale"], plain, rtol=1e-9):
        found.append(("scale_head_dim", f"the scores scaled by 1/sqrt(head size) ({plain:.6g})", {"scale": plain}))
    return [(name, text, {**params, **change}) for name, text, change in found]


def _units(expected, observed, keep, tol: dict) -> tuple[float, float]:
    observed = np.asarray(observed, np.float64)
    if observed.size != np.size(expected):
        return float("inf"), float("inf")
    observed = observed.reshape(np.shape(expected))
    if keep is not None and np.ndim(expected) >= 2 and np.shape(expected)[:2] == keep.shape:
        expected, observed = expected[keep], observed[keep]
    units = tol_units(expected, observed, tol)
    return units, float(np.abs(observed - expected).max()) if np.isfinite(units) and observed.size else float("inf")


def _stats(units: float, max_abs: float) -> dict:
    return {
        "tol_units": round(units, 6) if np.isfinite(units) else None,
        "max_abs": max_abs if np.isfinite(max_abs) else None,
    }


def judge(kind: str, compute, declared_params, variants, observed, expected_ref, context: dict, attrs=None) -> dict:
    """The rule of ``diagnose_causes``: ``compute(params, side)`` recomputes the module on the reference's inputs
    (``side`` "reference") or the path's ("path"); the declared form must reproduce the reference's own value, then
    a variant that reproduces ``observed`` where the declared form does not, and is told apart from it, is named."""
    keep, tol = context["keep"], context["tolerances"]
    result: dict = {"kind": kind, "variant": None, **({"attrs": attrs} if attrs else {})}
    own = _units(compute(declared_params, "reference"), expected_ref, keep, tol)[0]
    if not own <= 1.0:
        result["explanation"] = (
            f"no cause tested: the {kind} recomputed as declared does not reproduce the reference's own output "
            f"({own:.3g} tolerance units)"
        )
        return result
    base = compute(declared_params, "path")
    before = _units(base, observed, keep, tol)
    result["before"] = _stats(*before)
    if before[0] <= 1.0:
        result["explanation"] = (
            f"the {kind} computes what the model declares from the path's own inputs ({before[0]:.3g} tolerance "
            "units): the departure is inherited or arises elsewhere"
        )
        return result
    found, tried = [], []
    for name, text, params in variants:
        value = compute(params, "path")
        units, max_abs = _units(value, observed, keep, tol)
        tried.append((units, name))
        if units <= 1.0 and _units(base, value, keep, tol)[0] > 1.0:
            found.append((units, name, text, max_abs))
    if not found:
        closest = min(tried) if tried else None
        near = f"; closest {closest[1]}: {closest[0]:.3g}" if closest else ""
        result["explanation"] = (
            f"no known {kind} variant explains the departure (the declared form is off by {before[0]:.3g} tolerance "
            f"units{near})"
        )
        return result
    found.sort(key=lambda f: f[0])
    units, name, text, max_abs = found[0]
    result.update(
        variant=name,
        description=text,
        after=_stats(units, max_abs),
        also=[f[1] for f in found[1:]],
        explanation=f"{text}: this reproduces the path's {'logits' if kind == 'logit_softcap' else kind + ' output'} ({units:.3g} tolerance units; the declared "
        f"form is off by {before[0]:.3g})",
    )
    return result


def _rotary_before(context: dict) -> str | None:
    order = context["reference"].order
    for name in reversed(order[: order.index(context["path"])]):
        if type(context["root"].get_submodule(name)).__name__.endswith("RotaryEmbedding"):
            return name
    return None


def attention_cause(context: dict) -> dict | None:
    """The attention leaf recomputed by ``attend`` on the path's input and rotary tables over the reference's cache."""
    path, ref, module = context["path"], context["reference"], context["module"]
    rotary = _rotary_before(context)
    x_ref, x_path = ref.inputs.get(path), context["path_inputs"].get(path)
    tables_ref = ref.values.get(rotary) if rotary else None
    tables_path = context["path_values"].get(rotary) if rotary else None
    missing = [what for what, value in (("input", x_path), ("rotary tables", tables_path)) if value is None]
    if x_ref is None or not tables_ref or len(tables_ref) != 2 or (tables_path is not None and len(tables_path) != 2):
        missing.append("two rotary tables of the reference")
    if missing or tables_ref is None or tables_path is None:
        return {
            "kind": "attention",
            "variant": None,
            "explanation": f"no cause tested: the attention's {', '.join(missing)} are not mapped",
        }
    past = getattr(ref, "past", {}).get(path)
    if past is None and context["feed"]["input_ids"].shape[1] != context["feed"]["attention_mask"].shape[1]:
        return {
            "kind": "attention",
            "variant": None,
            "explanation": "no cause tested: the reference's key/value cache at this step was not recorded",
        }
    shape_x, shape_t = x_ref.shape, tables_ref[0].shape
    sides = {
        "reference": (x_ref, *tables_ref),
        "path": (
            np.asarray(x_path, np.float64).reshape(shape_x),
            *(np.asarray(t, np.float64).reshape(shape_t) for t in tables_path),
        ),
    }
    weights, keep_full = context["weights"], context["feed"]["attention_mask"]

    def compute(params, side):
        x, cos, sin = sides[side]
        return attend(x, weights, path, cos, sin, past, keep_full, params)

    params = declared(module)
    observed = np.asarray(context["observed"][0], np.float64)
    attrs = {k: v for k, v in params.items() if k in ("heads", "kv_heads", "head_dim", "window", "softcap")}
    return judge(
        "attention", compute, params, attention_variants(params), observed, ref.values[path][0], context, attrs
    )


def embedding_cause(context: dict) -> dict | None:
    """Gemma's scaled embedding: the lookup of the call's tokens times ``embed_scale``, or not."""
    module, path = context["module"], context["path"]
    table = context["weights"].get(f"{path}.weight")
    if table is None:
        return None
    rows = table[np.asarray(context["feed"]["input_ids"], np.int64)]
    scale = float(module.embed_scale.detach().double())

    def compute(factor, _side):
        return rows * factor

    variants = [
        ("embed_scale_dropped", f"the embedding's scale of {scale:.6g} dropped", 1.0),
        (
            "embed_scale_bfloat16",
            "the embedding's scale rounded in bfloat16",
            float(_round(np.float64(scale), "bfloat16")),
        ),
        (
            "embed_scale_float16",
            "the embedding's scale rounded in float16",
            float(_round(np.float64(scale), "float16")),
        ),
    ]
    observed = np.asarray(context["observed"][0], np.float64)
    ref = context["reference"].values[path][0]
    return judge("embedding", compute, scale, variants, observed, ref, context, {"embed_scale": scale})


def logit_softcap_cause(context: dict) -> dict | None:
    """The logits of a model that softcaps them, recomputed from the path's ``lm_head`` output."""
    cap = float(context["module"].config.final_logit_softcapping)
    head_ref = context["reference"].values.get("lm_head")
    head_path = context["path_values"].get("lm_head")
    if not head_ref or not head_path:
        return {
            "kind": "logit_softcap",
            "variant": None,
            "explanation": "no cause tested: the path's lm_head output is not mapped",
        }
    sides = {"reference": head_ref[0], "path": np.asarray(head_path[0], np.float64).reshape(head_ref[0].shape)}

    def compute(capped, side):
        x = sides[side]
        return cap * np.tanh(x / cap) if capped else x

    variants = [("logit_softcap_dropped", f"the final logit softcap of {cap:g} dropped", False)]
    observed = np.asarray(context["observed"][0], np.float64)
    ref = context["reference"].values[""][0]
    return judge("logit_softcap", compute, True, variants, observed, ref, context, {"final_logit_softcapping": cap})
