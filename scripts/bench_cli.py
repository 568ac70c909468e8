#!/usr/bin/env python
"""Start-up and overhead of the CLI, measured side by side in one run (interleaved, medians, ratios).

(a) ``parity --help`` against ``python -c "import click"``                      target ratio <= 1.25
(b) one cached ``parity check`` of one ONNX path (``onnx/ort``) of a tiny user ONNX model against a bare
    NumPy + onnxruntime script doing the same comparison (load the model, run it on the golden inputs,
    compare with the golden outputs)                                              target ratio <= 2
    and, where Polygraphy is installed, against the peer a user would pick for it: ``polygraphy run
    tiny.onnx --onnxrt --load-inputs in.json --load-outputs out.json`` on the same golden inputs and float64
    outputs (written in Polygraphy's JSON by ``parity.interop.polygraphy``) at the same tolerances
                                                                                  target ratio <= 1
    (b) runs with the user's worker service (``parity.run.service``) as a user's second check has it, warm from the
    set-up's runs; a row for the record runs the same check with ``PARITY_WORKER_SERVICE=off`` (no target).
(c) ``parity check`` of the whole built-in zoo with a warm export cache (long; ``--zoo-repeats 0`` skips it)

Set-up (not timed): a temporary workspace with a two-node ONNX model written by ``onnx.helper``,
``parity init tiny --onnx tiny.onnx --input x=2x8``, ``parity golden build``, and one check to fill the
export cache (a scratch ``PARITY_CACHE_DIR`` unless ``--cache-dir``). Every command runs in a fresh process;
the order of the sides rotates from repeat to repeat.

    python scripts/bench_cli.py --repeats 7 --zoo-repeats 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARITY = [sys.executable, "-m", "parity"] if shutil.which("parity") is None else [shutil.which("parity")]

BARE = textwrap.dedent("""
    import sys
    import numpy as np
    import onnxruntime as ort

    golden = sys.argv[2]
    with np.load(golden + "/inputs.npz") as z:
        x = z["x"]
    with np.load(golden + "/reference.npz") as z:
        reference = z["y"]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
    y = session.run(None, {"x": x.astype(np.float32)})[0]
    error = np.abs(y.astype(np.float64) - reference)
    ok = bool(np.all(error <= 1e-5 + 1e-4 * np.abs(reference)))
    print("pass" if ok else "fail", float(error.max()))
    sys.exit(0 if ok else 1)
