"""Feeds: a model's inputs as ``{input name: array}`` in the spec's order, as golden data stores them and as
runners take them. NumPy only.

A model with one input keeps it under ``x`` in ``inputs.npz`` and ``eval.npz`` (what every golden folder has
always held); a model with several keeps each under ``input/<name>``, apart from ``labels`` and ``y``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from parity.model import batch_axes
from parity.platform.errors import ParityError

if TYPE_CHECKING:
    import numpy as np

SINGLE_KEY = "x"
PREFIX = "input/"


def key(spec, name: str) -> str:
    """The npz key of input ``name``."""
    return SINGLE_KEY if len(spec.model_inputs) == 1 else PREFIX + name


def from_arrays(spec, arrays: dict) -> dict[str, np.ndarray]:
    """The feeds stored in an npz dict (``inputs.npz``, ``eval.npz``), in the spec's order."""
    return {i.name: arrays[key(spec, i.name)] for i in spec.model_inputs}


def to_arrays(spec, feeds: dict) -> dict[str, np.ndarray]:
    """``feeds`` under their npz keys."""
    return {key(spec, name): value for name, value in feeds.items()}


def as_feeds(spec, value) -> dict[str, np.ndarray]:
    """``value`` as feeds: a dict as it is, a bare array as the only input of a one-input model."""
    if isinstance(value, dict):
        return value
    if len(spec.model_inputs) != 1:
        names = ", ".join(i.name for i in spec.model_inputs)
        raise ParityError(f"model {spec.name!r} takes {len(spec.model_inputs)} inputs ({names}): pass a dict of them")
    return {spec.model_inputs[0].name: value}


def first_non_finite(arrays: dict) -> tuple[str, np.ndarray, str] | None:
    """``(name, rows, what)`` of the first floating array (by the dict's order) holding NaN or infinity: the indices
    along its first axis that hold one (0 for a scalar) and ``"NaN"`` or ``"infinity"``; None where all are
    finite."""
    import numpy as np

    for name, value in arrays.items():
        value = np.asarray(value)
        if value.dtype.kind not in "fc" or np.all(np.isfinite(value)):
            continue
        bad = ~np.isfinite(value.reshape(len(value), -1) if value.ndim else value.reshape(1, -1))
        return name, np.flatnonzero(bad.any(axis=1)), "NaN" if np.isnan(value).any() else "infinity"
    return None


def samples(spec, feeds: dict) -> int:
    """The number of samples along the batch axis (of the first batched input)."""
    for i in spec.model_inputs:
        if i.batched:
            return len(feeds[i.name])
    return 1


def rows(spec, feeds: dict, start: int, stop: int) -> dict[str, np.ndarray]:
    """Samples ``start:stop`` of every batched input (an unbatched input as it is)."""
    return {i.name: feeds[i.name][start:stop] if i.batched else feeds[i.name] for i in spec.model_inputs}


def padded(spec, feeds: dict, batch_size: int) -> dict[str, np.ndarray]:
    """``feeds`` with fewer than ``batch_size`` samples filled up to it by repeating the last sample."""
    import numpy as np

    out = {}
    for i in spec.model_inputs:
        value = feeds[i.name]
        if i.batched and len(value) < batch_size:
            value = np.concatenate([value, np.repeat(value[-1:], batch_size - len(value), axis=0)])
        out[i.name] = value
    return out


def run_batched(runner, feeds, batch_size: int, axes: dict | None = None) -> dict[str, np.ndarray]:
    """Run a static-batch runner over any number of samples; the last batch is filled up by repeating its last
    sample (a valid input for every domain: an attention mask, token ids) and the fill is dropped. ``axes``: each
    output's batch axis (``parity.model.batch_axes``; default 0): an output without one is the first batch's."""
    spec = runner.spec
    feeds = as_feeds(spec, feeds)
    if not any(i.batched for i in spec.model_inputs):  # one whole input set, outputs as they come
        return runner.run(feeds)
    n = samples(spec, feeds)
    chunks = [
        runner.run(padded(spec, rows(spec, feeds, start, start + batch_size), batch_size))
        for start in range(0, n, batch_size)
    ]
    return {
        name: batch_axes.join([c[name] for c in chunks], batch_axes.axis_of(axes or {}, name), n) for name in chunks[0]
    }


def call_torch(module, tensors: dict):
    """A torch module on its inputs: the only one positionally, several as keywords by input name."""
    if len(tensors) == 1:
        return module(*tensors.values())
    return module(**tensors)


def call_keras(model, inputs: dict):
    """A Keras model on its inputs (inference mode): the only one alone, several as a dict by name where the
    Keras inputs have the spec's names, else as a list in the spec's order."""
    if len(inputs) == 1:
        return model(next(iter(inputs.values())), training=False)
    if {t.name for t in model.inputs} == set(inputs):
        return model(inputs, training=False)
    return model(list(inputs.values()), training=False)


def generate(spec, batch_size: int, default, rng: np.random.Generator, axes: dict | None = None) -> dict:
    """Seeded golden data for every input: its own ``values`` domain, else ``default`` (a ``Values``)."""
    from parity.model.spec import Values

    feeds = {}
    for i in spec.model_inputs:
        values = i.values or default or Values()
        shape = spec.input_shape(i.name, batch_size, axes)
        feeds[i.name] = draw(values, shape, i.dtype, rng)
    return feeds


def draw(values, shape: tuple, dtype: str, rng: np.random.Generator) -> np.ndarray:
    """One array of ``shape`` from the domain ``values``, in ``dtype`` (bfloat16 as float32)."""
    import numpy as np

    from parity.model.values import LOW_PRECISION, TEXT, ml_dtype

    # bfloat16 drawn as float32; float8, int4 ... rounded to their own dtype (golden data then keeps their bits)
    store = "float32" if dtype == "bfloat16" else ml_dtype(dtype) if dtype in LOW_PRECISION else dtype
    if dtype == TEXT:  # an ONNX string input: short lowercase words, drawn like any other golden data
        letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
        lengths = rng.integers(1, 9, size=shape)
        return (
            np.vectorize(lambda n: "".join(rng.choice(letters, n)), otypes=[str])(lengths).astype(str)
            if lengths.size
            else np.zeros(shape, dtype="<U1")
        )
    if values.kind == "fixed":
        return np.full(shape, values.value, dtype=store)
    if values.kind == "mask":
        return _mask(shape, rng).astype(store)
    if values.kind == "integers":
        if dtype.startswith(("float", "bfloat")):
            raise ParityError(f"integer values for a {dtype} input: declare Values('uniform', ...) or an integer dtype")
        return rng.integers(int(values.low), int(values.high), size=shape).astype(store)
    if not dtype.startswith(("float", "bfloat")):
        raise ParityError(
            f"{values.kind} values for a {dtype} input: declare Values('integers', low, high) or Values('mask')"
        )
    if values.kind == "uniform":
        return rng.uniform(values.low, values.high, size=shape).astype(store)
    return rng.normal(values.mean, values.std, size=shape).astype(store)


def _mask(shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """Ones with a padded tail of zeros along the last axis; each row keeps at least one 1, the first row all."""
    import numpy as np

    if not shape:
        return np.ones((), dtype=np.int64)
    length = shape[-1]
    rows_ = int(np.prod(shape[:-1], dtype=np.int64))
    kept = rng.integers(1, length + 1, size=rows_) if length else np.zeros(rows_, dtype=np.int64)
    if rows_:
        kept[0] = length
    mask = (np.arange(length)[None, :] < kept[:, None]).astype(np.int64)
    return mask.reshape(shape)
