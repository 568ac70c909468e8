"""The history page (``history.html``): the findings, then one plot per timed series (median and 95 % CI per run,
runs that did not pass marked, steps drawn where they were found), self-contained like the run report."""

from __future__ import annotations

from pathlib import Path

from parity.platform.safefs import write_text_atomic
from parity.report.html_parts import CSS, _e, inline_svg, plot_style
from parity.results.history import Series, findings, skipped


def _plot(series: Series, salt: str) -> str:
    from matplotlib.figure import Figure

    with plot_style(salt):
        fig = Figure(figsize=(8, 2.6))
        ax = fig.add_subplot()
        timed = [(i, p) for i, p in enumerate(series.points) if p["verdict"] == "pass" and p["median_ms"]]
        if timed:
            xs = [i for i, _ in timed]
            med = [p["median_ms"] for _, p in timed]
            lo = [m - (p["ci"][0] or m) for m, (_, p) in zip(med, timed)]
            hi = [(p["ci"][1] or m) - m for m, (_, p) in zip(med, timed)]
            ax.errorbar(
                xs, med, yerr=[lo, hi], fmt="o-", ms=3, lw=1, capsize=2, color="#0969da", label="median, 95 % CI"
            )
        bad = [i for i, p in enumerate(series.points) if p["verdict"] != "pass"]
        if bad:
            top = max((p["median_ms"] for _, p in timed), default=1.0)
            ax.scatter(bad, [top] * len(bad), marker="x", color="#cf222e", label="not timed (verdict)")
        for step in series.steps:
            ax.axvline(step.index - 0.5, color="#cf222e", ls="--", lw=1)
            ax.annotate(
                f"{step.ratio:.3g}x",
                (step.index - 0.5, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(3, -10),
                textcoords="offset points",
                color="#cf222e",
            )
        ax.set_xticks(
            range(len(series.points)),
            [p["run"][:15] for p in series.points],
            rotation=50,
            ha="right",
            rotation_mode="anchor",
        )
        ax.set_ylabel("ms")
        ax.grid(axis="y", color="#eaeef2", lw=0.6)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
        return inline_svg(fig, f"median per run of {series.label}")


def render(series: list[Series], envs: dict, where: str) -> str:
    found = findings(series, envs)
    body = [
        f"<h1>parity history</h1><p class='muted'>{_e(where)}</p>",
        "<h2>Findings</h2>",
        "<ul>" + "".join(f"<li>{_e(line)}</li>" for line in found) + "</ul>"
        if found
        else "<p>No verdict changed and no series stepped.</p>",
    ]
    skips = skipped(series)
    if skips:
        body += [
            "<h2>Skipped</h2><p class='muted'>Not a verdict: the path did not run there.</p>",
            "<ul>" + "".join(f"<li>{_e(line)}</li>" for line in skips) + "</ul>",
        ]
    for k, s in enumerate(x for x in series if x.kind != "check"):
        body += [f"<h3>{_e(s.label)}</h3>", _plot(s, f"h{k}")]
    head = f'<meta charset="utf-8"><title>parity history</title><style>{CSS}</style>'
    return f'<!DOCTYPE html>\n<html lang="en"><head>{head}</head><body>\n' + "\n".join(body) + "\n</body></html>\n"


def write(series: list[Series], envs: dict, where: str, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "history.html"
    write_text_atomic(target, render(series, envs, where))
    return target
