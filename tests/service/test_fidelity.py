"""The same data through every door gives the same stored answer: the ``.ops`` accessor (its
result saved as an xarray user saves it), ``chunked-tensor-ops run`` and a service job (a
zipped store uploaded, the result stored), on five datasets that look like real ones, each
result compared with the others in everything a reader sees: the decoded values (NaN-aware,
bit for bit), dims, coordinates, the variable's attrs, the group's attrs, the packing
(encoding) and the grid-mapping variable it names.
"""

from __future__ import annotations

import io
import json
import warnings
import zipfile

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import ops  # noqa: F401  (registers .ops)
from ops import registry
from ops.accessor.conventions import CF_ENCODING
from service.cli import main as cli
from tests.service.api.calls import unique, wait_job
from tests.service.conftest import inline, load_npy

QUICK = ["--in-process", "--n-workers", "1", "--threads-per-worker", "2", "--quiet"]
RNG = np.random.default_rng(29)


def _with_gaps(values: np.ndarray, count: int) -> np.ndarray:
    flat = values.reshape(-1)
    flat[RNG.choice(flat.size, count, replace=False)] = np.nan
    return values


def packed_field() -> tuple[xr.Dataset, dict]:
    """A CF NetCDF field as it is published: int16 packed with scale_factor/add_offset/_FillValue,
    descending latitudes, dates, a grid-mapping variable and global attrs."""
    values = _with_gaps(273.15 + 8 * RNG.standard_normal((2, 4, 6, 8)), 9)
    ds = xr.Dataset(
        {"t2m": (("time", "lat", "lon", "band"), values,
                 {"units": "K", "long_name": "2 metre temperature", "grid_mapping": "crs"}),
         "crs": ((), 0, {"grid_mapping_name": "latitude_longitude"})},
        coords={"time": pd.date_range("2024-01-01", periods=2, freq="6h"), "lat": [40.0, 30.0, 20.0, 10.0],
                "lon": np.arange(6.0) - 3, "band": [f"b{i}" for i in range(8)]},
        attrs={"Conventions": "CF-1.8", "title": "a packed field", "history": "made for a test"})
    packing = {"t2m": {"dtype": "int16", "scale_factor": 0.01, "add_offset": 273.15, "_FillValue": -32767}}
    return ds, packing


def raster() -> tuple[xr.Dataset, dict]:
    """A rioxarray-style raster: (band, y, x) with one long_name per band and a spatial_ref."""
    values = _with_gaps(RNG.uniform(0, 3000, (4, 6, 8)).astype(np.float32), 5)
    ds = xr.Dataset(
        {"reflectance": (("band", "y", "x"), values,
                         {"long_name": ("B02", "B03", "B04", "B08"), "scale": 1e-4, "grid_mapping": "spatial_ref"}),
         "spatial_ref": ((), 0, {"crs_wkt": "PROJCS[...]", "spatial_ref": "PROJCS[...]"})},
        coords={"band": [1, 2, 3, 4], "y": 5e6 - 10 * np.arange(6.0), "x": 4e5 + 10 * np.arange(8.0)},
        attrs={"AREA_OR_POINT": "Area"})
    return ds, {"reflectance": {"_FillValue": np.float32(np.nan)}}


def nchw_series() -> tuple[xr.Dataset, dict]:
    """An NCHW time series: (time, channel, y, x) float32 with gaps and dated steps."""
    values = _with_gaps(RNG.standard_normal((4, 4, 4, 6)).astype(np.float32), 7)
    ds = xr.Dataset({"signal": (("time", "channel", "y", "x"), values, {"units": "1"})},
                    coords={"time": pd.date_range("2024-03-01", periods=4, freq="D"), "channel": list("abcd")},
                    attrs={"source": "a sensor"})
    return ds, {}


def masked_dataset() -> tuple[xr.Dataset, dict]:
    """A Dataset of mixed variables: a field, a land mask and a per-band wavelength."""
    values = _with_gaps(RNG.standard_normal((2, 4, 4, 4)), 4)
    ds = xr.Dataset(
        {"sst": (("time", "lat", "lon", "band"), values, {"units": "degC"}),
         "land_mask": (("lat", "lon"), (RNG.uniform(size=(4, 4)) > 0.7).astype(np.int8)),
         "band_wavelength": (("band",), [0.4, 0.5, 0.6, 0.7], {"units": "um"})},
        coords={"lat": np.linspace(-10, 10, 4), "lon": np.linspace(0, 30, 4)},
        attrs={"institution": "a test"})
    return ds, {"sst": {"dtype": "float32"}}


