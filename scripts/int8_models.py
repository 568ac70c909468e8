#!/usr/bin/env python
"""The models parity's int8 paths are proven on, trained and brought in as a user brings a model, through the
README's commands: ``parity init`` -> ``golden build`` -> ``run`` (check, diagnose what fails, time what passes).

Three models learn scikit-learn's digits in seconds (``tests/int8models.py``): a ``transformers`` ResNet, a
``transformers`` BERT classifier (each image a token sequence) and an MLP with one outlier activation channel
that per-tensor int8 cannot hold. Each gets its own workspace: the factory file, the trained weights in the
model's own format, and ``inputs.npz`` whose training samples calibrate and whose held-out split (449 samples)
the accuracy gate scores. Then every int8 path with its float path, and where an int8 path fails, the layers its
diagnosis keeps in float are written into the spec (``Quantization(keep_float=...)``) and that path is run again.

One table: model x int8 path: accuracy of the float64 golden and of the int8 path, argmax agreement, lowest
SQNR, the gate's decision, speed-up over the float path at the largest timed batch, and what the repair kept
(with the repaired path's own decision and speed-up).

    python scripts/int8_models.py [--only bert,outlier_mlp] [--workspace DIR] [--float-only] [--budget S]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import int8models  # noqa: E402 - tests/int8models.py (on sys.path above): the models, their data and training

FLOAT_PATHS = ("torch", "torch/onnx/ort", "torch/export", "torch/openvino", "torch/onnx/openvino")


def int8_available() -> bool:
    """Whether this parity has the int8 paths (their quantizing exporters)."""
    return importlib.util.find_spec("parity.exporters.onnx_int8") is not None


def parity(root: Path, *args: str) -> tuple[int, str, float]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "parity.cli", *args, "--workspace", str(root)],
        cwd=root,
        check=False,
        capture_output=True,
        text=True,
    )
    return done.returncode, (done.stdout + done.stderr).strip(), time.perf_counter() - started


def run_paths(root: Path, name: str, paths: list[str], budget: float, out: str) -> list[dict]:
    """``parity run`` of ``paths`` on ``name`` (check, diagnose failures, time what passed); its results."""
    report = root / out
    selected = [arg for path in paths for arg in ("--path", path)]
    code, text, _ = parity(
        root, "run", "--model", name, *selected, "--json", str(report), "--no-store", "--budget", str(budget)
    )
    if not report.exists():
        raise RuntimeError(f"run: {text.splitlines()[-1] if text else code}")
    return json.loads(report.read_text())["results"]


def repairs(results: list[dict]) -> dict[str, tuple[list[str], str]]:
    """Failing int8 path -> the layers its diagnosis keeps in float for it to pass, and who found them: parity's
    repair on ONNX Runtime's QDQ model, or NNCF's accuracy control (run beside it, for the OpenVINO int8 path of
    the same ONNX model). A path whose diagnosis found none is left out."""
    found = {}
    for r in results:
        diagnosis = r.get("diagnosis") or {}
        repair = (diagnosis.get("int8") or {}).get("repair") or {}
        if repair.get("passes"):
            found[r["path"]] = (list(repair["nodes_to_exclude"]), "parity")
        nncf = diagnosis.get("nncf") or {}
        if nncf.get("met") and (nncf.get("gate") or {}).get("decision") == "pass":
            for path, layers in (nncf.get("keep_float") or {}).items():
                if layers:  # NNCF met its target reverting nothing: no repair to write
                    found.setdefault(path, (list(layers), "NNCF"))
    return found


def diagnose(root: Path, name: str, path: str) -> dict:
    """``parity diagnose`` of one failing path: its diagnosis (the int8 layer ranking and repair)."""
    out = root / "diagnose.json"
    parity(root, "diagnose", "--model", name, "--path", path, "--json", str(out))
    found = json.loads(out.read_text())["results"] if out.exists() else []
    return (found[0].get("diagnosis") if found else None) or {}


def keep_in_spec(root: Path, name: str, keep: dict[str, list[str]]) -> None:
    """Write ``keep`` into the spec ``init`` wrote: ``quantization=Quantization(keep_float={path: (layers...)})``,
    as a user applies the repair a diagnosis prints."""
    spec = root / "models" / f"{name}.py"
    text = spec.read_text()
    kept = ", ".join(f"{path!r}: {tuple(layers)!r}" for path, layers in keep.items())
    text = text.replace("from parity.model.spec import ", "from parity.model.spec import Quantization, ", 1)
    head, tail = text.rsplit("\n)", 1)
    spec.write_text(f"{head}\n    quantization=Quantization(keep_float={{{kept}}}),\n){tail}")


def one(name: str, root: Path, budget: float, with_int8: bool) -> dict:
    """Train, bring in and run one model in ``root``; its row."""
    row = {"model": name}
    facts = int8models.build_workspace(name, root)
    row.update(accuracy=facts["accuracy"], train_s=facts["train_s"], epochs=facts["epochs"], eval=facts["eval"])
    code, text, _ = parity(root, "init", name, *facts["init"])
    if code:
        return {**row, "error": f"init: {text.splitlines()[-1]}"}
    row["params"] = int(text.split(" parameters")[0].rsplit(" ", 1)[-1].replace(",", ""))
    code, text, row["golden_s"] = parity(root, "golden", "build", "--model", name)
    if code:
        return {**row, "error": f"golden build: {text.splitlines()[-1]}"}
    paths = [*FLOAT_PATHS, *(("*int8*",) if with_int8 else ())]
    started = time.perf_counter()
    results = run_paths(root, name, paths, budget, "run.json")
    row["run_s"] = time.perf_counter() - started
    row["paths"] = {r["path"]: r for r in results}
    for r in results:  # run diagnosed each failure; a failing int8 path without a diagnosis is diagnosed now
        if r.get("gate") and r["verdict"] == "fail" and not r.get("diagnosis"):
            r["diagnosis"] = diagnose(root, name, r["path"])
    row["repairs"] = repairs(results)
    keep = {path: layers for path, (layers, _) in row["repairs"].items() if row["paths"][path]["verdict"] == "fail"}
    if keep:  # the repairs applied as a user applies them, and those paths run again
        keep_in_spec(root, name, keep)
        repaired = run_paths(root, name, list(keep), budget, "repaired.json")
        row["repaired"] = {r["path"]: r for r in repaired}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help=f"comma-separated models (default: {','.join(int8models.NAMES)})")
    parser.add_argument("--workspace", type=Path, help="write one workspace per model under this folder and keep it")
    parser.add_argument("--float-only", action="store_true", help="the float paths only (no int8 path)")
    parser.add_argument("--budget", type=float, default=0.5, help="seconds of timed runs per path and batch size")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(int8models.NAMES)
    unknown = sorted(set(names) - set(int8models.NAMES))
    if unknown:
        parser.error(f"unknown model {', '.join(unknown)} (one of {', '.join(int8models.NAMES)})")
    with_int8 = not args.float_only and int8_available()
    base = args.workspace or Path(tempfile.mkdtemp(prefix="parity-int8-"))
    rows = []
    try:
        for name in names:
            try:
                rows.append(one(name, base / name, args.budget, with_int8))
            except Exception as error:  # noqa: BLE001 - a model that cannot be run says why in its row
                rows.append({"model": name, "error": f"{type(error).__name__}: {error}"})
            print(f"{name}: done", file=sys.stderr)
    finally:
        if args.workspace is None:
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    render(rows, with_int8)


def render(rows: list[dict], with_int8: bool) -> None:
    from rich.console import Console

    console = Console(width=180)
    console.print(model_table(rows))
    if with_int8:
        table, notes = int8_table(rows)
        console.print(table)
        for note in notes:
            console.print(note, highlight=False, soft_wrap=True)
    else:
        console.print("int8 paths: not run (--float-only, or this parity has no int8 exporter)")
    for row in rows:
        if "error" in row:
            console.print(f"{row['model']}: {row['error']}", highlight=False, soft_wrap=True)


def model_table(rows: list[dict]):
    """One row per model: what it is, how it trained, and its float paths' verdicts."""
    from rich.table import Table

    table = Table(title="Models (trained on the digits' training split, scored on its 449 held-out samples)")
    for column in ("model", "params", "epochs", "train s", "accuracy", "golden s", "run s", "float paths"):
        table.add_column(column, justify="left" if column in ("model", "float paths") else "right")
    for row in rows:
        floats = {p: r["verdict"] for p, r in row.get("paths", {}).items() if not r.get("gate")}
        table.add_row(
            row["model"],
            f"{row['params']:,}" if "params" in row else "-",
            str(row.get("epochs", "-")),
            _number(row.get("train_s")),
            _percent(row.get("accuracy")),
            _number(row.get("golden_s")),
            _number(row.get("run_s")),
            ", ".join(f"{p} {v}" for p, v in floats.items()) or "-",
        )
    return table


