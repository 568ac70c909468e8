"""The built-in zoo end to end through the CLI (slow: every model, every path)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_parity_run_on_the_zoo_is_as_expected(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "parity", "run", "--budget", "0.2", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["schema"] == "parity.result/2" and not report["model_errors"]
    for model in ("mlp", "cnn", "transformer"):
        results = [r for r in report["results"] if r["model"] == model]
        assert len(results) == 19  # every path but the opt-in ones (torch/compile*, torch/executorch)
        passing = [r for r in results if r["verdict"] == "pass"]
        assert len(passing) >= 5 and {r["stages"][0] for r in passing} == {"torch", "tf", "jax"}
        for r in results:
            assert (r["timing"] is not None) == (r["verdict"] == "pass")
            if r["path"] == "torch/litert" and r["verdict"] == "skip":  # pip refuses litert-torch beside this stack
                assert "pip refuses litert-torch" in r["reason"]
            elif r["verdict"] != "pass":
                assert r["verdict"] == "error" and r["expected"], (model, r["path"], r["reason"])
            if r["path"] in ("torch", "tf", "jax", "jax/tf", "torch/export", "tf/xla"):
                assert r["gradients"] and all(s["ok"] for s in r["gradients"].values())
            if r["outputs"] is not None:
                assert r["metrics"]["accuracy"]["value"] == r["metrics"]["accuracy"]["golden"]
