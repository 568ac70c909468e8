"""The terminal table: one row per path, then a one-line summary per model."""

from __future__ import annotations

from collections import defaultdict

VERDICT_LABELS = {"pass": "pass", "fail": "FAIL", "error": "ERROR", "skip": "skip"}


def _label(result: dict) -> str:
    if result.get("unexpected_pass"):
        return "XPASS"
    if result["verdict"] == "error" and result.get("expected"):
        return "xerror"
    return VERDICT_LABELS.get(result["verdict"], str(result["verdict"]))


def _worst(stats: dict | None) -> tuple[str, str]:
    if not stats:
        return "-", "-"
    entries = [s for s in stats.values() if "tol_units" in s]
    if len(entries) != len(stats):
        return "nan/shape", "-"
    worst = max(entries, key=lambda s: s["tol_units"])
    return f"{worst['tol_units']:.3g}", f"{worst['max_abs']:.2e}"


def _gradients(result: dict) -> str:
    grads = result.get("gradients")
    if grads is None:
        return "-"
    bad = sum(1 for s in grads.values() if not s["ok"])
    return f"ok {len(grads)}" if not bad else f"{bad} bad"


def _metric(result: dict) -> str:
    m = result.get("metrics")
    if not m:
        return "-"
    return f"{m['accuracy']['value']:.4f} {m['argmax_agreement']:.3f}"


def _timing(result: dict) -> str:
    t = result.get("timing")
    return f"{t['median_ms']:.3f}" if t else "-"


def _reason(result: dict) -> str:
    reason = result.get("reason") or ""
    if result.get("unexpected_pass"):
        reason = f"declared as expected error ({result['expected_reason']}) but passed: update the spec"
    elif result.get("expected"):
        reason = f"expected: {reason}"
    return reason if len(reason) <= 110 else reason[:107] + "..."


def render(report: dict) -> str:
    """The table as text (no colour, safe to paste into an issue)."""
    header = ("model", "path", "verdict", "tol×", "max_abs", "grads", "acc agree", "det", "median ms", "reason")
    rows = []
    for r in report["results"]:
        tol_units, max_abs = _worst(r.get("outputs"))
        det = "-" if r.get("deterministic") is None else ("yes" if r["deterministic"] else "no")
        rows.append((r["model"], r["path"], _label(r), tol_units, max_abs, _gradients(r), _metric(r), det,
                     _timing(r), _reason(r)))
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header) - 1)]
    lines = []
    for row in [header, *rows]:
        lines.append("  ".join(str(cell).ljust(w) for cell, w in zip(row[:-1], widths)) + "  " + str(row[-1]))
    lines.insert(1, "  ".join("-" * w for w in widths) + "  ------")
    lines.append("")
    lines.extend(summary_lines(report))
    return "\n".join(lines)


def summary_lines(report: dict) -> list[str]:
    by_model = defaultdict(list)
    for r in report["results"]:
        by_model[r["model"]].append(r)
    lines = []
    for model, results in by_model.items():
        ran = [r for r in results if r.get("outputs") is not None]
        outputs_ok = sum(1 for r in ran if all(s["ok"] for s in r["outputs"].values()))
        with_grads = [r for r in ran if r.get("gradients") is not None]
        grads_ok = sum(1 for r in with_grads if all(s["ok"] for s in r["gradients"].values()))
        metrics_ok = sum(1 for r in ran if r["metrics"]["ok"])
        counts = defaultdict(int)
        for r in results:
            counts[_label(r)] += 1
        verdicts = ", ".join(f"{n} {label}" for label, n in sorted(counts.items()))
        lines.append(f"{model}: {verdicts} | outputs ok {outputs_ok}/{len(ran)}, gradients ok {grads_ok}/{len(with_grads)}, "
                     f"metrics ok {metrics_ok}/{len(ran)}")
    for problem in report.get("model_errors", []):
        lines.append(f"{problem['model']}: ERROR {problem['reason']}")
    return lines
