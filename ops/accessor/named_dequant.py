"""AscendDequant on a DataArray: the column dim and the scale matched by dim name, any number
of leading dims flattened into rows (lazily, by reshape) and restored afterwards.

``ops.ascend_dequant`` works on ``[m, n]`` (or ``[n]``); the kernel treats rows independently,
so ``(batch, token, channel)`` is ``[batch * token, channel]`` and back, with every coordinate
kept (sizes do not change, except the column dim under ``align_output``).
"""

from __future__ import annotations

import math

import numpy as np
import xarray as xr

from ops.accessor import conventions
from ops.accessor import coords as coords_module
from ops.dims import find_dims
from ops.errors import DimensionError, InvalidArgument, MissingDims, NotApplicable


def _check_dtype(src: xr.DataArray, policy) -> None:
    allowed = ("int32",) if policy is None else ("int32", "float32")
    if src.dtype.name not in allowed:
        rule = "int32 without a policy" if policy is None else f"int32 or float32 with policy={policy!r}"
        raise NotApplicable(f"ascend_dequant: src {src.name!r} must be {rule}, got dtype {src.dtype}"
                            if src.name is not None else
                            f"ascend_dequant: src dtype must be {rule}, got {src.dtype}")


def _layout(src: xr.DataArray, scale, policy):
    """(column dim, scale dims shared with src, the scale's own group dim or None, k_dim)."""
    dims = src.dims
    if not (isinstance(scale, xr.DataArray) and scale.ndim):
        # A number or a plain array: the columns are the channel dim, found by its name as
        # every operator finds it, else the last dim.
        return find_dims(dims, "ascend_dequant", "", "C").get("C", dims[-1]), [], None, 1
    shared = [d for d in scale.dims if d in dims]
    own = [d for d in scale.dims if d not in dims]
    if policy is None:
        if scale.ndim != 1 or not shared:
            raise MissingDims(
                f"ascend_dequant: a vector deq_scale must have one dim, the column dim of src {dims}; "
                f"got dims {scale.dims}"
            )
        return shared[0], shared, None, 1
    if policy == "per_token":
        if own or len(shared) != len(dims) - 1:
            raise MissingDims(
                f"ascend_dequant: a per_token deq_scale has every dim of src {dims} but the column dim; "
                f"got dims {scale.dims}"
            )
        return next(d for d in dims if d not in shared), shared, None, 1
    if len(own) != 1 or len(shared) != len(dims) - 1:
        raise MissingDims(
            f"ascend_dequant: a per_group deq_scale has one group dim of its own and every dim of src {dims} "
            f"but the grouped one; got dims {scale.dims}"
        )
    grouped = next(d for d in dims if d not in shared)
    if grouped == dims[-1]:
        return grouped, shared, own[0], 1
    if len(dims) != 2:
        raise DimensionError(
            f"ascend_dequant: per_group over the leading dim {grouped!r} needs a 2-D src; got dims {dims}. "
            f"Group along the last dim, or stack the other leading dims first: "
            f"src.stack(rows=[...]).ops.ascend_dequant(...)"
        )
    return dims[-1], shared, own[0], 0


def _aligned(scale: xr.DataArray, src: xr.DataArray, shared) -> xr.DataArray:
    """The scale reordered to src's labels along each shared dim where both are labelled."""
    for dim in shared:
        if dim in scale.indexes and dim in src.indexes:
            try:
                scale = scale.sel({dim: src.indexes[dim]})
            except KeyError as error:
                raise InvalidArgument(f"ascend_dequant: deq_scale has no value for {dim}={error}") from None
        elif scale.sizes[dim] != src.sizes[dim]:
            raise InvalidArgument(
                f"ascend_dequant: deq_scale dim {dim!r} has {scale.sizes[dim]} entries, src dim {dim!r} has "
                f"{src.sizes[dim]}"
            )
    return scale


def dequant_by_name(src: xr.DataArray, deq_scale, *, function, dst_dtype, calc_count, mode, policy,
                    group_size, align_output) -> xr.DataArray:
    """AscendDequant of ``src`` (any rank >= 1) with the scale matched by dim name; attrs empty."""
    if src.ndim == 0:
        raise DimensionError("ascend_dequant: src must have at least one dim (the column dim), got a 0-d DataArray")
    _check_dtype(src, policy)
    cols, shared, group, k_dim = _layout(src, deq_scale, policy)
    rows = [d for d in src.dims if d != cols]
    work = src.transpose(*rows, cols)
    m, n = math.prod(work.shape[:-1]), work.shape[-1]
    scale = deq_scale
    if isinstance(scale, xr.DataArray):
        if scale.ndim:
            scale = _aligned(scale, src, shared)
            if policy == "per_token":
                scale = scale.transpose(*rows).data.reshape(m)
            elif policy == "per_group":
                order = (*rows, group) if k_dim == 1 else (group, cols)
                scale = scale.transpose(*order).data
                scale = scale.reshape(m, scale.shape[-1]) if k_dim == 1 else scale
            else:
                scale = scale.data
        else:
            scale = scale.data
    if policy is None and np.ndim(scale) == 1 and np.shape(scale)[0] != n:
        # The device reads as many entries as there are columns; by name, a mismatch is a mistake.
        raise InvalidArgument(
            f"ascend_dequant: deq_scale has {np.shape(scale)[0]} entries, the column dim {cols!r} of src has {n}"
        )
    data = work.data if len(rows) <= 1 else work.data.reshape(m, n)  # rows are independent: flatten
    out = function(data, scale, dst_dtype=dst_dtype, calc_count=calc_count, mode=mode, policy=policy,
                   group_size=group_size, k_dim=k_dim if policy == "per_group" else 1, align_output=align_output)
    n_out = out.shape[-1]
    if len(rows) > 1:
        out = out.reshape(*work.shape[:-1], n_out)
    padded = n_out != n
    coords = {name: c.variable for name, c in src.coords.items() if not (padded and cols in c.dims)}
    result = xr.DataArray(out, dims=work.dims, coords=coords)
    result.name = conventions.name_of(src)  # not a Dask key, which xarray takes for a name
    packing = [k for k in ("scale_factor", "add_offset", "_FillValue", "missing_value") if k in src.encoding]
    if packing:  # the result holds new values, in dst_dtype: the src's packing would corrupt them
        coords_module._warn(f"ascend_dequant: the packing of src ({', '.join(packing)}) is not kept: the result "
                            f"holds new values, stored as {np.dtype(result.dtype)}")
    return result.transpose(*src.dims)

