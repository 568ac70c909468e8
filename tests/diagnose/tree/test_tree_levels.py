"""A descent reads each side of a JAX or Keras model's tree from one run: every module's value and input at all
depths computed once (one compile), each level served from it as a run of its own would serve it; past the memory
bound, each level is read by a run of its own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from parity.diagnose.tree import jax_tree, keras_tree
from parity.diagnose.tree.descent import Tree

TESTS = Path(__file__).resolve().parents[2]
JAX_SCOPES = ("", "encoder", "encoder/block_1")
KERAS_SCOPES = ("", "encoder", "mlp")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A plain JAX function in named scopes (``parity init --jax``) and a Keras model holding a sub-model and a
    ``Sequential`` (``assert_parity``'s factory), each with its golden."""
    from click.testing import CliRunner

    from parity.cli import cli
    from parity.pipeline import scaffold
    from tests.diagnose.tree.test_tree_jax import save_scoped_params

    root = tmp_path_factory.mktemp("tree_levels")
    save_scoped_params(root / "scoped.npz")
    request = scaffold.Request(
        name="nested",
        kind="tf",
        reference=f"{TESTS / 'nestedmodels.py'}:make_keras_nested",
        inputs=(scaffold.InputDecl("x", (2, 12), "float32"),),
        builder="keras_factory",
    )
    scaffold.init(root, request, force=False, threads=1, timeout_s=300)
    for args in (
        [
            "init",
            "scoped",
            "--jax",
            f"{Path(__file__).with_name('test_tree_jax.py')}:scoped_apply,{root / 'scoped.npz'}",
        ]
        + ["--input", "x=2x6"],
        ["golden", "build"],
    ):
        result = CliRunner().invoke(cli, [*args, "--workspace", str(root)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    return root


def _same_level(served: dict, own: dict) -> None:
    assert served["children"] == own["children"]
    for key in ("values", "inputs", "outputs"):
        assert served[key].keys() == own[key].keys(), key
        for name, value in served[key].items():
            np.testing.assert_allclose(value, own[key][name], rtol=1e-12, atol=1e-12, err_msg=f"{key} {name}")


def _golden_dir(root: Path, model: str) -> Path:
    from parity.model.workspace import Workspace

    return Workspace(root).golden_dir(model)


def test_jax_levels_compile_the_function_once(workspace):
    """The reader is found by tracing and every scope's value comes from one compile: the levels after the first
    compile nothing (each level used to compile the function once per reader tried)."""
    from jax import monitoring

    tree = Tree(str(workspace), "scoped", str(_golden_dir(workspace, "scoped")), "jax", "fp32", 1)
    assert tree.reference_runner is not None  # the source built (it compiles its own forward) before counting
    compiles: list[str] = []
    monitoring.register_event_duration_secs_listener(
        lambda event, _seconds, **_: compiles.append(event) if event.endswith("backend_compile_duration") else None
    )
    first = tree.reference(JAX_SCOPES[0])
    at_first = len(compiles)
    for scope in JAX_SCOPES[1:]:
        assert tree.reference(scope)["reproduces"], scope
    assert first["reproduces"] and 1 <= at_first <= 2 and len(compiles) == at_first, compiles


def test_jax_levels_served_from_one_run_are_those_of_runs_of_their_own(workspace):
    tree = Tree(str(workspace), "scoped", str(_golden_dir(workspace, "scoped")), "jax", "fp32", 1)
    whole = jax_tree.Levels(tree.reference_runner, tree.x)
    own = jax_tree.Levels(tree.reference_runner, tree.x)
    own.per_level()
    assert whole.whole is not None
    for scope in JAX_SCOPES:
        _same_level(whole.level(scope), own.level(scope))
    names = ["encoder/block_0/dense", "encoder/block_2", "head"]
    _same_level(whole.level("", names), own.level("", names))
    assert [c["path"] for c in whole.level("encoder/block_1")["children"]] == [
        "encoder/block_1/dense",
        "encoder/block_1/act",
    ]


def test_jax_tree_past_the_memory_bound_is_read_level_by_level(workspace, monkeypatch):
    tree = Tree(str(workspace), "scoped", str(_golden_dir(workspace, "scoped")), "jax", "fp32", 1)
    monkeypatch.setattr(jax_tree, "TAP_BYTES", 0)
    levels = jax_tree.Levels(tree.reference_runner, tree.x)
    assert levels.whole is None
    level = levels.level("encoder")
    assert [c["path"] for c in level["children"]] == [f"encoder/block_{i}" for i in range(3)]
    assert level["values"].keys() == {f"encoder/block_{i}" for i in range(3)}


def _counted_runs(model) -> list:
    """The model's own ``call`` counted (an instance attribute: ``Layer.__call__`` reads ``self.call``)."""
    runs: list = []
    original = model.call

    def call(*args, **kwargs):
        runs.append(1)
        return original(*args, **kwargs)

    model.__dict__["call"] = call
    return runs


def test_keras_reference_runs_the_model_once_for_every_level(workspace):
    tree = Tree(str(workspace), "nested", str(_golden_dir(workspace, "nested")), "tf", "fp32", 1)
    runs = _counted_runs(tree.reference_runner.model)
    levels = [tree.reference(scope) for scope in KERAS_SCOPES]
    assert all(level["reproduces"] for level in levels)
    assert [c["path"] for c in levels[1]["children"]] == ["encoder/dense", "encoder/norm", "encoder/out"]
    assert [c["path"] for c in levels[2]["children"]] == ["mlp/fc1", "mlp/ln", "mlp/fc2"]
    assert len(runs) == 1, runs  # one eager run wrapping every layer at all depths, not one per level


@pytest.mark.parametrize("eager", [True, False])
def test_keras_levels_served_from_one_run_are_those_of_runs_of_their_own(workspace, eager, monkeypatch):
    tree = Tree(str(workspace), "nested", str(_golden_dir(workspace, "nested")), "tf", "fp32", 1)
    runner = tree.reference_runner
    whole = keras_tree.Levels(runner, tree.x, eager=eager)
    assert whole.whole is not None
    for scope in KERAS_SCOPES:
        _same_level(whole.level(scope), keras_tree.level_of(runner, tree.x, scope, eager=eager))
    names = ["encoder/norm", "mlp/ln", "head"]
    _same_level(whole.level("", names), keras_tree.level_of(runner, tree.x, "", names, eager=eager))
    monkeypatch.setattr(keras_tree, "TAP_BYTES", 0)  # past the bound: each level by a run of its own
    bounded = keras_tree.Levels(runner, tree.x, eager=eager)
    assert bounded.whole is None
    _same_level(bounded.level("mlp"), keras_tree.level_of(runner, tree.x, "mlp", eager=eager))


def test_a_second_descent_of_the_model_reuses_the_reference_side_until_its_golden_or_spec_changes(workspace):
    """The reference's tree depends only on the model and its golden data: a worker keeps it for the next path's
    descent, and builds it again when the spec file (or the golden manifest) is not the one it was built from."""
    golden_dir = str(_golden_dir(workspace, "scoped"))
    first = Tree(str(workspace), "scoped", golden_dir, "jax", "fp32", 1)
    levels = first._reference_levels
    again = Tree(str(workspace), "scoped", golden_dir, "jax", "fp32", 1)
    assert again._reference_levels is levels and again.reference("encoder")["reproduces"]
    spec_file = Path(first.spec.source_file)
    original = spec_file.read_text()
    try:
        spec_file.write_text(original + "\n# edited\n")
        edited = Tree(str(workspace), "scoped", golden_dir, "jax", "fp32", 1)
        assert edited._reference_levels is not levels
    finally:
        spec_file.write_text(original)
