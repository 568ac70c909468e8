#!/usr/bin/env python
"""Workers forked from a template against workers spawned afresh, side by side in one run.

For ``--rounds`` rounds (alternating which goes first), one ``parity check`` of the built-in ``--model`` on
``--path`` patterns with timing (``PARITY_WORKER_START=fork``, then ``spawn``, in this one process: the fork
side keeps its templates from round to round, as a test session or a notebook does) and records:

- the wall time of the check stage (worker start-up included) and of the whole run;
- each path's timed median at ``--batch`` (is a forked worker as fast to *run* a model as a spawned one?);
- each path's first result: load and first inference.

It prints per-path ratios fork / spawn of the medians (pooled over rounds) and the ratio of the medians of
the stage times. Equal timing fidelity means timed ratios near 1; the start-up ratio is the gain.

    python scripts/bench_worker_start.py --rounds 3
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time
from contextlib import redirect_stderr
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(method: str, model: str, patterns: tuple[str, ...], batch: int, budget_s: float) -> dict:
    from parity.bench.plan import BenchOptions
    from parity.model.workspace import Workspace
    from parity.pipeline import orchestrate

    os.environ["PARITY_WORKER_START"] = method
    options = orchestrate.Options(
        threads=1, patterns=patterns, timing=BenchOptions(budget_s=budget_s, batch_sizes=(batch,), min_runs=30)
    )
    started = time.perf_counter()
    with redirect_stderr(io.StringIO()):
        report = orchestrate.check(Workspace(ROOT), [model], options)
    wall = time.perf_counter() - started
    out = {"wall_s": wall, "check_s": report["stage_seconds"].get("check", 0.0), "paths": {}}
    for result in report["results"]:
        timing = result.get("timing") or {}
        entry = timing.get("batches", {}).get(str(batch), {})
        first = timing.get("first_result") or {}
        if entry.get("verdict") == "pass":
            out["paths"][result["path"]] = {
                "samples": entry["samples_ms"],
                "load_s": first.get("load_s"),
                "first_s": first.get("first_inference_s"),
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="mlp")
    parser.add_argument(
        "--path",
        action="append",
        default=None,
        help="path patterns (default: every native path and its ONNX Runtime export)",
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--budget", type=float, default=0.5, help="seconds per timed series")
    args = parser.parse_args()
    patterns = tuple(args.path or ("torch", "tf", "jax", "torch/onnx/ort", "tf/onnx/ort", "jax/onnx/ort"))
    runs: dict[str, list[dict]] = {"fork": [], "spawn": []}
    one_run("fork", args.model, patterns, args.batch, 0.05)  # exports cached, templates started: not counted
    for k in range(args.rounds):
        for method in ("fork", "spawn") if k % 2 == 0 else ("spawn", "fork"):
            runs[method].append(one_run(method, args.model, patterns, args.batch, args.budget))
            print(
                f"round {k + 1} {method}: check {runs[method][-1]['check_s']:.1f} s, "
                f"run {runs[method][-1]['wall_s']:.1f} s",
                flush=True,
            )

    def median(method, key):
        return statistics.median(r[key] for r in runs[method])

    print(f"\n{'path':<18} {'fork ms':>9} {'spawn ms':>9} {'ratio':>6}   first inference fork/spawn")
    ratios = []
    for path in runs["spawn"][0]["paths"]:
        pooled = {m: [s for r in runs[m] for s in r["paths"].get(path, {}).get("samples", [])] for m in runs}
        if not pooled["fork"] or not pooled["spawn"]:
            continue
        fork_ms, spawn_ms = statistics.median(pooled["fork"]), statistics.median(pooled["spawn"])
        ratios.append(fork_ms / spawn_ms)
        firsts = {
            m: statistics.median(r["paths"][path]["first_s"] for r in runs[m] if path in r["paths"]) for m in runs
        }
        print(
            f"{path:<18} {fork_ms:9.3f} {spawn_ms:9.3f} {fork_ms / spawn_ms:6.3f}   "
            f"{firsts['fork'] / firsts['spawn']:.3f}"
        )
    print(f"\ntimed medians, geometric mean of fork/spawn: {statistics.geometric_mean(ratios):.3f}")
    print(
        f"check stage (worker start-up included), fork/spawn: {median('fork', 'check_s'):.1f} s / "
        f"{median('spawn', 'check_s'):.1f} s = {median('fork', 'check_s') / median('spawn', 'check_s'):.3f}"
    )
    print(
        f"whole run, fork/spawn: {median('fork', 'wall_s'):.1f} s / {median('spawn', 'wall_s'):.1f} s = "
        f"{median('fork', 'wall_s') / median('spawn', 'wall_s'):.3f}"
    )


if __name__ == "__main__":
    main()
