"""Audits of timed series: outputs of timed calls against the verified ones, inputs rotated, a path that gets
faster on repeated inputs flagged. The end-to-end cases are real torch models a user could write, taken through
init, golden build and bench: one whose outputs change once it has been called often at the timed batch size (as a
runtime that switches kernels after warm-up would), one that caches its result for a repeated input."""

from __future__ import annotations

import itertools
import json

import numpy as np
from click.testing import CliRunner

from parity.bench import audit
from parity.cli import cli

NETS = '''
def make_drifting():
    """Right at every batch size until it has run 40 times at batch 2: then 1e-2 off (only the timing sees it)."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 3)
            self.calls = 0

        def forward(self, x):
            y = self.fc(x)
            if x.shape[0] == 2:
                self.calls += 1
                if self.calls > 40:
                    y = y + 1e-2
            return y

    return Net().eval()


def make_caching():
    """Slow work for a new input; at batch 2 (the one timed) the same input again returns the stored result at once."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 3)
            self.lift = nn.Linear(8, 256)
            self.work = nn.Linear(256, 256)
            self.key, self.out = None, None

        def forward(self, x):
            key = (x.dtype, tuple(x.shape), x.detach().cpu().numpy().tobytes())
            if key == self.key and x.shape[0] == 2:
                return self.out
            h = self.lift(x)
            for _ in range(100):
                h = torch.tanh(self.work(h))
            y = self.fc(x) + 0 * h.sum()
            self.key, self.out = key, y
            return y

    return Net().eval()
'''


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _bench(tmp_path, maker):
    source = tmp_path / "nets.py"
    source.write_text(NETS)
    root = tmp_path / "ws"
    root.mkdir()
    name = maker.removeprefix("make_")
    assert _invoke("init", name, "--workspace", root, "--torch", f"{source}:{maker}", "--input", "x=4x8").exit_code == 0
    assert _invoke("golden", "build", "--workspace", root, "--model", name).exit_code == 0
    out = tmp_path / "b.json"
    result = _invoke(
        "bench",
        "--workspace",
        root,
        "--model",
        name,
        "--path",
        "torch",
        "--batch-size",
        "2",
        "--budget",
        "0.3",
        "--threads",
        "1",
        "--json",
        out,
    )
    return result, json.loads(out.read_text())["results"][0]


def test_outputs_that_change_during_timing_void_the_series_and_no_number_is_given(tmp_path):
    result, r = _bench(tmp_path, "make_drifting")
    entry = r["timing"]["batches"]["2"]
    assert r["verdict"] == "pass"  # checked right: only the timing sees the change
    assert entry["verdict"] == "invalid"
    assert entry["reason"].startswith("invalid: outputs during timing differ from the verified ones")
    assert "median_ms" not in entry and "samples_ms" not in entry
    assert not entry["audit"]["ok"] and entry["audit"]["feeds"] > 1
    assert result.exit_code == 1
    assert "INVALID" in result.output


def test_a_path_faster_on_repeated_inputs_is_flagged(tmp_path):
    result, r = _bench(tmp_path, "make_caching")
    entry = r["timing"]["batches"]["2"]
    assert entry["verdict"] == "pass" and entry["audit"]["ok"]
    cache = entry["audit"]["cache"]
    assert cache["flagged"], cache
    assert cache["ratio"] < 0.5 and (cache["rule"] == "order" or cache["ci95"][1] < 1)
    assert "faster on a repeated input" in result.output


def _linear(shift: float = 0.0):
    w = np.random.default_rng(0).normal(size=(8, 3))
    return lambda feed: {"y": feed["x"] @ w + shift}


