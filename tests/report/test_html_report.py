"""The HTML report, from synthetic result dicts: self-contained, escaped, and robust to odd diagnoses."""

from __future__ import annotations

import math
import os
import re

import pytest

from parity.report import html


def stats(tol: float) -> dict:
    return {
        "max_abs": tol * 2e-5,
        "max_rel": tol * 1e-4,
        "mean_abs": tol * 4e-6,
        "cosine": 0.9999,
        "tol_units": tol,
        "ok": tol <= 1,
        "n_bad": int(tol > 1),
        "size": 64,
    }


def tap(name: str, tol: float | None, found: str = "native", **extra) -> dict:
    t = {
        "tap": name,
        "kind": "conv",
        "found": found,
        "tensor": None,
        "fused_into": None,
        "reason": None,
        "stats": None if tol is None else stats(tol),
        "growth": None,
        "first_divergent": False,
    }
    t.update(extra)
    return t


def diagnosis(taps: list[dict], first: str | None = None, cause: dict | None = None) -> dict:
    for t in taps:
        t["first_divergent"] = t["tap"] == first
    return {
        "model": "cnn",
        "path": "torch/onnx/ort",
        "tolerance": {"atol": 1e-5, "rtol": 1e-5},
        "taps": taps,
        "first_divergent_tap": first,
        "cause": cause,
        "cause_test": None,
        "gradients": None,
        "links": None,
        "patterns": [],
        "notes": [],
    }


def result(path: str, verdict: str = "pass", diag: dict | None = None, **extra) -> dict:
    r = {
        "model": "cnn",
        "path": path,
        "stages": path.split("/"),
        "device": "cpu",
        "precision": "fp32",
        "verdict": verdict,
        "reason": None,
        "expected": False,
        "outputs": {"logits": stats(0.2)},
        "gradients": None,
        "metrics": None,
        "deterministic": True,
        "timing": None,
        "diagnosis": diag,
    }
    r.update(extra)
    return r


def report(*results, env=None, model_errors=()) -> dict:
    return {"schema": "parity.result/1", "env": env or {}, "results": list(results), "model_errors": list(model_errors)}


CAUSE = {
    "tap": "ln",
    "variant": "eps_1e-3",
    "description": "LayerNorm epsilon 1e-3 instead of 1e-5",
    "before": {"max_abs": 6e-3, "tol_units": 320.0},
    "after": {"max_abs": 8e-6, "tol_units": 0.4},
}


def full() -> dict:
    taps = [
        tap("conv1", 0.02),
        tap("bn1", None, "fused", fused_into="conv1"),
        tap("relu1", None, "unmapped"),
        tap("ln", 320.0, growth=16000.0),
        tap("fc", math.inf),
        tap("<b>evil</b>", math.nan),
        tap("exact", 0.0),
    ]
    diag = diagnosis(taps, "ln", CAUSE)
    diag["cause_test"] = {
        "tap": "ln",
        "kind": "layernorm",
        "attrs": {"eps": 1e-5},
        "declared": {"max_abs": 6e-3, "tol_units": 320.0},
        "variants": [
            {"name": "eps_1e-3", "description": "epsilon 1e-3", "max_abs": 8e-6, "tol_units": 0.4, "reproduces": True}
        ],
        "explanation": "epsilon 1e-3 reproduces it",
    }
    diag["links"] = {
        "enters_at": "converter",
        "explanation": "the export differs",
        "checks": [
            {
                "link": "runtime",
                "compared": "ort vs onnxref",
                "ok": False,
                "first_divergent_node": {"node": "n1", "op_type": "Conv", "tol_units": 3.0},
                "worst_tol_units": 3.0,
            }
        ],
    }
    diag["gradients"] = {
        "layers": [
            {
                "layer": "ln",
                "ok": False,
                "worst_tol_units": 5.0,
                "params": [{"name": "ln.weight", "tol_units": 5.0, "max_abs": 1e-4, "ok": False}],
            }
        ],
        "first_departing_param": "ln.weight",
        "note": "gradients depart at ln",
    }
    diag["patterns"] = [{"name": "scale", "holds": False, "detail": "no common scale"}]
    diag["notes"] = ["a note & more"]
    return report(
        result("torch"),
        result("torch/onnx/ort", "fail", diag, reason="logits out of tolerance"),
        result("tf", "error", outputs=None, reason="<boom> & crash"),
        env={"python": "3.11", "packages": {"torch": "2.13.0"}, "gpu": None, "flags": {}},
        model_errors=[{"model": "broken", "reason": "SyntaxError"}],
    )