def int8_table(rows: list[dict]):
    """Model x int8 path: golden and int8 accuracy, agreement, SQNR, the gate's decision, speed-up over the float
    path, what a repair kept (and the repaired path's decision and speed-up). Returns the table and notes (the
    reason of every path that did not pass)."""
    from rich.table import Table

    table = Table(title="int8 paths: accuracy gate (keep 99 % of the float64 golden's accuracy, 95 % confidence)")
    for column in (
        "model",
        "int8 path",
        "float64 acc",
        "int8 acc",
        "agree",
        "SQNR dB",
        "verdict",
        "vs float",
        "repair kept in float",
        "repaired",
    ):
        table.add_column(
            column,
            justify="left"
            if column in ("model", "int8 path", "verdict", "vs float", "repair kept in float", "repaired")
            else "right",
        )
    notes = []
    for row in rows:
        for path, r in row.get("paths", {}).items():
            gate = r.get("gate")
            if not (gate or "int8" in path):
                continue
            gate = gate or {}
            verdict = gate.get("decision") if "decision" in gate else r["verdict"]
            kept, repaired = "-", "-"
            found = row.get("repairs", {}).get(path) if r["verdict"] == "fail" else None
            if found:
                kept = f"{', '.join(found[0])} ({found[1]})"
                again = (row.get("repaired") or {}).get(path)
                if again is not None:
                    repaired = f"{(again.get('gate') or {}).get('decision', again['verdict'])}, {speed_up(again)}"
            table.add_row(
                row["model"],
                path,
                _percent(gate.get("golden")),
                _percent(gate.get("value")),
                _number(gate.get("agreement"), 3),
                _number(sqnr(r), 1),
                verdict,
                speed_up(r),
                kept,
                repaired,
            )
            if r["verdict"] != "pass":
                notes.append(f"{row['model']} {path}: {r['verdict']}: {r.get('reason')}")
            if r["verdict"] == "fail" and not found and (r.get("diagnosis") or {}).get("error"):
                notes.append(f"{row['model']} {path}: no repair: {r['diagnosis']['error']}")
    return table, notes


