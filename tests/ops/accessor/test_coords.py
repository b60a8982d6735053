"""Coordinates through the accessor (ops/accessor/coords.py): even steps with a dtype-fit tolerance, cell
centres refined and coarsened, block grids with provenance coordinates, channel label groups,
exact restoration by invert() and by the plain inverse call, through Zarr too.

The truth is computed here independently: cell centres by hand, and provenance coordinates
checked against the data (each input value encodes where it came from)."""

from __future__ import annotations

import json
import warnings

import dask.array as da
import numpy as np
import pytest
import xarray as xr

from ops import CoordinateDropped
from ops.accessor.coord_values import coarsened, even_step, refined

# Zarr 3 stores fixed-width string coords with a not-yet-specified dtype; xarray reads them back.
pytestmark = pytest.mark.filterwarnings("ignore:The data type .* does not have a Zarr V3 specification")


def _grid(y, x, channels=4, batch=None, dtype=np.int64):
    """A DataArray whose value at (n, i, j, c) is n*1e6 + i*1e4 + j*1e2 + c + 1 (0 = padding)."""
    y, x = np.asarray(y), np.asarray(x)
    n = 1 if batch is None else len(batch)
    index = np.indices((n, len(y), len(x), channels))
    data = (index[0] * 1_000_000 + index[1] * 10_000 + index[2] * 100 + index[3] + 1).astype(dtype)
    coords = {"y": ("y", y, {"units": "m", "axis": "Y"}), "x": ("x", x, {"units": "m", "axis": "X"}),
              "band": [f"b{k}" for k in range(channels)]}
    if batch is None:
        return xr.DataArray(data[0], dims=("y", "x", "band"), coords=coords, name="v")
    coords["time"] = batch
    arr = xr.DataArray(data, dims=("time", "y", "x", "band"), coords=coords, name="v")
    return arr.assign_coords(sensor=("time", [f"s{k}" for k in range(n)]))


def _decode(values):
    """(n, i, j, c) of each encoded value; -1 for padding."""
    v = np.asarray(values, dtype=np.int64) - 1
    return v // 1_000_000, v // 10_000 % 100, v // 100 % 100, v % 100


# --- even steps -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_decimal_steps_are_even_in_their_dtype(dtype):
    lat = (40 + 0.1 * np.arange(8)).astype(dtype)
    step, reason = even_step(lat)
    assert reason is None and step == pytest.approx(0.1, rel=1e-5)
    north_up = lat[::-1]
    assert even_step(north_up)[0] == pytest.approx(-0.1, rel=1e-5)
    uneven = lat.copy()
    uneven[3] += dtype(0.01)
    step, reason = even_step(uneven)
    assert step is None and "index 3" in reason and "not evenly spaced" in reason


def test_integer_and_datetime_steps_are_exact():
    assert even_step(np.arange(0, 20, 4)) == (4, None)
    assert even_step(np.array([0, 1, 3]))[0] is None
    days = np.arange("2026-01-01", "2026-01-05", dtype="datetime64[D]").astype("datetime64[ns]")
    assert even_step(days)[0] == 86_400 * 10**9
    assert even_step(np.array(["a", "b"]))[1] == "its dtype <U1 is not numeric"


