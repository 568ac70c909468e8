"""Hostile file systems and data: each becomes one line on stderr and exit code 2, never a traceback.

Cache folders that are files (and lock files that are folders), tap names matplotlib would read as
mathtext, timing samples at the ends of the float range, and ``--json``/``--report`` targets that are
symlinks, FIFOs, devices or in folders that do not exist.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import statistics
import subprocess
import sys
import threading

import pytest
from click.testing import CliRunner

from parity.bench import stats
from parity.cli import cli
from parity.platform import safefs
from parity.platform.cache_dir import named_lock
from parity.platform.errors import UsageError
from parity.report import compare, html
from parity.run.cache import ExportCache
from parity.run.pool import WorkerPool
from tests.conftest import REPO
from tests.report.test_compare_results import doc, res
from tests.report.test_html_report import diagnosis, report, result, tap


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def check(*extra):
    """``parity check`` of the cheapest path of the built-in zoo."""
    return invoke("check", "--workspace", str(REPO), "--model", "mlp", "--path", "torch", *extra)


def one_error_line(outcome, *words) -> str:
    """The single stderr line of a refused command, exit code 2, naming every one of ``words``."""
    assert outcome.exit_code == 2, outcome.output
    assert "Traceback" not in outcome.output
    (line,) = outcome.stderr.strip().splitlines()
    assert line.startswith("error: ")
    for word in words:
        assert word in line, line
    return line


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private, empty cache root."""
    root = tmp_path / "cache"
    root.mkdir()
    monkeypatch.setenv("PARITY_CACHE_DIR", str(root))
    return root


# --- 1. cache folders that are files, lock files that are folders ---------------------------------


@pytest.mark.parametrize(
    "name, what",
    [("exports", "cache folder"), ("logs", "log folder"), ("", "cache folder")],
    ids=["exports", "logs", "root"],
)
def test_cache_folder_that_is_a_file(cache, name, what):
    blocker = cache / name if name else cache
    if not name:
        cache.rmdir()
    blocker.write_text("not a folder")
    line = one_error_line(check(), f"{what} {blocker} is a file, not a folder", "PARITY_CACHE_DIR")
    assert line.endswith("remove it or set PARITY_CACHE_DIR")
    assert blocker.read_text() == "not a folder"  # reported, never replaced


@pytest.mark.slow  # a second proof of a lock folder refused; the fast set keeps
# test_lock_files_and_lock_folders_of_the_wrong_kind, and a run stopped in one line test_cache_folder_that_is_a_file
def test_export_lock_that_is_a_folder_stops_the_run(cache):
    first = invoke("check", "--workspace", str(REPO), "--model", "mlp", "--path", "torch/onnx/ort")
    assert first.exit_code == 0, first.output
    exports = cache / "exports"
    for lock in exports.glob("*.lock"):
        lock.unlink()
        lock.mkdir()
    for entry in exports.iterdir():
        if not entry.name.endswith(".lock"):
            shutil.rmtree(entry)
    second = invoke("check", "--workspace", str(REPO), "--model", "mlp", "--path", "torch/onnx/ort")
    one_error_line(second, "cache lock file", ".lock is a folder, not a file", "PARITY_CACHE_DIR")


def test_lock_files_and_lock_folders_of_the_wrong_kind(cache):
    (cache / "exports" / "k.lock").mkdir(parents=True)
    with pytest.raises(UsageError, match=r"cache lock file .*k\.lock is a folder, not a file; remove it"):
        ExportCache(cache).lock("k", timeout_s=1)
    (cache / "locks").write_text("")
    with pytest.raises(UsageError, match=r"cache folder .*locks is a file, not a folder"):
        named_lock("golden-x")
    (cache / "locks").unlink()
    os.mkdir(named_lock("golden-x").lock_file)
    with pytest.raises(UsageError, match="is a folder, not a file"):
        named_lock("golden-x")


