"""``ops.accessor.named_gather``: GatherNd on DataArrays, coordinates kept or dropped with a warning."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import ops


@pytest.mark.smoke
def test_batch_dims_keep_the_params_batch_coordinate():
    params = xr.DataArray(np.arange(24.0).reshape(2, 3, 4), dims=("time", "y", "x"),
                          coords={"time": [10, 20], "y": [1.0, 2.0, 3.0]})
    indices = xr.DataArray(np.array([[[0], [1]], [[1], [2]]]), dims=("time", "point", "idx"))
    out = params.ops.gather_nd(indices, batch_dims=1)
    assert out.dims == ("time", "point", "x")
    assert list(out["time"].values) == [10, 20]
    np.testing.assert_array_equal(out["y"].values, [[1.0, 2.0], [2.0, 3.0]])


def test_lazy_indices_warn_for_the_coordinate_they_cannot_pick():
    import dask.array as da

    params = xr.DataArray(np.arange(24.0).reshape(2, 3, 4), dims=("time", "y", "x"),
                          coords={"time": [10, 20], "y": [1.0, 2.0, 3.0]})
    lazy = xr.DataArray(da.from_array(np.array([[0, 1], [1, 2]]), chunks=1), dims=("point", "idx"))
    with pytest.warns(ops.CoordinateDropped, match="coordinate 'time' dropped: the indices are lazy"):
        out = params.ops.gather_nd(lazy)
    assert "time" not in out.coords and "y" not in out.coords