@pytest.mark.smoke
def test_refine_and_coarsen_by_cell_centres():
    # A 10 m pixel centred at c becomes four 5 m pixels centred at c -/+ 2.5.
    centres = np.array([1005.0, 1015.0, 1025.0])
    fine, _ = refined(centres, 2)
    assert fine.tolist() == [1002.5, 1007.5, 1012.5, 1017.5, 1022.5, 1027.5]
    assert coarsened(fine, 2)[0].tolist() == centres.tolist()
    thirds, _ = refined(np.array([0.0, 3.0]), 3)
    assert thirds.tolist() == [-1.0, 0.0, 1.0, 2.0, 3.0, 4.0]
    # Integers: kept when the centres are whole, float64 otherwise; datetimes: whole units only.
    assert refined(np.array([0, 4, 8]), 2)[0].dtype == np.int64
    assert refined(np.array([0, 1]), 2)[0].tolist() == [-0.25, 0.25, 0.75, 1.25]
    days = np.array(["2026-01-01", "2026-01-02"], dtype="datetime64[ns]")
    assert refined(days, 2)[0].tolist() == np.array(
        ["2025-12-31T18", "2026-01-01T06", "2026-01-01T18", "2026-01-02T06"], dtype="datetime64[ns]").tolist()
    assert refined(np.array(["2026-01-01", "2026-01-02"], dtype="datetime64[D]"), 2) == (
        None, "the new values are not whole units of datetime64[D]")


# --- DepthToSpace / SpaceToDepth ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_decimal_lat_lon_refined_coarsened_and_restored(dtype):
    lat = (40 + 0.1 * np.arange(8)).astype(dtype)[::-1]  # north-up
    lon = (10 + 0.1 * np.arange(6)).astype(dtype)
    arr = _grid(lat, lon, channels=4).rename(y="lat", x="lon")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing dropped
        fine = arr.ops.depth_to_space(2)
        coarse = arr.ops.space_to_depth(2)
    assert fine["lat"].dtype == dtype and fine["lat"].attrs == {"units": "m", "axis": "Y"}
    expected = np.repeat(lat.astype(np.float64), 2) + np.tile([0.025, -0.025], 8)
    np.testing.assert_allclose(fine["lat"].values, expected, rtol=0, atol=4 * np.finfo(dtype).eps * 48)
    np.testing.assert_allclose(coarse["lon"].values, lon.astype(np.float64).reshape(3, 2).mean(1),
                               rtol=0, atol=4 * np.finfo(dtype).eps * 11)
    for out in (fine, coarse):
        xr.testing.assert_identical(out.ops.invert(), arr)


def test_uneven_coordinate_dropped_with_a_reason_and_restored_by_invert():
    arr = _grid([0.0, 1.0, 3.0, 7.0], 5.0 + 10 * np.arange(4))
    with pytest.warns(CoordinateDropped, match=r"depth_to_space: coordinate 'y' dropped: it is not evenly "
                                               r"spaced: value 3.0 at index 2") as caught:
        out = arr.ops.depth_to_space(2)
    assert caught[0].filename == __file__  # points at the caller's line
    assert "y" not in out.coords and out["x"].values[:2].tolist() == [2.5, 7.5]
    xr.testing.assert_identical(out.ops.invert(), arr)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_channel_provenance_matches_the_data(mode):
    arr = _grid(5.0 + 10 * np.arange(4), 5.0 + 10 * np.arange(6), channels=3)
    out = arr.ops.space_to_depth(2, mode=mode)
    n, i, j, c = _decode(out.values)  # (y, x, band) of the input cell each output value holds
    y, x = np.arange(2)[:, None, None], np.arange(3)[None, :, None]
    assert (c == out["source_band"].values).all()
    assert (i == 2 * y + out["phase_y"].values).all() and (j == 2 * x + out["phase_x"].values).all()
    assert out["band"].values.tolist() == [f"b{k}" for k in out["source_band"].values]
    xr.testing.assert_identical(out.ops.invert(), arr)
    # The plain inverse call consumes the provenance coords and restores the labels too.
    xr.testing.assert_identical(out.ops.depth_to_space(2, mode=mode).drop_attrs(), arr.drop_attrs())


@pytest.mark.parametrize("mode, groups", [("DCR", ["b0|b2|b4|b6", "b1|b3|b5|b7"]),
                                          ("CRD", ["b0|b1|b2|b3", "b4|b5|b6|b7"])])
