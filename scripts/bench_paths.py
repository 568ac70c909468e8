#!/usr/bin/env python
"""Side-by-side latency of every verified path, as ratios to a baseline path, in one run.

Checks every path first (the gate) and times only those that pass; the machine is noisy, so
what matters is the ratio of medians measured in the same run, with each median's 95 % CI.

    python scripts/bench_paths.py --model mlp --baseline torch --budget 2
"""

from __future__ import annotations

import argparse

from parity import orchestrate
from parity.env import default_threads
from parity.workspace import Workspace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=[])
    parser.add_argument("--path", action="append", default=[])
    parser.add_argument("--baseline", default="torch", help="path id the ratios are relative to")
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of timed runs per path")
    parser.add_argument("--threads", type=int, default=default_threads())
    parser.add_argument("--workspace", default=None)
    args = parser.parse_args()

    ws = Workspace(args.workspace)
    options = orchestrate.Options(threads=args.threads, patterns=tuple(args.path), timing={"budget_s": args.budget})
    report = orchestrate.check(ws, ws.select(args.model), options)
    print(f"threads {args.threads}, budget {args.budget:g} s per path, cpu {report['env']['cpu']}")
    for model in dict.fromkeys(r["model"] for r in report["results"]):
        rows = [r for r in report["results"] if r["model"] == model]
        base = next((r["timing"] for r in rows if r["path"] == args.baseline and r["timing"]), None)
        print(f"\n{model} (ratio = median / median of {args.baseline})")
        for r in rows:
            t = r["timing"]
            if t is None:
                print(f"  {r['path']:<20} {r['verdict']:<6} not timed")
                continue
            ratio = f"{t['median_ms'] / base['median_ms']:.2f}x" if base else "-"
            lo, hi = t["ci95_ms"]
            print(f"  {r['path']:<20} pass   median {t['median_ms']:.4f} ms [{lo:.4f}, {hi:.4f}]  "
                  f"runs {t['runs']:<6} ratio {ratio}")


if __name__ == "__main__":
    main()