def ml_tensors() -> tuple[xr.Dataset, dict]:
    """Labelled ML tensors: an NHWC float16 batch with named channels."""
    values = RNG.standard_normal((2, 4, 4, 8)).astype(np.float16)
    ds = xr.Dataset({"features": (("sample", "height", "width", "feature"), values)},
                    coords={"feature": [f"f{i}" for i in range(8)], "sample": ["s0", "s1"]},
                    attrs={"model": "a test"})
    return ds, {}


def _stored(tmp_path, make) -> tuple[xr.Dataset, object]:
    ds, encoding = make()
    path = tmp_path / f"{make.__name__}.zarr"
    ds.to_zarr(path, zarr_format=3, encoding=encoding)
    return ds, path


# (dataset, variable, operator, parameters as run and the service take them, the accessor call,
#  the variable's name in a dataset that names its grid mapping)
CASES = [
    (packed_field, "t2m", "space_to_depth", {"block_size": 2}, lambda a: a.ops.space_to_depth(2)),
    (packed_field, "t2m", "depth_to_space", {"block_size": 2}, lambda a: a.ops.depth_to_space(2)),
    (packed_field, "t2m", "space_to_batch_nd", {"block_shape": [2, 2], "paddings": [[0, 0], [2, 0]],
                                                "pad_value": "NaN"},
     lambda a: a.ops.space_to_batch_nd(lat=2, lon=2, paddings={"lon": (2, 0)}, pad_value=np.nan)),
    (packed_field, "t2m", "batch_to_space_nd", {"block_shape": [2, 1], "crops": [[1, 0], [0, 0]]},
     lambda a: a.ops.batch_to_space_nd(lat=2, lon=1, crops={"lat": (1, 0)})),
    (packed_field, "t2m", "gather_nd", {"indices": [[0, 1, 2], [1, 3, 0], [1, 0, 5]]},
     lambda a: a.ops.gather_nd(xr.DataArray(np.array([[0, 1, 2], [1, 3, 0], [1, 0, 5]]), dims=("point", "index")))),
    (raster, "reflectance", "space_to_batch_nd", {"block_shape": [2, 2], "paddings": [[0, 0], [0, 0]],
                                                  "dims": {"N": "band"}},
     lambda a: a.ops.space_to_batch_nd(y=2, x=2, dims={"N": "band"})),
    (raster, "reflectance", "batch_to_space_nd", {"block_shape": [2, 2], "crops": [[0, 0], [0, 0]],
                                                  "dims": {"N": "band"}},
     lambda a: a.ops.batch_to_space_nd(y=2, x=2, dims={"N": "band"})),
    (nchw_series, "signal", "depth_to_space", {"block_size": 2}, lambda a: a.ops.depth_to_space(2)),
    (nchw_series, "signal", "space_to_batch_nd", {"block_shape": {"y": 2, "x": 3}, "paddings": {"y": [1, 1]},
                                                  "pad_value": -1.0},
     lambda a: a.ops.space_to_batch_nd(y=2, x=3, paddings={"y": (1, 1)}, pad_value=-1.0)),
    (masked_dataset, "sst", "space_to_depth", {"block_size": 2}, lambda a: a.ops.space_to_depth(2)),
    (ml_tensors, "features", "space_to_depth", {"block_size": 2}, lambda a: a.ops.space_to_depth(2)),
    (ml_tensors, "features", "batch_to_space_nd", {"block_shape": [2, 1], "crops": [[0, 0], [0, 0]]},
     lambda a: a.ops.batch_to_space_nd(height=2, width=1)),
]
IDS = [f"{make.__name__}-{op}" for make, _, op, _, _ in CASES]


