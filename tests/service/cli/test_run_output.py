"""What ``chunked-tensor-ops run`` writes besides the values: coordinates in one chunk each,
and no library warnings on the user's terminal."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import xarray as xr

from service.cli import main as cli


@pytest.mark.smoke
def test_coordinates_are_one_chunk_and_no_warnings_leak(tmp_path, capsys):
    xr.Dataset({"v": (("time", "y", "x", "c"), np.zeros((64, 8, 8, 1), np.float32))},
               coords={"time": np.arange(64)}).chunk({"time": 1}).to_zarr(tmp_path / "in.zarr", zarr_format=3)
    out = tmp_path / "out.zarr"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        code = cli.main(["run", "space_to_batch_nd", "--input", str(tmp_path / "in.zarr"), "--param",
                         "block_shape=[2,2]", "--param", "paddings=[[0,0],[0,0]]", "--output", str(out),
                         "--in-process", "--quiet"])
    assert code == 0, capsys.readouterr().err
    assert [str(w.message) for w in seen] == []
    # 256 output blocks along time; the source_time labels are one chunk, not 256 files
    chunk_files = [p for p in (out / "source_time").rglob("*") if p.is_file() and p.name != "zarr.json"]
    assert len(chunk_files) == 1
    assert xr.open_zarr(out)["v"].sizes["time"] == 256
