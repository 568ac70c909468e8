"""The quantized paths' block of the reports: each int8 path's accuracy gate, and its speed beside its accuracy."""

from __future__ import annotations

import math

GATE_LEGEND = [
    ("int8 / golden", "the gate's metric on the labelled eval split: the int8 path's, the float64 golden's"),
    ("drop [bounds]", "golden - int8, with its one-sided bounds at the gate's confidence (Tango's paired score"),
    ("", "interval: samples both get right or wrong cancel); lost / gained: samples only the golden / only the"),
    ("", "int8 path gets right"),
    ("allowed", "(1 - keep) x golden: MLPerf's rule, keep 99 % by default (the spec's Gate)"),
    ("gate", "pass: the upper bound is within allowed | fail: the lower bound is beyond it | inconclusive: the"),
    ("", "split cannot tell (more labelled samples would decide)"),
    ("agree", "fraction of eval samples whose argmax is the golden's"),
    ("SQNR dB", "the lowest signal-to-quantization-noise ratio of the outputs, against the float64 golden"),
]
SPEED_LEGEND = [
    ("vs float", "the float path's median / the int8 path's at the same batch [95 % CI]: its speed-up (or the"),
    ("", "inverse, slower); significant only where the CI excludes 1 and Welch's test gives p < 0.05"),
    ("int8 / golden", "the gate's metric beside it (only paths that passed the gate are timed)"),
]


def percent(value: float) -> str:
    return f"{100 * value:.2f}%"


def lowest_sqnr(result: dict) -> float | None:
    """The lowest SQNR (dB) over the result's outputs and eval outputs, or None where none was measured."""
    found = [
        s["sqnr_db"]
        for group in ("outputs", "eval_outputs")
        for s in (result.get(group) or {}).values()
        if "sqnr_db" in s
    ]
    return min(found) if found else None


def db(value: float | None) -> str:
    if value is None:
        return "-"
    return "exact" if math.isinf(value) and value > 0 else f"{value:.1f}"


def gate_rows(results: list[dict]) -> list[tuple]:
    """One row per quantized path that was gated: model, path, metric, int8 / golden, drop [bounds], lost / gained,
    allowed, gate decision, agreement, lowest SQNR."""
    rows = []
    for r in results:
        g = r.get("gate")
        if not g or "interval" not in g:
            continue
        low, high = g["interval"]
        decision = g["decision"] + (f" (+{g['more_samples']} samples)" if g.get("more_samples") else "")
        rows.append(
            (
                r["model"],
                r["path"],
                g["metric"],
                f"{percent(g['value'])} / {percent(g['golden'])}",
                f"{percent(g['drop'])} [{percent(low)}, {percent(high)}]",
                f"{g['lost']} / {g['gained']}",
                percent(g["allowed"]),
                decision,
                f"{g['agreement']:.3f}",
                db(lowest_sqnr(r)),
            )
        )
    return rows


GATE_COLUMNS = [
    ("model", "left"),
    ("path", "left"),
    ("metric", "left"),
    ("int8 / golden", "right"),
    ("drop [bounds]", "right"),
    ("lost / gained", "right"),
    ("allowed", "right"),
    ("gate", "left"),
    ("agree", "right"),
    ("SQNR dB", "right"),
]


def speed_rows(results: list[dict]) -> list[tuple]:
    """Per timed batch of a quantized path: its median, the float path's, the speed-up with its CI, and the gate's
    metric beside it."""
    rows = []
    for r in results:
        g = r.get("gate")
        for batch, e in ((r.get("timing") or {}).get("batches") or {}).items():
            if not g or not isinstance(e, dict) or e.get("verdict") != "pass":
                continue
            vs = e.get("vs_float") or {}
            rows.append(
                (
                    r["model"],
                    r["path"],
                    batch,
                    f"{e['median_ms']:.4f}",
                    vs.get("baseline", "-"),
                    speedup(vs),
                    f"{percent(g['value'])} / {percent(g['golden'])}",
                )
            )
    return rows


SPEED_COLUMNS = [
    ("model", "left"),
    ("path", "left"),
    ("batch", "right"),
    ("median ms", "right"),
    ("float path", "left"),
    ("vs float", "left"),
    ("int8 / golden", "right"),
]


def speedup(vs: dict) -> str:
    """The float path's median over this one's (a speed-up above 1), with its CI; or why there is none."""
    if "ratio" not in vs:
        return vs.get("reason") or "-"
    from parity.bench.stats import ratio_text  # NumPy: only once a path was timed

    lo, hi = vs["ci95"]
    span = f"[{ratio_text(1 / hi)}, {ratio_text(1 / lo)}]"
    if not vs.get("significant"):
        return f"{ratio_text(1 / vs['ratio'])} {span}: no significant difference"
    if vs["ratio"] > 1:
        return f"{ratio_text(vs['ratio'])} slower [{ratio_text(lo)}, {ratio_text(hi)}]"
    return f"{ratio_text(1 / vs['ratio'])} faster {span}"


def recipe(result: dict) -> str | None:
    """What the quantizer did, in one line (the export's ``quantization`` meta), or None."""
    export = result.get("export") or {}
    q = export.get("quantization")
    if not q:
        return None
    parts = [q.get("tool", "?")]
    parts += [
        f"{k.replace('_', ' ')} {q[k]}"
        for k in ("calibration", "calibration_samples", "per_channel", "quantized_layers")
        if q.get(k) not in (None, "")
    ]
    if q.get("kept_float"):
        parts.append(f"kept in float: {', '.join(q['kept_float'])}")
    cpu = q.get("int8_cpu")
    if isinstance(cpu, dict):  # ONNX Runtime: the int8 kernel it was quantized for, and the setting that follows
        parts.append(
            f"{'reduce_range (7-bit weights)' if q.get('reduce_range') else 'full 8-bit weights'} for {cpu.get('kind')}"
        )
    if export.get("calibration_data"):
        parts.append(f"calibrated on {export['calibration_data']}")
    return "; ".join(str(p) for p in parts)
