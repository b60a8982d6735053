"""``chunked-tensor-ops run`` on CF data: a packed variable (int16 with scale_factor, add_offset
and _FillValue), a grid-mapping variable and global attrs, against the accessor on the same
variable opened the way xarray users open it (decoded)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import ops  # noqa: F401  (registers .ops)
from service.cli import main as cli

QUICK = ["--in-process", "--n-workers", "1", "--threads-per-worker", "2", "--quiet"]
PACKING = {"dtype": np.dtype("int16"), "scale_factor": 0.01, "add_offset": 273.15, "_FillValue": -32767}
MISSING = [(0, 0, 0, 0), (1, 2, 3, 4), (0, 3, 5, 7)]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    values = 273.15 + np.random.default_rng(3).standard_normal((2, 4, 6, 8))
    for where in MISSING:
        values[where] = np.nan
    ds = xr.Dataset(
        {"t2m": (("time", "lat", "lon", "band"), values, {"units": "K", "grid_mapping": "crs"}),
         "crs": ((), 0, {"grid_mapping_name": "latitude_longitude"})},
        coords={"lat": [40.0, 30.0, 20.0, 10.0], "lon": np.arange(6.0)},
        attrs={"Conventions": "CF-1.8", "title": "a packed field"},
    )
    path = tmp_path_factory.mktemp("cf") / "packed.zarr"
    ds.to_zarr(path, zarr_format=3, encoding={"t2m": {k: v for k, v in PACKING.items()}})
    return path


CALLS = [
    ("space_to_depth", {"block_size": 2}, lambda arr: arr.ops.space_to_depth(2)),
    ("depth_to_space", {"block_size": 2}, lambda arr: arr.ops.depth_to_space(2)),
    ("space_to_batch_nd", {"block_shape": [2, 2], "paddings": [[0, 0], [2, 0]]},
     lambda arr: arr.ops.space_to_batch_nd(lat=2, lon=2, paddings={"lon": (2, 0)})),
    ("batch_to_space_nd", {"block_shape": [2, 1], "crops": [[0, 0], [0, 0]]},
     lambda arr: arr.ops.batch_to_space_nd(lat=2, lon=1)),
]


def _run(capsys, packed, out, op, params):
    import json

    flags = [item for k, v in params.items() for item in ("--param", f"{k}={json.dumps(v)}")]
    variable = ["--variable", "t2m"] if str(packed).endswith("packed.zarr") else []
    code = cli.main(["run", op, "--input", str(packed), *variable, *flags, "--output", str(out), *QUICK])
    err = capsys.readouterr().err
    assert code == 0, err


@pytest.mark.smoke
@pytest.mark.parametrize("op, params, accessor", CALLS, ids=[c[0] for c in CALLS])
def test_a_packed_variable_keeps_its_missing_values_and_its_packing(capsys, tmp_path, packed, op, params,
                                                                     accessor):
    """The same decoded values as the accessor gives (NaN where the input was missing, at the
    moved positions), written back packed as the input was."""
    out = tmp_path / "out.zarr"
    _run(capsys, packed, out, op, params)
    result = accessor(xr.open_zarr(packed)["t2m"])
    for key, value in PACKING.items():
        assert result.encoding[key] == value, key  # the accessor keeps the packing
    # What an accessor user stores (and reads back) is what run stores.
    result.to_dataset(name="t2m").to_zarr(tmp_path / "expected.zarr", zarr_format=3)
    expected = xr.open_zarr(tmp_path / "expected.zarr")["t2m"]
    got = xr.open_zarr(out)["t2m"]
    assert got.dims == expected.dims
    np.testing.assert_array_equal(got.values, expected.values)  # NaN-aware: NaNs in the same places
    if op not in ("batch_to_space_nd",):  # the fixture's field has 3 missing values; none are cropped
        assert int(np.isnan(got.values).sum()) == len(MISSING)
    for key, value in PACKING.items():
        assert got.encoding[key] == value, key


def test_global_attrs_stay_global_and_the_grid_mapping_comes_along(capsys, tmp_path, packed):
    out = tmp_path / "out.zarr"
    _run(capsys, packed, out, "space_to_depth", {"block_size": 2})
    written = xr.open_zarr(out)
    assert written.attrs == {"Conventions": "CF-1.8", "title": "a packed field"}
    assert "Conventions" not in written["t2m"].attrs and "title" not in written["t2m"].attrs
    mapping = written["t2m"].encoding.get("grid_mapping", written["t2m"].attrs.get("grid_mapping"))
    assert mapping == "crs" and written["crs"].attrs["grid_mapping_name"] == "latitude_longitude"


def test_a_rearranged_cf_variable_can_be_saved_again(tmp_path, packed):
    """The grid mapping is in one place (attrs or encoding), so xarray writes it."""
    arr = xr.open_zarr(packed)["t2m"]
    for result in (arr.ops.space_to_depth(2), arr.ops.space_to_batch_nd(lat=2, lon=2)):
        assert not ("grid_mapping" in result.attrs and "grid_mapping" in result.encoding)
        result.to_dataset(name="t2m").to_zarr(tmp_path / f"{len(result.dims)}-{result.shape[0]}.zarr",
                                              zarr_format=3)


def test_a_cf_time_coordinate_joined_by_batch_to_space_opens_again(capsys, tmp_path):
    """The batch dim's dates are joined into labels as the accessor joins them; the output
    keeps no time units for them, so xarray opens it (it refused '0|6' labels with units)."""
    import pandas as pd

    ds = xr.Dataset({"v": (("time", "y", "x", "c"), np.arange(16, dtype=np.float32).reshape(4, 2, 2, 1))},
                    coords={"time": pd.date_range("2020-01-01", periods=4, freq="6h")})
    ds.to_zarr(tmp_path / "in.zarr", zarr_format=3)
    _run(capsys, tmp_path / "in.zarr", tmp_path / "out.zarr", "batch_to_space_nd",
         {"block_shape": [2, 2], "crops": [[0, 0], [0, 0]]})
    written = xr.open_zarr(tmp_path / "out.zarr")
    expected = xr.open_zarr(tmp_path / "in.zarr")["v"].ops.batch_to_space_nd(y=2, x=2)
    assert list(written["time"].values) == list(expected["time"].values)
    np.testing.assert_array_equal(written["v"].values, expected.values)
