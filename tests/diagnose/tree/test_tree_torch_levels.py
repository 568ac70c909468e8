"""A torch model's descent at scale: the reference runs the whole model once (each run reads the level below too, and a
deeper level runs only the module it opens), its levels are those a run of their own gives, bitwise; the descent says
each level and module through the run's progress, and keeps raw values only for the module it goes into."""

from __future__ import annotations

import numpy as np
import pytest

from parity.diagnose.tree import torch_tree
from parity.diagnose.tree.descent import Tree
from tests.conftest import REPO, failing_export, worker_pool

NESTED = REPO / "tests" / "nestedmodels.py"
SCOPES = ("", "blocks", "blocks.5")


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """The residual stack through init, golden build and check: its diagnosis and the command's output."""
    root = tmp_path_factory.mktemp("levels")
    diagnosis, output = failing_export(root, "stack", ["--torch", f"{NESTED}:make_residual_stack", "--input", "x=2x16"])
    return root, diagnosis, output


def test_the_reference_runs_the_model_once_and_its_levels_are_those_of_runs_of_their_own(checked):
    from parity.model.workspace import Workspace

    root = checked[0]
    tree = Tree(str(root), "stack", str(Workspace(root).golden_dir("stack")), "torch", "fp32", 1)
    levels = [tree.reference(scope) for scope in SCOPES]
    served = tree._reference_levels
    assert isinstance(served, torch_tree.Levels)
    assert (served.runs, served.own_runs) == (1, 1)  # the root's run read "blocks" too; "blocks.5" ran alone
    assert all(level["reproduces"] for level in levels)
    for scope, level in zip(SCOPES, levels):
        own = torch_tree.level_of(tree.reference_runner, tree.x, scope)
        assert level["children"] == own["children"], scope
        for key in ("values", "inputs"):
            assert level[key].keys() == own[key].keys(), (scope, key)
            for name, value in level[key].items():
                np.testing.assert_array_equal(value, own[key][name], err_msg=f"{scope} {key} {name}")


def test_a_module_that_does_not_give_its_value_alone_is_read_by_a_whole_run(checked):
    from parity.model.workspace import Workspace

    root = checked[0]
    tree = Tree(str(root), "stack", str(Workspace(root).golden_dir("stack")), "torch", "fp32", 1)
    levels = torch_tree.Levels(tree.reference_runner, tree.x)
    levels.level("")
    levels.level("blocks")
    args, kwargs, value = levels.called["blocks.5"]
    levels.called["blocks.5"] = (args, kwargs, value + 1.0)  # not what the module gives on these arguments
    level = levels.level("blocks.5")
    assert (levels.runs, levels.own_runs, level["whole"]) == (2, 1, True)
    own = torch_tree.level_of(tree.reference_runner, tree.x, "blocks.5")
    assert [c["path"] for c in level["children"]] == [c["path"] for c in own["children"]]


def test_the_descent_says_each_level_and_keeps_raw_values_only_where_it_goes(checked, tmp_path):
    from parity.diagnose.descend import descend
    from parity.golden import store as golden
    from parity.model.workspace import Workspace
    from parity.pipeline import orchestrate
    from parity.run import paths

    root, diagnosis = checked[0], checked[1]
    assert diagnosis["tree"]["raw_tensors"]["held"] <= 4 < diagnosis["tree"]["raw_tensors"]["compared"]
    ws = Workspace(root)
    spec = ws.load_spec("stack")
    lines: list[str] = []
    run = orchestrate.Run(ws, orchestrate.Options(threads=1), progress=lines.append)
    path = paths.by_id("torch/onnx/ort")
    with worker_pool(None, tmp_path / "logs") as pool:
        artifact = run._export(pool, spec, golden.verify(ws.golden_dir("stack"), spec), path, len(path.exports) - 1)
        lines.clear()
        tree = descend(run, pool, spec, path, artifact)
    assert tree["first_divergent_path"] == ["blocks", "blocks.5", "blocks.5.norm"]
    said = [line.removeprefix("stack: diagnose torch/onnx/ort: ") for line in lines]
    assert "level 1, module 1 of 3 (proj)" in said, said  # the root's children: proj, blocks, head
    assert any(line.startswith("level 3, module 1 of") and "(blocks.5." in line for line in said), said
    assert "the causes of blocks.5.norm" in said, said
    raw = tree["raw_tensors"]
    assert raw["held"] <= 4 < raw["compared"]  # the leaf's value and input on each side, of every level's
