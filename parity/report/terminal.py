"""The terminal report: a results table, a legend, full reasons, and a one-line summary per model.

Everything is plain text (no colour, ASCII rules) so that it can be pasted into an issue as is.
Tables are laid out by ``rich`` at a fixed width, so piped output never wraps differently.
"""

from __future__ import annotations

import io
import textwrap
from collections import defaultdict
from collections.abc import Sequence
from typing import cast

from rich import box
from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

from parity.report import quantized
from parity.report.escape import visible

VERDICT_LABELS = {"pass": "pass", "fail": "FAIL", "error": "ERROR", "skip": "skip"}
UNEXPECTED = ("FAIL", "ERROR", "XPASS")  # their full reasons are always listed
WIDTH = 200  # the tables' width: generous, so that rows never wrap
SHORT_REASON = 60  # characters of a reason shown in the table
WRAP = 100  # width of the wrapped full reasons
# One rule of ASCII dashes under the header, nothing else: survives any terminal, pipe or issue tracker.
PLAIN = box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)

LEGEND = [
    ("tol×", "the worst output element's error in units of its tolerance atol + rtol·|golden|"),
    ("", "(numpy.allclose semantics): at most 1 passes"),
    ("max_abs", "the largest absolute output error"),
    ("grads", "ok N: all N gradients (every trainable parameter and the input) within tolerance;"),
    ("", "K bad: K of them out of tolerance; -: the path cannot differentiate (e.g. ONNX)"),
    ("acc", "accuracy on the labelled eval split"),
    ("agree", "fraction of eval samples whose argmax equals the golden argmax"),
    ("det", "yes: two runs are bitwise identical"),
]
TIMING_LEGEND = [("median ms", "median time per batch at the checked batch size; passing paths only (the gate)")]
STAGES = ("verify", "export", "check", "diagnose", "bench")  # the orchestrator's stages, in the order they run
VERDICT_LEGEND = [
    ("verdict", "pass | FAIL: out of tolerance | ERROR: export or run failed | skip: not available here"),
    ("", "xerror: an error the spec declares as expected | XPASS: a declared error passed, update the spec"),
]


def _label(result: dict) -> str:
    if result.get("unexpected_pass"):
        return "XPASS"
    if result["verdict"] == "error" and result.get("expected"):
        return "xerror"
    return VERDICT_LABELS.get(result["verdict"], str(result["verdict"]))


def _worst(stats: dict | None) -> tuple[str, str]:
    if not stats:
        return "-", "-"
    if all(s.get("judged_by") for s in stats.values()):  # a quantized path: judged by its accuracy gate
        return "gate", f"{max(s['max_abs'] for s in stats.values()):.2e}"
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


def _metrics(result: dict) -> tuple[str, str]:
    m = result.get("metrics")
    if not m:
        return "-", "-"
    return f"{m['accuracy']['value']:.4f}", f"{m['argmax_agreement']:.3f}"


def _generation(generation: dict) -> tuple[str, str, str]:
    """(tol×, max_abs, agree) of a generation path: its worst step's logits and its greedy tokens' agreement."""
    units, worst, agreement = (generation.get(k) for k in ("tol_units_max", "max_abs_logit", "token_agreement"))
    return (
        "-" if units is None else f"{units:.3g}",
        "-" if worst is None else f"{worst:.2e}",
        "-" if agreement is None else f"{agreement:.3f}",
    )


def _determinism(result: dict) -> str:
    return "-" if result.get("deterministic") is None else ("yes" if result["deterministic"] else "no")


def _timing(result: dict) -> str:
    """The median at the spec's batch size (the one the path was checked at), when it was timed."""
    entry = ((result.get("timing") or {}).get("batches") or {}).get(str(result.get("batch_size")))
    return f"{entry['median_ms']:.3f}" if entry and entry.get("verdict") == "pass" else "-"


def _reason(result: dict) -> str:
    """The full reason, with what the spec declared for expected errors and unexpected passes."""
    reason = result.get("reason") or ""
    if result["verdict"] == "error" and result.get("log"):
        reason += f" (worker log: {result['log']})"
    elif result["verdict"] == "error" and (result.get("export") or {}).get("cached"):
        reason += " (cached from an earlier run: --no-cache exports again and keeps the worker log)"
    if result.get("unexpected_pass"):
        return f"declared as expected error ({result['expected_reason']}) but passed: update the spec"
    if result.get("expected"):
        return f"expected: {reason}"
    return reason


