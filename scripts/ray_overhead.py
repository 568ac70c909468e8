"""Per-cell overhead of ``--executor ray`` against local execution: the same ``parity check`` of the same models,
side by side in one run, each repeated; prints the medians, seconds per cell and their ratio.

    python scripts/ray_overhead.py [--model mlp ...] [--repeats 2]

The Ray run starts a Ray of this machine's own (its start-up is counted); the export cache is warm for both
(a first, untimed local run fills it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _check(models: list[str], executor: str, out: Path) -> tuple[float, int]:
    args = [sys.executable, "-m", "parity", "check", "--workspace", str(REPO), "--no-store", "--json", str(out),
            "--executor", executor]
    for model in models:
        args += ["--model", model]
    started = time.perf_counter()
    subprocess.run(args, cwd=REPO, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    cells = sum(1 for r in json.loads(out.read_text())["results"] if r["verdict"] != "skip")
    return seconds, cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=[])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    models = args.model or ["mlp"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        _check(models, "local", out)  # fills the export cache
        times = {"local": [], "ray": []}
        cells = 0
        for _ in range(args.repeats):
            for executor in ("local", "ray"):  # alternated, so a drift of the machine falls on both
                seconds, cells = _check(models, executor, out)
                times[executor].append(seconds)
    local, ray = statistics.median(times["local"]), statistics.median(times["ray"])
    print(f"models {', '.join(models)}: {cells} cells, {args.repeats} runs each, medians")
    print(f"local {local:7.1f} s  ({local / cells:5.2f} s per cell)")
    print(f"ray   {ray:7.1f} s  ({ray / cells:5.2f} s per cell)")
    print(f"ray/local {ray / local:.2f}; overhead per cell {(ray - local) / cells:+.2f} s")


if __name__ == "__main__":
    main()