def sqnr(result: dict) -> float | None:
    """The lowest SQNR (dB) of the path's outputs against the float64 golden: ``sqnr_db`` ({output: dB}) where the
    result has it, else the per-output statistics of the eval split and the inputs."""
    found = list((result.get("sqnr_db") or {}).values())
    found += [
        s["sqnr_db"]
        for group in ("eval_outputs", "outputs")
        for s in (result.get(group) or {}).values()
        if isinstance(s, dict) and s.get("sqnr_db") is not None
    ]
    return min(found) if found else None


def speed_up(result: dict) -> str:
    """The float path's median over the int8 path's at the largest batch timed against it, ``x1.8 @32``; or why
    there is none (a path that failed its gate is not timed)."""
    from parity.report.quantized import speedup

    batches = (result.get("timing") or {}).get("batches") or {}
    timed = [(int(b), e["vs_float"]) for b, e in batches.items() if isinstance(e, dict) and e.get("vs_float")]
    if not timed:
        return "not timed" if result["verdict"] != "pass" else "-"
    batch, versus = max(timed, key=lambda t: t[0])
    if "ratio" not in versus:  # a series too noisy to compare: the reason is in the result's timing
        return f"withheld (noisy timing) @{batch}"
    return f"{speedup(versus)} @{batch}"


def _percent(value) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _number(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    main()
