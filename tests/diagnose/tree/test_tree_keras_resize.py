"""A tf2onnx graph whose activations tie NCHW with NHWC (channels = height = width): a tap is compared only in the
axis order the graph's Transposes prove, a graph-read divergence that its own outputs contradict is withdrawn, and
``parity repro`` reports the part that fails, never a healthy one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from parity.diagnose import chain
from parity.diagnose.graph import mapping_check
from parity.golden import store as golden
from parity.model.workspace import Workspace
from parity.pipeline import model_jobs, orchestrate
from parity.run import paths
from tests.conftest import keras_workspace

TESTS = Path(__file__).resolve().parents[2]


def _tighten(root: Path, name: str) -> None:
    """The spec's tolerances tight enough that tf2onnx's exact cubic weights fail at 15x15."""
    spec_file = root / "models" / f"{name}.py"
    text = spec_file.read_text()
    spec_file.write_text(
        text.replace(
            text[text.index("Tolerances(Tolerance(") :].split(")")[0], "Tolerances(Tolerance(atol=2e-5, rtol=2e-5"
        )
    )


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, pool) -> Workspace:
    models = {
        name: (f"{TESTS / 'resizemodels.py'}:{factory}", (2, 8, 8, 3))
        for name, factory in (("up15", "make_15"), ("up16", "make_16"))
    }
    return keras_workspace(tmp_path_factory.mktemp("keras_resize"), pool, models, edit=_tighten)


def _diagnose(ws: Workspace, model: str, pool) -> dict:
    spec = ws.load_spec(model)
    run = orchestrate.Run(ws, orchestrate.Options(threads=1))
    return chain.diagnose(run, pool, spec, golden.verify(ws.golden_dir(model), spec), paths.by_id("tf/onnx/ort"))


def _healthy_named(d: dict) -> list[str]:
    named = [r["tap"] for r in d["taps"] if r["stats"] is not None and not r["stats"]["ok"]]
    named += list(d["first_divergent_path"])
    for level in d["tree"].get("levels", []):
        named += [r["tap"] for r in level["rows"] if r["stats"] is not None and not r["stats"]["ok"]]
    return [n for n in named if n.startswith(("encoder", "bottleneck"))]


@pytest.mark.slow
def test_passing_path_shows_no_false_divergence(workspace, pool):
    d = _diagnose(workspace, "up16", pool)
    assert d["tree"]["descended"], d["tree"]
    assert d["first_divergent_tap"] is None and d["first_divergent_path"] == [], d["tree"]
    assert _healthy_named(d) == [], d["tree"]["levels"]
    top = {r["tap"]: r for r in d["taps"]}
    assert top["encoder"]["stats"]["ok"] and top["encoder"]["order"] == [0, 2, 3, 1]  # NCHW, proven by Transposes


@pytest.mark.slow
def test_failing_resize_names_no_healthy_layer(workspace, pool):
    d = _diagnose(workspace, "up15", pool)
    assert _healthy_named(d) == [], (d["taps"], d["tree"]["levels"])
    assert d["first_divergent_tap"] == "head"  # the first compared tap after the resize


@pytest.mark.slow
def test_repro_reduces_the_failing_part(workspace, pool, tmp_path):
    out = tmp_path / "bug"
    code, line = model_jobs.repro(
        str(workspace.root), "up15", "tf/onnx/ort", str(out), False, "fp32", 1, 300, "parity repro"
    )
    assert code == 0, line
    assert "Resize" in line and "Relu" not in line, line
    readme = (out / "README.md").read_text()
    assert "ort departs" not in readme.splitlines()[0], readme  # titled by the link: the converter
    assert "converter" in readme.splitlines()[0]


def test_a_divergence_its_outputs_contradict_is_withdrawn():
    def row(tap, units):
        return {"tap": tap, "found": "name", "stats": {"ok": units <= 1, "tol_units": units}, "growth": None}

    rows = [row("a", 0.1), row("b", 2.7e3), row("c", 1.48)]
    located = {"a": {"feeds_outputs": True}, "b": {"feeds_outputs": True}, "c": {"feeds_outputs": True}}
    assert mapping_check.withdraw_contradicted(rows, located, 1.48) == ["b"]
    assert rows[1]["stats"] is None and rows[1]["found"] == "withdrawn" and "contradicts" in rows[1]["reason"]
    assert np.isclose(rows[2]["growth"], 14.8)
    rows = [row("b", 2.7e3)]  # an output not computed from it: nothing contradicts it
    assert mapping_check.withdraw_contradicted(rows, {"b": {"feeds_outputs": False}}, 1.48) == []


def test_outputs_that_are_nan_or_inf_contradict_no_divergence():
    """An overflow (Inf) or an underflow into a log (-Inf, NaN) has no finite error measure: such outputs are
    infinitely off, so a divergence they are computed from stands."""
    from parity.check import closeness
    from parity.model.spec import Tolerance

    golden_out = np.array([1.0, -87.5, 3.0])
    tolerance = Tolerance(atol=1e-4, rtol=1e-4)
    for bad in (np.inf, -np.inf, np.nan):
        stats = closeness.compare_named({"y": golden_out + [0.0, 0.0, bad]}, {"y": golden_out}, lambda _: tolerance)
        assert mapping_check.output_units(stats) == np.inf
        rows = [{"tap": "act", "found": "name", "stats": {"ok": False, "tol_units": 3e4}, "growth": None}]
        assert (
            mapping_check.withdraw_contradicted(
                rows, {"act": {"feeds_outputs": True}}, mapping_check.output_units(stats)
            )
            == []
        )
        assert rows[0]["stats"] is not None
    passing = closeness.compare_named({"y": golden_out}, {"y": golden_out}, lambda _: tolerance)
    assert mapping_check.output_units(passing) == 0.0 and mapping_check.output_units({}) is None
