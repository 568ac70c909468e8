"""Pieces every HTML page of parity shares: the style sheet, escaping, number cells, verdict badges, tables."""

from __future__ import annotations

import io
import math
import re
from html import escape

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:#1f2328;
 margin:24px auto;max-width:1320px;padding:0 16px}
h1{margin:0 0 4px}h2{margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}h3{margin:16px 0 6px}
.muted{color:#656d76}.summary{font-size:16px;margin:8px 0 16px}
table{border-collapse:collapse;margin:6px 0 12px;font-size:13px}
th,td{border-bottom:1px solid #e4e7eb;padding:3px 9px;text-align:left;vertical-align:top}
th{background:#f6f8fa;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.hl td{background:#ffebe9}tr.rep td{background:#fff8c5}.nomap td{color:#8c959f}
.v{font-weight:600;padding:1px 7px;border-radius:9px;font-size:12px;white-space:nowrap}
.v-pass{background:#dafbe1;color:#116329}.v-fail{background:#ffebe9;color:#a40e26}
.v-error{background:#ffe2cc;color:#953800}.v-skip{background:#eaeef2;color:#57606a}
.v-xerror{background:#eaeef2;color:#6639ba}.v-xpass{background:#fff8c5;color:#7d4e00}
.headline{font-size:15px;background:#f6f8fa;border-left:4px solid #cf222e;padding:6px 10px}
.headline.quiet{border-left-color:#8c959f}
.ok{color:#116329}.bad{color:#a40e26;font-weight:600}.plot svg{width:100%;max-width:1100px;height:auto}
section.diag{margin-top:36px}td{max-width:560px;overflow-wrap:break-word}code{font-size:12px}
details>summary{cursor:pointer;font-weight:600;margin:4px 0}details .level{margin-left:18px;border-left:2px solid #d0d7de;
 padding-left:10px}
"""
LABEL_CLASS = {"pass": "pass", "FAIL": "fail", "ERROR": "error", "skip": "skip", "xerror": "xerror", "XPASS": "xpass"}


class _Right(str):
    """A table cell (already escaped) that is right-aligned: a number."""


def _e(value) -> str:
    return escape("" if value is None else str(value))


def _num(value, fmt: str = ".3g") -> str:
    """A number as text; None is "-", non-finite floats are "inf", "-inf" or "nan"."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else _e(value)
    if not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
    return format(value, fmt)


def _n(value, fmt: str = ".3g", suffix: str = "") -> _Right:
    return _Right(_num(value, fmt) + (suffix if isinstance(value, (int, float)) else ""))


def _badge(label: str) -> str:
    return f'<span class="v v-{LABEL_CLASS.get(label, "skip")}">{_e(label)}</span>'


def _table(headers: list[str], rows: list[tuple[str, list[str]]]) -> str:
    """``rows``: (the row's class, its cells already escaped; a ``_Right`` cell is right-aligned)."""

    def cell(c: str) -> str:
        return f'<td class="n">{c}</td>' if isinstance(c, _Right) else f"<td>{c}</td>"

    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(f'<tr class="{cls}">{"".join(map(cell, cells))}</tr>' for cls, cells in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def plot_style(salt: str):
    """The style every plot is drawn and saved in (a context manager; matplotlib is imported only here): small
    sans-serif text kept as SVG text, a fixed hash salt so a page is reproducible, and names from users' models
    drawn literally, never parsed as mathtext ("a$x^2$b") or LaTeX."""
    import matplotlib

    return matplotlib.rc_context(
        {
            "svg.fonttype": "none",
            "svg.hashsalt": salt,
            "font.size": 8,
            "font.family": "sans-serif",
            "text.parse_math": False,
            "text.usetex": False,
        }
    )


def inline_svg(fig, label: str) -> str:
    """``fig`` as an inline SVG block without its date or metadata (call it inside ``plot_style``)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    svg = buf.getvalue()
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg[svg.index("<svg") :], flags=re.DOTALL)
    return f'<div class="plot" role="img" aria-label="{escape(label)}">{svg}</div>'
