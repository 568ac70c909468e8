"""The benchmark section of the HTML report: what a benchmarker reads, in the order to read it.

The warnings first (host audit, voided or cache-flagged series, warm-ups that did not converge, noise), then per path
and batch: median with its CI, spread, tail latency where enough runs claim it, runs, the ratio to the baseline with
its CI and the rule applied, the output audit and repeat probe, process-to-process variation; time to first result
by part with peak memory; the latency distributions as plots, one per model and batch size.
"""

from __future__ import annotations

from parity.bench.stats import ratio_text
from parity.report import quantized
from parity.report.html_parts import _badge, _e, _n, _table, inline_svg, plot_style
from parity.report.timing_table import footprint_rows, series_of, warnings

MAX_PLOTTED = 2000  # samples per series drawn (evenly spaced order statistics beyond that)


def _series(results: list[dict]):
    for r in results:
        for batch, e in series_of(r):
            yield r, batch, e


def _ratio(e: dict) -> str:
    vs = e.get("vs_baseline") or {}
    if vs.get("self"):
        return "baseline"
    if "ratio" not in vs:
        return _e(vs.get("reason") or "-")
    lo, hi = vs["ci95"]
    rule = (
        f"{vs['verdict']}: CI excludes 1 and Welch p {vs['p']:.2g} &lt; 0.05"
        if vs["significant"]
        else f"no significant difference (p {vs['p']:.2g})"
    )
    return f"{ratio_text(vs['ratio'])} [{ratio_text(lo)}, {ratio_text(hi)}] vs {_e(vs['baseline'])}: {rule}"


def _audit(e: dict) -> str:
    a = e.get("audit")
    if not a:
        return "-"
    outputs = a.get("outputs") or []
    cache = a.get("cache") or {}
    text = f"{sum(o['ok'] for o in outputs)}/{len(outputs)} outputs ok over {a.get('feeds')} inputs"
    if cache.get("ratio"):
        text += f"; repeats {ratio_text(cache['ratio'])}" + (" <b>cache?</b>" if cache.get("flagged") else "")
    if a.get("cost_fraction") is not None:
        text += f"; cost {100 * a['cost_fraction']:.1f}%"
    return text


def _tail(e: dict) -> str:
    tail = (e.get("tail") or {}).get("p99") or {}
    if e.get("p99_ms") is not None:
        return f"{e['p99_ms']:.4g} (&le; {tail.get('upper_ms', 0):.4g})"
    return f"needs {tail.get('needs_runs', 299)} runs" if tail else "-"


def _rows(results: list[dict]) -> list:
    rows = []
    for r, batch, e in _series(results):
        if e.get("verdict") != "pass":
            rows.append(
                (
                    "hl",
                    [
                        _e(r["model"]),
                        _e(r["path"]),
                        _e(batch),
                        _badge(str(e.get("verdict")).upper()),
                        *["-"] * 7,
                        _e(e.get("reason")),
                    ],
                )
            )
            continue
        lo, hi = e["ci95_ms"]
        processes = e.get("processes")
        rows.append(
            (
                "",
                [
                    _e(r["model"]),
                    _e(r["path"]),
                    _e(batch),
                    _badge("pass"),
                    _n(e["median_ms"], ".4g"),
                    f"[{lo:.4g}, {hi:.4g}]",
                    _n(100 * e.get("spread", e["cv"]), ".1f", "%"),
                    _tail(e),
                    _n(e["runs"], "d"),
                    (
                        f"{processes['n']}: cv {100 * processes['between_processes_cv']:.1f}% between, "
                        f"{100 * processes['within_process_spread']:.1f}% within"
                        if processes
                        else "1"
                    ),
                    _audit(e),
                    _ratio(e),
                ],
            )
        )
    return rows


def _footprint(results: list[dict]) -> str:
    rows, unmeasured = footprint_rows(results)
    if not rows:
        return ""
    notes = "".join(f"<li>not measured here: {_e(why)}</li>" for why in unmeasured)
    return (
        "<h3>Memory and energy (per timed series, beside its latency)</h3>"
        + _table(
            ["model", "path", "batch", "median ms", "peak MB above idle", "artifact MB", "device MB", "J / inference"],
            [("", [_e(c) for c in row]) for row in rows],
        )
        + (f"<ul>{notes}</ul>" if notes else "")
    )


