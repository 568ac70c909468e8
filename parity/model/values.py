"""Golden values that are not floats: how text and other kinds are held in golden data (NumPy only).

Golden data never holds object arrays (they need pickles): a string tensor is a fixed-width unicode array
(``<U``), which ``np.save`` writes and ``np.load(allow_pickle=False)`` reads; numbers are held in float64.
"""

from __future__ import annotations

import numpy as np

TEXT = "str"  # the dtype name an ONNX string tensor has in a spec


def is_text(value) -> bool:
    """Whether ``value`` is an array of strings (unicode, bytes or Python objects holding them)."""
    return np.asarray(value).dtype.kind in "USO"


def text(value) -> np.ndarray:
    """``value`` as a unicode array (bytes decoded as UTF-8), its shape kept."""
    array = np.asarray(value)
    if array.dtype.kind == "U":
        return array
    items = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.ravel().tolist()]
    return np.array(items, dtype=str).reshape(array.shape) if items else np.zeros(array.shape, dtype="<U1")


def golden(value) -> np.ndarray:
    """A computed output as golden data holds it: text as unicode, every number as float64."""
    return text(value) if is_text(value) else np.asarray(value, dtype=np.float64)


def stored_dtype(dtype: str) -> str:
    """The dtype golden data holds an input of spec dtype ``dtype`` in ("unicode" for text: any width)."""
    return {"bfloat16": "float32", TEXT: "unicode"}.get(dtype, dtype)


def runtime_feed(value: np.ndarray) -> np.ndarray:
    """A feed as ONNX runtimes take it: text as an object array of Python strings, others as they are."""
    return value.astype(object) if value.dtype.kind == "U" else value
