"""The samples a quantizer calibrates on: never the eval split the accuracy gate measures on.

A quantizer picks each tensor's int8 range from the values it sees; calibrating on the samples the gate then
scores would let the ranges fit exactly those samples and flatter the verdict. So parity calibrates on:

- the zoo: the digits' training split (the same seeded split the weights were trained on, rebuilt from the
  dataset the golden manifest names);
- a user model whose eval set was given apart from its inputs (``eval_x`` in the inputs ``.npz``): the inputs
  (every sample of the file, not only the golden's one batch);
- a user model whose inputs parity generated from a declared distribution: fresh samples of that distribution
  drawn with another seed;
- anything else (the eval set *is* the inputs): no calibration data, said as the reason.

Calibration rows that hold NaN or infinity are refused with the input and row named, before any quantizer sees them.
``identity`` is what an int8 export is keyed on: the sha256 of the very rows it calibrates on (the export cache makes
a new model when only the calibration data changed).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from parity.model import feeds
from parity.model.digits import DATASET, digits_split
from parity.model.identity import numpy_arrays, weights_digest
from parity.platform.errors import ExportError, Unavailable

LIMIT = 256  # calibration samples at most: ranges settle well before, and each costs a forward pass
SEED_OFFSET = 1_000_003  # generated calibration samples: the inputs' seed plus this, so never the same draw


def calibration_feeds(
    spec, verified, root: Path | None = None, limit: int = LIMIT
) -> tuple[dict[str, np.ndarray], str]:
    """``(feeds, where)``: up to ``limit`` calibration samples for ``spec`` (canonical layout, float32 for float
    inputs) and a line saying where they come from; ``root``: the workspace a user's inputs file is relative to.
    Raises ``Unavailable`` where only the eval split exists, ``ExportError`` where a row is not finite."""
    found, where = _calibration_feeds(spec, verified, root, limit)
    check_finite(found, where)
    return found, where


def check_finite(found: dict, where: str) -> None:
    """An ``ExportError`` naming the first calibration input and sample that holds NaN or infinity."""
    bad = feeds.first_non_finite(found)
    if bad is not None:
        name, rows, what = bad
        raise ExportError(
            f"calibration input {name!r} ({where}) holds {what} in {len(rows)} sample(s), the first sample "
            f"{int(rows[0])}: int8 ranges cannot be calibrated on it; give finite calibration samples"
        )


def digest(found: dict) -> str:
    """sha256 over every calibration input's name, dtype, shape and bytes, in name order."""
    return weights_digest(numpy_arrays(found.items()))


def identity(workspace: str, model: str, golden_dir: str) -> dict:
    """What an int8 export of ``model`` is keyed on, as a worker task: ``{"sha256", "samples", "where"}`` of the
    rows ``calibration_feeds`` gives it, or ``{"unavailable": reason}`` where it has none (or none that is
    finite): the export then fails with that reason, and is made again once the data changes."""
    from parity.golden import store as golden
    from parity.model.workspace import Workspace

    ws = Workspace(workspace)
    spec = ws.load_spec(model)
    try:
        found, where = calibration_feeds(spec, golden.load(Path(golden_dir), spec), ws.root)
    except (Unavailable, ExportError) as error:
        return {"unavailable": str(error)}
    return {"sha256": digest(found), "samples": feeds.samples(spec, found), "where": where}


def _calibration_feeds(spec, verified, root: Path | None, limit: int) -> tuple[dict[str, np.ndarray], str]:
    data = verified.manifest.get("data") or {}
    if data.get("dataset") == DATASET:
        split = digits_split(spec.model_inputs[0].shape)
        x = split.train_x[:limit].astype(np.float32)
        return {spec.model_inputs[0].name: x}, f"the digits' training split ({len(x)} of {len(split.train_x)} samples)"
    evaluated = feeds.from_arrays(spec, verified.arrays["eval.npz"])
    declared = getattr(spec, "inputs", None)
    if declared is not None and declared.file and root is not None:  # every input sample of the file, not one batch
        from parity.golden.user import _file_feeds, _stored
        from parity.model.user import UserModelError
        from parity.platform.safefs import read_npz

        given, _ = _file_feeds(spec, declared, read_npz(Path(root) / declared.file, UserModelError, ".npz"))
        given = {name: _stored(spec, name, value) for name, value in given.items()}  # as the golden stores them
        if not _overlaps(spec, given, evaluated):
            rows = min(limit, feeds.samples(spec, given))
            return (
                feeds.rows(spec, given, 0, rows),
                (
                    f"the inputs of {declared.file} ({rows} of {feeds.samples(spec, given)} samples, apart from its "
                    "eval set)"
                ),
            )
    given = feeds.from_arrays(spec, verified.arrays["inputs.npz"])
    if not _overlaps(spec, given, evaluated):
        rows = min(limit, feeds.samples(spec, given))
        return feeds.rows(spec, given, 0, rows), f"the golden inputs ({rows} samples, apart from the eval set)"
    if declared is not None and not (declared.file or declared.test_data or declared.polygraphy_inputs):
        rng = np.random.default_rng(declared.seed + SEED_OFFSET)
        drawn = feeds.generate(spec, min(limit, max(spec.batch_size, 64)), declared.values(), rng)
        return drawn, (
            f"{feeds.samples(spec, drawn)} fresh samples of the inputs' declared distribution "
            f"(seed {declared.seed + SEED_OFFSET})"
        )
    raise Unavailable(
        f"model {spec.name!r} has no calibration data apart from the eval set the accuracy gate "
        "measures on: give the eval set apart from the inputs (eval_x and eval_labels in the inputs "
        ".npz), and the inputs calibrate"
    )


def _overlaps(spec, given: dict, evaluated: dict) -> bool:
    """Whether any input sample of ``given`` is also a sample of ``evaluated`` (compared row by row, bitwise)."""
    first = spec.model_inputs[0].name
    seen = {np.ascontiguousarray(row).tobytes() for row in np.asarray(evaluated[first])}
    return any(np.ascontiguousarray(row).tobytes() in seen for row in np.asarray(given[first]))
