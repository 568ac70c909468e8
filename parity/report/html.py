"""The HTML report: one self-contained page per run (inline CSS and SVG; no script, no network).

matplotlib is imported only while a plot is drawn, so importing this module stays cheap.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from parity.diagnose.descend import display
from parity.platform.safefs import write_text_atomic
from parity.report import quantized
from parity.report.html_parts import CSS, _badge, _e, _n, _num, _Right, _table, inline_svg, plot_style
from parity.report.terminal import placement


def _flag(ok, yes: str = "ok", no: str = "bad") -> str:
    return f'<span class="ok">{yes}</span>' if ok else f'<span class="bad">{no}</span>'


def _label(r: dict) -> str:
    if r.get("unexpected_pass"):
        return "XPASS"
    if r.get("verdict") == "error" and r.get("expected"):
        return "xerror"
    return {"fail": "FAIL", "error": "ERROR"}.get(str(r.get("verdict")), str(r.get("verdict")))


def _worst(stats: dict | None):
    """The largest tol_units of a stats dict (nan counts as the worst), or None."""
    values = [s.get("tol_units") for s in (stats or {}).values() if isinstance(s, dict)]
    numbers = [v for v in values if isinstance(v, (int, float))]
    return max(numbers, key=lambda v: math.inf if math.isnan(v) else v) if numbers else None


def _verdicts(results: list[dict]) -> str:
    rows = []
    for i, r in enumerate(results):
        grads, m = r.get("gradients"), r.get("metrics") or {}
        t = ((r.get("timing") or {}).get("batches") or {}).get(str(r.get("batch_size"))) or {}
        bad = sum(1 for s in (grads or {}).values() if not (s or {}).get("ok"))
        acc = m["accuracy"].get("value") if isinstance(m.get("accuracy"), dict) else None
        path = _e(r.get("path"))
        if r.get("diagnosis"):
            path = f'<a href="#diag-{i}">{path}</a> <span class="muted">(diagnosis)</span>'
        grad_cell = "-" if grads is None else _flag(not bad, f"ok {len(grads)}", f"{bad} bad")
        rows.append(
            (
                "",
                [
                    _e(r.get("model")),
                    path,
                    _badge(_label(r)),
                    _n(_worst(r.get("outputs"))),
                    grad_cell,
                    _n(acc, ".4f"),
                    _n(m.get("argmax_agreement"), ".3f"),
                    _n(t.get("median_ms"), ".3f"),
                    _e(r.get("reason")),
                ],
            )
        )
    return _table(["model", "path", "verdict", "tol×", "grads", "acc", "agree", "median ms", "reason"], rows)


def _plot(taps: list[dict], first: str | None, salt: str) -> str:
    """Error per tap in tolerance units (log scale) as an inline SVG; clipped and unmeasured taps are marked."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter
    from matplotlib.transforms import blended_transform_factory

    vals = [(t.get("stats") or {}).get("tol_units") for t in taps]
    finite = [v for v in vals if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]
    top = max(finite + [1.0]) * 10
    floor = min(finite + [1.0]) / 10
    groups: dict[str, tuple[list, list]] = {"measured": ([], []), "over": ([], []), "zero": ([], []), "none": ([], [])}
    for x, v in enumerate(vals):
        kind = (
            "none"
            if not isinstance(v, (int, float))
            else "over"
            if not math.isfinite(v)
            else "zero"
            if v <= 0
            else "measured"
        )
        groups[kind][0].append(x)
        groups[kind][1].append({"over": top, "zero": floor}.get(kind, v))
    with plot_style(salt):
        fig = Figure(figsize=(8, 3))
        ax = fig.add_subplot()
        ax.set_yscale("log")
        line = sorted([(x, y) for k in ("measured", "over", "zero") for x, y in zip(*groups[k])])
        if line:
            ax.plot(*zip(*line), color="#8c959f", lw=1, zorder=1)
        colours = ["#0969da" if v <= 1 else "#cf222e" for v in groups["measured"][1]]
        if colours:
            ax.scatter(*groups["measured"], s=18, c=colours, zorder=2, label="tol× at tap (red: out of tolerance)")
        if groups["over"][0]:
            ax.scatter(
                *groups["over"], marker="^", s=40, color="#a40e26", zorder=3, label=f"inf/nan (clipped at {top:.0e})"
            )
            for x in groups["over"][0]:
                ax.annotate(
                    _num(vals[x]),
                    (x, top),
                    xytext=(0, 5),
                    textcoords="offset points",
                    ha="center",
                    fontsize=7,
                    color="#a40e26",
                )
        if groups["zero"][0]:
            ax.scatter(*groups["zero"], marker="v", s=30, color="#116329", zorder=3, label="exact (0)")
        if groups["none"][0]:
            trans = blended_transform_factory(ax.transData, ax.transAxes)
            ax.scatter(
                groups["none"][0],
                [0.04] * len(groups["none"][0]),
                marker="x",
                s=28,
                color="#8c959f",
                transform=trans,
                zorder=3,
                label="fused / unmapped (no value)",
            )
        ax.axhline(1.0, color="#cf222e", ls="--", lw=1, label="tolerance (1×)")
        names = [str(t.get("tap")) for t in taps]
        if first in names:
            x = names.index(first)
            ax.axvspan(x - 0.4, x + 0.4, color="#ffcecb", zorder=0, label=f"first divergent: {first[:30]}")
        ax.set_xticks(
            range(len(taps)),
            [n if len(n) <= 24 else n[:23] + "…" for n in names],
            rotation=50,
            ha="right",
            rotation_mode="anchor",
        )
        ax.set_xlim(-0.6, len(taps) - 0.4)
        ax.set_ylim(floor / 2, top * 3)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # no mathtext: plain SVG text
        ax.set_ylabel("error / tolerance")
        ax.grid(axis="y", color="#eaeef2", lw=0.6)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
        return inline_svg(fig, "error per tap in tolerance units")


