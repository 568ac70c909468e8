"""``parity history``: per path and series, verdict, median (with CI) and peak memory over the stored runs, the
versions that changed between runs, and where a path started failing, became slower or faster, or came to hold
more or less memory (``parity.results.steps``).
A skip is no verdict (the path did not run there): verdict changes are read between the runs that judged the path,
and the runs that skipped it are one line per path, with the reason.

Reads the store only; plots for the HTML page are drawn in ``parity.results.history_html``.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from parity.bench.footprint import MEMORY_CHANGE, memory_change
from parity.bench.stats import ratio_text
from parity.platform.errors import one_line
from parity.results.steps import Step, detect, se_from_ci

SHOWN_RUNS = 12  # rows per series in the terminal (steps and verdict changes are always listed)


@dataclass
class Series:
    """One (model, path, device, precision, kind, key) over the runs that have it, oldest first."""

    model: str
    path: str
    device: str
    precision: str
    kind: str
    key: str
    points: list[dict] = field(default_factory=list)  # {"run", "created", "verdict", "median_ms", "ci", "hardware"}
    steps: list[Step] = field(default_factory=list)
    memory_steps: list[Step] = field(default_factory=list)  # in its peak resident memory
    verdict_changes: list[tuple[int, str, str]] = field(default_factory=list)  # (index, before, after), no skips

    @property
    def label(self) -> str:
        what = {
            "check": "check",
            "batch": f"batch {self.key}",
            "shape": self.key,
            "train_step": "training step",
            "ttft": f"batch {self.key} time to first token",
            "decode_step": f"batch {self.key} decode step",
        }
        extra = "" if (self.device, self.precision) == ("cpu", "fp32") else f" {self.device} {self.precision}"
        return f"{self.model} {self.path}{extra} {what.get(self.kind, self.kind)}"


def version_changes(before: dict, after: dict) -> list[str]:
    """``name a -> b`` for every package whose version differs between two environment manifests, then Python and
    hardware."""
    pa, pb = before.get("packages") or {}, after.get("packages") or {}
    lines = [
        f"{n} {pa.get(n) or '-'} -> {pb.get(n) or '-'}" for n in sorted(set(pa) | set(pb)) if pa.get(n) != pb.get(n)
    ]
    for key in ("python", "cpu", "gpu"):
        if before.get(key) != after.get(key):
            lines.append(f"{key} {before.get(key) or '-'} -> {after.get(key) or '-'}")
    return lines


def build(runs: list[dict]) -> tuple[list[Series], dict[str, dict]]:
    """Series from the store's runs (``Store.history``), analysed; and each run's environment by id."""
    found: dict[tuple, Series] = {}
    envs = {}
    for run in runs:
        envs[run["id"]] = run["env"]
        for row in run["rows"]:
            key = (row["model"], row["path"], row["device"], row["precision"], row["kind"], row["key"])
            series = found.setdefault(key, Series(*key))
            series.points.append(
                {
                    "run": run["id"],
                    "created": run["created"],
                    "verdict": row["verdict"],
                    "median_ms": row["median_ms"],
                    "ci": (row["ci_lo_ms"], row["ci_hi_ms"]),
                    "hardware": run["hardware"],
                    "tol_units": row["tol_units"],
                    "reason": row.get("reason"),
                    "peak_rss_mb": row.get("peak_rss_mb"),
                    "gate": (row.get("gate_value"), row.get("gate_golden")),
                }
            )
    for series in found.values():
        analyse(series)
    return list(found.values()), envs


def analyse(series: Series) -> None:
    """Verdict changes between consecutive runs, and steps in the medians of the runs that passed (on one hardware
    only: the newest run's; other hardware is not a step)."""
    points = series.points
    judged = [i for i, p in enumerate(points) if p["verdict"] != "skip"]
    series.verdict_changes = [
        (i, points[j]["verdict"], points[i]["verdict"])
        for j, i in itertools.pairwise(judged)
        if points[i]["verdict"] != points[j]["verdict"]
    ]
    if series.kind == "check" or not points:
        return
    hardware = points[-1]["hardware"]
    timed = [
        (i, p) for i, p in enumerate(points) if p["verdict"] == "pass" and p["median_ms"] and p["hardware"] == hardware
    ]
    if len(timed) >= 4:
        values = [p["median_ms"] for _, p in timed]
        ses = [se_from_ci(p["median_ms"], *p["ci"]) for _, p in timed]
        series.steps = [Step(timed[s.index][0], s.before, s.after, s.p) for s in detect(values, ses)]
    # peak memory by the same test, a step only where it also moved past footprint.memory_change's thresholds
    held = [(i, p) for i, p in timed if p.get("peak_rss_mb")]
    if len(held) >= 4:
        series.memory_steps = [
            Step(held[s.index][0], s.before, s.after, s.p)
            for s in detect([p["peak_rss_mb"] for _, p in held], min_change=MEMORY_CHANGE)
            if memory_change(s.before, s.after)
        ]


def findings(series: list[Series], envs: dict) -> list[str]:
    """One line per step or verdict change: the run where it happened and the versions that changed there."""
    lines = []
    for s in series:
        for index, before, after in s.verdict_changes:
            run = s.points[index]["run"]
            previous = next(p for p in reversed(s.points[:index]) if p["verdict"] != "skip")
            changed = version_changes(envs[previous["run"]], envs[run])
            lines.append(f"{s.label}: {before} -> {after} at run {run}" + _changed(changed))
        kinds = (
            ("", "slower", "faster", "median ", ".4g", "ms", s.steps),
            ("peak memory ", "more memory", "less memory", "", ".0f", "MB", s.memory_steps),
        )
        for what, up, down, figure, spec, unit, steps in kinds:
            for step in steps:
                run = s.points[step.index]["run"]
                changed = version_changes(envs[s.points[step.index - 1]["run"]], envs[run])
                lines.append(
                    f"{s.label}: {what}{ratio_text(step.ratio)} ({up if step.ratio > 1 else down}; {figure}"
                    f"{step.before:{spec}} -> {step.after:{spec}} {unit}, p {step.p:.2g}) from run {run}"
                    + _changed(changed)
                )
    return lines


def skipped(series: list[Series]) -> list[str]:
    """One line per path that some runs skipped: in how many of its runs, the last one, and the newest reason."""
    lines = []
    for s in series:
        skips = [p for p in s.points if p["verdict"] == "skip"]
        if s.kind != "check" or not skips:
            continue
        reasons = list(dict.fromkeys(p["reason"] or "no reason recorded" for p in reversed(skips)))
        more = f" (and {len(reasons) - 1} other reason{'s' if len(reasons) > 2 else ''})" if len(reasons) > 1 else ""
        label = s.label.removesuffix(" check")
        lines.append(
            f"{label}: skipped in {len(skips)} of {len(s.points)} runs, last at run {skips[-1]['run']}: "
            f"{one_line(reasons[0], 200)}{more}"
        )
    return lines


def _changed(changed: list[str]) -> str:
    if not changed:
        return "; no version changed there"
    return "; changed there: " + ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")


def _figure(point: dict) -> str:
    """A run's figure: its median; for a check, its worst error in tolerance units, or a quantized path's gate
    metric beside the golden's."""
    value, golden = point.get("gate") or (None, None)
    if point["median_ms"]:
        return f"{point['median_ms']:.4g}"
    if value is not None and golden is not None:
        return f"gate {100 * value:.2f}% / {100 * golden:.2f}%"
    return f"{point['tol_units']:.3g}x tol" if point["tol_units"] is not None else "-"


def _when(created: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(created))


def render(series: list[Series], envs: dict, where: str, runs: int) -> str:
    """The terminal text of ``parity history``."""
    from parity.report.terminal import _table

    if not series:
        return f"{where}: {runs} run(s), none of the selected models and paths"
    lines = [f"{where}: {runs} run(s)"]
    found = findings(series, envs)
    lines += ["", "Findings (steps: a permutation test on the medians, p < 0.01; verdict changes)"]
    lines += [f"  {line}" for line in found] or ["  none: no verdict changed and no series stepped"]
    skips = skipped(series)
    if skips:
        lines += ["", "Skipped (not a verdict: the path did not run there)"] + [f"  {line}" for line in skips]
    for s in sorted(series, key=lambda s: (s.model, s.path, s.device, s.precision, s.kind != "check", s.kind, s.key)):
        marks = {step.index: f"memory step {ratio_text(step.ratio)}" for step in s.memory_steps}
        marks.update({step.index: f"step {ratio_text(step.ratio)}" for step in s.steps})
        marks.update({i: f"{b} -> {a}" for i, b, a in s.verdict_changes})
        shown = [i for i in range(len(s.points)) if i >= len(s.points) - SHOWN_RUNS or i in marks]
        rows = []
        for i in shown:
            p = s.points[i]
            lo, hi = p["ci"]
            changed = version_changes(envs[s.points[i - 1]["run"]], envs[p["run"]]) if i else []
            figure = _figure(p)
            rows.append(
                (
                    p["run"],
                    _when(p["created"]),
                    p["verdict"],
                    figure,
                    f"[{lo:.4g}, {hi:.4g}]" if lo and hi else "-",
                    "-" if p.get("peak_rss_mb") is None else f"{p['peak_rss_mb']:.0f}",
                    marks.get(i, ""),
                    ", ".join(changed[:3]) + (" ..." if len(changed) > 3 else ""),
                )
            )
        head = "worst error" if s.kind == "check" else "median ms"
        lines += [
            "",
            s.label + (f" ({len(s.points) - len(shown)} older runs not shown)" if len(shown) < len(s.points) else ""),
            _table(
                [
                    ("run", "left"),
                    ("date", "left"),
                    ("verdict", "left"),
                    (head, "right"),
                    ("95% CI ms", "left"),
                    ("peak MB", "right"),
                    ("", "left"),
                    ("versions changed", "left"),
                ],
                rows,
            ),
        ]
    return "\n".join(lines)
