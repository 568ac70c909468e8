"""More of the reliability battery, one test per defect: a ``repro --out`` that is a symlink or cannot be a folder,
a model named ``__init__``, an empty ``--against``, ``compare`` on samples near 1e308, skips in ``parity history``
and the size guard of a declared input, each refused in one line (exit 2) or shown as it is, never a traceback."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
from click.testing import CliRunner

from parity.cli import cli
from parity.model.spec import Tolerance
from parity.results import store
from tests.conftest import REPO
from tests.report.test_compare_results import doc, res

BUGS = REPO / "tests" / "converterbugs.py"


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def one_error_line(outcome, *words) -> str:
    """The single stderr line of a refused command, exit code 2, naming every one of ``words``."""
    assert outcome.exit_code == 2, outcome.output
    assert "Traceback" not in outcome.output
    (line,) = [line for line in outcome.stderr.strip().splitlines() if not line.startswith("  ")]
    assert line.startswith("error: "), line
    for word in words:
        assert word in line, line
    return line


# --- parity repro --out -------------------------------------------------------------------------------------------


def test_repro_out_follows_a_symlink_and_refuses_a_folder_that_cannot_be_made_before_any_work(tmp_path):
    from parity.diagnose.graph.reduce import reduce
    from parity.diagnose.repro import write_report
    from tests.diagnose.graph.test_repro import _chain, _known

    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    right, wrong = _chain(4, lambda i: 2.0), _chain(4, lambda i: 2.5 if i == 3 else 2.0)
    reduced = reduce(wrong, {"x": x}, "ort", _known(right, x), Tolerance(1e-5, 1e-5))
    write_report(link, reduced, Tolerance(1e-5, 1e-5))
    assert link.is_symlink() and os.readlink(link) == str(real)  # the link is kept, its folder written
    assert (real / "model.onnx").is_file() and (real / "repro.py").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]  # no hidden scratch or link left beside

    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(blocker / "bug")
    base = ["repro", "--workspace", REPO, "--model", "mlp", "--path", "torch/onnx/ort", "--out"]
    for out in (dangling, blocker / "bug"):  # refused at once (the path passes: it would have run, then exit 0)
        one_error_line(invoke(*base, out), f"--out {out} cannot be made: {blocker} is a file, not a folder")
    assert blocker.read_text() == "x" and dangling.is_symlink()


# --- parity init __init__ -----------------------------------------------------------------------------------------


def test_init_refuses_a_model_name_that_no_later_command_would_accept(tmp_path):
    for name in ("__init__", "_helpers"):
        one_error_line(
            invoke("init", name, "--workspace", tmp_path, "--torch", f"{BUGS}:make_logsigmoid", "--input", "x=2x8"),
            f"model name {name!r} must not start with _",
        )
        assert not (tmp_path / "models" / f"{name}.py").exists()


# --- --against '' -------------------------------------------------------------------------------------------------


def test_an_empty_against_is_refused_like_any_unknown_run(tmp_path):
    url = tmp_path / "r.sqlite"
    store.Store.open(f"sqlite:///{url}")  # an existing store, with no run in it
    base = ["check", "--workspace", REPO, "--model", "mlp", "--path", "torch"]
    one_error_line(invoke(*base, "--store", url, "--against", ""), "has no run ''")
    one_error_line(invoke(*base, "--no-store", "--against", ""), "drop --no-store")


# --- compare near 1e308 -------------------------------------------------------------------------------------------


def test_compare_near_the_float_range_prints_ratios_of_the_medians_shown_and_no_library_warning(tmp_path):
    def timed(samples):  # a document whose median_ms disagrees with its own samples (B)
        return {"batches": {"64": {"median_ms": 0.02382, "samples_ms": samples}}}

    a, b = tmp_path / "A.json", tmp_path / "B.json"
    a.write_text(json.dumps(doc(res("torch", timing=timed([0.02382, 0.02383, 0.02381, 0.02382])))))
    b.write_text(json.dumps(doc(res("torch", timing=timed([1e308, 1e308, 1e308, 1e308])))))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # SciPy's precision warning on nearly identical log-times raised here
        outcome = invoke("compare", a, b)
    assert outcome.exit_code == 0, outcome.output
    (row,) = [line for line in outcome.output.splitlines() if line.startswith("mlp ")]
    median_a, median_b, ratio = (float(v) for v in row.split()[3:6])
    assert ratio == pytest.approx(median_b / median_a, rel=1e-3) and median_b == 1e308
    assert "B mlp torch batch 64: its median_ms 0.02382 is not its samples' median (1e+308)" in outcome.output


# --- parity history and skips -------------------------------------------------------------------------------------


def _run(verdicts: dict[str, str]) -> dict:
    reason = "no node of the cluster has parity-tf 1"
    return {
        "schema": "parity.result/2",
        "env": {"python": "3.11", "cpu": "Test CPU", "cpu_count": 2, "gpu": None, "packages": {"torch": "2.13.0"}},
        "results": [
            {
                "model": "mlp",
                "path": path,
                "device": "cpu",
                "precision": "fp32",
                "verdict": verdict,
                "reason": reason if verdict == "skip" else None,
                "outputs": {},
                "timing": None,
            }
            for path, verdict in verdicts.items()
        ],
        "model_errors": [],
    }


def test_history_groups_skips_into_one_line_per_path_and_keeps_verdict_changes_as_findings(tmp_path):
    s = store.Store.open(f"sqlite:///{tmp_path / 'r.sqlite'}")
    ids = [
        s.append(_run({"tf": "skip" if k % 2 else "pass", "torch": "fail" if k >= 6 else "pass"}), "check", REPO, 0)
        for k in range(9)
    ]
    outcome = invoke("history", "--workspace", REPO, "--store", tmp_path / "r.sqlite")
    assert outcome.exit_code == 0, outcome.output
    findings = outcome.output.split("Findings")[1].split("\n\n")[0]
    assert findings.count("->") == 1 and f"mlp torch check: pass -> fail at run {ids[6]}" in findings
    skipped = outcome.output.split("Skipped")[1].split("\n\n")[0].strip().splitlines()[1:]
    assert skipped == [
        (f"  mlp tf: skipped in 4 of 9 runs, last at run {ids[7]}: no node of the cluster has parity-tf 1")
    ]


# --- the size guard of a declared input ---------------------------------------------------------------------------


def test_the_size_guard_counts_the_float64_a_float32_input_is_drawn_and_referenced_in():
    from parity.model.user import UserModelError, check_data_size, golden_data_limit

    limit, _ = golden_data_limit()
    elements = limit // 6  # 2/3 of the limit in float32, 4/3 of it in float64
    with pytest.raises(UserModelError, match=r"input 'x' of shape \(\d+,\) float32 would take .* 8 bytes an element"):
        check_data_size("input 'x'", (elements,), "float32")
    check_data_size("input 'x'", (limit // 10,), "float32")  # 4/5 of the limit in float64: allowed
