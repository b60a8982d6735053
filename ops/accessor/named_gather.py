"""GatherNd on a DataArray: the index tuples' components matched to params dims by name, the
result's dims and coordinates built from the indices' leading dims and params' remaining dims.

``ops.gather_nd`` works on positional axes; here the labels of the indices' last dim (or, without
them, params' dims in order after the batch dims) say which params dims the tuples index, and
the operator's positional error messages are reworded in dim names.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from ops import _validate, registry
from ops._limits import LimitExceeded
from ops.accessor import conventions
from ops.accessor.coords import _warn
from ops.accessor.history import with_step
from ops.errors import DimensionError, InvalidArgument, MissingDims


def gather_by_name(params: xr.DataArray, indices, *, batch_dims, negative_index_support, scratch=None) -> xr.DataArray:
    """GatherNd of ``params`` at the index tuples along the last dim of the ``indices`` DataArray;
    attrs: params' plus an ``ops_history`` step."""
    if not isinstance(indices, xr.DataArray):
        raise InvalidArgument("indices must be a DataArray whose last dim holds the index tuples "
                              "(use ops.gather_nd for plain arrays)")
    tuple_dim, lead = indices.dims[-1], indices.dims[:-1]
    b = _validate.integer("batch_dims", batch_dims)
    if not 0 <= b < len(indices.dims):
        raise InvalidArgument(f"batch_dims must be in 0..{len(indices.dims) - 1} (the indices' leading dims), got {b}")
    batch = list(lead[:b])
    for name in batch:
        if name not in params.dims:
            raise MissingDims(f"gather_nd: batch dim {name!r} of indices is not a dim of params {params.dims}")
    if tuple_dim in indices.coords:
        indexed = [str(v) for v in np.asarray(indices[tuple_dim].values)]
        absent = [d for d in indexed if d not in params.dims]
        if absent:
            raise MissingDims(f"gather_nd: params has no dims {absent} (named by indices dim {tuple_dim!r}); its dims are {params.dims}")
        if set(indexed) & set(batch) or len(set(indexed)) != len(indexed):
            raise DimensionError(
                f"gather_nd: the labels of indices dim {tuple_dim!r} must name distinct, non-batch "
                f"params dims {params.dims}; got {indexed}"
            )
    else:
        indexed = [d for d in params.dims if d not in batch][: indices.sizes[tuple_dim]]
    rest = [d for d in params.dims if d not in batch and d not in indexed]
    clash = set(rest) & set(lead)
    if clash:
        raise DimensionError(f"gather_nd: dims {sorted(clash)} are in both the indices' leading dims and the result's params dims")
    work = params.transpose(*batch, *indexed, *rest)
    try:
        data = registry.get("gather_nd").function(work.data, indices.data, batch_dims=batch_dims,
                                                  negative_index_support=negative_index_support, scratch=scratch)
    except LimitExceeded:  # no positions in it
        raise
    except (InvalidArgument, IndexError) as error:  # positional wording -> dim names
        raise type(error)(conventions.gather_in_dim_terms(str(error), work.dims, indices.dims)) from None
    coords = {name: c.variable for name, c in indices.coords.items() if tuple_dim not in c.dims}
    for name, coord in params.coords.items():  # batch dims and the dims taken whole keep theirs
        if set(coord.dims) <= set(rest) | set(batch) and name not in coords:
            coords[name] = coord.variable
    for k, dim in enumerate(indexed):
        if dim in params.indexes and dim not in coords:
            if isinstance(indices.data, np.ndarray):
                picked = np.take(params.indexes[dim].to_numpy(), indices.data[..., k])
                coords[dim] = xr.Variable(lead, picked, params[dim].attrs)
            else:
                _warn(f"gather_nd: coordinate {dim!r} dropped: the indices are lazy, so which labels the "
                      "points pick is not known until they are computed")
    attrs = with_step(params, "gather_nd", batch_dims=b, negative_index_support=negative_index_support,
                      indexed_dims=indexed)
    out = xr.DataArray(data, dims=(*lead, *rest), coords=coords, attrs=attrs)
    out.name = conventions.name_of(params)  # not a Dask key, which xarray takes for a name
    out.encoding.update(conventions.cf_encoding(params))
    return out