def _taps(taps: list[dict]) -> str:
    rows = []
    for t in taps:
        s = t.get("stats") or {}
        note = [
            f"fused into {t['fused_into']}" if t.get("fused_into") else "",
            t.get("reason") or "",
            f"tensor {t['tensor']}" if t.get("tensor") and t.get("tensor") != t.get("tap") else "",
        ]
        tol = _n(s.get("tol_units"))
        if s.get("ok") is False:
            tol = _Right(f'<span class="bad">{tol}</span>')
        cells = [_e(t.get("tap")), _e(t.get("kind") or "-"), _e(t.get("found"))]
        cells += [_n(s.get(k), ".6g" if k == "cosine" else ".3g") for k in ("max_abs", "max_rel", "mean_abs", "cosine")]
        cells += [tol, _n(t.get("growth"), ".2g", "×"), _e("; ".join(filter(None, note)))]
        rows.append(("hl" if t.get("first_divergent") else "" if s else "nomap", cells))
    return _table(["tap", "kind", "found", "max_abs", "max_rel", "mean_abs", "cosine", "tol×", "growth", "note"], rows)


def _tree(d: dict, i: int) -> str:
    """The descent into the model's tree: one collapsible level per scope on the first divergent path, each with
    its per-child plot and table (children in call order), nested as the modules are."""
    tree = d.get("tree") or {}
    if not tree.get("descended"):
        return f"<p class='muted'>Not descended into the model's tree: {_e(tree.get('reason'))}</p>" if tree else ""
    html = ""
    for depth, level in reversed(list(enumerate(tree.get("levels") or []))):
        rows = [r for r in level["rows"] if isinstance(r, dict)]
        first = level.get("first_divergent")
        scope = level.get("scope") or "the model"
        head = f"{_e(scope)}: {len(rows)} children" + (
            f" — first divergent <b>{_e(first)}</b>" if first else " — none departs"
        )
        body = _plot(rows, first, f"diag-{i}-tree-{depth}") + _taps(rows) if rows else ""
        html = f"<details open><summary>{head}</summary><div class='level'>{body}{html}</div></details>"
    leaf = tree.get("leaf") or {}
    nodes = ", ".join(f"{_e(name)} ({_e(op)})" for name, op in leaf.get("nodes") or [])
    where = f"<p>ONNX nodes of {_e(leaf.get('tap'))}: {nodes}</p>" if nodes and tree.get("verdict") == "leaf" else ""
    note = f"<p>{_e(tree['note'])}</p>" if tree.get("note") else ""
    return f"<h3>The model's tree</h3>{note}{html}{where}"