def _first(results: list[dict]) -> str:
    rows = []
    for r in results:
        f = (r.get("timing") or {}).get("first_result")
        if not f or f.get("verdict") == "error":
            continue
        ms = [
            None if f.get(k) is None else 1e3 * f[k]
            for k in ("first_inference_s", "second_inference_s", "first_backward_s")
        ]
        rows.append(
            (
                "",
                [
                    _e(r["model"]),
                    _e(r["path"]),
                    _n(f.get("import_s"), ".3f"),
                    "cache" if f.get("export_cached") else _n(f.get("export_s"), ".3f"),
                    _n(f.get("load_s"), ".3f"),
                    *[_n(v, ".2f") for v in ms],
                    _n(f.get("path_peak_mb"), ".0f"),
                ],
            )
        )
    if not rows:
        return ""
    return "<h3>Time to first result (fresh worker)</h3>" + _table(
        ["model", "path", "import s", "export s", "load s", "1st run ms", "2nd run ms", "1st backward ms", "peak MB"],
        rows,
    )


def _plots(results: list[dict]) -> str:
    import numpy as np

    groups: dict[tuple[str, str], list[tuple[str, list[float]]]] = {}
    for r, batch, e in _series(results):
        if e.get("verdict") == "pass" and e.get("samples_ms"):
            groups.setdefault((r["model"], batch), []).append((r["path"], e["samples_ms"]))
    out = []
    for k, ((model, batch), series) in enumerate(groups.items()):
        data = []
        for _, samples in series:
            x = np.sort(np.asarray(samples))
            data.append(x[np.linspace(0, x.size - 1, MAX_PLOTTED).astype(int)] if x.size > MAX_PLOTTED else x)
        out.append(
            f"<h3>Latency of {_e(model)} at batch {_e(batch)}</h3>" + _boxes([p for p, _ in series], data, f"lat{k}")
        )
    return "".join(out)


def _boxes(labels: list[str], data: list, salt: str) -> str:
    from matplotlib.figure import Figure

    with plot_style(salt):
        fig = Figure(figsize=(8, 0.45 * len(labels) + 0.9))
        ax = fig.add_subplot()
        ax.violinplot(data, orientation="horizontal", showmedians=True, showextrema=False)
        ax.boxplot(data, orientation="horizontal", widths=0.15, showfliers=False)
        ax.set_xscale("log")
        ax.set_yticks(range(1, len(labels) + 1), labels)
        ax.set_xlabel("ms per call (log scale): distribution, median, quartiles")
        ax.grid(axis="x", color="#eaeef2", lw=0.6)
        return inline_svg(fig, "latency distributions")


def render(report: dict) -> str:
    """The section, or "" for a report that timed nothing."""
    results = [r for r in report.get("results") or [] if isinstance(r, dict)]
    if not any(r.get("timing") for r in results):
        return ""
    body = ["<h2>Benchmark</h2>"]
    found = warnings(report)
    if found:
        body.append("<ul>" + "".join(f"<li class='bad'>{_e(w)}</li>" for w in found) + "</ul>")
    body.append(
        _table(
            [
                "model",
                "path",
                "batch",
                "verdict",
                "median ms",
                "95% CI ms",
                "spread",
                "p99 ms (95% bound)",
                "runs",
                "processes",
                "audit",
                "vs baseline",
            ],
            _rows(results),
        )
    )
    speed = quantized.speed_rows(results)
    if speed:
        body.append(
            "<h3>Quantized paths: speed-up over the float path, beside their accuracy</h3>"
            + _table([name for name, _ in quantized.SPEED_COLUMNS], [("", [_e(c) for c in row]) for row in speed])
        )
    body += [_footprint(results), _first(results), _plots(results)]
    return "\n".join(b for b in body if b)
