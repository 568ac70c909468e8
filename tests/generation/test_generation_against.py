"""``--against`` and ``parity history`` on generation paths: each path's time to first token and decode step time at
each batch size compared with the baseline's from the raw samples (ratio of medians, its 95 % CI, faster or slower
only beyond the noise), the results store keeping those series, and runs of generation models alone or beside a
forward model never failing the comparison or the history."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from parity.cli import cli
from parity.generation.timing import interval as _interval
from parity.pipeline.jobs import _past_medians
from parity.results import against, history, store

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

import lmmodels  # noqa: E402

SERIES = ("time to first token", "decode step")


def _samples(median: float, seed: int, spread: float, n: int) -> list[float]:
    return [float(x) for x in median * np.exp(np.random.default_rng(seed).normal(0, spread, n))]


def _generation_row(ttft: float, step: float, seed: int, spread: float, n: int, prompt_length: int) -> dict:
    batches = {}
    for batch in ("1", "4"):
        first = _samples(ttft * int(batch), seed, spread, n)
        steps = _samples(step, seed + 100, spread, n)
        batches[batch] = {
            "ttft_ms": _interval(first),
            "decode_step_ms": _interval(steps),
            "decode_tokens_per_s": {"median": int(batch) / float(np.median(steps)) * 1e3},
            "peak_rss_mb": 10.0,
            "samples_ms": {"ttft": first, "decode_step": steps},
        }
    timing = {"path": "torch", "prompt_length": prompt_length, "new_tokens": 8, "threads": 1, "batches": batches}
    return {
        "model": "llama",
        "path": "torch",
        "device": "cpu",
        "precision": "fp32",
        "verdict": "pass",
        "reason": None,
        "outputs": None,
        "timing": None,
        "generation": {"steps": 8, "first_divergent_step": None, "timing": timing},
    }


def _forward_row(median: float, seed: int) -> dict:
    samples = _samples(median, seed, 0.01, 200)
    q1, q3 = np.percentile(samples, [25, 75])
    entry = {
        "verdict": "pass",
        "median_ms": float(np.median(samples)),
        "ci95_ms": [float(np.percentile(samples, 45)), float(np.percentile(samples, 55))],
        "spread": float((q3 - q1) / np.median(samples)),
        "runs": 200,
        "samples_ms": samples,
        "stability": {"ok": True},
    }
    return {
        "model": "mlp",
        "path": "torch/onnx/ort",
        "device": "cpu",
        "precision": "fp32",
        "verdict": "pass",
        "reason": None,
        "outputs": {"logits": {"tol_units": 0.1, "ok": True}},
        "timing": {"batches": {"1": entry}},
    }


def _doc(
    ttft: float = 20.0,
    step: float = 2.0,
    seed: int = 0,
    spread: float = 0.01,
    n: int = 60,
    prompt_length: int = 16,
    forward: float | None = None,
) -> dict:
    results = [_generation_row(ttft, step, seed, spread, n, prompt_length)]
    if forward is not None:
        results.insert(0, _forward_row(forward, seed))
    env = {"python": "3.11", "cpu": "Test CPU", "cpu_count": 2, "gpu": None, "packages": {"torch": "2.13.0"}}
    return {"schema": "parity.result/2", "env": env, "results": results, "run_id": f"run{seed}"}


def _block(text: str) -> dict[str, str]:
    """Each generation series named in the against block -> its line."""
    found = {}
    for line in text.splitlines():
        for batch in ("1", "4"):
            for title in SERIES:
                if f"llama torch batch {batch} {title}: " in line:
                    found[(batch, title)] = line
    return found


def test_each_generation_series_is_compared_from_its_samples_and_a_slower_one_fails():
    baseline = _doc(seed=1)
    text, code = against.render(baseline, _doc(seed=2), [])
    assert code == 0, text
    lines = _block(text)
    assert set(lines) == {(b, t) for b in ("1", "4") for t in SERIES}, text
    assert all("95% CI [" in line and " ms" in line and "changed:" not in line for line in lines.values())
    assert "generation timing (this run / the baseline" in text
    # time to first token 1.5 times longer: slower beyond the noise, the exit code 1; the decode step did not move
    text, code = against.render(baseline, _doc(ttft=30.0, seed=3), [])
    assert code == 1 and "changed: llama torch batch 1 time to first token: 1.5x (slower; 95% CI [" in text, text
    assert "changed: llama torch batch 1 decode step" not in text
    # a decode step twice as fast: faster, which fails the comparison as any change does
    text, code = against.render(baseline, _doc(step=1.0, seed=4), [])
    assert code == 1 and "changed: llama torch batch 4 decode step: 0.499x (faster; 95% CI [" in text, text
    # 8 % slower is beyond the 5 % floor, but not beyond what the earlier runs of that series varied by
    text, code = against.render(baseline, _doc(ttft=21.6, seed=5), [])
    assert code == 1 and "changed: llama torch batch 1 time to first token: 1.08x (slower" in text, text
    wide = {("llama", "torch", "1", "ttft"): [20.0, 22.4, 18.0, 22.0, 18.6], ("llama", "torch", "4", "ttft"): [80.0]}
    text, code = against.render(baseline, _doc(ttft=21.6, seed=5), [], wide)
    assert "changed: llama torch batch 1 time to first token" not in text, text
    assert "llama torch batch 1 time to first token: 1.08x (within noise" in text


def test_generation_series_not_comparable_are_withheld_with_the_reason():
    baseline = _doc(seed=1)
    text, code = against.render(baseline, _doc(prompt_length=64, seed=2), [])
    withheld = "withheld: llama torch batch 1 time to first token: not compared, timed with a different prompt length"
    assert code == 0 and f"{withheld} 16 -> 64" in text, text
    # five generations 30 % apart: the median's interval is [min, max], far wider than 10 %
    text, code = against.render(baseline, _doc(ttft=40.0, spread=0.3, n=5, seed=2), [])
    assert code == 0 and "this run's series did not settle" in text, text
    failed = _doc(seed=2)
    failed["results"][0]["generation"]["timing"] = {"verdict": "error", "reason": "the worker died"}
    text, code = against.render(baseline, failed, [])
    assert (
        code == 0
        and "withheld: llama torch generation: not compared, this run's timing: error, the worker died" in text
    )
    no_samples = _doc(seed=2)
    del no_samples["results"][0]["generation"]["timing"]["batches"]["1"]["samples_ms"]
    assert (
        "batch 1 decode step: not compared, no raw samples in both runs" in against.render(baseline, no_samples, [])[0]
    )
    # a checked path never timed (parity check), or failing now: nothing to compare, nothing said, no error
    checked = _doc(seed=2)
    checked["results"][0]["generation"]["timing"] = None
    assert not _block(against.render(baseline, checked, [])[0])
    checked["results"][0]["verdict"] = "fail"
    text, code = against.render(baseline, checked, [])
    assert code == 1 and "verdict pass -> FAIL" in text


def test_a_run_mixing_forward_and_generation_paths_compares_both():
    text, code = against.render(_doc(seed=1, forward=1.0), _doc(seed=2, forward=1.5), [])
    assert code == 1 and "changed: mlp torch/onnx/ort batch 1: 1.5x (slower" in text, text
    assert len(_block(text)) == 4 and "changed: llama" not in text


def test_the_store_keeps_generation_series_with_their_samples_and_history_reads_them(tmp_path):
    rows = [r for r in store.series_rows(_doc(seed=1, forward=1.0)) if r["kind"] in ("ttft", "decode_step")]
    assert {(r["kind"], r["key"]) for r in rows} == {(k, b) for k in ("ttft", "decode_step") for b in ("1", "4")}
    first = next(r for r in rows if (r["kind"], r["key"]) == ("ttft", "1"))
    assert first["verdict"] == "pass" and len(json.loads(first["samples_ms"])) == 60
    assert first["ci_lo_ms"] <= first["median_ms"] <= first["ci_hi_ms"] and first["runs"] == 60
    opened = store.Store.open(f"sqlite:///{tmp_path / 'r.sqlite'}")
    opened.append(_doc(seed=1), "run", tmp_path, 0)  # a run of the generation model alone, then beside a forward one
    for seed, ttft in ((2, 20.0), (3, 20.0), (4, 20.0), (5, 40.0), (6, 40.0), (7, 40.0), (8, 40.0)):
        opened.append(_doc(ttft=ttft, seed=seed, forward=1.0), "run", tmp_path, 0)
    series, envs = history.build(opened.history())
    text = history.render(series, envs, "store", 8)
    assert "llama torch batch 1 time to first token" in text and "llama torch batch 4 decode step" in text
    steps = [line for line in history.findings(series, envs) if "batch 1 time to first token: " in line]
    assert any(": 2x (slower; median 20" in line for line in steps), steps
    past = _past_medians(opened, _doc(seed=10, forward=1.0))
    assert len(past[("llama", "torch", "1", "ttft")]) == 8 and len(past[("mlp", "torch/onnx/ort", "1")]) == 7
    # --against reads the stored document back whole: the samples are there
    assert len(_block(against.render(opened.document("last"), _doc(seed=10), [])[0])) == 4


def _cli(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


NET = """
def make_net():
    import torch

    torch.manual_seed(0)
    return torch.nn.Linear(8, 3).eval()