def _headline(d: dict) -> str:
    trail = d.get("first_divergent_path") or []
    first, cause = d.get("first_divergent_tap"), d.get("cause")
    if not first and not trail:
        measured = [(t.get("stats") or {}).get("ok") for t in d.get("taps") or [] if isinstance(t, dict)]
        measured = [ok for ok in measured if ok is not None]
        return "no divergent tap: " + (
            "no tap could be compared"
            if not measured
            else "every compared tap is within tolerance"
            if all(measured)
            else "none identified"
        )
    text = (
        f"first divergent path: <b>{_e(display(trail))}</b> — "
        if len(trail) > 1 or not first
        else f"first divergent tap: <b>{_e(first)}</b> — "
    )
    if not cause:
        return text + "no known variant explains it"
    before, after = cause.get("before") or {}, cause.get("after") or {}
    return text + (
        f"cause: {_e(cause.get('description') or cause.get('variant'))} — error "
        f"{_num(before.get('tol_units'), '.2g')}× → {_num(after.get('tol_units'), '.2g')}× tolerance"
    )


def _cause_test(ct: dict) -> str:
    attrs = ", ".join(f"{k}={v}" for k, v in (ct.get("attrs") or {}).items())
    declared = ct.get("declared") or {}
    rows = [("", ["<b>declared</b>", _e(attrs), _n(declared.get("max_abs")), _n(declared.get("tol_units")), ""])]
    for v in ct.get("variants") or []:
        rep = bool(v.get("reproduces"))
        rows.append(
            (
                "rep" if rep else "",
                [
                    _e(v.get("name")),
                    _e(v.get("description")),
                    _n(v.get("max_abs")),
                    _n(v.get("tol_units")),
                    _flag(True, "✔ reproduces") if rep else "-",
                ],
            )
        )
    title = f"Cause test at {_e(ct.get('tap'))} <span class='muted'>({_e(ct.get('kind'))})</span>"
    table = _table(["variant", "description", "max_abs", "tol×", "reproduces"], rows)
    return f"<h3>{title}</h3>{table}<p>{_e(ct.get('explanation'))}</p>"


def _links(links: dict) -> str:
    if links.get("unreliable"):
        return (
            "<h3>Where the drift enters: not judged</h3><p>The instrumented run does not reproduce the failure "
            "(see the notes).</p>"
        )
    rows = []
    for c in links.get("checks") or []:
        node = c.get("first_divergent_node") or {}
        where = c.get("first_divergent_tap") or (
            f"{node.get('node')} ({node.get('op_type')}, {_num(node.get('tol_units'))}×)" if node else "-"
        )
        rows.append(
            (
                "" if c.get("ok") else "hl",
                [
                    _e(c.get("link")),
                    _e(c.get("compared")),
                    _flag(c.get("ok"), "ok", "diverges"),
                    _e(where),
                    _n(c.get("worst_tol_units")),
                ],
            )
        )
    table = _table(["link", "compared", "result", "first divergent", "worst tol×"], rows) if rows else ""
    title = f"Where the drift enters: {_e(links.get('enters_at') or 'unknown')}"
    return f"<h3>{title}</h3><p>{_e(links.get('explanation'))}</p>{table}"


