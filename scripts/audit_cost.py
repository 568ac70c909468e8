"""What the audits of timed series cost: their seconds (output audits and the repeat probe) over the seconds of the
timed calls, measured on the built-in zoo by ``parity bench`` under two stopping rules, side by side.

    python scripts/audit_cost.py [--model mlp --model cnn ...] [--budget 1.0]

Prints per stopping rule: series timed, the median and the 90th percentile of the per-series cost, and the total
(all audit seconds over all timed seconds). The target is 5 % or less.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def _bench(models: list[str], budget: float, target_ci: float, out: Path) -> dict:
    args = [
        sys.executable,
        "-m",
        "parity",
        "bench",
        "--workspace",
        str(REPO),
        "--budget",
        str(budget),
        "--target-ci",
        str(target_ci),
        "--no-store",
        "--json",
        str(out),
    ]
    for model in models:
        args += ["--model", model]
    subprocess.run(args, cwd=REPO, capture_output=True, text=True, check=False)
    return json.loads(out.read_text())


def _costs(report: dict) -> tuple[list[float], float, float]:
    fractions, audit_s, timed_s = [], 0.0, 0.0
    for r in report["results"]:
        timing = r.get("timing") or {}
        for e in [*(timing.get("batches") or {}).values(), *(timing.get("shapes") or {}).values()]:
            a = (e or {}).get("audit") or {}
            if e.get("verdict") == "pass" and a.get("cost_fraction") is not None:
                fractions.append(a["cost_fraction"])
                audit_s += a["seconds"]
                timed_s += sum(e["samples_ms"]) / 1e3
    return fractions, audit_s, timed_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=[])
    parser.add_argument("--budget", type=float, default=1.0)
    args = parser.parse_args()
    models = args.model or ["mlp", "cnn", "transformer"]
    print(f"models {', '.join(models)}; budget {args.budget:g} s per series")
    print(f"{'stopping rule':28} {'series':>6} {'median cost':>12} {'p90 cost':>9} {'total':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, target in (("CI within 2 % (default)", 0.02), ("CI within 0.5 %", 0.005)):
            fractions, audit_s, timed_s = _costs(_bench(models, args.budget, target, Path(tmp) / "b.json"))
            if not fractions:
                print(f"{label:28} nothing timed")
                continue
            print(
                f"{label:28} {len(fractions):6d} {100 * np.median(fractions):11.1f}% "
                f"{100 * np.percentile(fractions, 90):8.1f}% {100 * audit_s / timed_s:6.1f}%"
            )


if __name__ == "__main__":
    main()