def _accessor(source, variable, op, params, call, out) -> xr.Dataset:
    """What an accessor user does: open the store, call the operator on the variable, save the
    result with the group's attrs and the grid mapping it names."""
    opened = xr.open_zarr(source)
    arr = opened[variable]
    result = call(arr)
    saved = result.to_dataset(name=variable).assign_attrs(opened.attrs)
    mapping = result.encoding.get("grid_mapping", result.attrs.get("grid_mapping"))
    if mapping:
        saved = saved.assign_coords({mapping: opened[mapping]})
    saved.to_zarr(out, zarr_format=3)
    return xr.open_zarr(out)


def _run(capsys, stores: dict, op, params, out) -> xr.Dataset:
    """``stores``: array input -> (path, variable)."""
    flags = [item for k, v in params.items() for item in ("--param", f"{k}={json.dumps(v)}")]
    for role, (path, variable) in stores.items():
        flags += ["--input", f"{role}={path}", "--variable", f"{role}={variable}"]
    code = cli.main(["run", op, *flags, "--output", str(out), *QUICK])
    assert code == 0, capsys.readouterr().err
    return xr.open_zarr(out)


def _zipped(path) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in sorted(path.rglob("*")):
            if file.is_file():
                archive.write(file, file.relative_to(path).as_posix())
    return buffer.getvalue()


def _service(client, service_root, stores: dict, op, params) -> xr.Dataset:
    """``stores`` uploaded as zipped stores, the job's result stored and read back."""
    inputs = {}
    for role, (path, variable) in stores.items():
        name = unique(role.replace("_", "-"))
        put = client.put(f"/arrays/{name}", params={"variable": variable}, content=_zipped(path),
                         headers={"Content-Type": "application/zip"})
        assert put.status_code == 201, put.text
        inputs[role] = {"href": f"/arrays/{name}"}
    # a small array input as the service takes one inline: NPY (run takes the JSON list)
    arrays = registry.get(op).array_inputs
    inputs.update({k: inline(np.array(v)) if k in arrays else v for k, v in params.items()})
    result = unique("out")
    body = {"inputs": inputs, "outputs": {"result": {"transmissionMode": "reference", "name": result}}}
    job = client.post(f"/processes/{op}/execution", json=body, headers={"Prefer": "respond-async"})
    assert job.status_code == 201, job.text
    assert wait_job(client, job.json()["jobID"])["status"] == "successful"
    return xr.open_zarr(service_root / "arrays" / result)


def _mapping(ds: xr.Dataset, variable: str):
    arr = ds[variable]
    return arr.encoding.get("grid_mapping", arr.attrs.get("grid_mapping"))


def _packing(arr: xr.DataArray) -> dict:
    """The CF keys of the encoding, NaN written out (NaN == NaN is false in a dict compare)."""
    def shown(value):
        return "NaN" if isinstance(value, float) and np.isnan(value) else value
    return {k: shown(arr.encoding[k]) for k in CF_ENCODING if k in arr.encoding}


def assert_same_answer(got: xr.Dataset, expected: xr.Dataset, variable: str, door: str) -> None:
    """Everything a reader of ``variable`` sees, equal: values bit for bit (NaNs where NaNs),
    dims, coordinates (the grid mapping apart: its own check), attrs, group attrs, packing."""
    a, b = got[variable], expected[variable]
    assert a.dims == b.dims, door
    assert a.dtype == b.dtype, door
    assert np.ascontiguousarray(a.values).tobytes() == np.ascontiguousarray(b.values).tobytes(), door
    mapping = _mapping(expected, variable)
    assert _mapping(got, variable) == mapping, door
    names = lambda arr: sorted(str(c) for c in arr.coords if c != mapping)  # noqa: E731
    assert names(a) == names(b), door
    for coord in names(b):
        xr.testing.assert_identical(a[coord].variable, b[coord].variable)
    assert a.attrs == b.attrs, door
    assert got.attrs == expected.attrs, door
    assert _packing(a) == _packing(b), door
    if mapping:
        assert got[mapping].attrs == expected[mapping].attrs, door


