"""The descent into a JAX model's own tree: a Flax model's module paths and a plain function's ``jax.named_scope``
scopes, on the native ``jax`` path and inside a jax2onnx graph (mapped by value: jax2onnx records neither).

The models are users' (``parity init --jax module:apply,params.npz``), each with one leaf that computes something
else on one path only: in the export (while jax2onnx traces it), or in float32 (a Flax LayerNorm's fast variance on
an input far from zero: ``flaxmodels.offset_apply``, 4 blocks, ``blocks_2`` far). This file is also the models'
module: parity loads ``scoped_apply`` from it by path, so it imports nothing of ``tests`` at module level.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve()
SCOPED_BLOCKS, SCOPED_FAULTY, WIDTH = 3, 1, 8


def _traced_by_jax2onnx() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).split(".")[0] == "jax2onnx":
            return True
        frame = frame.f_back
    return False


def scoped_apply(params, x, tap=None):
    """A plain JAX MLP in named scopes: ``proj``, ``encoder/block_<i>/{dense,act}`` (residual), ``head``: x (2x6)
    -> (2x3). Fault: ``encoder/block_1/act`` is the erf GELU, computed with the tanh approximation while jax2onnx
    traces it."""
    import jax
    import jax.numpy as jnp

    with jax.named_scope("proj"):
        h = x @ params["proj"]["kernel"] + params["proj"]["bias"]
    with jax.named_scope("encoder"):
        for i in range(SCOPED_BLOCKS):
            with jax.named_scope(f"block_{i}"):
                with jax.named_scope("dense"):
                    y = h @ params[f"block_{i}"]["kernel"] + params[f"block_{i}"]["bias"]
                with jax.named_scope("act"):
                    y = jax.nn.gelu(y, approximate=i == SCOPED_FAULTY and _traced_by_jax2onnx())
                h = h + y
        if tap is not None:
            tap("encoder", h)
    with jax.named_scope("head"):
        return jnp.tanh(h) @ params["head"]["kernel"]


def save_scoped_params(path) -> Path:
    rng = np.random.default_rng(0)
    weights = {
        "proj/kernel": rng.standard_normal((6, WIDTH)),
        "proj/bias": rng.standard_normal(WIDTH),
        "head/kernel": rng.standard_normal((WIDTH, 3)),
    }
    for i in range(SCOPED_BLOCKS):
        weights[f"block_{i}/kernel"] = rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)
        weights[f"block_{i}/bias"] = rng.standard_normal(WIDTH)
    np.savez(path, **{k: v.astype(np.float32) for k, v in weights.items()})
    return Path(path)


# --------------------------------------------------------------------------- the workflow


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The three models, each through ``parity init --jax`` and ``golden build`` when a test first asks for it."""
    from tests import flaxmodels, nestedmodels
    from tests.conftest import Models

    root = tmp_path_factory.mktemp("jax_tree")
    table = {
        "flax_nested": (f"{HERE.parents[2] / 'nestedmodels.py'}:flax_apply", nestedmodels.save_flax_params, 12),
        "scoped": (f"{HERE}:scoped_apply", save_scoped_params, 6),
        "offset": (f"{flaxmodels.__file__}:offset_apply", partial(flaxmodels.save_offset_params, blocks=4, far=2), 6),
    }

    def source(name: str, reference: str, save, features: int) -> list:
        """A model's ``--jax`` arguments, its weights written by ``save`` first."""
        weights = save(root / f"{name}.npz")
        return ["--jax", f"{reference},{weights}", "--input", f"x=2x{features}"]

    return Models(root, {name: partial(source, name, *entry) for name, entry in table.items()})


def diagnose(root: Path, model: str, path_id: str, pool) -> dict:
    from parity.diagnose import chain
    from parity.golden import store as golden
    from parity.model.workspace import Workspace
    from parity.pipeline import orchestrate
    from parity.run import paths

    ws = Workspace(root)
    spec = ws.load_spec(model)
    manifest = golden.verify(ws.golden_dir(model), spec)
    return chain.diagnose(
        orchestrate.Run(ws, orchestrate.Options(threads=1)), pool, spec, manifest, paths.by_id(path_id)
    )


def _drift(d: dict) -> list:
    return [
        (
            level["scope"],
            [(r["tap"], r["found"], r["stats"] and round(r["stats"]["tol_units"], 2)) for r in level["rows"]],
        )
        for level in d["tree"].get("levels", [])
    ]


def _clean(d: dict) -> None:
    """No level of the descent shows a divergence."""
    assert d["tree"]["descended"] and d["first_divergent_path"] == [], _drift(d)
    assert all(r["stats"]["ok"] for level in d["tree"]["levels"] for r in level["rows"]), _drift(d)


