"""`import parity` and every `--help` must not import an ML framework (run in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FRAMEWORKS = ("torch", "tensorflow", "jax", "tensorrt", "onnxruntime", "keras")
HELPS = [[], ["run"], ["check"], ["paths"], ["env"], ["golden"], ["golden", "build"], ["golden", "verify"]]

PROBE = f"""
import json, sys
from click.testing import CliRunner
import parity
from parity.cli import cli
args = json.loads(sys.argv[1])
if args is not None:
    result = CliRunner().invoke(cli, args + ["--help"])
    assert result.exit_code == 0, result.output
print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r})))
"""


@pytest.mark.parametrize("args", [None, *HELPS], ids=lambda a: "import" if a is None else " ".join(a) or "parity")
def test_no_framework_imported(args):
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_tree_readers_import_no_framework():
    """The registry of tree readers imports every reader: none may import its framework at module level."""
    probe = (
        "import json, sys, types; from parity.diagnose import tree; "
        "assert all(isinstance(r, types.ModuleType) for r in tree.READERS.values()); "
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r})))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
