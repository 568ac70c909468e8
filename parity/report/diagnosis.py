"""The terminal form of a diagnosis: the tap table in network order, the first divergent tap, the tested
cause with its before/after errors, the chain link where the drift enters, output patterns, gradients."""

from __future__ import annotations

import textwrap

from parity.diagnose.descend import display, relative
from parity.report.escape import visible
from parity.report.terminal import WRAP, _table

MARK = ">"  # marks the first divergent tap's row


def _num(value, spec: str = ".2e") -> str:
    return "-" if value is None else format(value, spec)


def _row(row: dict) -> tuple:
    s = row["stats"] or {}
    if row["stats"] is None:
        note = f"fused into {row['fused_into']}" if row.get("fused_into") else (row.get("reason") or "")
    elif "reason" in s:
        note = s["reason"]
    else:
        note = f"{s['n_bad']} of {s['size']} out" if not s["ok"] else ""
    return (
        MARK if row["first_divergent"] else "",
        row["tap"],
        row.get("kind") or "-",
        row.get("found") or "-",
        _num(s.get("max_abs")),
        _num(s.get("max_rel")),
        _num(s.get("mean_abs")),
        _num(s.get("cosine"), ".6f"),
        _num(s.get("tol_units"), ".3g"),
        _num(row.get("growth"), ".3g"),
        note,
    )


def _cause_lines(d: dict) -> list[str]:
    cause, test = d.get("cause"), d.get("cause_test")
    if cause:
        before, after = cause["before"], cause["after"]
        return [
            (
                f"  cause: {cause['description']} [{cause['variant']}]: recomputing {cause['tap']} this way "
                f"reproduces the path ({before['tol_units']:.3g}x the tolerance as declared -> "
                f"{after['tol_units']:.3g}x with the variant; max_abs {before['max_abs']:.3g} -> {after['max_abs']:.3g})"
            )
        ]
    if test:
        return [f"  cause: none confirmed: {test.get('explanation', '')}"]
    return []


def _node_cause_lines(d: dict) -> list[str]:
    cause = d.get("node_cause")
    if not cause or cause["cause"] == "optimiser_rewrite":  # the optimiser is told with the runtime link
        return []
    fix = f"; fix: {cause['fix']}" if cause.get("fix") else ""
    return [f"  node cause: {cause['description']} (at {cause['op_type']} {cause['node']}){fix}"]


def _units(stats: dict | None) -> str:
    return "not compared" if not stats else f"{_num(stats.get('tol_units'), '.3g')}x"


def tree_lines(d: dict) -> list[str]:
    """The descent into the model's tree: the path found, and at each level the divergent child with its error, its
    input's, what came before it, and at the leaf its class, kind and ONNX nodes (a ``rich`` tree)."""
    from io import StringIO

    from rich.console import Console
    from rich.markup import escape
    from rich.tree import Tree

    tree = d.get("tree") or {}
    trail = d.get("first_divergent_path") or []
    if not tree.get("descended") or not tree.get("levels"):
        return []
    head = display(trail) or "none"
    root = Tree(
        escape(
            f"first divergent path: {head}"
            + (f" ({tree['verdict'].replace('_', ' ')})" if tree.get("verdict") not in (None, "leaf") else "")
        )
    )
    node, parent = root, None
    for level in tree["levels"]:
        rows = level["rows"]
        first = level["first_divergent"]
        if first is None:
            worst = max((r["stats"].get("tol_units", 0.0) for r in rows if r["stats"]), default=0.0)
            node.add(
                escape(f"{len(rows)} children of {level['scope'] or 'the model'}, none departs (worst {worst:.3g}x)")
            )
            break
        index = [r["tap"] for r in rows].index(first)
        row = rows[index]
        before = [r for r in rows[:index] if r["stats"]]
        worst = max((r["stats"].get("tol_units", 0.0) for r in before), default=None)
        context = (
            f"after {relative(before[0]['tap'], parent)}, within tolerance"
            if len(before) == 1
            else f"after {len(before)} within tolerance, worst {worst:.3g}x"
            if before
            else "its first child"
        )
        unseen = [relative(r["tap"], parent) for r in rows[:index] if not r["stats"]]
        if unseen:
            context += f"; not observed: {', '.join(unseen)}"
        label = (
            f"{relative(first, parent)}  {_units(row['stats'])}  input {_units(row['input'])}  "
            f"{row['class'].rsplit('.', 1)[-1]}{' [' + row['kind'] + ']' if row.get('kind') else ''}"
            f"{' called ' + str(row['calls']) + 'x, compared at its first call' if row['calls'] > 1 else ''}  ({context})"
        )
        node, parent = node.add(escape(label)), first
    leaf = tree.get("leaf") or {}
    if leaf.get("nodes") and tree.get("verdict") == "leaf":
        shown = ", ".join(f"{name} ({op})" for name, op in leaf["nodes"][:8])
        more = f" and {len(leaf['nodes']) - 8} more" if len(leaf["nodes"]) > 8 else ""
        node.add(escape(f"ONNX nodes: {shown}{more}"))
    out = StringIO()
    Console(file=out, width=WRAP, no_color=True, highlight=False, soft_wrap=False).print(root)
    return ["  " + line.rstrip() for line in out.getvalue().splitlines()]


