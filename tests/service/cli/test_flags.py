"""``service.cli.flags`` and what ``chunked-tensor-ops run`` takes from the command line: JSON
values (and invalid JSON called so), the accessor's by-name forms, vector scales, dims by name
or a clear refusal."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
import zarr

import ops
from service.cli import flags
from service.cli import main as cli
from service.cli.run_errors import RunError

QUICK = ["--in-process", "--n-workers", "1", "--threads-per-worker", "2", "--quiet"]
RNG = np.random.default_rng(11)


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["run", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.smoke
@pytest.mark.parametrize("text", ["[[1,1],[0,0]", "{\"lat\": 2", "\"DCR"])
def test_invalid_json_is_called_invalid_json(text):
    with pytest.raises(RunError, match=r"--param p: invalid JSON \(.*\): " + __import__("re").escape(text)):
        flags.parse_params([f"p={text}"])
    assert flags.parse_params(["p=DCR", "q=float16"]) == {"p": "DCR", "q": "float16"}  # plain words stay words


@pytest.fixture(scope="module")
def field(tmp_path_factory):
    root = tmp_path_factory.mktemp("flags")
    values = RNG.standard_normal((2, 4, 6, 8)).astype(np.float32)
    xr.Dataset({"t": (("time", "lat", "lon", "band"), values)}).to_zarr(root / "field.zarr", zarr_format=3)
    xr.Dataset({"t": (("a", "b", "c", "d"), values)}).to_zarr(root / "odd.zarr", zarr_format=3)
    return root, values


def test_block_shape_by_name_as_the_accessor_takes_it(capsys, tmp_path, field):
    root, values = field
    out = tmp_path / "o.zarr"
    code, _, err = run(capsys, "space_to_batch_nd", "--input", str(root / "field.zarr"), "--param",
                       'block_shape={"lat": 2, "lon": 3}', "--param", 'paddings={"lat": [0, 0]}', "--output", str(out),
                       *QUICK)
    assert code == 0, err
    expected = xr.open_zarr(root / "field.zarr")["t"].ops.space_to_batch_nd(lat=2, lon=3)
    np.testing.assert_array_equal(xr.open_zarr(out)["t"].values, expected.values)


def test_dims_it_cannot_name_are_refused_not_read_by_position(capsys, tmp_path, field):
    root, _ = field
    code, _, err = run(capsys, "depth_to_space", "--input", str(root / "odd.zarr"), "--param", "block_size=2",
                       "--output", str(tmp_path / "o.zarr"), *QUICK)
    assert code == 2
    assert "depth_to_space needs height (H), width (W) dim(s) among ('a', 'b', 'c', 'd')" in err
    assert not (tmp_path / "o.zarr").exists()


@pytest.mark.parametrize("dst_dtype", ["float32", "float16"])
def test_a_vector_scale_as_json(capsys, tmp_path, dst_dtype):
    """The scale as a JSON list: float32, packed for float16 output as the operator takes it
    (no Python needed)."""
    src = RNG.integers(-1000, 1000, (6, 8), dtype=np.int32)
    zarr.create_array(str(tmp_path / "src.zarr"), data=src)
    scale = [0.5, 0.25, 2.0, 1.0, 0.125, 4.0, 1.5, 0.75]
    out = tmp_path / "o.zarr"
    code, _, err = run(capsys, "ascend_dequant", "--input", str(tmp_path / "src.zarr"), "--param",
                       f"deq_scale={scale}", "--param", f"dst_dtype={dst_dtype}", "--output", str(out), *QUICK)
    assert code == 0, err
    packed = ops.pack_deq_scale(np.float32(scale)) if dst_dtype == "float16" else np.float32(scale)
    expected = ops.ascend_dequant(src, packed, dst_dtype=dst_dtype)
    np.testing.assert_array_equal(xr.open_zarr(out)["result"].values, expected)


def test_a_dry_run_with_overwrite_says_the_run_replaces_the_output(capsys, tmp_path, field):
    root, _ = field
    out = tmp_path / "taken.zarr"
    out.mkdir()
    args = ["space_to_depth", "--input", str(root / "field.zarr"), "--param", "block_size=2", "--output", str(out),
            "--dry-run"]
    code, printed, err = run(capsys, *args)
    assert code == 0, err
    assert "(exists: the run needs --overwrite)" in printed
    code, printed, err = run(capsys, *args, "--overwrite")
    assert code == 0, err
    assert "(exists: the run replaces it)" in printed and "needs --overwrite" not in printed


def test_advice_on_dims_is_in_command_line_terms_and_works(capsys, tmp_path):
    """The accessor's advice (.ops.OP(..., dims={...}), arr.expand_dims(...)) was Python; run
    says --param 'dims=...' as JSON, and the input to change when a dim must be added."""
    raster = xr.Dataset({"r": (("band", "y", "x"), RNG.standard_normal((4, 6, 8)).astype(np.float32))})
    raster.to_zarr(tmp_path / "raster.zarr", zarr_format=3)
    code, _, err = run(capsys, "space_to_batch_nd", "--input", str(tmp_path / "raster.zarr"), "--param",
                       "block_shape=[2,2]", "--param", "paddings=[[0,0],[0,0]]", "--output", str(tmp_path / "o.zarr"),
                       *QUICK)
    assert code == 2 and ".ops." not in err and "arr." not in err, err
    assert "--param 'dims={\"N\":\"<batch dim>\"}'" in err and "ds.expand_dims('batch', axis=0)" in err
    code, _, err = run(capsys, "space_to_batch_nd", "--input", str(tmp_path / "raster.zarr"), "--param",
                       "block_shape=[2,2]", "--param", "paddings=[[0,0],[0,0]]", "--param", 'dims={"N":"band"}', "--output", str(tmp_path / "o.zarr"),
                       *QUICK)
    assert code == 0, err
    assert xr.open_zarr(tmp_path / "o.zarr")["r"].sizes["band"] == 16
    field = xr.Dataset({"t": (("time", "lat", "lon"), RNG.standard_normal((2, 4, 6)))})
    field.to_zarr(tmp_path / "field.zarr", zarr_format=3)
    code, _, err = run(capsys, "space_to_depth", "--input", str(tmp_path / "field.zarr"), "--param", "block_size=2",
                       "--output", str(tmp_path / "f.zarr"), *QUICK)
    assert code == 2 and "to the input first (in xarray: ds.expand_dims('channel', axis=3).to_zarr(...))" in err
    xr.open_zarr(tmp_path / "field.zarr").expand_dims("channel", axis=3).to_zarr(tmp_path / "field1.zarr",
                                                                                   zarr_format=3)
    code, _, err = run(capsys, "space_to_depth", "--input", str(tmp_path / "field1.zarr"), "--param",
                       "block_size=2", "--output", str(tmp_path / "f.zarr"), *QUICK)
    assert code == 0, err


def test_a_rule_broken_in_the_list_form_is_said_in_dim_names(capsys, tmp_path, field):
    """block_shape=[2,2] on (time, lat, lon, band): the refusal names lat, as the accessor's
    does, not x.shape[1]."""
    root, _ = field
    code, _, err = run(capsys, "space_to_batch_nd", "--input", str(root / "field.zarr"), "--param",
                       "block_shape=[3,2]", "--param", "paddings=[[0,0],[0,0]]", "--output", str(tmp_path / "o.zarr"),
                       *QUICK)
    assert code == 2, err
    assert "padded size of dim 'lat' (dim 'lat' + paddings['lat'] = 4 + 0 + 0 = 4) must be divisible by " \
           "block_shape['lat'] = 3" in err and "x.shape" not in err
