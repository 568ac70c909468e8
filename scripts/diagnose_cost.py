#!/usr/bin/env python
"""What a diagnosis costs next to a plain check of the same path, measured side by side in one run.

The worker pool keeps one framework process alive at a time, so each piece is timed in a warm
worker, repeated back to back: the plain check (outputs twice, the eval split, gradients where
the path has them); the diagnosis's run of the path (one inference with the tap tensors as extra
outputs); the runtime link (ONNX Runtime and the reference evaluator on every intermediate tensor);
the source's own taps (the converter link); and the analysis in the orchestrator (statistics, first
divergent tap, the cause's layer recomputations). Prints medians and ratios to the plain check.

    python scripts/diagnose_cost.py --model cnn --path torch/onnx/ort --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import time

from parity.diagnose import chain
from parity.diagnose.collect import ONNX_RUNTIMES
from parity.golden import store as golden
from parity.model.workspace import Workspace
from parity.pipeline import orchestrate
from parity.platform.cache_dir import cache_root
from parity.run import paths
from parity.run.worker import WorkerPool


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=[])
    parser.add_argument("--path", action="append", default=[])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workspace", default=None)
    args = parser.parse_args()

    ws = Workspace(args.workspace)
    run = orchestrate.Run(ws, orchestrate.Options(threads=args.threads))
    print(f"threads {args.threads}, {args.repeats} back-to-back repeats in a warm worker; medians in seconds")
    print(f"{'model':<12} {'path':<20} {'check':>7} {'taps':>7} {'runtime':>8} {'source':>7} {'analyse':>8} "
          f"{'taps/check':>11} {'diagnosis/check':>16}")
    with WorkerPool(args.threads, cache_root() / "logs", 600) as pool:
        for model in ws.select(args.model):
            spec = ws.load_spec(model)
            manifest = golden.verify(ws.golden_dir(model), spec)
            arrays = golden.load(ws.golden_dir(model), spec).arrays
            for path in paths.select(tuple(args.path) or ("torch", "*/onnx/ort"), spec.frameworks, "cpu", "fp32"):
                artifact = run._export(pool, spec, manifest, path, len(path.exports) - 1) if path.exports else None
                if artifact is not None and "error" in artifact:
                    continue
                common = {"workspace": str(ws.root), "model": model, "golden_dir": str(ws.golden_dir(model)),
                          "threads": args.threads}
                own = {**common, "path_id": path.id, "artifact_dir": artifact and artifact["dir"],
                       "artifact_meta": artifact and artifact["meta"]}
                group = path.runtime.group
                med = {"check": _median(args.repeats, pool.call, group, "parity.run.tasks:check_path",
                                         precision="fp32", **own)}
                observed = pool.call(group, chain.COLLECT, precision="fp32", **own)
                med["taps"] = _median(args.repeats, pool.call, group, chain.COLLECT, precision="fp32", **own)
                med["runtime"] = 0.0
                if path.exports and path.runtime.name in ONNX_RUNTIMES:
                    with_link = _median(args.repeats, pool.call, group, chain.COLLECT, precision="fp32",
                                        runtime_link=True, **own)
                    med["runtime"] = max(with_link - med["taps"], 0.0)
                source, med["source"] = observed, 0.0
                if path.exports:
                    source_kw = {**common, "path_id": path.source, "precision": "fp32", "gradients": False}
                    source_group = paths.by_id(path.source).runtime.group
                    source = pool.call(source_group, chain.COLLECT, **source_kw)
                    med["source"] = _median(args.repeats, pool.call, source_group, chain.COLLECT, **source_kw)
                med["analyse"] = _median(args.repeats, chain.analyse, spec, path, arrays, observed, source)
                total = med["taps"] + med["runtime"] + med["source"] + med["analyse"]
                print(f"{model:<12} {path.id:<20} {med['check']:>7.3f} {med['taps']:>7.3f} {med['runtime']:>8.3f} "
                      f"{med['source']:>7.3f} {med['analyse']:>8.3f} {med['taps'] / med['check']:>11.2f} "
                      f"{total / med['check']:>16.2f}")


def _median(repeats: int, call, *args, **kwargs) -> float:
    """Median seconds of ``call(*args, **kwargs)`` over ``repeats`` back-to-back calls."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call(*args, **kwargs)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


if __name__ == "__main__":
    main()