"""


@pytest.mark.slow
def test_two_runs_of_a_tiny_llama_beside_a_forward_model_the_second_against_the_first(tmp_path):
    lmmodels.save(lmmodels.llama(), tmp_path / "tiny_llama")
    (tmp_path / "net.py").write_text(NET)
    root = tmp_path / "ws"
    root.mkdir()
    assert (
        _cli("init", "llama", "--hf", tmp_path / "tiny_llama", "--task", "text-generation", "-w", root).exit_code == 0
    )
    spec = root / "models" / "llama.py"
    spec.write_text(
        spec.read_text().replace(
            "    seed=0,\n",
            "    seed=0,\n    bench_batch_sizes=(1, 2),\n    bench_prompt_length=8,\n    bench_new_tokens=4,\n",
        )
    )
    assert (
        _cli("init", "net", "-w", root, "--torch", f"{tmp_path / 'net.py'}:make_net", "--input", "x=4x8").exit_code == 0
    )
    for model in ("llama", "net"):
        assert _cli("golden", "build", "--model", model, "-w", root).exit_code == 0
    run = ["run", "-w", root, "--model", "llama", "--model", "net", "--path", "torch", "--budget", "0.1"]
    assert _cli(*run).exit_code == 0
    second = _cli(*run, "--against", "last", "--json", tmp_path / "b.json")
    assert second.exit_code in (0, 1), second.output  # 1 only where a timing changed beyond its noise
    block = json.loads((tmp_path / "b.json").read_text())["against"]["text"]
    for batch in ("1", "2"):
        for title in SERIES:  # compared, or withheld as not settled on a busy machine: named either way
            assert f"llama torch batch {batch} {title}: " in block, block
    shown = _cli("history", "-w", root)
    assert shown.exit_code == 0, shown.output
    assert "llama torch batch 2 time to first token" in shown.output and "net torch batch 4" in shown.output
    only = _cli("run", "-w", root, "--model", "llama", "--path", "torch", "--budget", "0.1", "--against", "last")
    assert only.exit_code in (0, 1) and "llama torch batch 1 decode step: " in only.output, only.output
