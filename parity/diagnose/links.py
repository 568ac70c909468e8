"""The chain of links a diagnosis judges: where the drift enters, definition -> converter -> runtime.

The definition is the source against the golden; the converter the exported model against its own source on the
same inputs; the runtime ONNX Runtime against the reference evaluator on the same file, with a third opinion on
the first disputed node (``parity.diagnose.graph.onnx_ops``), or ONNX Runtime's optimiser where the failure depends on
its level (``parity.diagnose.graph.optimiser``). NumPy only.
"""

from __future__ import annotations

import math
import re

from parity.check import closeness as compare
from parity.diagnose.causes import drift
from parity.run import paths


def _link(spec, link: str, compared: str, reference: dict, actual: dict, tolerances) -> dict:
    """One link of the chain: ``actual``'s taps and outputs against ``reference``'s (``{"taps", "outputs"}``)."""
    rows = drift.tap_rows(spec, reference["taps"], actual["taps"], actual["located"], tolerances.for_name)
    outputs = compare.compare_named(actual["outputs"], reference["outputs"], tolerances.for_name)
    worst = max([drift.worst_units(rows), *(s.get("tol_units", math.inf) for s in outputs.values())])
    return {
        "link": link,
        "compared": compared,
        "ok": all(s["ok"] for s in outputs.values()) and worst <= 1.0,
        "first_divergent_tap": drift.first_divergent(rows),
        "worst_tol_units": worst,
    }


def judge(spec, path, observed, source, golden_reference: dict, tolerances) -> dict:
    """Which link of definition -> export -> runtime the drift enters at (taps and outputs compared)."""
    checks = [_link(spec, "definition", f"{path.definition} vs golden", golden_reference, source, tolerances)]
    source_first = checks[0]["first_divergent_tap"]
    if path.exports and path.source in paths.NATIVE:  # an ONNX source file has no converter of its own
        checks.append(
            _link(
                spec,
                "converter",
                f"{'/'.join(path.stages[:-1])} ({path.runtime.name}) vs {path.source} on the same inputs",
                source,
                observed,
                tolerances,
            )
        )
    runtime = observed.get("runtime_compare")
    if observed.get("optimiser"):
        checks.append(_optimiser_link(observed["optimiser"]))
    elif runtime is not None:
        checks.append(_runtime_link(runtime, path.runtime.name))
    by_link = {c["link"]: c for c in checks}
    if not by_link["definition"]["ok"]:
        enters = "definition"
        where = f"first at {source_first}" if source_first else "at the outputs"
        why = f"{path.definition} itself departs from the golden ({where}): every path of this source inherits it"
    elif "runtime" in by_link and not by_link["runtime"]["ok"]:
        enters = "runtime"
        why = by_link["runtime"]["explanation"]
    elif "converter" in by_link and not by_link["converter"]["ok"]:
        enters = "converter"
        first = by_link["converter"]["first_divergent_tap"]
        why = (
            f"{path.source} matches the golden but the exported model departs from it "
            f"({f'first at {first}' if first else 'at the outputs'})"
        )
        if "runtime" in by_link:
            why += f"; {by_link['runtime'].get('note') or 'both runtimes agree on the exported file'}"
    elif path.source not in paths.NATIVE and by_link.get("runtime", {}).get("other_off_spec"):
        enters, why = _off_spec_golden(spec, by_link["runtime"])
    else:
        enters = None
        why = "no link departs on the taps or the outputs"
    return {"enters_at": enters, "explanation": why, "checks": checks}


def _off_spec_golden(spec, runtime: dict) -> tuple[str, str]:
    """An ONNX file whose golden (onnx.reference in float64) does not follow the ONNX spec where this path's runtime
    does: the converter when the file was version-converted (the conversion changed what the node computes, which
    onnx.reference hides), else the definition (the golden's own evaluator)."""
    converted = re.search(
        r"converted from .+? \(opset (\d+)\) to opset (\d+) by onnx.version_converter", spec.description or ""
    )
    if converted:
        return "converter", (
            f"{runtime['note']}; the golden, made by onnx.reference, computes what the model did "
            f"before onnx.version_converter took it from opset {converted[1]} to {converted[2]}: "
            f"the conversion changed what the node computes"
        )
    return "definition", (
        f"{runtime['note']}; the golden was computed by onnx.reference, which departs from the ONNX "
        f"spec there: this path computes the file as the spec defines it"
    )


