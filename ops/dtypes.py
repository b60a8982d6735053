"""The element types the operators accept.

``bfloat16`` is ml_dtypes' type; ``complex32`` is the structured dtype of two float16 halves,
since NumPy has no native complex32. The rearrangement ops and GatherNd only move elements, so
they are exact for every type here.

ml_dtypes is imported only when bfloat16 is asked for (``bfloat16``, ``SUPPORTED``,
``named("bfloat16")``): its release 0.7 takes most of a second to import (it registers the
loops of its many types one by one), which every command-line run, service process and
Dask worker would otherwise pay whatever its data. No bfloat16 array or dtype exists before
ml_dtypes is imported, so ``is_bfloat16`` answers without importing it.
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from ops.errors import InvalidArgument

complex32 = np.dtype([("real", "<f2"), ("imag", "<f2")])

#: The supported types by name, in the order messages list them.
SUPPORTED_NAMES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128", "complex32",
)
# Every supported type but bfloat16, as NumPy knows them without ml_dtypes.
_WITHOUT_BFLOAT16 = {n: complex32 if n == "complex32" else np.dtype(n) for n in SUPPORTED_NAMES if n != "bfloat16"}


@functools.cache
def _bfloat16() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def __getattr__(attribute: str):
    # ``bfloat16`` and ``SUPPORTED`` import ml_dtypes on first use (see the module docstring).
    if attribute == "bfloat16":
        value = _bfloat16()
    elif attribute == "SUPPORTED":
        value = tuple(_bfloat16() if n == "bfloat16" else _WITHOUT_BFLOAT16[n] for n in SUPPORTED_NAMES)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
    globals()[attribute] = value
    return value


def is_bfloat16(dtype) -> bool:
    """Whether ``dtype`` is bfloat16 in either byte order (without importing ml_dtypes)."""
    if "ml_dtypes" not in sys.modules:
        return False
    dtype = np.dtype(dtype)
    return dtype.names is None and dtype.newbyteorder("<") == _bfloat16()


def named(text: str) -> np.dtype:
    """``np.dtype(text)``, where ``bfloat16`` is ml_dtypes' type and ``complex32`` this
    module's (as NumPy itself reads ``bfloat16`` once ml_dtypes is imported, and no other
    spelling of it)."""
    if text == "complex32":
        return complex32
    if text == "bfloat16":
        return _bfloat16()
    return np.dtype(text)


def name(dtype: np.dtype) -> str:
    """A short readable name (``complex32`` rather than its structured spelling)."""
    return "complex32" if dtype == complex32 else str(dtype)


def check_supported(param: str, dtype) -> np.dtype:
    """Return ``dtype`` as an np.dtype, or raise InvalidArgument naming the supported ones."""
    dtype = named(dtype) if isinstance(dtype, str) else np.dtype(dtype)
    # Either byte order is fine; structured dtypes compare by layout, hence the kind check.
    little = dtype.newbyteorder("<")
    known = _WITHOUT_BFLOAT16.values()
    if not (any(little == t and dtype.kind == t.kind for t in known) or is_bfloat16(dtype)):
        raise InvalidArgument(f"{param} dtype must be one of {', '.join(SUPPORTED_NAMES)}; got {dtype}")
    return dtype
