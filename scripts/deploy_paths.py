#!/usr/bin/env python
"""The runtimes models are deployed to, on the zoo, in one run: ``parity run`` with every deployment path named
(the opt-in ones too) beside each model's native baseline, then one table per model: verdict and reason, time to
first result and steady-state median each as a ratio to the native baseline measured in the same run, and peak
memory above the worker's idle size. Ratios, not absolute times: this machine is shared and noisy.

    python scripts/deploy_paths.py [--models mlp,cnn,transformer] [--budget 0.5] [--json r.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

DEPLOYED = (
    "torch/compile",
    "torch/compile-autotune",
    "torch/export",
    "torch/executorch",
    "torch/openvino",
    "torch/onnx/openvino",
    "torch/litert",
    "tf/xla",
    "tf/litert",
    "tf/onnx/openvino",
    "jax/onnx/openvino",
)
NATIVE = ("torch", "tf", "jax")


def first_s(result: dict) -> float | None:
    """Seconds from a fresh worker to the first output: import, export (cached or not: its own time), load, first
    inference."""
    first = (result.get("timing") or {}).get("first_result") or {}
    parts = [first.get(k) for k in ("import_s", "load_s", "first_inference_s")]
    if any(p is None for p in parts):
        return None
    return sum(parts) + (first.get("export_s") or 0.0)


def steady(result: dict, batch: str) -> tuple[float | None, float | None]:
    """The median ms and peak MB of the series at ``batch``."""
    entry = ((result.get("timing") or {}).get("batches") or {}).get(batch) or {}
    if entry.get("verdict") != "pass":
        return None, None
    return entry.get("median_ms"), (entry.get("memory") or {}).get("peak_rss_mb")


def ratio(value, base) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}x"


def render(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=170)
    by_model: dict[str, dict[str, dict]] = {}
    for r in report["results"]:
        by_model.setdefault(r["model"], {})[r["path"]] = r
    for model, results in by_model.items():
        table = Table(title=f"{model}: deployment paths against the native baseline (same run)")
        for column in (
            "path",
            "verdict",
            "batch",
            "first result s",
            "vs native",
            "median ms",
            "vs native",
            "peak MB",
            "artifact MB",
            "reason",
        ):
            table.add_column(
                column, justify="left" if column in ("path", "verdict", "reason") else "right", overflow="fold"
            )
        for path, r in results.items():
            base = results.get(path.split("/")[0]) or {}
            batches = sorted(((r.get("timing") or {}).get("batches") or {}), key=lambda b: int(b) if b.isdigit() else 0)
            batch = batches[-1] if batches else "-"
            median, peak = steady(r, batch)
            base_median, _ = steady(base, batch)
            entry = ((r.get("timing") or {}).get("batches") or {}).get(batch) or {}
            table.add_row(
                path,
                r.get("verdict", "-"),
                batch,
                "-" if first_s(r) is None else f"{first_s(r):.2f}",
                ratio(first_s(r), first_s(base)),
                "-" if median is None else f"{median:.4f}",
                ratio(median, base_median),
                "-" if peak is None else f"{peak:.0f}",
                "-" if entry.get("artifact_mb") is None else f"{entry['artifact_mb']:.2f}",
                " ".join(str(r.get("reason") or "").split())[:160],
            )
        console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn,transformer")
    parser.add_argument("--budget", default="0.5", help="seconds of timed runs per series")
    parser.add_argument("--json", type=Path, help="keep the result JSON here")
    args = parser.parse_args()
    out = args.json or Path(tempfile.mkdtemp(prefix="parity-deploy-")) / "r.json"
    command = [sys.executable, "-m", "parity.cli", "run", "--json", str(out), "--budget", args.budget, "--no-store"]
    for model in args.models.split(","):
        command += ["--model", model]
    for path in (*NATIVE, *DEPLOYED):
        command += ["--path", path]
    done = subprocess.run(command, capture_output=True, text=True)
    if not out.exists():
        sys.exit(f"parity run wrote no result (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-400:]}")
    render(json.loads(out.read_text()))


if __name__ == "__main__":
    main()