@pytest.mark.smoke
@pytest.mark.parametrize("make, variable, op, params, call", CASES, ids=IDS)
def test_every_door_gives_the_same_stored_answer(client, service_root, capsys, tmp_path, make, variable, op,
                                                 params, call):
    original, source = _stored(tmp_path, make)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a coordinate dropped is each door's own warning, tested elsewhere
        expected = _accessor(source, variable, op, params, call, tmp_path / "accessor.zarr")
    first = registry.get(op).array_inputs[0]
    by_run = _run(capsys, {first: (source, variable)}, op, params, tmp_path / "run.zarr")
    by_service = _service(client, service_root, {first: (source, variable)}, op, params)
    assert_same_answer(by_run, expected, variable, "run")
    assert_same_answer(by_service, expected, variable, "service")
    assert expected.attrs == original.attrs  # the group's attrs stay the group's
    if op == "gather_nd" or any(any(pair) for pair in params.get("crops", [])):
        return  # the points pick some values, crops cut some
    # Nothing lost: every missing value of the input is missing in the result (and padding
    # adds missing values only when asked to)
    missing = int(original[variable].isnull().sum())
    padded = int(np.isnan(expected[variable].values).sum()) - missing
    assert padded >= 0 and (padded == 0 or params.get("pad_value") == "NaN")


def test_a_labelled_per_channel_scale_gives_the_same_answer_through_every_door(client, service_root, capsys,
                                                                               tmp_path):
    """AscendDequant of labelled int32 accumulators by a per-channel scale stored in another
    channel order: aligned by label in every door (run applied it by position)."""
    labels = [f"c{i}" for i in range(8)]
    src = xr.Dataset({"acc": (("token", "channel"), RNG.integers(-2000, 2000, (6, 8), dtype=np.int32))},
                     coords={"channel": labels, "token": np.arange(6)}, attrs={"model": "a test"})
    scale = xr.Dataset({"scale": (("channel",), RNG.uniform(0.5, 2, 8).astype(np.float32)[::-1])},
                       coords={"channel": labels[::-1]})
    src.to_zarr(tmp_path / "src.zarr", zarr_format=3)
    scale.to_zarr(tmp_path / "scale.zarr", zarr_format=3)
    opened = xr.open_zarr(tmp_path / "src.zarr")
    result = opened["acc"].ops.ascend_dequant(xr.open_zarr(tmp_path / "scale.zarr")["scale"], dst_dtype="float32")
    result.to_dataset(name="acc").assign_attrs(opened.attrs).to_zarr(tmp_path / "accessor.zarr", zarr_format=3)
    expected = xr.open_zarr(tmp_path / "accessor.zarr")
    stores = {"src": (tmp_path / "src.zarr", "acc"), "deq_scale": (tmp_path / "scale.zarr", "scale")}
    params = {"dst_dtype": "float32"}
    assert_same_answer(_run(capsys, stores, "ascend_dequant", params, tmp_path / "run.zarr"), expected, "acc", "run")
    assert_same_answer(_service(client, service_root, stores, "ascend_dequant", params), expected, "acc", "service")
    assert list(expected["channel"].values) == labels


def test_an_inline_result_is_packed_as_a_stored_one_downloads(client, service_root, capsys, tmp_path):
    """A value result of a packed input is its stored form (int16, missing values as the fill
    value), the bytes a download of the stored result gives and run's output holds."""
    _, source = _stored(tmp_path, packed_field)
    by_run = _run(capsys, {"x": (source, "t2m")}, "space_to_depth", {"block_size": 2}, tmp_path / "run.zarr")
    name = unique("packed")
    put = client.put(f"/arrays/{name}", params={"variable": "t2m"}, content=_zipped(source),
                     headers={"Content-Type": "application/zip"})
    assert put.status_code == 201, put.text
    body = {"inputs": {"x": {"href": f"/arrays/{name}"}, "block_size": 2},
            "outputs": {"result": {"transmissionMode": "value"}}, "response": "raw"}
    response = client.post("/processes/space_to_depth/execution", json=body)
    assert response.status_code == 200, response.text
    value = load_npy(response.content)
    raw = xr.open_zarr(tmp_path / "run.zarr", mask_and_scale=False)["t2m"].values
    assert value.dtype == np.int16 and value.tobytes() == raw.tobytes()
    assert (value == -32767).sum() == int(by_run["t2m"].isnull().sum()) == 9