def test_depth_to_space_groups_channel_labels(mode, groups):
    arr = _grid(5.0 + 10 * np.arange(2), 5.0 + 10 * np.arange(2), channels=8)
    arr = arr.assign_coords(wavelength=("band", np.arange(8) * 100.0), sensor=("band", ["s"] * 8))
    with pytest.warns(CoordinateDropped, match=r"'wavelength' dropped: its values differ within the groups"):
        out = arr.ops.depth_to_space(2, mode=mode)
    assert out["band"].values.tolist() == groups
    _, _, _, c = _decode(out.values)  # each output channel holds the group its label names
    for k, label in enumerate(groups):
        assert sorted(f"b{v}" for v in np.unique(c[..., k])) == label.split("|")
    assert out["sensor"].values.tolist() == ["s", "s"]  # the same across each group: kept
    xr.testing.assert_identical(out.ops.invert(), arr)


# --- SpaceToBatchND / BatchToSpaceND ---------------------------------------------------------------


def _batch_image():
    times = np.array(["2026-01-01", "2026-02-01"], dtype="datetime64[ns]")
    return _grid(1000.0 - 10 * np.arange(5), 40 + 0.1 * np.arange(6), channels=2, batch=times)


def test_space_to_batch_block_grid_and_provenance_match_the_data():
    arr = _batch_image()
    out = arr.ops.space_to_batch_nd({"y": 3, "x": 2}, {"y": (1, 0)})  # y: 1 padded row, 5 + 1 = 2 blocks
    assert out.sizes["time"] == 12 and out.sizes["y"] == 2 and out.sizes["x"] == 3
    # Block coordinate = its first cell's (the first y block starts in the padding: extrapolated).
    assert out["y"].values.tolist() == [1010.0, 980.0]
    assert out["x"].values.tolist() == arr["x"].values[::2].tolist()
    assert out["source_time"].values.tolist() == [0, 1] * 6
    assert out["block_offset_y"].values.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert out["block_offset_x"].values.tolist() == [0, 0, 1, 1] * 3
    # Batch coords repeat per offset: entry k is still from time[source_time[k]].
    assert (out["time"].values == arr["time"].values[out["source_time"].values]).all()
    assert out["sensor"].values.tolist() == ["s0", "s1"] * 6
    n, i, j, _ = _decode(out.values)
    step_y, step_x = -10.0, 0.1
    for k in range(12):
        real = n[k] >= 0  # not padding
        assert (n[k][real] == out["source_time"].values[k]).all()
        # the cell's own coordinate = block coordinate + offset * step
        cell_y = (out["y"].values[:, None, None] + out["block_offset_y"].values[k] * step_y)
        cell_x = (out["x"].values[None, :, None] + out["block_offset_x"].values[k] * step_x)
        np.testing.assert_allclose(np.broadcast_to(cell_y, real.shape)[real], arr["y"].values[i[k][real]])
        np.testing.assert_allclose(np.broadcast_to(cell_x, real.shape)[real], arr["x"].values[j[k][real]])


def test_batch_round_trips_restore_every_coordinate_exactly(tmp_path):
    arr = _batch_image()
    blocks, pads = {"y": 3, "x": 2}, {"y": (1, 0)}
    out = arr.ops.space_to_batch_nd(blocks, pads)
    xr.testing.assert_identical(out.ops.invert(), arr)
    direct = out.ops.batch_to_space_nd(blocks, pads)
    xr.testing.assert_identical(direct.drop_attrs(), arr.drop_attrs())
    # Through Zarr: coords and plain JSON attrs only.
    out.to_dataset().to_zarr(tmp_path / "b.zarr")
    stored = xr.open_zarr(tmp_path / "b.zarr")["v"]  # lazy data and lazy non-index coords
    assert all(isinstance(v, (str, int, float)) for v in stored.attrs.values())
    restored = stored.ops.invert()
    assert isinstance(restored.data, da.Array)
    xr.testing.assert_identical(restored.load(), arr)
    xr.testing.assert_identical(stored.ops.batch_to_space_nd(blocks, pads).drop_attrs(), arr.drop_attrs())
    # The 4-D SpaceToBatch labels its block grid the same way.
    four_d = arr.ops.space_to_batch(2, [[1, 0], [0, 0]])
    assert four_d["y"].values.tolist() == [1010.0, 990.0, 970.0] and four_d.sizes["time"] == 8 and "block_offset_x" in four_d.coords
    xr.testing.assert_identical(four_d.ops.invert(), arr)


