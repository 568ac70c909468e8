"""Results as JUnit XML (``--junit-xml``), the format CI systems show as test results.

One ``<testcase>`` per model and path: ``classname`` the model, ``name`` the path id (with ``[device-precision]``
where those are not cpu and fp32), ``time`` the path's check seconds. A failing path is a ``<failure>`` whose message
is the reason and whose text adds the first divergent layer and the diagnosis where one ran; an error is an
``<error>``; a skip or an error the spec declares as expected is ``<skipped>``. A model that could not be taken at all
(its spec, its golden data, a refused ONNX file) is one ``<testcase name="model">`` with an ``<error>``, so a CI
page never shows green while the run's exit code says otherwise. Built with the standard library's ``xml.etree``.
"""

from __future__ import annotations

import re
import socket
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from parity.platform.safefs import write_bytes_atomic
from parity.report.timing_table import series_of

DEFAULT_PLACEMENT = ("cpu", "fp32")
# what XML 1.0 cannot hold at all (control characters a converter's message may carry): replaced, so the file parses
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_PACKAGES = ("onnx", "onnxruntime", "torch", "tensorflow-cpu", "tensorflow", "jax", "tf2onnx", "jax2onnx", "tensorrt")


def case_name(result: dict) -> str:
    """The path id, with ``[device-precision]`` (only the parts that are not cpu and fp32) like a pytest id."""
    placement = [
        part
        for part, default in zip((result.get("device", "cpu"), result.get("precision", "fp32")), DEFAULT_PLACEMENT)
        if part != default
    ]
    return result["path"] + (f"[{'-'.join(placement)}]" if placement else "")


def first_divergence(result: dict) -> str | None:
    """Where a diagnosis found the path's drift entering: the first divergent layer of the model's tree (``a › b``),
    else the first divergent tap, else the first divergent ONNX node of a chain link; None without one."""
    from parity.diagnose.descend import display

    diagnosis = result.get("diagnosis") or {}
    if not diagnosis or diagnosis.get("error"):
        return None
    if diagnosis.get("first_divergent_path"):
        return display(diagnosis["first_divergent_path"])
    if diagnosis.get("first_divergent_tap"):
        return diagnosis["first_divergent_tap"]
    for check in (diagnosis.get("links") or {}).get("checks") or ():
        where = check.get("first_divergent_tap") or (check.get("first_divergent_node") or {}).get("node")
        if where and not check.get("ok", True):
            return f"{where} ({check['link']})"
    return None


def _clean(text) -> str:
    return _NOT_XML.sub("\ufffd", str(text))


def _outcome(result: dict) -> tuple[str | None, str]:
    """(``failure`` | ``error`` | ``skipped`` | None for a pass, the message)."""
    reason = " ".join((result.get("reason") or "").split())
    if result.get("unexpected_pass"):
        return "failure", f"declared as expected error ({result.get('expected_reason')}) but passed: update the spec"
    if result["verdict"] == "fail":
        return "failure", reason or "out of tolerance"
    if result["verdict"] == "error":
        if result.get("expected"):
            return "skipped", f"expected error: {reason}"
        return "error", reason or "error"
    if result["verdict"] == "skip":
        return "skipped", reason or "not available here"
    invalid = [key for key, entry in series_of(result) if entry.get("verdict") == "invalid"]
    if invalid:
        return "failure", f"timing voided by its output audit at batch {', '.join(map(str, invalid))}"
    return None, ""


def _detail(result: dict, message: str) -> str:
    """The text of a failure or error: the reason in full, the first divergent layer, the diagnosis as printed."""
    lines = [message]
    where = first_divergence(result)
    if where:
        lines.append(f"first divergent layer: {where}")
    if result.get("diagnosis"):
        from parity.report.diagnosis import render

        lines += ["", render(result["diagnosis"])]
    if result.get("log"):
        lines.append(f"worker log: {result['log']}")
    return "\n".join(lines)


def to_xml(report: dict, suite: str = "parity") -> ET.Element:
    """The report as a ``<testsuites>`` element holding one ``<testsuite>``."""
    env = report.get("env") or {}
    packages = env.get("packages") or {}
    cases, counts, total = [], {"failure": 0, "error": 0, "skipped": 0}, 0.0
    for result in report["results"]:
        seconds = float(result.get("check_s") or 0.0)
        total += seconds
        case = ET.Element("testcase", classname=result["model"], name=case_name(result), time=f"{seconds:.3f}")
        kind, message = _outcome(result)
        if kind is not None:
            counts[kind] += 1
            child = ET.SubElement(case, kind, message=message)
            if kind != "skipped":
                child.text = _detail(result, message)
        cases.append(case)
    for problem in report.get("model_errors") or ():
        counts["error"] += 1
        case = ET.Element("testcase", classname=problem["model"], name="model", time="0.000")
        ET.SubElement(case, "error", message=" ".join(str(problem["reason"]).split())).text = str(problem["reason"])
        cases.append(case)
    attributes = {
        "tests": str(len(cases)),
        "failures": str(counts["failure"]),
        "errors": str(counts["error"]),
        "skipped": str(counts["skipped"]),
        "time": f"{total:.3f}",
    }
    root = ET.Element("testsuites", {"name": suite, **{k: v for k, v in attributes.items() if k != "skipped"}})
    testsuite = ET.SubElement(
        root,
        "testsuite",
        {
            "name": suite,
            **attributes,
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "hostname": socket.gethostname(),
        },
    )
    properties = ET.SubElement(testsuite, "properties")
    facts = {
        "parity.version": packages.get("parity") or _own_version(),
        "python": env.get("python"),
        "cpu": env.get("cpu"),
        "gpu": (env.get("gpu") or {}).get("name") if isinstance(env.get("gpu"), dict) else env.get("gpu"),
        "threads": env.get("threads"),
        **{f"package.{name}": packages.get(name) for name in _PACKAGES},
    }
    for name, value in facts.items():
        if value is not None:
            ET.SubElement(properties, "property", name=name, value=str(value))
    testsuite.extend(cases)
    for element in root.iter():
        element.attrib.update({key: _clean(value) for key, value in element.attrib.items()})
        if element.text:
            element.text = _clean(element.text)
    return root


def _own_version() -> str:
    from parity import __version__

    return __version__


def write(report: dict, path: str | Path, suite: str = "parity") -> Path:
    """``report`` as JUnit XML at ``path``, replaced atomically (or written through to a FIFO or device)."""
    root = to_xml(report, suite)
    ET.indent(root)
    data = ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"
    write_bytes_atomic(Path(path), data)
    return Path(path)