""")


def write_model(folder: Path) -> Path:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
    ]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "tiny.onnx"
    onnx.save(model, str(path))
    return path


def timed(command: list[str], cwd: Path, env: dict, expect_ok: bool = True) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if expect_ok and done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return seconds


def side_by_side(sides: dict[str, list[str]], cwd: Path, env: dict, repeats: int) -> dict[str, float]:
    """``repeats`` runs of each side, interleaved, the order rotated each repeat; the median of each."""
    labels = list(sides)
    times: dict[str, list[float]] = {label: [] for label in labels}
    for k in range(repeats):
        for label in labels[k % len(labels) :] + labels[: k % len(labels)]:
            times[label].append(timed(sides[label], cwd, env))
    return {label: statistics.median(values) for label, values in times.items()}


def row(name: str, ours: float, theirs: float, target: float) -> dict:
    return {"name": name, "parity": ours, "bare": theirs, "ratio": ours / theirs, "target": target}


def polygraphy_files(workspace: Path, scratch: Path) -> tuple[Path, Path]:
    """The golden inputs (as the model takes them, float32) and float64 reference outputs in Polygraphy's JSON."""
    import numpy as np

    from parity.interop import polygraphy

    golden = workspace / "golden" / "tiny"
    with np.load(golden / "inputs.npz") as z:
        x = z["x"].astype(np.float32)
    with np.load(golden / "reference.npz") as z:
        reference = z["y"]
    inputs, outputs = scratch / "polygraphy-inputs.json", scratch / "polygraphy-outputs.json"
    polygraphy.write_inputs(inputs, [{"x": x}])
    polygraphy.write_run_results(outputs, "golden", [{"y": reference}])
    return inputs, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="runs of each side of (a) and (b)")
    parser.add_argument("--zoo-repeats", type=int, default=1, help="timed warm runs of (c); 0 skips it")
    parser.add_argument("--cache-dir", default=None, help="export cache for (c) (default: a scratch one, filled first)")
    parser.add_argument(
        "--bytecode",
        action="store_true",
        help="let every measured process cache compiled bytecode (in a scratch PYTHONPYCACHEPREFIX), "
        "as an installed package has it, even where PYTHONDONTWRITEBYTECODE is set",
    )
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="parity-bench-cli-"))
    try:
        base = dict(os.environ)
        if args.bytecode:
            base.pop("PYTHONDONTWRITEBYTECODE", None)
            base["PYTHONPYCACHEPREFIX"] = str(scratch / "pycache")
        # the worker service of these settings starts in the untimed set-up and ends soon after the last run
        env = {**base, "PARITY_CACHE_DIR": str(scratch / "cache"), "PARITY_WORKER_SERVICE_IDLE_S": "30"}
        workspace = scratch / "ws"
        workspace.mkdir()
        model = write_model(workspace)
        for command in (
            PARITY + ["init", "tiny", "--onnx", str(model), "--input", "x=2x8"],
            PARITY + ["golden", "build", "--model", "tiny"],
            PARITY + ["check", "-m", "tiny", "-p", "onnx/ort"],
        ):  # the last one fills the cache
            timed(command, workspace, env)
        bare = scratch / "bare.py"
        bare.write_text(BARE)
        helps = side_by_side(
            {"parity": PARITY + ["--help"], "click": [sys.executable, "-c", "import click"]},
            workspace,
            env,
            args.repeats,
        )
        checks = {
            "parity": PARITY + ["check", "-m", "tiny", "-p", "onnx/ort"],
            "bare": [sys.executable, str(bare), str(model), str(workspace / "golden" / "tiny")],
            # for the record: every worker started afresh, as where the service is off or not yet warm
            "cold": ["env", "PARITY_WORKER_SERVICE=off", *PARITY, "check", "-m", "tiny", "-p", "onnx/ort"],
        }
        beside = Path(sys.executable).with_name("polygraphy")  # this interpreter's own, else one on PATH
        polygraphy = str(beside) if beside.is_file() else shutil.which("polygraphy")
        if polygraphy:
            inputs, outputs = polygraphy_files(workspace, scratch)
            # the bare script's tolerances (atol 1e-5, rtol 1e-4); exit 0 only when the outputs match
            checks["polygraphy"] = [
                polygraphy,
                "run",
                str(model),
                "--onnxrt",
                "--load-inputs",
                str(inputs),
                "--load-outputs",
                str(outputs),
                "--atol",
                "1e-5",
                "--rtol",
                "1e-4",
            ]
        checked = side_by_side(checks, workspace, env, args.repeats)
        rows = [
            row("(a) parity --help  vs  python -c 'import click'", helps["parity"], helps["click"], 1.25),
            row(
                "(b) parity check -m tiny -p onnx/ort  vs  numpy + onnxruntime", checked["parity"], checked["bare"], 2.0
            ),
        ]
        rows.append(
            row(
                "    the same, PARITY_WORKER_SERVICE=off (no warm template)  vs  bare",
                checked["cold"],
                checked["bare"],
                float("nan"),
            )
        )
        if polygraphy:
            rows.append(
                row(
                    "(b) parity check -m tiny -p onnx/ort  vs  polygraphy run --onnxrt",
                    checked["parity"],
                    checked["polygraphy"],
                    1.0,
                )
            )
        zoo = None
        if args.zoo_repeats > 0:
            zoo_env = {**base, "PARITY_CACHE_DIR": args.cache_dir or str(scratch / "zoo-cache")}
            command = PARITY + ["check", "--workspace", str(ROOT)]
            if args.cache_dir is None:
                print("filling the export cache for (c) (one untimed zoo check) ...", file=sys.stderr, flush=True)
                timed(command, ROOT, zoo_env, expect_ok=False)
            zoo = statistics.median(timed(command, ROOT, zoo_env, expect_ok=False) for _ in range(args.zoo_repeats))

        print(f"{'measurement':66s} {'parity s':>9s} {'other s':>8s} {'ratio':>6s} {'target':>7s}  met")
        for line in rows:
            target, ratio = line["target"], line["ratio"]
            judged = target == target  # a row for the record has no target (NaN)
            print(
                f"{line['name']:66s} {line['parity']:9.3f} {line['bare']:8.3f} {ratio:6.2f} "
                f"{f'{target:7.2f}' if judged else '      -'}  {('yes' if ratio <= target else 'NO') if judged else ''}"
            )
        if not polygraphy:
            print("polygraphy: not installed (pip install polygraphy, in the test extra), so not compared")
        if zoo is not None:
            print(
                f"{'(c) parity check, whole zoo, warm cache':66s} {zoo:9.1f} {'':8s} {'':6s} {'':7s}  "
                f"({args.zoo_repeats} run{'s' if args.zoo_repeats > 1 else ''})"
            )
        print(
            f"medians of {args.repeats} interleaved runs per side; python {sys.version.split()[0]}; bytecode "
            f"{'cached' if args.bytecode or not os.environ.get('PYTHONDONTWRITEBYTECODE') else 'not cached (PYTHONDONTWRITEBYTECODE)'}"
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