def _short(reason: str, ref: int | None) -> str:
    """The reason on one line, cut to SHORT_REASON characters; ``[ref]`` points to the Reasons block."""
    line = " ".join(reason.split())
    tag = f" [{ref}]" if ref else ""
    if len(line) + len(tag) > SHORT_REASON:
        line = line[: SHORT_REASON - len(tag) - 1].rstrip() + "…"
    return line + tag


def _table(columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[object]]) -> str:
    """Plain text: a header, an ASCII rule, and rows; no colour, no trailing spaces."""
    table = Table(box=PLAIN, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    for name, justify in columns:
        table.add_column(name, justify=cast("JustifyMethod", justify), no_wrap=True)  # "left" or "right"
    for row in rows:
        table.add_row(*(Text(visible(str(cell))) for cell in row))  # Text: no markup parsing of "[...]"
    text = io.StringIO()
    console = Console(
        file=text, width=WIDTH, color_system=None, force_terminal=False, markup=False, highlight=False, emoji=False
    )
    console.print(table)
    return "\n".join(line.rstrip() for line in text.getvalue().splitlines())


def _legend(entries: list[tuple[str, str]]) -> list[str]:
    key_width = max(len(key) for key, _ in entries)
    return [f"  {key:<{key_width}}  {text}".rstrip() for key, text in entries]


def _wrapped(ref: int, result: dict, reason: str) -> list[str]:
    """``[ref] model path (verdict): reason``, wrapped and indented; the reason's own line breaks are kept."""
    first = f"  [{ref}] {result['model']} {result['path']} ({_label(result)}): "
    indent = " " * (len(str(ref)) + 5)
    lines: list[str] = []
    for paragraph in visible(reason).splitlines():
        lines += textwrap.wrap(
            paragraph,
            WRAP,
            initial_indent=indent if lines else first,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        )
    return lines


def _timing_legend(results: list[dict]) -> list[tuple[str, str]]:
    """The ``median ms`` entry, naming the batch size(s) the column is at (each model's checked batch size)."""
    by_model = dict.fromkeys((r["model"], r.get("batch_size")) for r in results if r.get("batch_size"))
    sizes = {batch for _, batch in by_model}
    if not sizes:
        return TIMING_LEGEND
    if len(sizes) == 1:
        at = f"batch {sizes.pop()}"
    else:
        at = "batch " + ", ".join(f"{batch} ({model})" for model, batch in by_model)
    return [("median ms", f"median time per batch at the checked batch size, {at}; passing paths only (the gate)")]


def stage_seconds(report: dict) -> str:
    """One line of the run's time by stage (``report["stage_seconds"]``), in the order they ran; "" when absent."""
    seconds = report.get("stage_seconds") or {}
    if not seconds:
        return ""
    order = [key for key in STAGES if key in seconds] + [key for key in seconds if key not in STAGES]
    parts = [f"{key} {_duration(seconds[key])}" for key in order if seconds[key] is not None]
    total = sum(seconds[key] for key in order if seconds[key] is not None)
    return f"Time by stage: {', '.join(parts)}; {_duration(total)} in all"


def _duration(seconds: float) -> str:
    """``0.4 s``, ``12.3 s``, ``2 min 05 s``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


def placement(results: list[dict]) -> list[str]:
    """One line naming the device and precision of the run, and what a reduced precision is compared with."""
    from parity.platform.precision import PRECISIONS

    lines = []
    for device, precision in dict.fromkeys((r.get("device", "cpu"), r.get("precision", "fp32")) for r in results):
        described = PRECISIONS[precision].description if precision in PRECISIONS else precision
        lines.append(
            f"device {device}, precision {precision} ({described}): every path against the float64 golden "
            f"under the {precision} tolerances and metric rules"
        )
    return [*lines, ""]


def dtype_tolerances(results: list[dict]) -> list[str]:
    """``Tolerances by output dtype``: each output judged at its own reduced dtype's tolerance, not the run's, and
    why (``closeness.dtype_tolerance``); nothing when none was."""
    lines = []
    for r in results:
        for name, stats in (r.get("outputs") or {}).items():
            rule = stats.get("tolerance")
            if rule:
                lines.append(
                    f"  {r['model']} {r['path']} output {name}: atol {rule['atol']:.3g}, rtol "
                    f"{rule['rtol']:.3g}; {rule['why']}"
                )
    return ["", "Tolerances by output dtype"] + lines if lines else []


def noisier(results: list[dict]) -> list[str]:
    """One line per passing path far noisier than the model's float32 floor (``parity.check.noise_floor``)."""
    from parity.check import noise_floor

    found = [text for r in results if (text := noise_floor.line(r))]
    return (
        [""]
        + [
            line
            for text in found
            for line in textwrap.wrap(text, WRAP, subsequent_indent="    ", break_on_hyphens=False)
        ]
        if found
        else []
    )


def render(report: dict, timed: bool, verbose: bool = False) -> str:
    """The whole terminal report as text; ``timed`` adds the median ms column (``parity run``).

    The Reasons block lists in full every FAIL, ERROR and XPASS reason, and with ``verbose``
    also those of xerror and skip rows.
    """
    results = report["results"]
    if not results:
        return visible("\n".join(summary_lines(report)))
    head = placement(results)
    listed = UNEXPECTED + (("xerror", "skip") if verbose else ())
    columns = [
        ("model", "left"),
        ("path", "left"),
        ("verdict", "left"),
        ("tol×", "right"),
        ("max_abs", "right"),
        ("grads", "left"),
        ("acc", "right"),
        ("agree", "right"),
        ("det", "left"),
    ]
    columns += [("median ms", "right")] * timed + [("reason", "left")]
    rows, reasons, hidden = [], [], 0
    for r in results:
        reason = _reason(r)
        ref = None
        if reason.strip() and _label(r) in listed:
            reasons.append((r, reason))
            ref = len(reasons)
        short = _short(reason, ref)
        hidden += ref is None and short.endswith("…")
        tol_units, max_abs = _worst(r.get("outputs"))
        acc, agree = _metrics(r)
        if r.get("generation"):  # a generation path: its worst step, and its free-running tokens' agreement
            tol_units, max_abs, agree = _generation(r["generation"])
        row = [r["model"], r["path"], _label(r), tol_units, max_abs, _gradients(r), acc, agree, _determinism(r)]
        rows.append(row + [_timing(r)] * timed + [short])
    lines = [*head, _table(columns, rows), ""]
    lines += _legend(LEGEND + (_timing_legend(results) if timed else []) + VERDICT_LEGEND)
    lines += dtype_tolerances(results)
    lines += noisier(results)
    if hidden:
        lines.append("  (…: reason shortened; --verbose lists xerror and skip reasons in full; --json has all)")
    if reasons:
        lines += ["", "Reasons"]
        for ref, (r, reason) in enumerate(reasons, 1):
            lines += _wrapped(ref, r, reason)
    gated = quantized.gate_rows(results)
    if gated:
        lines += [
            "",
            "Accuracy gates of the quantized paths (int8 outputs are judged by the task, not elementwise)",
            _table(quantized.GATE_COLUMNS, gated),
            "",
            *_legend(quantized.GATE_LEGEND),
        ]
        lines += [
            line
            for r in results
            if quantized.recipe(r)
            for line in textwrap.wrap(
                f"{r['model']} {r['path']}: {quantized.recipe(r)}", WRAP, initial_indent="  ", subsequent_indent="    "
            )
        ]
    ran = [r for r in results if (r.get("runtime") or {}).get("summary")]
    if ran:
        lines += ["", "What the compilers and runtimes did (`runtime` in the JSON has all)"]
        lines += [
            line
            for r in ran
            for line in textwrap.wrap(
                f"{r['model']} {r['path']}: {r['runtime']['summary']}",
                WRAP,
                initial_indent="  ",
                subsequent_indent="    ",
            )
        ]
    return visible("\n".join(lines + ["", *summary_lines(report)]))


def render_paths(rows: list[dict]) -> str:
    """The ``parity paths`` matrix: one row per path and device, one column per precision (``ok``, or
    ``skip [n]`` with reason n listed below), then the notes of runtimes that could not be verified here."""
    precisions = list(dict.fromkeys(r["precision"] for r in rows))
    reasons: dict[str, int] = {}
    table: dict[tuple, dict] = {}
    for r in rows:
        cell = "ok"
        if r["reason"]:
            cell = f"skip [{reasons.setdefault(r['reason'], len(reasons) + 1)}]"
        table.setdefault((r["id"], r["device"]), {"chain": r["steps"]})[r["precision"]] = cell
    columns = [("path", "left"), ("device", "left"), *[(p, "left") for p in precisions], ("export chain", "left")]
    body = [
        (path, device, *[cells.get(p, "-") for p in precisions], cells["chain"])
        for (path, device), cells in table.items()
    ]
    lines = [_table(columns, body)]
    if reasons:
        lines += ["", "Why not"] + [
            line
            for reason, n in reasons.items()
            for line in textwrap.wrap(f"[{n}] {reason}", WRAP, initial_indent="  ", subsequent_indent="      ")
        ]
    notes: dict[str, list[str]] = {}  # each note once, with the paths it is about
    for r in rows:
        if r.get("note") and r["id"] not in notes.setdefault(r["note"], []):
            notes[r["note"]].append(r["id"])
    if notes:
        lines += ["", "Notes"] + [
            line
            for note, ids in notes.items()
            for line in textwrap.wrap(f"{', '.join(ids)}: {note}", WRAP, initial_indent="  ", subsequent_indent="    ")
        ]
    return "\n".join(lines)


def summary_lines(report: dict) -> list[str]:
    """One line per model (verdict counts, checks within tolerance), then each model error in full."""
    by_model = defaultdict(list)
    for r in report["results"]:
        by_model[r["model"]].append(r)
    lines = []
    for model, results in by_model.items():
        ran = [r for r in results if r.get("outputs") is not None]
        outputs_ok = sum(1 for r in ran if all(s["ok"] for s in r["outputs"].values()))
        with_grads = [r for r in ran if r.get("gradients") is not None]
        grads_ok = sum(1 for r in with_grads if all(s["ok"] for s in r["gradients"].values()))
        with_metrics = [r for r in ran if r.get("metrics") is not None]
        metrics_ok = sum(1 for r in with_metrics if r["metrics"]["ok"])
        counts: defaultdict[str, int] = defaultdict(int)
        for r in results:
            counts[_label(r)] += 1
        verdicts = ", ".join(f"{n} {label}" for label, n in sorted(counts.items()))
        generated = [r["generation"] for r in results if r.get("generation")]
        if generated or any(r.get("task") for r in results):  # a language model: its steps and consistency checks
            steps_ok = sum(1 for g in generated if g.get("first_divergent_step") is None)
            held = sum(
                1 for g in generated if all(c.get("ok") is not False for c in (g.get("consistency") or {}).values())
            )
            lines.append(
                f"{model}: {verdicts} | every step within tolerance {steps_ok}/{len(generated)}, "
                f"consistency holds {held}/{len(generated)}"
            )
            continue
        lines.append(
            f"{model}: {verdicts} | outputs ok {outputs_ok}/{len(ran)}, gradients ok {grads_ok}/{len(with_grads)}, "
            f"metrics ok {metrics_ok}/{len(with_metrics)}"
        )
    for problem in report.get("model_errors", []):
        lines.append(f"{problem['model']}: ERROR {problem['reason']}")
    changed = {r["model"]: r["golden_changed"]["message"] for r in report["results"] if r.get("golden_changed")}
    lines += [f"warning: {model}: {message}" for model, message in changed.items()]
    fallbacks = {r["model"]: r["reference_fallback"] for r in report["results"] if r.get("reference_fallback")}
    lines += [
        f"warning: {model}: checked against a {f['dtype']} golden reference, not float64 ({f['reason']}); "
        f"tolerances widened x{f['tolerance_factor']:g}"
        for model, f in fallbacks.items()
    ]
    for r in report["results"]:
        if (r.get("export") or {}).get("rebuilt"):
            lines.append(f"note: {r['model']} {r['path']}: exported again ({r['export']['rebuilt']})")
        build = (r.get("export") or {}).get("build_determinism")
        if build and not build["deterministic"]:
            lines.append(
                f"warning: {r['model']} {r['path']}: two TensorRT builds of the same model give outputs "
                f"that differ by up to {build['max_abs_diff']:.3g} (tactics chosen by timing); the engine "
                "checked is the one timed"
            )
    return lines
