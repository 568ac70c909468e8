"""Step detection on synthetic histories: parity's (``parity.results.steps``) beside asv's, on the same series.

Prints, for each kind of history, the false-alarm rate (a step reported on pure noise) and, where a step was
injected, how often it is found at its run and within one run of it. asv is optional
(``pip install -c constraints.txt -e '.[asv]'``); without it only parity's column is printed.

    python scripts/step_detection.py [--histories 400] [--runs 50]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from parity.results.steps import detect


def _asv(values):
    try:
        from asv import step_detect
    except ImportError:
        return None
    steps = step_detect.detect_steps(list(values))
    return [right for (_, right, *_rest) in steps[:-1]]


def _parity(values, seed):
    return [s.index for s in detect(values, seed=seed)]


def _history(rng, kind: str, runs: int, at: int, step: float):
    if kind == "gaussian 3%":
        y = rng.normal(0.0, 0.03, runs)
    elif kind == "heavy-tailed (t, 3 df) 3%":
        y = 0.03 * rng.standard_t(3, runs) / np.sqrt(3.0)
    elif kind == "bimodal: 1 run in 4 +6%, 2% noise":
        y = rng.normal(0.0, 0.02, runs) + 0.06 * (rng.random(runs) < 0.25)
    elif kind == "outliers: 1 run in 20 x2, 2% noise":
        y = rng.normal(0.0, 0.02, runs) + np.log(2.0) * (rng.random(runs) < 0.05)
    else:  # a slow drift of 3 % over the history, plus 2 % noise
        y = np.linspace(0.0, 0.03, runs) + rng.normal(0.0, 0.02, runs)
    values = np.exp(y)
    if step:
        values[at:] *= 1.0 + step
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--histories", type=int, default=400)
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    at = args.runs // 2
    rng = np.random.default_rng(0)
    have_asv = _asv([1.0, 1.0, 1.0, 1.0]) is not None
    print(f"{args.histories} histories of {args.runs} runs each; injected steps at run {at}")
    print(f"{'history':36} {'step':>5}  {'parity: alarm/found  exact':>28}  {'asv: alarm/found  exact':>26}")
    for kind in (
        "gaussian 3%",
        "heavy-tailed (t, 3 df) 3%",
        "bimodal: 1 run in 4 +6%, 2% noise",
        "outliers: 1 run in 20 x2, 2% noise",
        "drift 3% + noise 2%",
    ):
        for step in (0.0, 0.05):
            counts = {"parity": [0, 0], "asv": [0, 0]}
            seconds = 0.0
            for k in range(args.histories):
                values = _history(rng, kind, args.runs, at, step)
                started = time.perf_counter()
                found = {"parity": _parity(values, k)}
                seconds += time.perf_counter() - started
                if have_asv:
                    found["asv"] = _asv(values)
                for name, steps in found.items():
                    if step:
                        counts[name][0] += any(abs(i - at) <= 1 for i in steps)
                        counts[name][1] += at in steps
                    else:
                        counts[name][0] += bool(steps)
            rate = {n: (c[0] / args.histories, c[1] / args.histories) for n, c in counts.items()}
            cell = {
                n: (f"{100 * r[0]:5.1f}% alarms" if not step else f"{100 * r[0]:5.1f}% found {100 * r[1]:5.1f}%")
                for n, r in rate.items()
            }
            print(
                f"{kind:36} {100 * step:4.0f}%  {cell['parity']:>28}  "
                f"{cell['asv'] if have_asv else 'asv not installed':>26}"
                f"   ({1e3 * seconds / args.histories:.1f} ms per history)"
            )


if __name__ == "__main__":
    main()
