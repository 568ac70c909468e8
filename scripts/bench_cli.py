#!/usr/bin/env python
"""Start-up and overhead of the CLI, measured side by side in one run (interleaved, medians, ratios).

(a) ``parity --help`` against ``python -c "import click"``                      target ratio <= 1.25
(b) one cached ``parity check`` of one ONNX path (``onnx/ort``) of a tiny user ONNX model against a bare
    NumPy + onnxruntime script doing the same comparison (load the model, run it on the golden inputs,
    compare with the golden outputs)                                              target ratio <= 2
(c) ``parity check`` of the whole built-in zoo with a warm export cache (long; ``--zoo-repeats 0`` skips it)

Set-up (not timed): a temporary workspace with a two-node ONNX model written by ``onnx.helper``,
``parity init tiny --onnx tiny.onnx --input x=2x8``, ``parity golden build``, and one check to fill the
export cache (a scratch ``PARITY_CACHE_DIR`` unless ``--cache-dir``). Every command runs in a fresh process;
the order of the two sides alternates from repeat to repeat.

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
    weights = [numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "W"),
               numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")]
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
                              "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], weights)
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


def side_by_side(name: str, ours: list[str], theirs: list[str], cwd: Path, env: dict, repeats: int) -> dict:
    """``repeats`` runs of each, interleaved, alternating which goes first; medians and their ratio."""
    times = {"parity": [], "bare": []}
    for k in range(repeats):
        pair = [("parity", ours), ("bare", theirs)]
        for label, command in pair if k % 2 == 0 else reversed(pair):
            times[label].append(timed(command, cwd, env))
    medians = {label: statistics.median(values) for label, values in times.items()}
    return {"name": name, **medians, "ratio": medians["parity"] / medians["bare"], "runs": repeats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="runs of each side of (a) and (b)")
    parser.add_argument("--zoo-repeats", type=int, default=1, help="timed warm runs of (c); 0 skips it")
    parser.add_argument("--cache-dir", default=None, help="export cache for (c) (default: a scratch one, filled first)")
    parser.add_argument("--bytecode", action="store_true",
                        help="let every measured process cache compiled bytecode (in a scratch PYTHONPYCACHEPREFIX), "
                             "as an installed package has it, even where PYTHONDONTWRITEBYTECODE is set")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="parity-bench-cli-"))
    try:
        base = dict(os.environ)
        if args.bytecode:
            base.pop("PYTHONDONTWRITEBYTECODE", None)
            base["PYTHONPYCACHEPREFIX"] = str(scratch / "pycache")
        env = {**base, "PARITY_CACHE_DIR": str(scratch / "cache")}
        workspace = scratch / "ws"
        workspace.mkdir()
        model = write_model(workspace)
        for command in (PARITY + ["init", "tiny", "--onnx", str(model), "--input", "x=2x8"],
                        PARITY + ["golden", "build", "--model", "tiny"],
                        PARITY + ["check", "-m", "tiny", "-p", "onnx/ort"]):  # the last one fills the cache
            timed(command, workspace, env)
        bare = scratch / "bare.py"
        bare.write_text(BARE)
        rows = [
            side_by_side("(a) parity --help  vs  python -c 'import click'", PARITY + ["--help"],
                         [sys.executable, "-c", "import click"], workspace, env, args.repeats),
            side_by_side("(b) parity check -m tiny -p onnx/ort  vs  numpy + onnxruntime",
                         PARITY + ["check", "-m", "tiny", "-p", "onnx/ort"],
                         [sys.executable, str(bare), str(model), str(workspace / "golden" / "tiny")],
                         workspace, env, args.repeats),
        ]
        targets = {rows[0]["name"]: 1.25, rows[1]["name"]: 2.0}
        zoo = None
        if args.zoo_repeats > 0:
            zoo_env = {**base, "PARITY_CACHE_DIR": args.cache_dir or str(scratch / "zoo-cache")}
            command = PARITY + ["check", "--workspace", str(ROOT)]
            if args.cache_dir is None:
                print("filling the export cache for (c) (one untimed zoo check) ...", file=sys.stderr, flush=True)
                timed(command, ROOT, zoo_env, expect_ok=False)
            zoo = statistics.median(timed(command, ROOT, zoo_env, expect_ok=False) for _ in range(args.zoo_repeats))

        print(f"{'measurement':66s} {'parity s':>9s} {'bare s':>8s} {'ratio':>6s} {'target':>7s}  met")
        for row in rows:
            target = targets[row["name"]]
            print(f"{row['name']:66s} {row['parity']:9.3f} {row['bare']:8.3f} {row['ratio']:6.2f} {target:7.2f}  "
                  f"{'yes' if row['ratio'] <= target else 'NO'}")
        if zoo is not None:
            print(f"{'(c) parity check, whole zoo, warm cache':66s} {zoo:9.1f} {'':8s} {'':6s} {'':7s}  "
                  f"({args.zoo_repeats} run{'s' if args.zoo_repeats > 1 else ''})")
        print(f"medians of {args.repeats} interleaved runs per side; python {sys.version.split()[0]}; bytecode "
              f"{'cached' if args.bytecode or not os.environ.get('PYTHONDONTWRITEBYTECODE') else 'not cached (PYTHONDONTWRITEBYTECODE)'}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
