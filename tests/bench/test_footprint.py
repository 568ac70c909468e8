"""What a timed path costs besides time: the worker's peak resident memory per timed series (its high-water mark
reset per block), the artifact's size, energy where RAPL can be read (and why not where it cannot); memory changes
named by compare, history and --against as latency changes are."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest
from click.testing import CliRunner

from parity.bench import footprint
from parity.cli import cli
from parity.results import against, store
from parity.results.history import build, findings
from tests.conftest import REPO
from tests.results.test_results_store import _doc

LINUX_PEAK = footprint.reset_peak() is None and footprint.peak_mb() is not None


@pytest.mark.skipif(not LINUX_PEAK, reason="this kernel cannot reset the resident high-water mark")
def test_the_peak_is_reset_per_block_so_an_earlier_peak_is_not_counted_again():
    meter = footprint.BlockMeter()
    meter.start()
    big = np.ones(40 * 2**20 // 8)  # 40 MiB held during the block
    first = meter.stop(1)
    del big
    meter.start()
    small = np.ones(2**20 // 8)
    second = meter.stop(1)
    del small
    assert first["peak_rss_mb"] - second["peak_rss_mb"] > 30
    summary = footprint.summary([{**b, "idle_rss_mb": second["peak_rss_mb"] - 1} for b in (first, second)])
    assert summary["memory"]["peak_rss_mb"] == pytest.approx(first["peak_rss_mb"] - second["peak_rss_mb"] + 1)


def test_energy_is_read_from_rapl_counters_with_their_wrap_undone_and_its_absence_says_why(tmp_path):
    domains, why = footprint.rapl_domains(tmp_path / "missing")
    assert domains == [] and "does not exist" in why
    for name, energy in (("intel-rapl:0", 1_000_000), ("intel-rapl:1", 2_000_000), ("intel-rapl:0:0", 5)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "energy_uj").write_text(str(energy))
        (tmp_path / name / "max_energy_range_uj").write_text("10000000")
    domains, why = footprint.rapl_domains(tmp_path)
    assert why is None and [d.name for d in domains] == ["intel-rapl:0", "intel-rapl:1"]  # packages, not subdomains
    before = footprint.read_energy(domains)
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("1500000")  # +0.5 J
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("500000")  # wrapped: +8.5 J
    assert footprint.joules_between(before, footprint.read_energy(domains)) == pytest.approx(9.0)
    blocks = [{"peak_rss_mb": None, "joules": 9.0, "calls": 30, "idle_rss_mb": None, "reasons": {"memory": "no"}}]
    summary = footprint.summary(blocks)
    assert summary["energy"]["joules_per_inference"] == pytest.approx(0.3)
    assert summary["memory"] == {"peak_rss_mb": None, "reason": "no"}


def test_a_benchmark_records_peak_memory_and_artifact_size_per_series_and_shows_them_beside_latency(tmp_path):
    out = tmp_path / "r.json"
    result = CliRunner().invoke(
        cli,
        [
            "bench",
            "--workspace",
            str(REPO),
            "--model",
            "mlp",
            "--path",
            "torch",
            "--path",
            "torch/onnx/ort",
            "--batch-size",
            "8",
            "--budget",
            "0.05",
            "--store",
            str(tmp_path / "s.sqlite"),
            "--json",
            str(out),
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert "Memory and energy (per timed series, beside its latency)" in result.output
    entries = {r["path"]: r["timing"]["batches"]["8"] for r in json.loads(out.read_text())["results"]}
    for entry in entries.values():
        memory = entry["memory"]
        if LINUX_PEAK:
            assert memory["peak_rss_mb"] > 0 and memory["idle_rss_mb"] > 0, memory
        else:
            assert memory["peak_rss_mb"] is None and memory["reason"]
        assert entry["energy"]["joules_per_inference"] is not None or entry["energy"]["reason"]
    assert entries["torch"]["artifact_mb"] is None  # native: no artifact
    assert 0 < entries["torch/onnx/ort"]["artifact_mb"] < 1  # the mlp's ONNX file
    rows = store.Store.open(f"sqlite:///{tmp_path / 's.sqlite'}").history()[0]["rows"]
    assert any(r["kind"] == "batch" and r["artifact_mb"] for r in rows)


def _with_memory(doc: dict, peak: float) -> dict:
    doc["results"][0]["timing"]["batches"]["1"].update(memory={"peak_rss_mb": peak}, artifact_mb=0.5)
    return doc


def test_a_memory_change_is_named_by_compare_history_and_against_like_a_latency_change(tmp_path):
    a, b = _with_memory(_doc(seed=1), 100.0), _with_memory(_doc(seed=2), 160.0)
    failing, _ = against.findings(a, b)
    assert any("peak memory 1.6x (more memory), 100 -> 160 MB" in f for f in failing), failing
    same, _ = against.findings(a, _with_memory(_doc(seed=2), 104.0))  # within 10 % and 8 MB: not a change
    assert not any("peak memory" in f for f in same)
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    shown = CliRunner().invoke(cli, ["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]).output
    assert "Memory (B/A per batch)" in shown and "more memory" in shown and "1.600" in shown
    s = store.Store.open(f"sqlite:///{tmp_path / 'r.sqlite'}")
    ids = [
        s.append(_with_memory(_doc(seed=k), 100.0 + k % 2 if k < 6 else 180.0 + k % 2), "run", tmp_path, 0)
        for k in range(12)
    ]
    series, envs = build(s.history())
    lines = findings(series, envs)
    assert any("peak memory" in line and "more memory" in line and f"from run {ids[6]}" in line for line in lines)


def test_a_store_of_the_previous_version_is_migrated_in_place_and_keeps_its_runs(tmp_path):
    path = tmp_path / "old.sqlite"
    s = store.Store.open(f"sqlite:///{path}")
    first = s.append(_doc(), "run", REPO, 0)
    with sqlite3.connect(path) as conn:  # what a version-1 store holds: none of the columns added since
        for column in (c for version in range(2, store.VERSION + 1) for c in store.ADDED[version]):
            conn.execute(f"ALTER TABLE series DROP COLUMN {column}")
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'version'")
    s = store.Store.open(f"sqlite:///{path}")
    s.append(_with_memory(_doc(), 50.0), "run", REPO, 0)
    runs = s.history()
    assert runs[0]["id"] == first and runs[0]["rows"][1]["peak_rss_mb"] is None
    assert runs[1]["rows"][1]["peak_rss_mb"] == 50.0
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'version'").fetchone() == (str(store.VERSION),)
