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


def test_the_dry_run_shown_in_the_docs_is_what_run_prints(tmp_path, capsys, monkeypatch):
    """docs/cli.md's --dry-run example, run as written on the input it describes: the same
    lines (its task counts had gone stale as the plans changed)."""
    import re
    import shlex
    from pathlib import Path

    import zarr

    text = (Path(__file__).resolve().parents[3] / "docs" / "cli.md").read_text()
    block = re.search(r"## `--dry-run`.*?```console\n(.*?)```", text, re.S).group(1)
    command, _, shown = block.partition("\n      ")
    rest, _, shown = shown.partition("\n")
    args = shlex.split(command.removeprefix("$ ").rstrip("\\") + " " + rest)
    assert args[:2] == ["chunked-tensor-ops", "run"] and "--dry-run" in args
    zarr.create_array(str(tmp_path / "padded.zarr"), shape=(2, 6, 5, 16), chunks=(1, 3, 2, 8), dtype="float32",
                      fill_value=0)
    monkeypatch.chdir(tmp_path)
    assert cli.main(args[1:]) == 0
    printed = capsys.readouterr().out.replace(str(tmp_path), "/data")
    assert printed.splitlines() == shown.splitlines()
