"""The diagnosis of a quantized path that did not pass its accuracy gate: which layers cost the accuracy, and the
fewest to keep in float.

An int8 path is not diagnosed tap by tap against tolerances (every int8 tap is off by far more than float
rounding): its quantized layers are ranked against the float model it was quantized from
(``parity.diagnose.precision.int8_layers``, ONNX Runtime's QDQ models), and where NNCF installs its accuracy control
runs on the same float model, reported side by side (``parity.diagnose.precision.int8_nncf``).
"""

from __future__ import annotations

from parity.platform.errors import one_line
from parity.run import paths

ORT_STEPS = ("parity.exporters.onnx_int8:export_static", "parity.exporters.onnx_int8:export_dynamic")


def diagnose(run, pool, spec, manifest, path) -> dict:
    """``path``'s int8 diagnosis as a result's ``diagnosis``: ``{"model", "path", "int8": ..., "nncf": ...}``, or
    ``{"model", "path", "error"}`` where there is nothing to rank."""
    found = {"model": spec.name, "path": path.id}
    if path.exports[-1].target not in ORT_STEPS:
        onnx_id = f"{paths.onnx_prefix(path.source)}/ort-int8"
        return {
            **found,
            "error": (
                f"layers of a quantized model are ranked on ONNX Runtime's QDQ models: run "
                f"--path '{onnx_id}' on the same model to name the layers that cost the accuracy"
            ),
        }
    parent = run._export(pool, spec, manifest, path, len(path.exports) - 2)
    if "error" in parent:
        return {**found, "error": f"the float model it was quantized from did not export: {parent['error']}"}
    common = {
        "workspace": str(run.workspace.root),
        "model": spec.name,
        "path_id": path.id,
        "golden_dir": str(run.workspace.golden_dir(spec.name)),
        "float_dir": parent["dir"],
        "float_meta": parent["meta"],
        "threads": run.options.threads,
    }
    found["int8"] = pool.call("onnx", "parity.diagnose.precision.int8_layers:diagnose_int8", **common)
    from parity.diagnose.precision.int8_nncf import openvino_path

    nncf = paths.unavailable_reason(paths.by_id(openvino_path(path.id)))
    if nncf is None:
        try:
            found["nncf"] = pool.call("openvino", "parity.diagnose.precision.int8_nncf:nncf_side_by_side", **common)
        except Exception as error:  # noqa: BLE001 - the side-by-side is a comparison; parity's own ranking stands
            found["nncf"] = {"error": one_line(f"{type(error).__name__}: {error}", 300)}
    else:
        found["nncf"] = {"error": f"NNCF's accuracy control not run: {nncf}"}
    return found


def render(d: dict) -> list[str]:
    """Terminal lines for ``diagnose``'s dict (after its header)."""
    from parity.diagnose.precision.int8_layers import render_int8

    lines = render_int8(d["int8"])
    nncf = d.get("nncf") or {}
    if nncf.get("error"):
        lines.append(f"  NNCF accuracy control: {nncf['error']}")
    elif nncf:
        from parity.diagnose.precision.int8_nncf import render_nncf

        lines += render_nncf(nncf)
    return lines
