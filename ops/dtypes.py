"""The element types the operators accept.

``bfloat16`` is ml_dtypes' type; ``complex32`` is the structured dtype of two float16 halves,
since NumPy has no native complex32. The rearrangement ops and GatherNd only move elements, so
they are exact for every type here.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ops.errors import InvalidArgument

bfloat16 = np.dtype(ml_dtypes.bfloat16)
complex32 = np.dtype([("real", "<f2"), ("imag", "<f2")])

SUPPORTED = tuple(
    np.dtype(t)
    for t in (
        np.bool_, np.int8, np.int16, np.int32, np.int64,
        np.uint8, np.uint16, np.uint32, np.uint64,
        np.float16, bfloat16, np.float32, np.float64,
        np.complex64, np.complex128, complex32,
    )
)


def name(dtype: np.dtype) -> str:
    """A short readable name (``complex32`` rather than its structured spelling)."""
    return "complex32" if dtype == complex32 else str(dtype)


def check_supported(param: str, dtype) -> np.dtype:
    """Return ``dtype`` as an np.dtype, or raise InvalidArgument naming the supported ones."""
    dtype = np.dtype(dtype)
    # Either byte order is fine; structured dtypes compare by layout, hence the kind check.
    little = dtype.newbyteorder("<")
    if not any(little == t and dtype.kind == t.kind for t in SUPPORTED):
        supported = ", ".join(name(t) for t in SUPPORTED)
        raise InvalidArgument(f"{param} dtype must be one of {supported}; got {dtype}")
    return dtype
