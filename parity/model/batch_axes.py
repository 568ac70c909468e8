"""Which axis of each output and tap follows the batch, or none: read from the model's own run at two batch sizes,
recorded in the golden manifest (``batch_axes``: reference key -> axis or null), and used wherever rows are taken
or batches joined.

A tap or output is batched only where the model makes it so: a position table computed once and broadcast over the
batch (GPT-2's ``wpe``) has no batch axis; it is compared whole and never cut into rows. Golden data without the
field (the zoo, older builds) has every output and tap batched on axis 0, as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


DEFAULT = 0  # the batch axis of every output and tap where the manifest records none


def detect(shapes: dict[str, tuple], other_shapes: dict[str, tuple], batch: int, other_batch: int) -> dict:
    """Key -> the first axis whose size is ``batch`` in ``shapes`` and ``other_batch`` in ``other_shapes`` (the
    same arrays computed at another batch size), or None where no axis follows the batch (a shape that does not
    change with it, or changes otherwise: ``batch * sequence`` rows are compared whole too)."""
    axes = {}
    for key, shape in shapes.items():
        other = other_shapes.get(key)
        if other is None:  # not computed at the other size: as for a model that runs at one size only
            axes[key] = guess({key: shape}, batch)[key]
        elif len(other) != len(shape):
            axes[key] = None
        else:
            axes[key] = next(
                (
                    axis
                    for axis, (size, other_size) in enumerate(zip(shape, other))
                    if size == batch and other_size == other_batch
                ),
                None,
            )
    return axes


def guess(shapes: dict[str, tuple], batch: int) -> dict:
    """Key -> 0 where the first axis has the batch size, else None: for a model that runs at one batch size only
    (an ONNX graph that fixes it), where no second run can tell."""
    return {key: DEFAULT if len(shape) and shape[0] == batch else None for key, shape in shapes.items()}


def recorded(manifest: dict | None) -> dict:
    """The manifest's ``batch_axes`` (empty for golden data that records none: every key then on ``DEFAULT``)."""
    return dict((manifest or {}).get("batch_axes") or {})


def axis_of(axes: dict, key: str) -> int | None:
    """The batch axis of ``key`` (an output name or ``tap/<name>``) in ``axes``; ``DEFAULT`` where unrecorded."""
    return axes.get(key, DEFAULT)


def eval_output(spec, axes: dict) -> str:
    """The output the eval split is checked on (golden ``eval/logits``): the first one with a batch axis, so that
    it has one row per eval sample; the first output where none has one."""
    return next((name for name in spec.outputs if axis_of(axes, name) is not None), spec.outputs[0])


def rows(array: np.ndarray, axis: int | None, start: int, stop: int) -> np.ndarray:
    """Samples ``start:stop`` of ``array`` along its batch ``axis``; an unbatched array whole."""
    if axis is None:
        return array
    return array[(slice(None),) * axis + (slice(start, stop),)]


def join(chunks: list[np.ndarray], axis: int | None, samples: int) -> np.ndarray:
    """Per-batch results joined along their batch ``axis`` and cut to ``samples`` (the fill of the last batch
    dropped); an unbatched result is the first batch's, whole."""
    import numpy as np

    if axis is None:
        return chunks[0]
    return rows(np.concatenate(chunks, axis=axis), axis, 0, samples)
