#!/usr/bin/env python
"""Overhead of parity's timing loop: ``bench.measure`` against a bare perf_counter loop, same session.

Builds the built-in ``mlp`` as ONNX (torch dynamo exporter, golden weights), runs it in ONNX Runtime
(CPU, one intra-op thread) on the golden batch of 64, warms the session up, then for ``--rounds``
rounds (alternating which goes first) times ``--calls`` calls with (a) a bare loop,
``t0 = perf_counter(); session.run(...); perf_counter() - t0``, and (b) ``measure(lambda:
session.run(...), min_runs=N, max_runs=N, budget_s=tiny, no warm-up)``. Both give N per-call
times; the last line is the ratio of the pooled medians, measure / bare:

    python scripts/bench_overhead.py            # ... overhead_ratio=1.003
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np

from parity.bench import stats
from parity.bench.measure import measure

ROOT = Path(__file__).resolve().parents[1]


def build_session(tmp: Path):
    """ONNX Runtime session of the ``mlp`` model, its feed, and the torch reference output."""
    import onnxruntime as ort
    import torch

    from parity.model.workspace import Workspace
    from parity.sources.torch import build_module

    torch.set_num_threads(1)
    spec = Workspace(ROOT).load_spec("mlp")
    with np.load(ROOT / "golden" / "mlp" / "weights.npz", allow_pickle=False) as npz:
        weights = {k: npz[k] for k in npz.files}
    with np.load(ROOT / "golden" / "mlp" / "inputs.npz", allow_pickle=False) as npz:
        x = np.ascontiguousarray(npz["x"][:64], dtype=np.float32)
    module = build_module(spec, weights)
    path = tmp / "mlp.onnx"
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        torch.onnx.export(
            module,
            (torch.from_numpy(x),),
            str(path),
            input_names=[spec.input.name],
            output_names=list(spec.outputs),
            opset_version=spec.opset,
            dynamo=True,
            external_data=False,
            verbose=False,
        )
    with torch.inference_mode():
        reference = module(torch.from_numpy(x))
    reference = (reference[0] if isinstance(reference, tuple) else reference).numpy()

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session, {spec.input.name: x}, reference


def bare_loop(run, feed, n: int) -> list[float]:
    """N calls, each timed by perf_counter before and after, appended; nothing else."""
    clock = time.perf_counter
    samples: list[float] = []
    append = samples.append
    for _ in range(n):
        t0 = clock()
        run(None, feed)
        append(clock() - t0)
    return [s * 1e3 for s in samples]


def parity_loop(run, feed, n: int) -> list[float]:
    """The same N calls through ``measure`` (no warm-up, stops at exactly N)."""
    m = measure(lambda: run(None, feed), min_runs=n, max_runs=n, budget_s=1e-9, max_warmup_runs=0)
    assert len(m["samples_ms"]) == n
    return m["samples_ms"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=500, help="calls per loop per round (N)")
    parser.add_argument("--warmup", type=int, default=1000, help="untimed calls before the first round")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        session, feed, reference = build_session(Path(tmp))
        out = session.run(None, feed)[0]
        np.testing.assert_allclose(out, reference, rtol=1e-4, atol=1e-5)
        run = session.run
        for _ in range(args.warmup):
            run(None, feed)

        bare: list[float] = []
        ours: list[float] = []
        round_ratios = []
        for r in range(args.rounds):
            order = (bare_loop, parity_loop) if r % 2 == 0 else (parity_loop, bare_loop)
            got = {loop: loop(run, feed, args.calls) for loop in order}
            bare += got[bare_loop]
            ours += got[parity_loop]
            round_ratios.append(np.median(got[parity_loop]) / np.median(got[bare_loop]))

    b, p = stats.summarize(bare, 64), stats.summarize(ours, 64)
    print(f"mlp, onnxruntime CPU 1 thread, batch 64: {args.rounds} rounds x {args.calls} calls, alternating order")
    for name, s in (("bare loop", b), ("measure()", p)):
        print(
            f"  {name:10s} median {s['median_ms'] * 1e3:8.2f} us  95% CI [{s['ci95_ms'][0] * 1e3:.2f}, "
            f"{s['ci95_ms'][1] * 1e3:.2f}]  p90 {s['p90_ms'] * 1e3:.2f} us  cv {s['cv']:.3f}"
        )
    c = stats.compare_series(ours, bare)
    print(
        f"  per-call medians, measure/bare: {c['ratio']:.4f}  bootstrap 95% CI [{c['ci95'][0]:.4f}, "
        f"{c['ci95'][1]:.4f}]  Welch p={c['p']:.3g}  ({c['verdict']})"
    )
    print(
        f"  per-round ratios of medians: median {np.median(round_ratios):.4f}, "
        f"range [{min(round_ratios):.4f}, {max(round_ratios):.4f}]"
    )
    print(f"  per-block totals, measure/bare: {sum(ours) / sum(bare):.4f}")
    print(f"overhead_ratio={c['ratio']:.3f}")


if __name__ == "__main__":
    main()