def test_batch_to_space_of_a_plain_batch_merges_labels():
    # Eight labelled entries merged 2x2: each result entry shows the group it was built from.
    arr = _grid(np.arange(2.0), np.arange(2.0), channels=1, batch=[f"img{k}" for k in range(8)])
    with pytest.warns(CoordinateDropped, match=r"'sensor' dropped: its values differ"):
        out = arr.ops.batch_to_space_nd({"y": 2, "x": 2})
    assert out["time"].values.tolist() == ["img0|img2|img4|img6", "img1|img3|img5|img7"]
    assert out["y"].values.tolist() == [0.0, 0.5, 1.0, 1.5]  # the block grid's offsets, step 1 / 2
    xr.testing.assert_identical(out.ops.invert(), arr)


def test_space_to_batch_of_uneven_labels_keeps_first_cells_or_warns():
    arr = _grid([0.0, 1.0, 3.0, 7.0], ["c0", "c1", "c2", "c3"], channels=1, batch=[0])
    out = arr.ops.space_to_batch_nd({"y": 2, "x": 2})
    assert out["y"].values.tolist() == [0.0, 3.0] and out["x"].values.tolist() == ["c0", "c2"]
    xr.testing.assert_identical(out.ops.invert(), arr)
    with pytest.warns(CoordinateDropped, match=r"'y' dropped: some blocks start in the padding and it is not"):
        padded = arr.ops.space_to_batch_nd({"y": 2}, {"y": (1, 1)})
    xr.testing.assert_identical(padded.ops.invert(), arr)


def test_dataset_two_steps_through_zarr_and_back(tmp_path):
    arr = _batch_image().isel(y=slice(0, 4))
    ds = xr.Dataset({"v": arr, "w": arr * 2}, attrs={"title": "demo"})
    out = ds.ops.space_to_depth(2).ops.space_to_batch_nd({"y": 2}, {"y": (1, 1)})
    assert [s["operator"] for s in json.loads(out["v"].attrs["ops_history"])] == ["space_to_depth", "space_to_batch_nd"]
    out.to_zarr(tmp_path / "d.zarr")
    back = xr.open_zarr(tmp_path / "d.zarr").load().ops.invert().ops.invert()
    xr.testing.assert_identical(back, ds)


def test_invert_restores_datetime_and_2d_coordinates_from_the_record(monkeypatch):
    when = np.array(["2026-01-01", "2026-01-02", "2026-01-04", "2026-01-08"], dtype="datetime64[ns]")
    arr = _grid(when, 5.0 + 10 * np.arange(4)).assign_coords(
        lat=(("y", "x"), np.linspace(40, 41, 16).reshape(4, 4), {"units": "degrees_north"}))
    with pytest.warns(CoordinateDropped) as caught:
        out = arr.ops.depth_to_space(2)
    assert sorted(str(w.message).split("'")[1] for w in caught) == ["lat", "y"]
    step = json.loads(out.attrs["ops_history"])[-1]
    assert step["coords"]["y"]["values"][2].startswith("2026-01-04T00:00:00")
    xr.testing.assert_identical(out.ops.invert(), arr)
    # Past the size limit the record is left out, and the warning says invert() cannot restore it.
    monkeypatch.setattr("ops.accessor.coords.MAX_RECORDED_VALUES", 10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = arr.ops.depth_to_space(2)
    assert any("'lat' (16 values of float64) is not recorded" in str(w.message) for w in caught)
    assert "lat" not in out.ops.invert().coords and out.ops.invert()["y"].equals(arr["y"])