def test_worker_log_folder_that_is_a_file(tmp_path):
    logs = tmp_path / "logs"
    logs.write_text("")
    with pytest.raises(UsageError, match=r"log folder .*logs is a file, not a folder"):
        WorkerPool(1, logs, timeout_s=10)


# --- 2. names matplotlib would parse as mathtext ---------------------------------------------------


def test_plot_draws_tap_and_model_names_literally():
    import matplotlib

    names = ["a$x^2$b", "c$\\frac{x$d", "e$_$f", "<g>&h"]
    diag = diagnosis([tap(n, 3.0 if i % 2 else 0.4) for i, n in enumerate(names)], first=names[1])
    with matplotlib.rc_context({"text.usetex": True}):  # a user's matplotlibrc changes nothing
        page = html.render(report(result("torch/onnx/ort", "fail", diag, model="m$\\sqrt{$")))
    svg = page[page.index("<svg") : page.index("</svg>")]
    for name in ["a$x^2$b", "c$\\frac{x$d", "e$_$f", "&lt;g&gt;&amp;h"]:
        assert f">{name}</text>" in svg
    assert "first divergent: c$\\frac{x$d</text>" in svg
    assert "<g>&h" not in page and "m$\\sqrt{$" in page


# --- 3. timing samples at the ends of the float range ----------------------------------------------


