"""Small helpers the Dask builders share."""

from __future__ import annotations

import dask.array as da
import numpy as np


def meta(ndim: int, dtype) -> np.ndarray:
    """The empty NumPy array Dask uses to know a result's type without computing it."""
    return np.empty((0,) * ndim, dtype)


def empty(shape, dtype) -> da.Array:
    """A lazy result with no elements: one chunk per axis, however large the other axes are."""
    return da.zeros(shape, dtype=dtype, chunks=tuple((n,) for n in shape))