def _optimiser_link(effect: dict) -> dict:
    """The runtime link when the failure depends on ONNX Runtime's optimisation level: the optimiser is the link."""
    from parity.diagnose.graph.optimiser import describe

    return {
        "link": "runtime",
        "compared": "ort at each graph optimisation level vs the golden",
        "ok": False,
        "first_divergent_node": None,
        "worst_tol_units": effect["levels"][effect["appears_at"]],
        "explanation": describe(effect),
    }


def _runtime_link(runtime: dict, runtime_name: str) -> dict:
    """ORT vs the reference evaluator: judged on the tensors that carry a tap or an output.

    Inside a layer the two may legitimately differ by float32 summation order a little beyond
    the tap tolerance (large attention scores); what matters is whether a tap or an output
    differs. When one does, the first node where the disagreement starts and grows is named, and a third opinion
    (the node in float64 against its ONNX definition, on each runtime's own inputs) says which runtime follows the
    spec: the link fails only where the path's own runtime does not.
    """
    compared = "ort vs onnxref on the same file (every tensor; judged at taps and outputs)"
    if runtime.get("scope"):
        compared = (
            f"ort vs onnxref on the {runtime['scope']['nodes']} node(s) of the module where the drift begins, "
            f"from the same inputs (judged at its output)"
        )
    if runtime.get("error"):
        return {
            "link": "runtime",
            "compared": compared,
            "ok": True,
            "first_divergent_node": None,
            "worst_tol_units": None,
            "note": f"not compared: {runtime['error']}",
        }
    boundary = set(runtime.get("boundary_tensors", []))
    at_boundary = [n for n in runtime["nodes"] if n["tensor"] in boundary]
    worst = max((n["tol_units"] for n in at_boundary), default=0.0)
    if worst <= 1.0:
        return {
            "link": "runtime",
            "compared": compared,
            "ok": True,
            "first_divergent_node": None,
            "worst_tol_units": worst,
        }
    node = runtime.get("first_divergent") or next(n for n in at_boundary if not n["tol_units"] <= 1.0)
    where = f"node {node['node']} ({node['op_type']}, {compare.times(node['tol_units'])})"
    opinion = runtime.get("third_opinion") or {}
    follows = opinion.get("follows_spec")
    entry = {
        "link": "runtime",
        "compared": compared,
        "ok": False,
        "first_divergent_node": node,
        "worst_tol_units": worst,
        "third_opinion": opinion or None,
        "explanation": f"ONNX Runtime and the reference evaluator disagree on the same file, first at {where}",
    }
    runtime_name = "ort" if runtime_name.startswith("ort") else runtime_name  # ort-noopt: the same kernels
    if follows in ("both", runtime_name):
        other = "onnxref" if runtime_name == "ort" else "ort"
        entry["ok"] = True
        entry["other_off_spec"] = follows != "both"
        entry["note"] = (
            f"the runtimes disagree first at {where}, and {runtime_name} follows the ONNX definition of "
            f"{node['op_type']} at opset {opinion['opset']} (checked with {opinion['evaluator']})"
            + (
                " as does " + other + " on its own inputs: the node amplifies a difference of its inputs"
                if follows == "both"
                else f"; {other} does not"
            )
        )
    elif follows is not None:
        entry["explanation"] += (
            f"; {runtime_name} does not follow the ONNX definition of {node['op_type']} at opset "
            f"{opinion['opset']} there (checked with {opinion['evaluator']}"
            + (f"; {follows} does" if follows not in ("neither",) else "; neither does")
            + ")"
        )
    return entry
