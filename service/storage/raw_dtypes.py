"""The dtypes Zarr v3 has no name for, bfloat16 and complex32, stored as their raw bits.

They are stored as ``uint16`` and ``uint32`` with the attribute ``ops_dtype`` naming the real
type; ``to_stored`` and ``from_stored`` convert a DataArray each way, ``stored_block`` one
NumPy block of an upload.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from ops import dtypes

DTYPE_ATTR = "ops_dtype"
# Stored in place of the dtypes Zarr v3 has no name for.
_RAW_BITS = {"bfloat16": np.dtype("<u2"), "complex32": np.dtype("<u4")}


def stored_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype Zarr stores for ``dtype``: little-endian, raw bits for bfloat16/complex32."""
    name = dtypes.name(np.dtype(dtype))
    return _RAW_BITS[name] if name in _RAW_BITS else np.dtype(dtype).newbyteorder("<")


def to_stored(arr: xr.DataArray) -> xr.DataArray:
    """The DataArray as Zarr stores it: bfloat16/complex32 as raw bits with ``ops_dtype``."""
    name = dtypes.name(np.dtype(arr.dtype))
    if name in _RAW_BITS:
        return arr.copy(data=_view(arr.data, _RAW_BITS[name])).assign_attrs({DTYPE_ATTR: name})
    return arr


def _view(data, dtype: np.dtype):
    """``data.view(dtype)`` for a same-size dtype; Dask cannot view a 0-d array, so via one axis."""
    return data.reshape(1).view(dtype).reshape(()) if data.ndim == 0 else data.view(dtype)


def from_stored(arr: xr.DataArray) -> xr.DataArray:
    """The inverse of ``to_stored``: raw bits viewed as the dtype ``ops_dtype`` names."""
    name = arr.attrs.get(DTYPE_ATTR)
    if name in _RAW_BITS:
        attrs = {k: v for k, v in arr.attrs.items() if k != DTYPE_ATTR}
        return xr.DataArray(_view(arr.data, dtypes.named(name)), dims=arr.dims, coords=arr.coords, attrs=attrs,
                            name=arr.name)
    return arr


def stored_block(block: np.ndarray, stored: np.dtype) -> np.ndarray:
    """A block as the stored dtype (raw bits for bfloat16/complex32), little-endian."""
    if block.dtype.byteorder == ">":
        block = block.byteswap().view(block.dtype.newbyteorder("<"))
    return block.view(stored) if block.dtype != stored else block