def _gradients(g: dict) -> str:
    rows = [
        (
            "" if layer.get("ok") else "hl",
            [
                _e(layer.get("layer")),
                _flag(layer.get("ok")),
                _n(layer.get("worst_tol_units")),
                _e(", ".join(str(p.get("name")) for p in layer.get("params") or [] if not p.get("ok")) or "-"),
            ],
        )
        for layer in g.get("layers") or []
    ]
    first = g.get("first_departing_param")
    text = " · ".join(filter(None, [_e(g.get("note")), first and f"first departing parameter: <b>{_e(first)}</b>"]))
    table = _table(["layer", "result", "worst tol×", "bad parameters"], rows)
    return f"<h3>Gradients by layer</h3><p>{text}</p>{table}"


def _model_explorer(explorer: dict, base: Path | None) -> str:
    """The link to a diagnosis's Model Explorer folder (relative to the report's when both are known) and how to
    open it (``parity.report.model_explorer``), or why it could not be written."""
    folder = str(explorer.get("folder") or "")
    if explorer.get("error"):
        return f"<p>Model Explorer node data for {_e(folder)} {_e(explorer['error'])}.</p>"
    href = Path(os.path.relpath(folder, base)).as_posix() if base is not None else Path(folder).as_uri()
    packages = "ai-edge-model-explorer" + (
        " model-explorer-onnx" if "--extensions=" in explorer.get("command", "") else ""
    )
    return (
        f'<p>See it on the graph: <a href="{_e(href)}/">{_e(folder)}</a> holds Model Explorer node data '
        f"({_e(', '.join(explorer.get('files') or []))}); open it with "
        f"<code>{_e(explorer.get('command'))}</code> (<code>pip install {packages}</code>): each node coloured by "
        f"its drift in tolerance units.</p>"
    )


def _diagnosis(i: int, r: dict, base: Path | None = None) -> str:
    d = r.get("diagnosis") or {}
    taps = [t for t in d.get("taps") or [] if isinstance(t, dict)]
    tol = d.get("tolerance") or {}
    title = f"Diagnosis: {_e(r.get('model'))} · {_e(r.get('path'))} {_badge(_label(r))}"
    tolerance = (
        f"tolerance: atol {_num(tol.get('atol'))}, rtol {_num(tol.get('rtol'))}; {len(taps)} taps in network order"
    )
    if d.get("error"):
        return (
            f'<section class="diag" id="diag-{i}"><h2>{title}</h2>'
            f'<p class="headline quiet">{_e(d["error"])}</p></section>'
        )
    if "int8" in d:
        from parity.diagnose.precision.int8_chain import render as render_int8

        items = "".join(f"<li>{_e(line.strip())}</li>" for line in render_int8(d))
        return f'<section class="diag" id="diag-{i}"><h2>{title}</h2><ul>{items}</ul></section>'
    quiet = "" if d.get("first_divergent_tap") else " quiet"
    parts = [
        f'<section class="diag" id="diag-{i}"><h2>{title}</h2>',
        f'<p class="headline{quiet}">{_headline(d)}</p>',
        f'<p class="muted">{tolerance}</p>',
    ]
    if d.get("model_explorer"):
        parts.append(_model_explorer(d["model_explorer"], base))
    if taps:
        parts += [_plot(taps, d.get("first_divergent_tap"), f"diag-{i}"), _taps(taps)]
    else:
        parts.append("<p>No taps were recorded.</p>")
    parts.append(_tree(d, i))
    if d.get("cause_test"):
        parts.append(_cause_test(d["cause_test"]))
    if d.get("node_cause"):
        cause = d["node_cause"]
        fix = f" Fix: {_e(cause['fix'])}." if cause.get("fix") else ""
        parts.append(
            f"<h3>Cause on the graph: {_e(cause['op_type'])} {_e(cause['node'])}</h3>"
            f"<p>{_e(cause['description'])}.{fix}</p>"
        )
    if d.get("links"):
        parts.append(_links(d["links"]))
    if d.get("patterns"):
        rows = [
            ("", [_e(p.get("name")), _flag(not p.get("holds"), "no", "holds"), _e(p.get("detail"))])
            for p in d["patterns"]
        ]
        parts.append("<h3>Output patterns</h3>" + _table(["pattern", "holds", "detail"], rows))
    if d.get("gradients"):
        parts.append(_gradients(d["gradients"]))
    if d.get("notes"):
        parts.append("<h3>Notes</h3><ul>" + "".join(f"<li>{_e(n)}</li>" for n in d["notes"]) + "</ul>")
    return "\n".join(parts) + "</section>"