def test_audit_points_sit_between_blocks_and_a_steady_path_passes_with_a_small_cost():
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.normal(size=(4, 8))} for _ in range(5)]
    f = _linear()
    expected = [f(x)["y"] for x in feeds]
    calls = []

    def run(feed):
        calls.append(feed["x"])
        return f(feed)

    def verify(k, out):
        units = float(np.max(np.abs(out["y"] - expected[k])) / 1e-9)
        return {"ok": units <= 1, "tol_units": units}

    measured = audit.audited_measure(run, feeds, verify, {"budget_s": 0.05, "min_runs": 30})
    a = measured["audit"]
    assert a["ok"] and len(a["outputs"]) >= audit.AUDITS_MIN + 1
    assert all(o["feed"] == (o["call"] - 1) % len(feeds) for o in a["outputs"])
    # the timed calls rotate: consecutive timed calls never repeat one input
    timed = measured["warmup_runs"]
    assert not np.array_equal(calls[timed], calls[timed + 1])
    assert 1 <= len(a["probe_ms"]) <= audit.probe_target(len(measured["samples_ms"]))  # topped up at audit points


def test_a_series_timed_in_blocks_goes_on_rotating_where_its_last_block_stopped():
    """Each block of an interleaved series starts at the feed after the last one its previous block ran: started
    again at the first feed, a block could repeat the input the last one ended on, and a caching path's hit would
    count among the rotating times (and hide the cache from the probe)."""
    feeds = [{"x": np.full((2, 3), float(k))} for k in range(2)]
    ran: list[int] = []

    def run(feed):
        ran.append(int(feed["x"][0, 0]))
        return {"y": feed["x"]}

    def verify(k, out):
        return {"ok": bool(np.array_equal(out["y"], feeds[k]["x"])), "tol_units": 0.0}

    start = 1
    for block in range(4):
        timing = {"max_runs": 3 + block, "min_runs": 3 + block, "max_warmup_runs": 0, "budget_s": 10.0}
        measured = audit.audited_measure(run, feeds, verify, timing, seed=block, probe=0, start=start)
        assert measured["audit"]["ok"], measured["audit"]["outputs"]
        start = measured["audit"]["next_feed"]
    assert all(a != b for a, b in itertools.pairwise(ran)), ran  # never the same input twice in a row


def test_a_runtime_that_changes_after_warm_up_is_caught_by_the_sampled_audits():
    rng = np.random.default_rng(2)
    feeds = [{"x": rng.normal(size=(4, 8))} for _ in range(3)]
    right, wrong = _linear(), _linear(1e-3)
    expected = [right(x)["y"] for x in feeds]
    state = {"n": 0}

    def run(feed):  # switches after the warm-up's windows
        state["n"] += 1
        return (right if state["n"] <= 40 else wrong)(feed)

    def verify(k, out):
        units = float(np.max(np.abs(out["y"] - expected[k])) / 1e-6)
        return {"ok": units <= 1, "tol_units": units}

    measured = audit.audited_measure(run, feeds, verify, {"budget_s": 0.05, "min_runs": 30, "max_warmup_runs": 20})
    assert not measured["audit"]["ok"]
    voided = audit.void({"verified": None, **measured})
    assert voided["verdict"] == "invalid" and "median_ms" not in voided
    assert "x the tolerance" in voided["reason"]


def test_the_cache_verdict_needs_repeats_beyond_the_noise():
    rng = np.random.default_rng(4)
    rotating = list(np.exp(rng.normal(0, 0.05, 200)))
    assert not audit.cache_verdict(rotating, list(np.exp(rng.normal(0, 0.05, 8))))["flagged"]
    assert audit.cache_verdict(rotating, list(0.1 * np.exp(rng.normal(0, 0.05, 8))))["flagged"]
    few = audit.cache_verdict(rotating[:30], [0.2, 0.3])  # a slow series' two repeats: the order rule
    assert few["flagged"] and few["rule"] == "order"
    assert not audit.cache_verdict(rotating[:30], [0.2, 1.0])["flagged"]
    assert audit.probe_target(24) == 1 and audit.probe_target(60) == 2 and audit.probe_target(1000) == 20
