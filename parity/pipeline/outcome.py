"""A run's outcome: expected errors applied to each result, and the exit code of the whole run."""

from __future__ import annotations

from parity.platform.errors import one_line


def skeleton(model: str, path_id: str, stages: list, device: str, precision: str, batch_size: int) -> dict:
    """A path's result row before it is checked: every field a report reads, unset."""
    return {
        "model": model,
        "path": path_id,
        "stages": stages,
        "device": device,
        "precision": precision,
        "batch_size": batch_size,
        "verdict": None,
        "reason": None,
        "expected": False,
        "outputs": None,
        "gradients": None,
        "metrics": None,
        "deterministic": None,
        "timing": None,
        "peak_rss_mb": None,  # the check's worker at its memory peak (MB)
        "diagnosis": None,
        "golden_changed": None,
    }


def apply_expectation(spec, result: dict) -> None:
    """Mark declared expected errors; an expected error that passes is an unexpected pass."""
    declared = spec.expected_error(result["path"])
    if declared is None:
        return
    result["expected_reason"] = declared
    if result["verdict"] == "error":
        result["expected"] = True
    elif result["verdict"] == "pass":
        result["unexpected_pass"] = True


def is_unexpected(result: dict) -> bool:
    """A failure or error not declared, an expected error that passed, or a timing voided by its output audit."""
    if (result["verdict"] in ("fail", "error") and not result.get("expected")) or result.get("unexpected_pass"):
        return True
    if not result.get("timing"):
        return False
    from parity.report.timing_table import series_of  # the benchmark tables' module: only a timed run needs it

    return any(e.get("verdict") == "invalid" for _, e in series_of(result))


def exit_code(report: dict) -> int:
    """0 when everything is as expected, 1 when any path (or model) ended unexpectedly.

    2 when nothing was checked: no model could be loaded at all, or every selected path was skipped (a run that
    checked nothing proves nothing; ``nothing_checked`` says why in one line).
    """
    if (report["model_errors"] and not report["results"]) or nothing_checked(report):
        return 2
    if report["model_errors"] or any(is_unexpected(r) for r in report["results"]):
        return 1
    return 0


def nothing_checked(report: dict) -> str | None:
    """One line saying why no path was checked, when every selected path was skipped; else None."""
    results = report["results"]
    if not results or report["model_errors"] or any(r["verdict"] != "skip" for r in results):
        return None
    reasons: dict[str, list[str]] = {}
    for r in results:
        reasons.setdefault(r.get("reason") or "no reason given", []).append(r["path"])
    why = "; ".join(f"{', '.join(dict.fromkeys(ids))}: {reason}" for reason, ids in reasons.items())
    return one_line(f"nothing was checked: every selected path was skipped ({why})", 600)
