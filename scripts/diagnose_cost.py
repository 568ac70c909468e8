#!/usr/bin/env python
"""What a diagnosis costs next to a plain check of the same path, measured side by side in one run.

For each path, in one warm worker pool, alternately: the plain check (outputs twice, the eval
split, gradients where the path has them), the diagnosis's own run of the path (one inference
with the taps as outputs), and the whole diagnosis (that run, the source's own taps for the
converter link, ORT vs the reference evaluator on every tensor for the runtime link, the cause's
layer recomputations). Prints medians and the ratios to the plain check.

    python scripts/diagnose_cost.py --model cnn --path torch/onnx/ort --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import time

from parity import golden, orchestrate, paths
from parity.cache import cache_root
from parity.diagnose import chain
from parity.worker import WorkerPool
from parity.workspace import Workspace


def _timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


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
    print(f"threads {args.threads}, {args.repeats} repeats each, interleaved; medians in seconds")
    print(f"{'model':<12} {'path':<20} {'check':>8} {'taps run':>9} {'diagnose':>9} {'taps/check':>11} {'diag/check':>11}")
    with WorkerPool(args.threads, cache_root() / "logs", 600) as pool:
        for model in ws.select(args.model):
            spec = ws.load_spec(model)
            manifest = golden.verify(ws.golden_dir(model), spec)
            for path in paths.select(tuple(args.path) or ("torch", "*/onnx/ort"), spec.frameworks, "cpu", "fp32"):
                artifact = run._export(pool, spec, manifest, path, len(path.exports) - 1) if path.exports else None
                if artifact is not None and "error" in artifact:
                    continue
                kwargs = {"workspace": str(ws.root), "model": model, "path_id": path.id,
                          "golden_dir": str(ws.golden_dir(model)), "precision": "fp32", "threads": args.threads,
                          "artifact_dir": artifact and artifact["dir"], "artifact_meta": artifact and artifact["meta"]}

                def check(kw=kwargs, p=path):
                    pool.call(p.runtime.group, "parity.tasks:check_path", **kw)

                def taps(kw=kwargs, p=path):
                    pool.call(p.runtime.group, chain.COLLECT, **kw)

                def whole(s=spec, m=manifest, p=path, a=artifact):
                    chain.diagnose(run, pool, s, m, p, artifact=a)

                whole()  # warm every worker the diagnosis needs
                times = {"check": [], "taps": [], "diagnose": []}
                for _ in range(args.repeats):
                    for name, call in (("check", check), ("taps", taps), ("diagnose", whole)):
                        times[name].append(_timed(call))
                med = {name: statistics.median(values) for name, values in times.items()}
                print(f"{model:<12} {path.id:<20} {med['check']:>8.3f} {med['taps']:>9.3f} {med['diagnose']:>9.3f} "
                      f"{med['taps'] / med['check']:>11.2f} {med['diagnose'] / med['check']:>11.2f}")


if __name__ == "__main__":
    main()
