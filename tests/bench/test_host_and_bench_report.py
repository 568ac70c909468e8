"""The host audit (frequency settings, other processes' load, threads) and what a benchmarker reads: the HTML
benchmark section with its latency plots, processes and audits, the history page linked from it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from click.testing import CliRunner

from parity.cli import cli
from parity.platform.host import HostMonitor, frequency_settings
from tests.conftest import REPO


def test_frequency_settings_and_threads_become_warnings_that_name_the_fix(tmp_path):
    for cpu, governor in (("cpu0", "powersave"), ("cpu1", "performance")):
        (tmp_path / cpu / "cpufreq").mkdir(parents=True)
        (tmp_path / cpu / "cpufreq" / "scaling_governor").write_text(governor + "\n")
    (tmp_path / "cpufreq").mkdir()
    (tmp_path / "cpufreq" / "boost").write_text("1\n")
    assert frequency_settings(tmp_path) == {"governors": {"powersave": 1, "performance": 1}, "boost": True}
    with HostMonitor(threads=4096, interval_s=0.05, cpu_root=tmp_path) as monitor:
        time.sleep(0.2)
    audit = monitor.audit({"worker_environment": {}})
    text = " | ".join(audit["warnings"])
    assert "governor 'powersave' on 1 CPU(s)" in text and "pyperf system tune" in text
    assert "boost (turbo) is on" in text and "4096 intra-op threads" in text
    assert audit["threads"]["intra_op"] == 4096


def test_load_from_a_process_that_is_not_parity_is_measured_and_warned_about():
    # a busy loop detached from this process (its shell exits at once): not one of parity's own processes
    out = subprocess.run(
        ["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(out.stdout.strip())
    try:
        with HostMonitor(threads=1, interval_s=0.2) as monitor:
            time.sleep(1.5)
        audit = monitor.audit()
    finally:
        os.kill(pid, signal.SIGKILL)
    assert audit["other_load_cores"]["median"] > 0.5
    assert any("other processes used" in w for w in audit["warnings"])


def test_the_html_report_gains_the_benchmark_and_the_history_page(tmp_path):
    out = tmp_path / "report"
    args = [
        "bench",
        "--workspace",
        str(REPO),
        "--model",
        "mlp",
        "--path",
        "torch/onnx/ort",
        "--path",
        "torch",
        "--batch-size",
        "1",
        "--budget",
        "0.05",
        "--processes",
        "2",
        "--store",
        str(tmp_path / "r.sqlite"),
        "--report",
        str(out),
    ]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "Processes (each series pooled from fresh worker processes)" in result.output
    page = (out / "index.html").read_text()
    bench = page[page.index("<h2>Benchmark</h2>") :]
    assert "Latency of mlp at batch 1" in bench and bench.count("<svg") == 1
    assert "outputs ok over 16 inputs" in bench and "2: cv" in bench
    # the ratio to torch, or why it is withheld where a busy machine left a series unsettled
    assert "vs torch" in bench or "withheld: " in bench
    assert "Time to first result (fresh worker)" in bench
    assert "Memory and energy (per timed series, beside its latency)" in bench and "peak MB above idle" in bench
    assert 'href="history.html"' in page and "<svg" in (out / "history.html").read_text()
