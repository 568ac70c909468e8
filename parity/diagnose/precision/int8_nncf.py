"""NNCF's accuracy control beside parity's own int8 repair: ``nncf.quantize_with_accuracy_control`` on the same
float model, with the gate's metric on the labelled eval split as its validation function.

NNCF quantizes the model (the settings ``parity.exporters.openvino_int8`` uses, so its starting point is the
``*/openvino-int8`` path's model), ranks its quantized operations by how much each costs the metric, and reverts
them to float, worst first, until the relative drop from the float model is within ``max_drop`` (``1 - gate.keep``:
the drop the gate allows). What it reverted is read from the model it returns: the weighted ops that read int8
values in the plainly quantized model and not in this one (``openvino_int8.quantized_layers``); NNCF's own report
(its log's "were reverted back to the floating-point precision" list) is kept beside it. Those names are OpenVINO
op names, what ``keep_float`` takes for ``*/openvino-int8``; for an ONNX model each is also given as the ONNX node it
comes from (OpenVINO's ONNX frontend names an op after its node, with a suffix where it splits one: ``/WithoutBiases``).

Differences from parity's gate, said in the result: NNCF measures the drop against the float32 model compiled by
OpenVINO, not the float64 golden, as a point estimate (no confidence bound); so the model it returns is judged by
parity's gate too (``gate``).
"""

from __future__ import annotations

import io
import logging
import re
import time
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np

MAX_ITERATIONS = 20  # NNCF's revert-and-validate iterations at most (each validates on the whole eval split)
_REPORTED = re.compile(r"(\d+) out of (\d+) were reverted back to the floating-point precision")


def validation(spec, meta: dict, evals: dict, targets: np.ndarray, output: str, batch: int):
    """``(items, validation_fn)`` for NNCF: each item a ``(feed, targets of its rows)`` pair of ``batch`` eval samples
    as the model's feeds; ``validation_fn(compiled, items) -> (fraction of rows whose argmax is the target, one value
    per item)``, as ``nncf.quantize_with_accuracy_control`` takes it."""
    from parity.exporters.openvino_int8 import calibration_items
    from parity.model import feeds

    total = feeds.samples(spec, evals)
    batches = calibration_items(spec, meta, evals, batch)
    items = [(feed, targets[start : start + batch]) for feed, start in zip(batches, range(0, total, batch))]

    def validation_fn(compiled, data) -> tuple[float, list[float]]:
        port = compiled.output(output)
        per_item, hits, rows = [], 0, 0
        for feed, wanted in data:
            predicted = np.asarray(compiled(feed)[port])[: len(wanted)].argmax(axis=-1)
            correct = int(np.sum(predicted == wanted))
            per_item.append(correct / len(wanted))
            hits, rows = hits + correct, rows + len(wanted)
        return hits / max(rows, 1), per_item

    return items, validation_fn