def assert_self_contained(page: str) -> None:
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:|//)""", page, re.IGNORECASE)
    assert not re.search(r"url\(\s*['\"]?\s*(https?:|//)", page, re.IGNORECASE)
    assert "<script" not in page.lower()
    assert "@import" not in page and "<link" not in page.lower() and "<iframe" not in page.lower()


def test_write_is_atomic_and_self_contained(tmp_path):
    out = tmp_path / "new" / "dir"
    path = html.write(full(), out)
    assert path == out / "index.html"
    assert sorted(os.listdir(out)) == ["index.html"]  # no temporary file left behind
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "<title>parity report</title>" in page
    assert page.count("<svg") == 1 and "<?xml" not in page
    assert_self_contained(page)
    html.write(report(), out)  # replaces the page in place
    assert sorted(os.listdir(out)) == ["index.html"] and "No path ran" in path.read_text()


def test_write_leaves_old_page_when_render_fails(tmp_path, monkeypatch):
    path = html.write(report(result("torch")), tmp_path)
    before = path.read_text()
    monkeypatch.setattr(html, "render", lambda *args: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError):
        html.write(report(), tmp_path)
    assert path.read_text() == before and sorted(os.listdir(tmp_path)) == ["index.html"]


def test_content_taps_cause_and_escaping():
    page = html.render(full())
    for name in ("conv1", "bn1", "relu1", "ln", "fc", "ln.weight", "eps_1e-3", "n1 (Conv"):
        assert name in page
    assert "LayerNorm epsilon 1e-3 instead of 1e-5" in page and "3.2e+02× → 0.4× tolerance" in page
    assert 'href="#diag-1"' in page and 'id="diag-1"' in page
    assert "<b>evil</b>" not in page and "&lt;b&gt;evil&lt;/b&gt;" in page  # in the table and in the SVG
    assert "<boom>" not in page and "&lt;boom&gt; &amp; crash" in page
    assert "fused into conv1" in page and "inf/nan (clipped" in page
    assert "packages.torch" in page and "2.13.0" in page
    assert "1 pass · 1 FAIL · 1 ERROR · 0 skip · 0 xerror · 1 model error(s)" in page


@pytest.mark.parametrize(
    "diag",
    [
        diagnosis([]),
        diagnosis([tap("a", None, "fused"), tap("b", None, "unmapped")]),
        diagnosis([tap("a", math.inf), tap("b", math.nan)], "a"),
        diagnosis([tap("a", 0.0), tap("b", 0.5)]),
        diagnosis([tap("a", 3.0)], "a"),
        {"taps": [{"tap": "x"}, {"tap": None, "stats": {"ok": False}}], "cause": {}, "links": {}, "gradients": {}},
    ],
    ids=["no-taps", "all-fused", "non-finite", "no-divergence", "no-cause", "sparse"],
)
def test_edge_cases_render(diag):
    page = html.render(report(result("torch/onnx/ort", "fail", diag)))
    assert 'id="diag-0"' in page
    assert_self_contained(page)
    if diag.get("first_divergent_tap") is None:
        assert "no divergent tap" in page
    elif diag.get("cause") is None:
        assert "no known variant explains it" in page


def test_no_diagnosis_and_errors_only():
    page = html.render(
        report(
            result("torch"),
            result("tf", "error", outputs=None, expected=True, reason="xla"),
            result("jax", "skip", outputs=None),
        )
    )
    assert "Diagnosis" not in page and "<svg" not in page and "xerror" in page
    assert html.render({"results": None, "env": None}).count("No path ran") == 1


def test_module_import_does_not_load_matplotlib():
    import subprocess
    import sys

    code = "import sys, parity.report.html; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
