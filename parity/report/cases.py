"""The terminal table of ``parity check-onnx``: one row per case and path (case, path, verdict, reason, seconds), the
full reasons of what did not pass, and one summary line."""

from __future__ import annotations

import statistics
import textwrap

from parity.report.escape import visible
from parity.report.junit import case_name, first_divergence
from parity.report.terminal import UNEXPECTED, WRAP, _duration, _label, _reason, _short, _table

COLUMNS = [("case", "left"), ("path", "left"), ("verdict", "left"), ("reason", "left"), ("seconds", "right")]


def reason_of(result: dict) -> str:
    """The result's reason, led by the first divergent layer where a diagnosis found one."""
    reason = _reason(result)
    where = first_divergence(result)
    return f"first divergent {where}: {reason}" if where else reason


def render(report: dict, verbose: bool = False) -> str:
    """The table, the Reasons block (every FAIL, ERROR, XPASS and refused case in full; ``verbose``: skips and
    expected errors too) and the summary line."""
    by_model: dict[str, list[dict]] = {}
    for result in report["results"]:
        by_model.setdefault(result["model"], []).append(result)
    listed = UNEXPECTED + (("xerror", "skip") if verbose else ())
    rows, reasons = [], []
    for case in report.get("cases") or ():
        if case["error"]:
            reasons.append((case["label"], "-", "ERROR", case["error"]))
            rows.append((case["label"], "-", "ERROR", _short(case["error"], len(reasons)), f"{case['seconds']:.2f}"))
        for result in by_model.get(case["name"], ()):
            label, reason = _label(result), reason_of(result)
            ref = None
            if reason.strip() and label in listed:
                reasons.append((case["label"], case_name(result), label, reason))
                ref = len(reasons)
            seconds = result.get("check_s")
            rows.append(
                (
                    case["label"],
                    case_name(result),
                    label,
                    _short(reason, ref),
                    "-" if seconds is None else f"{seconds:.2f}",
                )
            )
    lines = [_table(COLUMNS, rows)] if rows else []
    if reasons:
        lines += ["", "Reasons"]
        for ref, (case, path, label, reason) in enumerate(reasons, 1):
            head = f"  [{ref}] {case} {path} ({label}): "
            lines += textwrap.wrap(
                " ".join(reason.split()),
                WRAP,
                initial_indent=head,
                subsequent_indent=" " * (len(str(ref)) + 5),
                break_long_words=False,
                break_on_hyphens=False,
            )
    return visible("\n".join(lines + ["", summary(report)]))


def summary(report: dict) -> str:
    """``N cases (K refused); paths: a pass, b FAIL, ...; median s per case, total``."""
    cases = report.get("cases") or []
    counts: dict[str, int] = {}
    for result in report["results"]:
        counts[_label(result)] = counts.get(_label(result), 0) + 1
    refused = sum(1 for case in cases if case["error"])
    seconds = [case["seconds"] for case in cases]
    paths = ", ".join(f"{n} {label}" for label, n in sorted(counts.items())) or "none checked"
    cost = (
        f"; {statistics.median(seconds):.2f} s per case (median), {_duration(sum(seconds))} in all" if seconds else ""
    )
    return f"{len(cases)} case{'s' * (len(cases) != 1)} ({refused} refused); paths: {paths}{cost}"
