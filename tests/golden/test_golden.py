"""Golden build: float64 agreement of the three definitions is proven, or the build refuses."""

from __future__ import annotations

import json

import pytest

from parity.golden import build as golden_build
from parity.golden import store as golden
from parity.model.workspace import Workspace
from parity.platform.errors import ParityError
from tests.conftest import mlp_variant, worker_pool


def build(root):
    ws = Workspace(root)
    with worker_pool(600) as pool:
        return golden_build.build(ws, ws.load_spec("mlp"), pool)


def test_build_proves_agreement_and_writes_checksummed_files(workspace_copy):
    root = workspace_copy()
    manifest = build(root)
    assert manifest["cross_framework_fp64_max_abs"] < 1e-9
    assert manifest["cross_framework_fp64_grad_max_abs"] < 1e-9
    assert manifest["frameworks"] == ["torch", "tf", "jax"]
    assert manifest["metrics"]["accuracy"] > 0.9
    assert golden.verify(root / "golden" / "mlp") == manifest
    arrays = manifest["files"]["gradients.npz"]["arrays"]
    assert arrays["dense1/kernel"] == {"shape": [64, 64], "dtype": "float64"}
    assert arrays["input:x"]["shape"] == [64, 64]
    assert not [p for p in (root / "golden").iterdir() if p.name.startswith(".")]  # no staging left behind


def test_build_refuses_when_definitions_disagree_and_names_first_tap(workspace_copy):
    # the JAX definition gets a slightly different dense2: a definition bug, not numerics
    source = mlp_variant(
        {
            'out = h @ params[f"{name}/kernel"] + params[f"{name}/bias"]': 'out = h @ params[f"{name}/kernel"] + params[f"{name}/bias"] + (1e-7 if name == "dense2" else 0.0)'
        }
    )
    root = workspace_copy(source)
    before = (root / "golden" / "mlp" / "manifest.json").read_text()
    with pytest.raises(ParityError, match=r"disagree in float64 at tap 'dense2'"):
        build(root)
    assert (root / "golden" / "mlp" / "manifest.json").read_text() == before  # nothing replaced
    assert json.loads(before)["schema"] == golden.SCHEMA