def _link_lines(d: dict) -> list[str]:
    links = d.get("links") or {}
    if links.get("unreliable"):
        return ["  chain: not judged (the instrumented run does not reproduce the failure)"]
    parts = []
    for check in links.get("checks", []):
        where = check.get("first_divergent_tap") or (check.get("first_divergent_node") or {}).get("node")
        parts.append(
            f"{check['link']} {'ok' if check['ok'] else 'DIFFERS'}" + (f" (first at {where})" if where else "")
        )
    lines = [f"  chain: {' | '.join(parts)}"] if parts else []
    if links.get("enters_at"):
        lines.append(f"  drift enters at the {links['enters_at']}: {links['explanation']}")
    return lines


def render(d: dict) -> str:
    """One diagnosed path as text."""
    header = f"Diagnosis {d.get('model', '')} {d.get('path', '')}"
    if "error" in d:
        return f"{header}: {d['error']}"
    if "int8" in d:
        from parity.diagnose.precision.int8_chain import render as render_int8

        lines = [f"{header}: the quantized layers that cost the accuracy, and the fewest to keep in float"]
        return "\n".join(
            lines
            + [
                wrapped
                for line in render_int8(d)
                for wrapped in textwrap.wrap(
                    line, WRAP, subsequent_indent="    ", break_long_words=False, break_on_hyphens=False
                )
            ]
        )
    tol = d["tolerance"]
    judged = f"atol {tol['atol']:g}, rtol {tol['rtol']:g}"
    if tol.get("scaled"):  # a passing path far above the float32 floor, diagnosed at the floor's bound
        judged = f"{tol['scaled']:.3g} of each tensor's largest magnitude, the float32 floor's bound"
    lines = [f"{header} (tap tolerance {judged}; {MARK} first divergent tap)"]
    if d["taps"]:
        columns = [
            ("", "left"),
            ("tap", "left"),
            ("kind", "left"),
            ("found", "left"),
            ("max_abs", "right"),
            ("max_rel", "right"),
            ("mean_abs", "right"),
            ("cosine", "right"),
            ("tol×", "right"),
            ("growth", "right"),
            ("note", "left"),
        ]
        lines.append(_table(columns, [_row(r) for r in d["taps"]]))
    first = d.get("first_divergent_tap")
    lines += tree_lines(d)
    notes = [
        f"  first divergent tap: {first}"
        if first
        else "  first divergent tap: none (no tap is over tolerance and growing)"
    ]
    notes += _cause_lines(d) + _node_cause_lines(d) + _link_lines(d)
    holding = [p["detail"] for p in d.get("patterns", []) if p["holds"]]
    notes.append(
        f"  output pattern: {'; '.join(holding)}"
        if holding
        else "  output patterns: no class permutation, constant scale, offset or grid shift explains the outputs"
    )
    if d.get("gradients"):
        notes.append(f"  gradients: {d['gradients']['note']}")
    if d.get("repair"):
        from parity.diagnose.precision.float16_repair import render_repair

        notes += render_repair(d["repair"])
    notes += [f"  note: {note}" for note in d.get("notes", [])]
    for note in notes:
        lines += textwrap.wrap(note, WRAP, subsequent_indent="    ", break_long_words=False, break_on_hyphens=False)
    return "\n".join(lines)


def render_all(report: dict) -> str:
    """Every diagnosis of a report, separated by blank lines ('' when there is none)."""
    blocks = [render(r["diagnosis"]) for r in report["results"] if r.get("diagnosis")]
    blocks += [
        render_generation(r) for r in report["results"] if (r.get("generation") or {}).get("diagnosis") is not None
    ]
    return visible("\n\n".join(blocks))


def render_generation(result: dict) -> str:
    """A generation path's diagnosis at its first divergent step: the module chain, the leaf and its cause."""
    found = result["generation"]["diagnosis"]
    head = f"{result['model']} {result['path']}"
    if found.get("error"):
        return f"{head}: the diagnosis failed: {found['error']}"
    if found.get("step") is None or not found.get("first_divergent_path"):
        return f"{head}: {found.get('note') or 'nothing diagnosed'}"
    lines = [
        f"{head}: the module tree at step {found['step']} ({found.get('mode')}, {found.get('batch')})",
        f"  first divergent module: {' › '.join(found['first_divergent_path'])}",
    ]
    leaf = found.get("leaf") or {}
    if leaf.get("path"):
        lines.append(f"  leaf: {leaf['path']} ({leaf.get('class')}), {leaf.get('tol_units') or 0:.3g} tolerance units")
    cause = found.get("cause")
    lines.append(f"  cause: {cause.get('explanation') or cause.get('description')}" if cause else "  no cause tested")
    return "\n".join(lines)