def accuracy_control(
    model,
    spec,
    meta: dict,
    calibration: dict,
    evals: dict,
    targets: np.ndarray,
    *,
    keep: float,
    kept=(),
    metric: str = "accuracy",
    max_iterations: int = MAX_ITERATIONS,
) -> tuple[object, dict]:
    """``(NNCF's model, result)``: ``nncf.quantize_with_accuracy_control`` of the float ``ov.Model`` ``model`` (fed
    as ``meta`` says), calibrated on ``calibration`` with ``openvino_int8``'s settings and ``kept`` ignored, its
    validation the fraction of ``evals`` rows whose argmax is ``targets`` (labels, or the golden's argmax for the
    ``agreement`` metric), ``max_drop = 1 - keep`` relative.

    ``result``: ``metric``, ``max_drop``, ``drop_type``, ``samples``, ``float_value`` / ``quantized_value`` /
    ``value`` (the float model, the plain ``nncf.quantize`` model, NNCF's model), ``drop`` (NNCF's model against
    the float one, relative), ``met``, ``kept_float`` (the ops it reverted), ``reported`` (NNCF's own list),
    ``quantized_layers`` (before and after), ``iterations``, ``seconds`` (the accuracy control's wall time),
    ``quantize_seconds`` (a plain ``nncf.quantize`` for comparison), ``settings`` and ``log`` (NNCF's info lines)."""
    import nncf
    import openvino as ov
    from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters

    from parity.exporters import openvino_int8

    settings = openvino_int8.settings_for(model, spec)
    batch = openvino_int8.static_batch(model)
    calibration_set = nncf.Dataset(openvino_int8.calibration_items(spec, meta, calibration, batch))
    output = meta["output_names"][0]
    items, validation_fn = validation(spec, meta, evals, np.asarray(targets), output, batch)
    validation_set = nncf.Dataset(items, lambda item: item[0])
    arguments = openvino_int8.nncf_arguments(nncf, settings, tuple(kept))
    controlled = {
        ("advanced_quantization_parameters" if key == "advanced_parameters" else key): value
        for key, value in arguments.items()
    }  # the same settings under the accuracy control's name
    subset = len(openvino_int8.calibration_items(spec, meta, calibration, batch))
    max_drop = round(1.0 - keep, 12)
    with nncf_log() as log:
        started = time.perf_counter()
        plain = nncf.quantize(model, calibration_set, subset_size=subset, **arguments)
        quantize_seconds = time.perf_counter() - started
        started = time.perf_counter()
        restored = nncf.quantize_with_accuracy_control(
            model,
            calibration_set,
            validation_set,
            validation_fn,
            max_drop=max_drop,
            drop_type=nncf.DropType.RELATIVE,
            subset_size=subset,
            advanced_accuracy_restorer_parameters=AdvancedAccuracyRestorerParameters(max_num_iterations=max_iterations),
            **controlled,
        )
        seconds = time.perf_counter() - started
    core = ov.Core()
    values = {}
    for name, candidate in (("float", model), ("quantized", plain), ("nncf", restored)):
        compiled = core.compile_model(
            candidate, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
        )
        values[name] = validation_fn(compiled, items)[0]
    before, after = openvino_int8.quantized_layers(plain), openvino_int8.quantized_layers(restored)
    reverted = [name for name in before if name not in set(after)]
    drop = (values["float"] - values["nncf"]) / values["float"] if values["float"] else 0.0
    return restored, {
        "tool": "nncf.quantize_with_accuracy_control",
        "nncf": nncf.__version__,
        "metric": metric,
        "max_drop": max_drop,
        "drop_type": "RELATIVE",
        "samples": len(targets),
        "float_value": values["float"],
        "quantized_value": values["quantized"],
        "value": values["nncf"],
        "drop": drop,
        "met": drop <= max_drop + 1e-12,
        "kept_float": reverted,
        "reported": reported(log),
        "quantized_layers": {"before": len(before), "after": len(after)},
        "iterations": sum(line.startswith("Reverted ") for line in log),
        "max_iterations": max_iterations,
        "seconds": seconds,
        "quantize_seconds": quantize_seconds,
        "settings": {**settings, "kept_float": list(kept)},
        "log": [line.split("\n")[0] for line in log if not line.startswith(("Reverted ", "Elapsed"))][:40],
    }


@contextmanager
def nncf_log():
    """NNCF's info messages collected in a list instead of printed (its logger writes to the stdout it found at
    import); its progress bars kept out of the worker's output."""
    logger = logging.getLogger("nncf")
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    saved = (list(logger.handlers), logger.level, logger.propagate)
    logger.handlers, logger.propagate = [Collect()], False
    logger.setLevel(logging.INFO)
    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            yield lines
    finally:
        logger.handlers, logger.propagate = saved[0], saved[2]
        logger.setLevel(saved[1])


def reported(log: list[str]) -> dict | None:
    """NNCF's closing report: ``{"reverted": [op names], "of": quantized operations}``; None where it reverted
    nothing (it prints no list then)."""
    for line in reversed(log):
        found = _REPORTED.search(line)
        if found:
            names = [part.strip() for part in line.split("\n")[1:] if part.strip()]
            return {"reverted": names, "of": int(found.group(2))}
    return None


def onnx_nodes(names: list[str], onnx_path: Path) -> dict[str, str]:
    """OpenVINO op name -> the ONNX node it comes from (the longest node name it is, or starts with plus ``/``)."""
    import onnx

    nodes = sorted(
        (node.name for node in onnx.load(str(onnx_path), load_external_data=False).graph.node if node.name),
        key=len,
        reverse=True,
    )
    found = {}
    for name in names:
        node = next((node for node in nodes if name == node or name.startswith(node + "/")), None)
        if node is not None:
            found[name] = node
    return found


def openvino_path(path_id: str) -> str:
    """The ``*/openvino-int8`` path quantized from the same float ONNX as ``path_id`` (an ``*/ort-int8*`` path)."""
    return f"{path_id.rsplit('/', 1)[0]}/openvino-int8"


