"""What an int8 export is keyed on besides the model and the code: the rows it calibrates on and the quantizer's
settings.

The model's spec (its ``Quantization``: calibration method, layers kept in float) is keyed through its file; here:

- ``calibration``: the sha256 of the very rows the exporter calibrates on (``parity.golden.calibration.identity``,
  read in a worker, where golden arrays are read), so new calibration data makes a new model even where the spec,
  the weights and the golden manifest's name for the data stay the same;
- ``int8_cpu``: for ONNX Runtime's quantizer, the int8 kernel it quantizes for and the setting that follows
  (``parity.platform.cpu_int8``), so a cache shared by an AVX2 and a VNNI machine keeps one model for each.
"""

from __future__ import annotations

from parity.platform import cpu_int8
from parity.platform.errors import TaskFailed

ORT_QUANTIZER = "parity.exporters.onnx_int8:"


def int8_parts(pool, workspace, spec, steps, memo: dict) -> dict | None:
    """The key parts of an export chain ``steps`` that quantizes (None where none of its steps does); ``memo``
    holds each model's calibration identity for the run (read once)."""
    quantizers = [step for step in steps if step.quantizes]
    if not quantizers:
        return None
    if spec.name not in memo:
        try:
            memo[spec.name] = pool.call(
                quantizers[0].group,
                "parity.golden.calibration:identity",
                workspace=str(workspace.root),
                model=spec.name,
                golden_dir=str(workspace.golden_dir(spec.name)),
            )
        except TaskFailed as error:
            if error.kind == "golden":
                raise
            memo[spec.name] = {"unavailable": str(error)}
    parts: dict = {"calibration": memo[spec.name], "quantization": repr(getattr(spec, "quantization", None))}
    if any(step.target.startswith(ORT_QUANTIZER) for step in quantizers):
        cpu = cpu_int8.int8_cpu()
        parts["int8_cpu"] = {"kind": cpu["kind"], "reduce_range": cpu_int8.ort_settings(cpu)["reduce_range"]}
    return parts