def _flatten(value, prefix: str = "") -> list[tuple[str, str]]:
    """Nested dicts as ``a.b.c`` keys; a list of dicts is indexed (``gpu.0.name``), other lists joined."""
    if isinstance(value, (list, tuple)) and any(isinstance(v, dict) for v in value):
        value = dict(enumerate(value))
    if isinstance(value, dict) and value:
        return [row for k, v in value.items() for row in _flatten(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(value, (list, tuple)):
        value = ", ".join(str(v) for v in value)
    return [(prefix, "-" if value is None or value == {} else str(value))]


def render(report: dict, base: Path | None = None) -> str:
    """The whole page as a string; ``base``: the report's folder, which links to other folders are relative to."""
    results = [r for r in report.get("results") or [] if isinstance(r, dict)]
    errors = report.get("model_errors") or []
    counts = Counter(_label(r) for r in results)
    summary = " · ".join(f"{counts.get(k, 0)} {k}" for k in ("pass", "FAIL", "ERROR", "skip", "xerror"))
    summary += f" · {counts['XPASS']} XPASS" if counts.get("XPASS") else ""
    summary += f" · {len(errors)} model error(s)" if errors else ""
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    body = [
        f"<h1>parity report</h1><p class='muted'>generated {now} · schema {_e(report.get('schema'))}</p>",
        f'<p class="summary">{_e(summary)}</p>',
        *(f"<p>{_e(line)}</p>" for line in placement(results) if line),
        "<h2>Verdicts</h2>",
        _verdicts(results) if results else "<p>No path ran.</p>",
    ]
    if errors:
        body.append(
            "<h2>Model errors</h2>"
            + _table(
                ["model", "reason"],
                [("hl", [_e(p.get("model")), _e(p.get("reason"))]) for p in errors if isinstance(p, dict)],
            )
        )
    gated = quantized.gate_rows(results)
    if gated:
        body.append(
            "<h2>Accuracy gates of the quantized paths</h2>"
            + _table(
                [name for name, _ in quantized.GATE_COLUMNS],
                [("pass" if row[7] == "pass" else "fail", [_e(c) for c in row]) for row in gated],
            )
            + "<ul>"
            + "".join(f"<li><b>{_e(k)}</b> {_e(v)}</li>" for k, v in quantized.GATE_LEGEND if k)
            + "".join(
                f"<li>{_e(r['model'])} {_e(r['path'])}: {_e(quantized.recipe(r))}</li>"
                for r in results
                if quantized.recipe(r)
            )
            + "</ul>"
        )
    body += [_diagnosis(i, r, base) for i, r in enumerate(results) if r.get("diagnosis")]
    from parity.report import bench_html

    body.append(bench_html.render(report))
    if report.get("history_page"):
        body.append(f'<p><a href="{_e(report["history_page"])}">History of these paths over the stored runs</a></p>')
    env = _flatten(report.get("env") or {})
    body.append(
        "<h2>Environment</h2>" + _table(["key", "value"], [("", [f"<code>{_e(k)}</code>", _e(v)]) for k, v in env if k])
    )
    head = (
        '<meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>parity report</title><style>{CSS}</style>"
    )
    return f'<!DOCTYPE html>\n<html lang="en"><head>{head}</head><body>\n' + "\n".join(body) + "\n</body></html>\n"


def write(report: dict, out_dir: str | Path) -> Path:
    """Render to ``out_dir/index.html``: a temporary file beside it, fsynced, then renamed over it.

    A symlinked ``index.html`` is followed (its target is replaced, the link kept); a FIFO or device is
    written through."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "index.html"
    write_text_atomic(target, render(report, Path(os.path.abspath(out_dir))))
    return target