def timed(samples: list[float]) -> dict:
    return {"batches": {"64": {"median_ms": sorted(samples)[len(samples) // 2], "samples_ms": samples}}}


def write_doc(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_compare_samples_from_1e_minus_300_to_1e300(tmp_path):
    a = doc(res("torch", timing=timed([1e-300, 2e-300, 3e-300, 1e-300, 1e300])))
    b = doc(res("torch", timing=timed([1e300, 2e300, 3e300, 1e300, 1e-300])))
    first, second = write_doc(tmp_path, "A.json", json.dumps(a)), write_doc(tmp_path, "B.json", json.dumps(b))
    outcome = invoke("compare", first, second)
    assert outcome.exit_code == 0, outcome.output
    (row,) = [line for line in outcome.output.splitlines() if line.startswith("mlp ")]
    assert row.split()[5] == "5.00e+599"  # B/A = 1e300 / 2e-300, past the float range: in powers of ten
    assert "no significant difference" in row


def test_stats_stay_finite_in_log_space():
    a, b = [1e-300, 2e-300, 3e-300, 4e-300], [1e300, 2e300, 3e300, 4e300]
    r = stats.compare_series_log(b, a)
    assert r["log_ratio"] == pytest.approx(600 * math.log(10), rel=1e-12)  # medians 2.5e300 / 2.5e-300
    lo, hi = r["log_ci95"]
    assert math.isfinite(lo) and math.isfinite(hi) and lo <= r["log_ratio"] <= hi
    assert stats.compare_series(b, a)["ratio"] == math.inf  # past the float range, and no OverflowError
    samples = [1e300, 1.7e308, 1e-300]
    s = stats.summarize(samples, batch_size=1)
    assert s["std_ms"] == pytest.approx(statistics.stdev(samples), rel=1e-12)  # squares would overflow
    assert s["mean_ms"] == pytest.approx(statistics.fmean(samples), rel=1e-12)


@pytest.mark.parametrize(
    "sample, shown", [("1e400", "inf"), ("0", "0"), ("-1.5", "-1.5"), ('"fast"', "a JSON str"), ("null", "null")]
)
def test_compare_refuses_samples_that_are_not_durations(tmp_path, sample, shown):
    good = json.dumps(doc(res("torch", timing=timed([1.0, 2.0, 3.0]))))
    bad = good.replace("[1.0, 2.0, 3.0]", f"[1.0, {sample}, 3.0]")
    outcome = invoke("compare", write_doc(tmp_path, "A.json", good), write_doc(tmp_path, "B.json", bad))
    one_error_line(
        outcome,
        str(tmp_path / "B.json"),
        "(mlp torch)",
        f"timing.batches.64.samples_ms[1] is {shown}, not a positive finite number of milliseconds",
    )


def test_compare_refuses_a_median_that_is_not_a_duration(tmp_path):
    bad = json.dumps(doc(res("torch/onnx/ort", timing={"batches": {"1": {"median_ms": -2.0}}})))
    with pytest.raises(
        UsageError,
        match=r"B\.json: results\[0\] \(mlp torch/onnx/ort\): timing\.batches\.1\."
        r"median_ms is -2\.0, not a positive finite",
    ):
        compare.load(write_doc(tmp_path, "B.json", bad))


# --- 4. --json and --report targets that are symlinks, FIFOs, devices --------------------------------


def test_json_and_report_follow_symlinks_to_their_targets(tmp_path):
    real = tmp_path / "results" / "real.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "r.json"
    link.symlink_to(real)
    pages = tmp_path / "pages"
    pages.mkdir()
    (pages / "index.html").write_text("old")
    report_link = tmp_path / "report"
    report_link.symlink_to(pages)
    outcome = check("--json", str(link), "--report", str(report_link))
    assert outcome.exit_code == 0, outcome.output
    assert link.is_symlink() and os.readlink(link) == str(real)  # the link is kept
    assert json.loads(real.read_text())["schema"] == "parity.result/2"
    assert report_link.is_symlink() and "<!DOCTYPE html>" in (pages / "index.html").read_text()
    assert sorted(p.name for p in real.parent.iterdir()) == ["real.json"]  # no temporary file left


def test_fifo_and_device_are_written_through(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    safefs.write_text_atomic(fifo, '{"a": 1}\n')
    reader.join(10)
    assert received == [b'{"a": 1}\n'] and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    null = tmp_path / "null"
    null.symlink_to("/dev/null")
    safefs.write_text_atomic(null, "x")
    assert null.is_symlink() and stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert safefs.check_writable(fifo, "--json") == fifo and safefs.check_writable(null, "--json") == null


def test_json_to_stdout_through_a_link_appends_to_what_stdout_is(tmp_path):
    """``--json /dev/stdout`` (here a link to it, so nothing of the system's is at stake) with stdout a file:
    the JSON follows the tables in that file; the link stays a link."""
    link = tmp_path / "stdout"
    link.symlink_to("/dev/stdout")
    out = tmp_path / "out.txt"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(out, "wb") as f:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "parity",
                "check",
                "--workspace",
                str(REPO),
                "--model",
                "mlp",
                "--path",
                "torch",
                "--json",
                str(link),
            ],
            stdout=f,
            stderr=subprocess.PIPE,
            env=env,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr.decode()
    text = out.read_text()
    assert link.is_symlink() and os.readlink(link) == "/dev/stdout"
    assert text.index("mlp: 1 pass") < text.index('"schema": "parity.result/2"')
    assert json.loads(text[text.index("{\n") :])["results"][0]["verdict"] == "pass"


# --- 5. folders that do not exist ---------------------------------------------------------------------


def test_json_into_a_missing_folder_is_refused_before_the_run(tmp_path):
    target = tmp_path / "typo" / "r.json"
    one_error_line(check("--json", str(target)), f"--json: folder {tmp_path / 'typo'} does not exist")
    assert not (tmp_path / "typo").exists()


def test_report_in_a_missing_parent_is_refused_and_a_new_report_folder_is_fine(tmp_path):
    one_error_line(
        check("--report", str(tmp_path / "typo" / "report")), f"--report: folder {tmp_path / 'typo'} does not exist"
    )
    assert not (tmp_path / "typo").exists()
    assert safefs.check_writable(tmp_path / "report", "--report", make_parents=False) == tmp_path / "report"
    assert list(tmp_path.iterdir()) == []  # checked, nothing created before the run
