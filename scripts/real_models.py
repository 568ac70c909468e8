#!/usr/bin/env python
"""Real architectures through the README's commands: ``parity init`` -> ``golden build`` -> ``check`` (every path,
the opt-in deployment runtimes too) -> ``diagnose`` of a failing path.

Each model is built by its package's own constructor with random weights (``tests/realmodels.py``; nothing is
downloaded) in a fresh workspace, and goes through the command line exactly as a user's would. One row per
model: parameters, inputs, paths pass / fail / error with their reasons (a failing path's with where its diagnosis
says the drift begins), golden build time, check time, golden size, and the peak resident memory of any process of
that model's run; then the verdict of every path on every model. A model that cannot be built here says
why in its row; none is left out.

    python scripts/real_models.py [--only bert,gpt2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FACTORIES = ROOT / "tests" / "realmodels.py"
OPT_IN = ("torch/compile", "torch/executorch")  # deployment runtimes a plain check leaves out (compile time)

MODELS = {  # name -> (how init is given the model, its --input/--axis arguments, what is prepared first)
    "bert": (
        "--torch",
        "realmodels.py:make_bert",
        [
            "--input",
            "input_ids=2,sequence:int64",
            "--input",
            "attention_mask=2,sequence:int64",
            "--input",
            "token_type_ids=2,sequence:int64",
            "--axis",
            "sequence=16",
        ],
        None,
    ),
    "gpt2": (
        "--torch",
        "realmodels.py:make_gpt2",
        [
            "--input",
            "input_ids=2,sequence:int64",
            "--input",
            "attention_mask=2,sequence:int64",
            "--axis",
            "sequence=16",
        ],
        None,
    ),
    "resnet18": ("--torch", "realmodels.py:make_resnet18", ["--input", "x=2x3x64x64"], "torchvision"),
    "mobilenet_v3_small": (
        "--torch",
        "realmodels.py:make_mobilenet_v3_small",
        ["--input", "x=2x3x64x64"],
        "torchvision",
    ),
    "hf_resnet18": ("--torch", "realmodels.py:make_hf_resnet18", ["--input", "pixel_values=2x3x64x64"], None),
    "hf_mobilenet_v2": ("--torch", "realmodels.py:make_hf_mobilenet_v2", ["--input", "pixel_values=2x3x96x96"], None),
    "keras_mobilenet_v2": ("--keras", "mobilenet_v2.keras", ["--input", "x=2x96x96x3"], "keras"),
    "flax_cnn": ("--jax", "realmodels.py:flax_apply,flax_params.npz", ["--input", "x=2x16x16x3"], "flax"),
}


def prepare(kind: str | None, root: Path) -> str | None:
    """Files a model needs before init (a saved .keras, Flax params); why it cannot be built here, or None."""
    code = {
        "keras": "import realmodels; realmodels.save_keras_mobilenet_v2('mobilenet_v2.keras')",
        "flax": "import realmodels; realmodels.save_flax_params('flax_params.npz')",
        "torchvision": "import torchvision",
    }.get(kind)
    if code is None:
        return None
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    if done.returncode:
        return (done.stderr.strip().splitlines() or ["failed"])[-1][:200]
    return None


def parity(root: Path, *args: str) -> tuple[int, str, float]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "parity.cli", *args, "--workspace", str(root)], cwd=root, capture_output=True, text=True
    )
    return done.returncode, (done.stdout + done.stderr).strip(), time.perf_counter() - started


def one(name: str, root: Path) -> dict:
    """Run one model in ``root``; the row."""
    flag, reference, inputs, kind = MODELS[name]
    shutil.copy(FACTORIES, root / "realmodels.py")
    row = {"model": name}
    blocked = prepare(kind, root)
    if blocked:
        return {**row, "error": f"cannot be built here: {blocked}"}
    code, text, _ = parity(root, "init", name, flag, reference, *inputs)
    if code:
        return {**row, "error": f"init: {text.splitlines()[-1]}"}
    row["params"] = int(text.split(" parameters")[0].rsplit(" ", 1)[-1].replace(",", ""))
    row["inputs"] = ", ".join(inputs[i + 1].split("=")[0] for i, arg in enumerate(inputs) if arg == "--input")
    code, text, row["golden_s"] = parity(root, "golden", "build", "--model", name)
    if code:
        return {**row, "error": f"golden build: {text.splitlines()[-1]}"}
    row["golden_mb"] = sum(f.stat().st_size for f in (root / "golden" / name).iterdir()) / 2**20
    report = root / "report.json"
    # every path that is not opt-in, and the opt-in deployment runtimes named
    selected = [arg for path in ("*", *OPT_IN) for arg in ("--path", path)]
    code, text, row["check_s"] = parity(root, "check", "--model", name, "--json", str(report), *selected)
    if not report.exists():
        return {**row, "error": f"check: {text.splitlines()[-1] if text else code}"}
    results = json.loads(report.read_text())["results"]
    row["paths"] = {r["path"]: (r["verdict"], r.get("reason")) for r in results}
    for r in results:  # a failing path: where its diagnosis says the drift begins
        if r["verdict"] == "fail":
            out = root / "diagnose.json"
            parity(root, "diagnose", "--model", name, "--path", r["path"], "--json", str(out))
            found = json.loads(out.read_text())["results"] if out.exists() else []
            diagnosis = (found[0].get("diagnosis") if found else None) or {}
            trail = diagnosis.get("first_divergent_path") or [diagnosis.get("first_divergent_tap") or "no tap"]
            cause = (diagnosis.get("cause") or {}).get("variant") or "no tested cause"
            row["paths"][r["path"]] = ("fail", f"{r.get('reason')}; diagnosis: drift begins at {trail[-1]} ({cause})")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated model names (default: all)")
    parser.add_argument("--keep", type=Path, help="keep the workspaces under this folder")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # a child: one model, its peak memory measured over its own processes
        row = one(args.one, args.root)
        row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(json.dumps(row))
        return
    names = [n for n in args.only.split(",") if n] or list(MODELS)
    rows = []
    for name in names:
        root = Path(tempfile.mkdtemp(prefix=f"parity-{name}-", dir=args.keep))
        done = subprocess.run(
            [sys.executable, __file__, "--one", name, "--root", str(root)], capture_output=True, text=True
        )
        try:
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        except (IndexError, json.JSONDecodeError):
            rows.append({"model": name, "error": (done.stderr.strip().splitlines() or ["crashed"])[-1][:200]})
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
        print(f"{name}: done", file=sys.stderr)
    render(rows)


def render(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Real architectures: init -> golden build -> check (random weights, CPU)")
    for column in (
        "model",
        "params",
        "inputs",
        "pass",
        "fail",
        "error",
        "xerror",
        "golden s",
        "check s",
        "golden MB",
        "peak RSS MB",
    ):
        table.add_column(column, justify="right" if column not in ("model", "inputs") else "left")
    notes = []
    for row in rows:
        paths = row.get("paths", {})
        counts = {
            v: sum(1 for verdict, _ in paths.values() if verdict == v) for v in ("pass", "fail", "error", "xerror")
        }
        counts["error"] += sum(1 for verdict, _ in paths.values() if verdict in ("skip", "XPASS"))
        table.add_row(
            row["model"],
            f"{row['params']:,}" if "params" in row else "-",
            row.get("inputs", "-"),
            *(str(counts[v]) for v in ("pass", "fail", "error", "xerror")),
            f"{row['golden_s']:.1f}" if "golden_s" in row else "-",
            f"{row['check_s']:.1f}" if "check_s" in row else "-",
            f"{row['golden_mb']:.1f}" if "golden_mb" in row else "-",
            f"{row['peak_rss_mb']:.0f}" if "params" in row else "-",
        )
        if "error" in row:
            notes.append(f"{row['model']}: {row['error']}")
        notes += [
            f"{row['model']} {path}: {verdict}: {reason}"
            for path, (verdict, reason) in paths.items()
            if verdict != "pass"
        ]
    console = Console(width=160)
    console.print(table)
    console.print(_matrix(rows))
    for note in notes:
        console.print(note, highlight=False, soft_wrap=True)


def _matrix(rows: list[dict]):
    """Models x paths: each cell the path's verdict on that model (blank where the model's framework has no such
    path)."""
    from rich.table import Table

    columns = list(dict.fromkeys(path for row in rows for path in row.get("paths", {})))
    table = Table(title="Verdict of every path on every model")
    table.add_column("model")
    for path in columns:
        table.add_column(path.replace("/", "/\n"), justify="center")
    for row in rows:
        paths = row.get("paths", {})
        table.add_row(row["model"], *(paths[p][0] if p in paths else "" for p in columns))
    return table


if __name__ == "__main__":
    main()