def nncf_side_by_side(
    workspace: str, model: str, path_id: str, golden_dir: str, float_dir: str, float_meta: dict, threads: int
) -> dict:
    """The worker task: ``accuracy_control`` on the float model ``path_id`` is quantized from (``float_dir`` /
    ``float_meta``: an ONNX file or an OpenVINO IR), the spec's gate metric on the golden eval split, the layers
    the spec keeps in float for the matching ``*/openvino-int8`` path ignored; NNCF's model judged by parity's gate
    as well (``gate``). JSON-able; ``threads`` are the threads parity's own judging of NNCF's model uses."""
    import openvino as ov

    from parity.check import accuracy_gate
    from parity.golden import calibration
    from parity.golden import store as golden
    from parity.model import batch_axes, feeds
    from parity.model.workspace import Workspace

    ws = Workspace(workspace)
    spec = ws.load_spec(model)
    verified = golden.load(Path(golden_dir), spec)
    samples, where = calibration.calibration_feeds(spec, verified, ws.root)
    evals = feeds.from_arrays(spec, verified.arrays["eval.npz"])
    labels = verified.arrays["eval.npz"].get("y")
    golden_logits = verified.arrays["reference.npz"]["eval/logits"]
    metric, targets = accuracy_gate.scored_against(golden_logits, labels, spec.gate)
    ov_path = openvino_path(path_id)
    kept = spec.quantization.kept_float(ov_path)
    source = Path(float_dir) / float_meta["file"]
    float_model = ov.Core().read_model(str(source))
    restored, result = accuracy_control(
        float_model, spec, float_meta, samples, evals, targets, keep=spec.gate.keep, kept=kept, metric=metric
    )
    core = ov.Core()
    from parity.runtimes.openvino import compile_config

    compiled = core.compile_model(restored, "CPU", compile_config(threads))
    output = batch_axes.eval_output(spec, batch_axes.recorded(verified.manifest))
    from parity.exporters.openvino_int8 import calibration_items

    logits = np.concatenate(
        [np.asarray(compiled(feed)[compiled.output(output)]) for feed in calibration_items(spec, float_meta, evals, 1)]
    )
    gate = accuracy_gate.judge(logits, golden_logits, labels, spec.gate)
    mapped = onnx_nodes(result["kept_float"], source) if float_meta.get("format") == "onnx" else {}
    return {
        **result,
        "path": ov_path,
        "compared_with": path_id,
        "calibration_data": where,
        "onnx_nodes": [mapped.get(name) for name in result["kept_float"]],
        "keep_float": {ov_path: list(dict.fromkeys([*kept, *result["kept_float"]]))},
        "gate": {key: gate.get(key) for key in ("decision", "value", "golden", "drop", "allowed", "reason")},
    }


def render_nncf(result: dict) -> list[str]:
    """Terminal lines for ``nncf_side_by_side``'s result, beside parity's own int8 diagnosis."""
    if result.get("error"):
        return [f"  NNCF accuracy control: {result['error']}"]
    from parity.check.accuracy_gate import percent as pct

    kept = result.get("kept_float") or []
    lines = [
        (
            f"  NNCF accuracy control ({result['tool']} {result['nncf']}, {result['metric']}, max drop "
            f"{pct(result['max_drop'])} relative) on {result['path']}: float {pct(result['float_value'])}, "
            f"quantized {pct(result['quantized_value'])}, its model {pct(result['value'])} "
            f"({'within' if result['met'] else 'NOT within'} its max drop) in {result['seconds']:.1f} s, "
            f"{result['iterations']} iteration(s)"
        )
    ]
    if kept:
        nodes = result.get("onnx_nodes") or [None] * len(kept)
        shown = [f"{name} (ONNX node {node})" if node and node != name else name for name, node in zip(kept, nodes)]
        lines.append(f"    kept in float ({len(kept)} of {result['quantized_layers']['before']}): {', '.join(shown)}")
    else:
        lines.append("    kept nothing in float: the quantized model is within its max drop")
    gate = result.get("gate") or {}
    if gate.get("decision"):
        lines.append(
            f"    parity's gate on NNCF's model: {gate['decision']}"
            + (f" ({gate['reason']})" if gate.get("reason") else "")
        )
    if kept:
        lines.append(f"    to run it as a path: keep_float={result['keep_float']!r}")
    return lines
