"""Golden values that are not floats: how text and other kinds are held in golden data (NumPy only).

Golden data never holds object arrays (they need pickles): a string tensor is a fixed-width unicode array
(``<U``), which ``np.save`` writes and ``np.load(allow_pickle=False)`` reads; numbers are held in float64.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from parity.interop.onnx_test_data import unicode

if TYPE_CHECKING:
    import numpy as np

TEXT = "str"  # the dtype name an ONNX string tensor has in a spec


def is_text(value) -> bool:
    """Whether ``value`` is an array of strings (unicode, bytes or Python objects holding them)."""
    import numpy as np

    return np.asarray(value).dtype.kind in "USO"


def text(value) -> np.ndarray:
    """``value`` as a unicode array (bytes decoded as UTF-8), its shape kept."""
    import numpy as np

    return unicode(np.asarray(value))


def golden(value) -> np.ndarray:
    """A computed output as golden data holds it: text as unicode, every number as float64."""
    import numpy as np

    return text(value) if is_text(value) else np.asarray(value, dtype=np.float64)


def stored_dtype(dtype: str) -> str:
    """The dtype golden data holds an input of spec dtype ``dtype`` in ("unicode" for text: any width)."""
    return "uint8" if dtype in LOW_PRECISION else {"bfloat16": "float32", TEXT: "unicode"}.get(dtype, dtype)


def runtime_feed(value: np.ndarray) -> np.ndarray:
    """A feed as ONNX runtimes take it: text as an object array of Python strings, others as they are."""
    return value.astype(object) if value.dtype.kind == "U" else value


# ONNX element types NumPy holds only through ml_dtypes, by ml_dtypes' name and ONNX's enum. Golden data keeps
# their raw bits (uint8, one element a byte: int4, uint4 and float4 unpacked) and the spec their name, so nothing
# is rounded, no NaN loses its sign and no pickle is needed. bfloat16 is held as float32, which holds it exactly.
LOW_PRECISION = {
    "float8_e4m3fn": 17,
    "float8_e4m3fnuz": 18,
    "float8_e5m2": 19,
    "float8_e5m2fnuz": 20,
    "uint4": 21,
    "int4": 22,
    "float4_e2m1fn": 23,
    "float8_e8m0fnu": 24,
}
ONNX_ELEMENT_TYPES = {"bfloat16": 16, **LOW_PRECISION}
PACKED = frozenset({"uint4", "int4", "float4_e2m1fn"})  # two to a byte in ONNX's (and ONNX Runtime's) buffers


def ml_dtype(name: str) -> np.dtype:
    """The NumPy dtype of ``name`` (``bfloat16``, a float8, int4 ...), registered by ``ml_dtypes``."""
    import ml_dtypes  # noqa: F401 - registers the names with NumPy
    import numpy as np

    return np.dtype(name)


def low_precision_name(value) -> str | None:
    """The ``ONNX_ELEMENT_TYPES`` name of an array's dtype, or None for a dtype NumPy has itself."""
    import numpy as np

    name = np.asarray(value).dtype.name
    return name if name in ONNX_ELEMENT_TYPES else None


def to_bits(value) -> np.ndarray:
    """An ml_dtypes array's raw bits, shape kept: uint16 for bfloat16, uint8 for the others (a 4-bit value in the
    low nibble)."""
    import numpy as np

    array = np.ascontiguousarray(value)
    bits: np.ndarray = array.view(np.uint16 if array.dtype.itemsize == 2 else np.uint8)
    return bits & np.uint8(0x0F) if array.dtype.name in PACKED else bits


def from_bits(bits, dtype: str) -> np.ndarray:
    """``to_bits`` reversed: the array of ``dtype`` whose raw bits ``bits`` are."""
    import numpy as np

    target = ml_dtype(dtype)
    bits = np.ascontiguousarray(bits)
    if bits.dtype.kind != "u" or bits.dtype.itemsize != target.itemsize:
        raise ValueError(f"{bits.dtype} cannot hold the bits of {dtype}")
    return bits.view(target)


def typed_inputs(spec, x: dict) -> dict:
    """The model's inputs ``x`` (golden data's arrays) each in its declared dtype: a float8, int4 ... input, which
    golden data holds as raw bits, as an ml_dtypes array; the others as they are."""
    return {
        i.name: as_low_precision(x[i.name], i.dtype) if i.dtype in LOW_PRECISION else x[i.name]
        for i in spec.model_inputs
    }


def as_low_precision(value, dtype: str) -> np.ndarray:
    """``value`` as an array of ``dtype`` (a ``LOW_PRECISION`` name): its raw bits as golden data keeps them
    (uint8), an array of that dtype as it is, numbers converted (a float8 value widened to float32 comes back
    exactly)."""
    import numpy as np

    array = np.asarray(value)
    if array.dtype.name == dtype:
        return array
    if array.dtype == np.uint8 and dtype in LOW_PRECISION:
        return from_bits(array, dtype)
    return array.astype(ml_dtype(dtype))


def pack4(value) -> np.ndarray:
    """A 4-bit array as ONNX lays it out: two elements a byte, the first in the low nibble, flattened."""
    import numpy as np

    nibbles = to_bits(value).ravel()
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    return (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)


def unpack4(packed, dtype: str, shape) -> np.ndarray:
    """``pack4`` reversed: ``shape``'s elements of ``dtype`` from their packed bytes."""
    import numpy as np

    packed = np.asarray(packed, dtype=np.uint8).ravel()
    nibbles = np.stack([packed & np.uint8(0x0F), packed >> 4], axis=-1).ravel()
    count = int(np.prod(shape, dtype=np.int64))
    return from_bits(nibbles[:count], dtype).reshape(tuple(shape))


def storable(value) -> np.ndarray:
    """An input array as ``.npz`` files hold it without pickles: a ``LOW_PRECISION`` one as its raw bits (uint8),
    bfloat16 as float32 (exactly), others as they are."""
    import numpy as np

    name = low_precision_name(value)
    if name is None:
        return value
    return to_bits(value) if name in LOW_PRECISION else np.asarray(value, dtype=np.float32)


def dtype_kind(dtype: str) -> str:
    """NumPy's kind letter of a spec dtype name, without importing ml_dtypes (``int4`` is ``i``, ``uint4`` ``u``,
    bfloat16, float8 and float4 ``f``)."""
    import numpy as np

    if dtype in ONNX_ELEMENT_TYPES:
        return {"int4": "i", "uint4": "u"}.get(dtype, "f")
    return np.dtype(dtype).kind
