"""rioxarray and CF metadata through the accessor: the GeoTransform in ``spatial_ref`` follows the
new grid (rioxarray's own resolution, transform and reproject are the judges), CF attributes on
coordinates stay, and ops itself never imports rioxarray."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import ops  # noqa: F401  (registers .ops)

rioxarray = pytest.importorskip("rioxarray")
from affine import Affine  # noqa: E402  (a rioxarray dependency)

pytestmark = [
    pytest.mark.filterwarnings("ignore:The data type .* does not have a Zarr V3 specification"),
    # rioxarray's and rasterio's own use of affine's `*`
    pytest.mark.filterwarnings("ignore:Use `@` matmul instead of `\\*` mul operator:PendingDeprecationWarning"),
]

CRS = "EPSG:32633"


def _raster(step=10.0, bands=4, height=8, width=6):
    """A north-up UTM raster: pixel centres at x0 + step/2 + step*j, y0 - step/2 - step*i."""
    x = 500_000.0 + step / 2 + step * np.arange(width)
    y = 4_100_000.0 - step / 2 - step * np.arange(height)
    data = np.arange(bands * height * width, dtype=np.float32).reshape(bands, height, width)
    arr = xr.DataArray(data, dims=("band", "y", "x"), coords={"band": np.arange(1, bands + 1), "y": y, "x": x},
                       name="reflectance")
    return arr.rio.write_crs(CRS).rio.write_coordinate_system().rio.write_transform()


def _consistent(arr):
    """The stored GeoTransform agrees with the one rioxarray computes from the coordinates."""
    cached, recomputed = arr.rio.transform(), arr.rio.transform(recalc=True)
    assert cached.almost_equals(recomputed, precision=1e-6), (cached, recomputed)
    return cached


@pytest.mark.smoke
def test_depth_to_space_gives_a_5_m_raster_that_reprojects_at_5_m():
    arr = _raster()
    assert arr.rio.resolution() == (10.0, -10.0)
    fine = arr.ops.depth_to_space(2)
    assert fine.rio.resolution() == (5.0, -5.0)
    assert _consistent(fine) == Affine(5.0, 0, 500_000.0, 0, -5.0, 4_100_000.0)  # same corner
    assert fine.rio.crs == arr.rio.crs and fine.rio.bounds() == arr.rio.bounds()
    same_crs = fine.rio.reproject(CRS)
    assert same_crs.rio.resolution() == pytest.approx((5.0, -5.0))
    other = fine.rio.reproject("EPSG:32632")  # the next zone west: the grid stays about 5 m
    assert abs(other.rio.resolution()[0]) == pytest.approx(5.0, rel=0.05)
    # CF attributes on the coordinates stay.
    for name in ("x", "y"):
        assert fine[name].attrs == arr[name].attrs and "standard_name" in fine[name].attrs
    assert fine["spatial_ref"].attrs["crs_wkt"] == arr["spatial_ref"].attrs["crs_wkt"]


def test_space_to_depth_and_invert_restore_the_transform():
    arr = _raster(step=5.0, bands=1)
    coarse = arr.ops.space_to_depth(2)
    assert coarse.rio.resolution() == (10.0, -10.0)
    _consistent(coarse)
    back = coarse.ops.invert()
    assert back.rio.transform() == arr.rio.transform()
    xr.testing.assert_identical(back, arr)


def test_space_to_batch_block_grid_transform():
    arr = _raster(bands=1).expand_dims(time=[np.datetime64("2026-01-01", "ns")])
    out = arr.ops.space_to_batch_nd({"y": 2, "x": 2}, {"y": (1, 1)})
    # The block grid: 20 m cells, labelled by their first cell (the first y block starts in padding).
    assert out.rio.resolution() == (20.0, -20.0)
    assert out["y"].values[0] == arr["y"].values[0] + 10.0
    _consistent(out)
    xr.testing.assert_identical(out.ops.invert(), arr)


def test_rotated_geotransform_is_scaled_without_coordinates():
    arr = xr.DataArray(np.zeros((4, 4, 8)), dims=("y", "x", "band")).rio.write_crs(CRS)
    rotated = Affine(10.0, 2.0, 500_000.0, 1.0, -10.0, 4_100_000.0)
    arr = arr.rio.write_transform(rotated)
    fine = arr.ops.depth_to_space(2)
    assert fine.rio.transform() == Affine(5.0, 1.0, 500_000.0, 0.5, -5.0, 4_100_000.0)
    coarse = arr.ops.space_to_depth(2)
    assert coarse.rio.transform() == Affine(20.0, 4.0, 500_000.0, 2.0, -20.0, 4_100_000.0)


def test_zarr_round_trip_keeps_the_new_grid(tmp_path):
    fine = _raster().ops.depth_to_space(2)
    fine.to_dataset().to_zarr(tmp_path / "fine.zarr")
    stored = xr.open_zarr(tmp_path / "fine.zarr", decode_coords="all")["reflectance"]
    assert stored.rio.resolution() == (5.0, -5.0) and stored.rio.crs.to_epsg() == 32633
    xr.testing.assert_identical(stored.load().ops.invert().drop_encoding(), _raster().drop_encoding())


def test_ops_does_not_import_rioxarray(fresh_imports):
    assert "rioxarray" not in fresh_imports["ops"]["modules"]


def test_per_band_attrs_follow_the_bands_and_the_raster_can_be_written(tmp_path):
    """rioxarray keeps per-band descriptions as tuples (``long_name``); after the band count
    changes they are regrouped with the bands (space_to_depth: each new band has one source
    band) or dropped with a warning (depth_to_space: several), so to_raster takes the result."""
    import ops as ops_module

    arr = _raster().assign_attrs(long_name=("B02", "B03", "B04", "B08"))
    deeper = arr.ops.space_to_depth(2)
    assert deeper.attrs["long_name"] == tuple(("B02", "B03", "B04", "B08")[int(b)]
                                              for b in deeper["source_band"].values)
    deeper.drop_vars(["source_band", "phase_y", "phase_x"]).rio.to_raster(tmp_path / "deeper.tif")
    with pytest.warns(ops_module.CoordinateDropped, match="attribute 'long_name' dropped"):
        shallower = deeper.ops.depth_to_space(2)
    assert "long_name" not in shallower.attrs
    shallower.rio.to_raster(tmp_path / "shallower.tif")


def test_per_band_attrs_follow_the_bands_as_a_batch(tmp_path):
    """With the bands as the batch dim of SpaceToBatchND/BatchToSpaceND, the per-band tuple
    follows them too: regrouped where each new entry has one source band, dropped with a
    warning where it has several (it stayed, 4 names for 16 or 1 bands)."""
    import ops as ops_module

    names = ("B02", "B03", "B04", "B08")
    arr = xr.DataArray(np.arange(4 * 6 * 8, dtype=np.float32).reshape(4, 6, 8), dims=("band", "y", "x"),
                       attrs={"long_name": names})
    tiles = arr.ops.space_to_batch_nd(y=2, x=2, dims={"N": "band"})
    assert tiles.sizes["band"] == 16
    assert tiles.attrs["long_name"] == tuple(names[int(b)] for b in tiles["source_band"].values)
    with pytest.warns(ops_module.CoordinateDropped, match="attribute 'long_name' dropped"):
        whole = arr.ops.batch_to_space_nd(y=2, x=2, dims={"N": "band"})
    assert whole.sizes["band"] == 1 and "long_name" not in whole.attrs
