"""The descent into Flax models as users bring them (tests/flaxmodels.py, ``parity init --jax``): a flax.linen
feature-pyramid network and a flax.nnx model, each departing on ``jax/onnx/ort`` where jax2onnx exports a bicubic
resize with ONNX's cubic coefficient (a real converter behaviour). The leaf is named by its full module path, the
reproducer cut at its boundary is small, and the passing paths show no divergence at any level."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Models
from tests.diagnose.tree.test_tree_jax import _clean, _drift, diagnose

MODELS = Path(__file__).resolve().parents[2] / "flaxmodels.py"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The models, each through ``parity init --jax`` and ``golden build`` when a test first asks for it."""
    from tests import flaxmodels

    root = tmp_path_factory.mktemp("tree_flax")
    table = {
        "fpn": ("fpn_apply", flaxmodels.save_fpn_params, flaxmodels.FPN_INPUT),
        "fpn_tf": ("fpn_jax2tf_apply", flaxmodels.save_fpn_params, flaxmodels.FPN_INPUT),
        "nnxnet": ("nnx_apply", flaxmodels.save_nnx_params, flaxmodels.NNX_INPUT),
    }
    inits = {}
    for name, (function, save, shape) in table.items():
        weights = save(root / f"{name}.npz")
        inits[name] = ["--jax", f"{MODELS}:{function},{weights}", "--input", f"x={'x'.join(map(str, shape))}"]
    return Models(root, inits)


def _repro_nodes(root: Path, model: str, out: Path) -> int:
    import onnx

    from parity.pipeline import model_jobs

    code, line = model_jobs.repro(str(root), model, "jax/onnx/ort", str(out), False, "fp32", 1, 300, "parity repro")
    assert code == 0, line
    return len(onnx.load(str(out / "model.onnx")).graph.node)


@pytest.mark.slow
def test_linen_fpn_descends_to_the_upsampler_on_jax2onnx(models, pool, tmp_path):
    """``top_down`` returns the coarsest level as it was given: its value is the first level it computes, so it is
    observed and descended into. ``up_1``'s input (of a shape no module of its level outputs) is found by value too,
    so the reproducer is cut at both ends of the leaf."""
    d = diagnose(models("fpn"), "fpn", "jax/onnx/ort", pool)
    assert d["first_divergent_path"] == ["top_down", "top_down/up_1"], _drift(d)
    root, top_down = d["tree"]["levels"]
    assert [r["tap"] for r in root["rows"]] == [
        *(f"stages_{i}" for i in range(3)),
        *(f"laterals_{i}" for i in range(3)),
        "top_down",
        "head",
    ]
    assert all(r["stats"]["ok"] for r in root["rows"][:6]) and not root["rows"][6]["stats"]["ok"]
    assert "called 3 times" in root["rows"][7]["reason"]  # the shared head
    assert [r["tap"] for r in top_down["rows"]] == ["top_down/up_1", "top_down/up_0"]
    assert d["tree"]["verdict"] == "leaf" and d["tree"]["leaf"]["class"].endswith("Upsample")
    assert top_down["rows"][0]["input"]["ok"] and [op for _, op in top_down["rows"][0]["nodes"]] == ["Resize"]
    assert _repro_nodes(models("fpn"), "fpn", tmp_path / "repro") <= 12


@pytest.mark.slow  # a second proof of a Flax model descended on jax2onnx; the fast set keeps it in
# test_tree_jax.py::test_flax_export_fault_descends_to_the_leaf_and_finds_its_epsilon (nnx's descent: the test below)
def test_nnx_descends_to_the_upsampler_on_jax2onnx(models, pool, tmp_path):
    d = diagnose(models("nnxnet"), "nnxnet", "jax/onnx/ort", pool)
    assert d["first_divergent_path"] == ["blocks/1", "blocks/1/up"], _drift(d)
    root, block = d["tree"]["levels"]
    assert [r["tap"] for r in root["rows"]] == ["stem", "blocks/0", "blocks/1", "blocks/2", "norm", "head"]
    assert [r["tap"] for r in block["rows"]] == ["blocks/1/conv", "blocks/1/norm", "blocks/1/up"]
    assert [r["kind"] for r in root["rows"]] == ["conv", None, None, None, "rms_norm", "dense"]
    assert [r["kind"] for r in block["rows"]] == ["conv", "layer_norm", None]
    assert all(r["stats"]["ok"] for r in block["rows"][:2]) and block["rows"][2]["input"]["ok"]
    assert d["tree"]["leaf"]["class"].endswith("Upsample") and d["cause"] is None  # a user's module: not typed
    assert _repro_nodes(models("nnxnet"), "nnxnet", tmp_path / "repro") <= 12


# slow: fpn, a second proof of a linen model's clean native descent; the fast set keeps it in
# test_tree_jax.py::test_flax_native_path_shows_no_divergence_at_any_level, and keeps nnxnet here
@pytest.mark.parametrize("model", [pytest.param("fpn", marks=pytest.mark.slow), "nnxnet"])
def test_native_path_shows_no_divergence_at_any_level(models, pool, model):
    _clean(diagnose(models(model), model, "jax", pool))


@pytest.mark.slow
def test_linen_fpn_descends_to_the_upsampler_on_jax2tf(models, pool):
    """On ``jax/tf`` each level's values are computed by jax2tf and TensorFlow (the SavedModel holds no graph of the
    model's operations to read): the leaf the conversion computes differently is named."""
    d = diagnose(models("fpn_tf"), "fpn_tf", "jax/tf", pool)
    assert d["first_divergent_path"] == ["top_down", "top_down/up_1"], _drift(d)
    root, top_down = d["tree"]["levels"]
    assert all(r["found"] == "jax2tf" for r in root["rows"] + top_down["rows"]), _drift(d)
    assert all(r["stats"]["ok"] for r in root["rows"][:6]) and not root["rows"][6]["stats"]["ok"]
    assert [r["tap"] for r in top_down["rows"]] == ["top_down/up_1", "top_down/up_0"]
    assert top_down["rows"][0]["input"]["ok"] and not top_down["rows"][0]["stats"]["ok"]
    assert d["tree"]["verdict"] == "leaf" and d["tree"]["leaf"]["class"].endswith("Upsample")


@pytest.mark.slow
@pytest.mark.parametrize("model", ["fpn", "nnxnet"])
def test_passing_jax2tf_path_names_no_divergence(models, pool, model):
    _clean(diagnose(models(model), model, "jax/tf", pool))


def test_nnx_reader_restores_the_classes_it_wraps():
    from flax import nnx

    from parity.diagnose.tree.nnx_tree import _wrapped

    before = nnx.Linear.__dict__["__call__"]
    with _wrapped(nnx.Module, lambda original: lambda self, *a, **k: ("wrapped", original(self, *a, **k))):

        class Defined(nnx.Module):  # defined while inside: wrapped too
            def __call__(self, x):
                return x

        assert Defined()(1) == ("wrapped", 1)
    assert nnx.Linear.__dict__["__call__"] is before and Defined()(1) == 1
    assert "__init_subclass__" not in nnx.Module.__dict__