def test_flax_export_fault_descends_to_the_leaf_and_finds_its_epsilon(models, pool):
    d = diagnose(models("flax_nested"), "flax_nested", "jax/onnx/ort", pool)
    assert d["first_divergent_path"] == ["blocks_3", "blocks_3/norm"], _drift(d)
    tree = d["tree"]
    assert tree["verdict"] == "leaf"
    root, block = tree["levels"]
    assert [r["tap"] for r in root["rows"]] == ["proj", *(f"blocks_{i}" for i in range(6)), "head"]
    assert [r["tap"] for r in block["rows"]] == ["blocks_3/dense", "blocks_3/norm"]
    assert all(r["found"] == "value" for r in root["rows"] + block["rows"])  # jax2onnx records no module names
    assert all(r["stats"]["ok"] for r in root["rows"][:4]) and block["rows"][0]["stats"]["ok"]
    leaf = tree["leaf"]
    assert leaf["class"].endswith("ExportEpsLayerNorm") and (leaf["kind"], leaf["attrs"]["eps"]) == ("layer_norm", 1e-6)
    cause = d["cause"]  # the leaf's weights are Flax's scale and bias, found under its path
    assert cause["tap"] == "blocks_3/norm" and cause["variant"] == "eps_fitted", d["cause_test"]
    assert "epsilon 0.1 " in cause["description"]
    assert cause["before"]["tol_units"] > 1 >= cause["after"]["tol_units"]


def test_flax_native_path_shows_no_divergence_at_any_level(models, pool):
    _clean(diagnose(models("flax_nested"), "flax_nested", "jax", pool))


def test_flax_float32_fault_on_the_native_path_descends_to_the_leaf(models, pool):
    d = diagnose(models("offset"), "offset", "jax", pool)
    assert d["first_divergent_path"] == ["blocks_2", "blocks_2/norm"], _drift(d)
    root, block = d["tree"]["levels"]
    assert all(r["found"] == "native" for r in root["rows"] + block["rows"])
    assert block["rows"][0]["stats"]["ok"] and block["rows"][1]["input"]["ok"]  # its input agrees: the norm drifts
    assert d["tree"]["cause_test"]["kind"] == "layer_norm" and d["cause"] is None  # not one of its variants


@pytest.mark.slow
def test_named_scopes_export_fault_descends_to_the_scope(models, pool):
    d = diagnose(models("scoped"), "scoped", "jax/onnx/ort", pool)
    assert d["first_divergent_path"] == ["encoder", "encoder/block_1", "encoder/block_1/act"], _drift(d)
    levels = d["tree"]["levels"]
    assert [r["tap"] for r in levels[0]["rows"]] == ["proj", "encoder", "head"]
    assert [r["tap"] for r in levels[1]["rows"]] == [f"encoder/block_{i}" for i in range(SCOPED_BLOCKS)]
    assert [r["tap"] for r in levels[2]["rows"]] == ["encoder/block_1/dense", "encoder/block_1/act"]
    assert levels[2]["rows"][0]["stats"]["ok"] and not levels[2]["rows"][1]["stats"]["ok"]
    assert d["tree"]["leaf"]["class"] == "jax.named_scope" and d["cause"] is None  # a scope is not typed


def test_named_scopes_native_path_shows_no_divergence(models, pool):
    _clean(diagnose(models("scoped"), "scoped", "jax", pool))


# --------------------------------------------------------------------------- typing and weights of Flax leaves


def test_flax_leaves_typed_and_recomputed_from_their_own_weights():
    """Each typed Flax module, recomputed by the catalogue from its Flax parameters (by path, Flax's names and
    layouts), equals Flax's own output (float32: a wrong layout is off by O(1))."""
    import flax.linen as nn
    import jax

    from parity.diagnose.causes.layers.native import bind, canonical_weights
    from parity.model.layer_types_flax import flax_layer

    rng = np.random.default_rng(0)
    cases = [
        (nn.Dense(5), (2, 3, 4)),
        (nn.LayerNorm(epsilon=1e-3), (2, 7)),
        (nn.Conv(6, (3, 3), strides=2, padding="SAME"), (2, 9, 9, 4)),
        (nn.Conv(4, (3,), padding=[(2, 0)], kernel_dilation=2, feature_group_count=2), (2, 11, 4)),
        (nn.Conv(3, (2, 2), padding="VALID"), (1, 5, 6, 2)),
    ]
    for module, shape in cases:
        x = rng.standard_normal(shape).astype(np.float32)
        variables = module.init(jax.random.PRNGKey(1), x)
        params = jax.tree_util.tree_map(lambda v: v + rng.standard_normal(v.shape) * 0.3, variables["params"])
        expected = np.asarray(module.apply({"params": params}, x))
        kind, attrs = flax_layer(module.bind({"params": params}))
        flat = {f"layer/{k}": np.asarray(v) for k, v in params.items()}
        weights = canonical_weights(flat, "layer", kind, attrs)
        np.testing.assert_allclose(
            bind(kind, attrs).forward([x], weights),
            expected,
            rtol=1e-4,
            atol=1e-4,
            err_msg=f"{type(module).__name__} {attrs}",
        )
    assert flax_layer(nn.Conv(3, (3, 3), padding="CIRCULAR")) is None
    assert flax_layer(nn.LayerNorm(reduction_axes=(-2, -1))) is None
    assert flax_layer(nn.Dropout(0.1)) == ("dropout", {"rate": 0.1})


def test_children_of_a_scope_skip_modules_never_called():
    from parity.diagnose.tree.jax_tree import _children

    called = ["", "proj", "enc/layer_0", "enc/layer_0/dense", "enc/layer_1", "head"]  # 'enc' itself never called
    assert _children(called, "") == ["proj", "enc/layer_0", "enc/layer_1", "head"]
    assert _children(called, "enc/layer_0") == ["enc/layer_0/dense"]
    assert _children(called, "head") == []
