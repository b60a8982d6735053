"""``chunked-tensor-ops run`` with inputs and outputs in object storage (``s3://``), against a
real S3-compatible server (moto in server mode on 127.0.0.1, started for this module).

The truth is NumPy's kernel on the same array, byte for byte, and what another S3 client
(s3fs of our own, xarray) finds in the bucket: a finished output is a Zarr group, a failed or
unfinished one is not there at all, and a failed replacement leaves the old output as it was.
"""

from __future__ import annotations

import sys
from pathlib import Path

import dask
import numpy as np
import pytest
import xarray as xr
import zarr
from zarr.storage import FsspecStore

import ops
from service.cli import main as cli
from service.storage.run_storage import HeldRootStore
from tests.helpers import assert_same
from tests.service.processes import dask_processes, free_port
from tests.service.storage.moto_server import KEY, SECRET, moto_bucket, raw_fs

BUCKET = "batch"
RNG = np.random.default_rng(31)
IMAGE = RNG.standard_normal((2, 8, 8, 16), dtype=np.float32)
PARAMS = RNG.standard_normal((10, 8, 3), dtype=np.float32)
POINTS = np.stack([RNG.integers(-10, 10, 40), RNG.integers(0, 8, 40)], axis=1).astype(np.int64)
QUICK = ["--in-process", "--n-workers", "1", "--threads-per-worker", "2"]


@pytest.fixture(scope="module")
def endpoint():
    with moto_bucket(BUCKET) as url:
        yield url


@pytest.fixture
def s3_env(endpoint, monkeypatch):
    """The settings ``run`` reads, as a user sets them: environment variables."""
    monkeypatch.setenv("CHUNKED_TENSOR_OPS_S3_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("CHUNKED_TENSOR_OPS_S3_KEY", KEY)
    monkeypatch.setenv("CHUNKED_TENSOR_OPS_S3_SECRET", SECRET)
    return endpoint


@pytest.fixture
def bucket(endpoint):
    return raw_fs(endpoint)


def options(endpoint) -> dict:
    return {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": endpoint}}


def s3_store(endpoint, path: str, read_only: bool = False) -> FsspecStore:
    return FsspecStore.from_url(f"s3://{BUCKET}/{path}", storage_options=options(endpoint), read_only=read_only)


def put_array(endpoint, path: str, array: np.ndarray, chunks, dims=None) -> str:
    """A bare Zarr v3 array in the bucket, written with zarr itself; its URL."""
    extra = {"dimension_names": dims} if dims else {}
    z = zarr.create_array(s3_store(endpoint, path), shape=array.shape, chunks=chunks, dtype=array.dtype, **extra)
    z[...] = array
    return f"s3://{BUCKET}/{path}"


def read_output(endpoint, path: str, variable: str) -> xr.DataArray:
    """The output as xarray reads it from the bucket (no help from this project)."""
    return xr.open_zarr(f"s3://{BUCKET}/{path}", storage_options=options(endpoint), mask_and_scale=False)[variable]


def objects(bucket, prefix: str = "") -> list[str]:
    return sorted(p.removeprefix(f"{BUCKET}/") for p in bucket.find(f"{BUCKET}/{prefix}"))


def main(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["run", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def depth_to_space(x: np.ndarray, block: int) -> np.ndarray:
    n, h, w, c = x.shape
    y = x.reshape(n, h, w, block, block, c // block**2).transpose(0, 1, 3, 2, 4, 5)
    return y.reshape(n, h * block, w * block, c // block**2)


@pytest.fixture
def workspace(bucket, request):
    """A fresh prefix for one test, removed afterwards."""
    prefix = request.node.name.replace("[", "-").replace("]", "")
    yield prefix
    if bucket.exists(f"{BUCKET}/{prefix}"):
        bucket.rm(f"{BUCKET}/{prefix}", recursive=True)


# --- runs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("cluster", ["threads", "processes"])
def test_s3_to_s3_matches_the_numpy_kernel(s3_env, bucket, workspace, capfd, cluster):
    """Worker processes read and write the bucket themselves (the store carries its options),
    and end without reporting open sessions on the run's stderr (capfd: theirs too)."""
    source = put_array(s3_env, f"{workspace}/image.zarr", IMAGE, (1, 4, 4, 16), dims=["n", "y", "x", "c"])
    flags = QUICK if cluster == "threads" else ["--n-workers", "1", "--memory-limit", "1GiB"]
    code, out, err = main(capfd, "depth_to_space", "--input", source, "--param", "block_size=2",
                          "--output", f"s3://{BUCKET}/{workspace}/d2s.zarr", "--quiet", *flags)
    assert code == 0, err
    assert err == "", err
    assert f"wrote s3://{BUCKET}/{workspace}/d2s.zarr (variable result)" in out
    got = read_output(s3_env, f"{workspace}/d2s.zarr", "result")
    assert got.dims == ("n", "y", "x", "c")
    assert_same(got.values, depth_to_space(IMAGE, 2))
    assert objects(bucket, workspace)[0] == f"{workspace}/d2s.zarr/result/c/0/0/0/0"  # nothing left beside
    assert not [p for p in objects(bucket, workspace) if "/." in p]


@pytest.mark.smoke
def test_local_and_s3_mixed(s3_env, bucket, workspace, tmp_path, capsys):
    source = put_array(s3_env, f"{workspace}/image.zarr", IMAGE, (1, 4, 4, 16))
    code, _, err = main(capsys, "space_to_depth", "--input", source, "--param", "block_size=2",
                        "--output", str(tmp_path / "s2d.zarr"), "--quiet", *QUICK)
    assert code == 0, err
    local = xr.open_zarr(tmp_path / "s2d.zarr")["result"].values
    assert_same(local, ops.space_to_depth(IMAGE, 2))
    code, _, err = main(capsys, "depth_to_space", "--input", str(tmp_path / "s2d.zarr"), "--param", "block_size=2",
                        "--output", f"s3://{BUCKET}/{workspace}/back.zarr", "--quiet", *QUICK)
    assert code == 0, err
    assert_same(read_output(s3_env, f"{workspace}/back.zarr", "result").values, IMAGE)  # the round trip


def test_dry_run_reads_metadata_only(s3_env, bucket, workspace, capsys):
    source = put_array(s3_env, f"{workspace}/image.zarr", IMAGE, (1, 4, 4, 16))
    before = objects(bucket)
    code, out, err = main(capsys, "space_to_depth", "--input", source, "--param", "block_size=2",
                          "--output", f"s3://{BUCKET}/{workspace}/s2d.zarr", "--dry-run")
    assert code == 0, err
    assert f"input x: {source}: shape [2, 8, 8, 16] float32" in out
    assert f"output: s3://{BUCKET}/{workspace}/s2d.zarr variable result: shape [2, 4, 4, 64]" in out
    assert objects(bucket) == before


def test_an_output_appears_only_when_every_chunk_is_stored(s3_env, bucket, workspace):
    """``HeldRootStore``: the metadata and chunks are written, the root ``zarr.json`` not,
    until ``release``; before it neither zarr nor xarray finds a group there."""
    fs = raw_fs(s3_env)
    store = HeldRootStore.at(f"s3://{BUCKET}/{workspace}/held.zarr", options(s3_env))
    ds = xr.Dataset({"v": (("a", "b"), np.arange(12.0).reshape(3, 4))}).chunk({"a": 1})
    graph = ds.to_zarr(store, zarr_format=3, consolidated=True, compute=False, mode="w")
    dask.compute(graph)
    stored = objects(fs, workspace)
    assert f"{workspace}/held.zarr/v/zarr.json" in stored and f"{workspace}/held.zarr/v/c/2/0" in stored
    assert f"{workspace}/held.zarr/zarr.json" not in stored
    with pytest.raises(Exception):
        zarr.open_group(s3_store(s3_env, f"{workspace}/held.zarr", read_only=True), mode="r")
    fs.pipe_file(f"{BUCKET}/{workspace}/held.zarr/zarr.json", store.held_root())
    reread = xr.open_zarr(f"s3://{BUCKET}/{workspace}/held.zarr", storage_options=options(s3_env))
    assert_same(reread["v"].values, ds["v"].values)


def test_a_run_that_finds_its_new_output_published_by_another_removes_nothing(s3_env, bucket, workspace):
    """Two runs on one new output: the second to publish is refused and leaves the first's
    output in place (its discard would otherwise remove the whole prefix)."""
    from service.storage.run_storage import ObjectOutput
    from service.settings import Settings

    output = ObjectOutput(f"s3://{BUCKET}/{workspace}/both.zarr", Settings())
    store = output.target()
    xr.Dataset({"v": ("a", np.arange(3.0))}).to_zarr(store, zarr_format=3, consolidated=True, mode="w")
    bucket.pipe_file(f"{BUCKET}/{workspace}/both.zarr/zarr.json", store.held_root())  # the other run publishes
    with pytest.raises(FileExistsError, match="appeared while computing"):
        output.publish(overwrite=False)
    assert not output.discard()
    assert bucket.exists(f"{BUCKET}/{workspace}/both.zarr/zarr.json")


def test_a_failed_run_leaves_nothing_and_a_failed_replacement_keeps_the_old_output(s3_env, bucket, workspace,
                                                                                  capsys):
    """GatherNd finds a bad index only while computing (exit 2): a new output is not there
    afterwards, and an output it was to replace is still whole, byte for byte."""
    params = put_array(s3_env, f"{workspace}/params.zarr", PARAMS, (5, 8, 3))
    bad = POINTS.copy()
    bad[33, 1] = 8
    good_idx = put_array(s3_env, f"{workspace}/good.zarr", POINTS, (10, 2))
    bad_idx = put_array(s3_env, f"{workspace}/bad.zarr", bad, (10, 2))
    out = f"s3://{BUCKET}/{workspace}/picked.zarr"
    inputs_before = objects(bucket, workspace)

    code, _, err = main(capsys, "gather_nd", "--input", params, "--input", f"indices={bad_idx}", "--output", out,
                        "--quiet", *QUICK)
    assert code == 2 and "indices[33, 1] = 8 is out of range for dimension 1 of size 8" in err
    assert objects(bucket, workspace) == inputs_before

    code, _, err = main(capsys, "gather_nd", "--input", params, "--input", f"indices={good_idx}", "--output", out,
                        "--quiet", *QUICK)
    assert code == 0, err
    kept = {p: bucket.cat(f"{BUCKET}/{p}") for p in objects(bucket, f"{workspace}/picked.zarr")}

    code, _, err = main(capsys, "gather_nd", "--input", params, "--input", f"indices={bad_idx}", "--output", out,
                        "--overwrite", "--quiet", *QUICK)
    assert code == 2, err
    assert {p: bucket.cat(f"{BUCKET}/{p}") for p in objects(bucket, f"{workspace}/picked.zarr")} == kept
    assert objects(bucket, workspace) == sorted(inputs_before + list(kept))
    assert_same(read_output(s3_env, f"{workspace}/picked.zarr", "result").values, ops.gather_nd(PARAMS, POINTS))


def test_overwrite_replaces_the_output_whole(s3_env, bucket, workspace, capsys):
    """A replacement with other chunks: none of the old chunk objects survive."""
    source = put_array(s3_env, f"{workspace}/image.zarr", IMAGE, (1, 4, 4, 16))
    out = f"s3://{BUCKET}/{workspace}/out.zarr"
    code, _, err = main(capsys, "space_to_depth", "--input", source, "--param", "block_size=2", "--output", out,
                        "--quiet", *QUICK)
    assert code == 0, err
    code, _, err = main(capsys, "depth_to_space", "--input", source, "--param", "block_size=2", "--output", out,
                        "--quiet", *QUICK)
    assert code == 3 and err.strip().endswith(f"output {out} exists; pass --overwrite to replace it")
    code, _, err = main(capsys, "depth_to_space", "--input", source, "--param", "block_size=2", "--output", out,
                        "--overwrite", "--chunks", "1,8,8,16", "--quiet", *QUICK)
    assert code == 0, err
    assert_same(read_output(s3_env, f"{workspace}/out.zarr", "result").values, depth_to_space(IMAGE, 2))
    chunks = [p for p in objects(bucket, f"{workspace}/out.zarr") if "/c/" in p]
    assert chunks == [f"{workspace}/out.zarr/result/c/{n}/0/0/0" for n in (0, 1)]
    assert not [p for p in objects(bucket, workspace) if "/." in p]  # no build prefix left


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory):
    """The address of a ``dask scheduler`` with one ``dask worker``, each its own process."""
    with dask_processes(tmp_path_factory.mktemp("dask-logs"), workers=1, nthreads=2) as (address, _, _):
        yield address


def _large_gather(s3_env, bucket, workspace, capsys, monkeypatch, *cluster: str) -> str:
    """GatherNd past the broadcast limit (array.chunk-size lowered to 1 KiB) from and to the
    bucket, checked against NumPy; the scratch URL its plan used (nothing of it left)."""
    gather_module = sys.modules["ops.gather_nd.scratch_graph"]
    used = []
    build_scratch = gather_module._build_scratch

    def recording(*args):
        used.append(args[-1].url)
        return build_scratch(*args)

    monkeypatch.setattr(gather_module, "_build_scratch", recording)
    params = put_array(s3_env, f"{workspace}/params.zarr", PARAMS, (5, 8, 3))
    idx = put_array(s3_env, f"{workspace}/idx.zarr", POINTS, (10, 2))
    with dask.config.set({"array.chunk-size": "1KiB"}):
        code, _, err = main(capsys, "gather_nd", "--input", params, "--input", f"indices={idx}",
                            "--output", f"s3://{BUCKET}/{workspace}/picked.zarr", "--quiet", *cluster)
    assert code == 0, err
    assert_same(read_output(s3_env, f"{workspace}/picked.zarr", "result").values, ops.gather_nd(PARAMS, POINTS))
    assert not [p for p in objects(bucket, workspace) if "/." in p]  # no scratch or build prefix left
    assert len(used) == 1, used
    return used[0]


def test_a_large_gather_on_the_embedded_cluster_keeps_its_scratch_on_local_disk(s3_env, bucket, workspace,
                                                                               capsys, monkeypatch, tmp_path):
    """The embedded cluster's workers share this machine's disk: the gathered rows go through
    a directory in Dask's temporary-directory, not through the bucket."""
    with dask.config.set({"temporary-directory": str(tmp_path)}):
        url = _large_gather(s3_env, bucket, workspace, capsys, monkeypatch, *QUICK)
    assert Path(url).parent == tmp_path and Path(url).name.startswith("chunked-tensor-ops-scratch-"), url
    assert not Path(url).exists()  # removed when the run ended


def test_a_large_gather_on_an_external_cluster_puts_its_scratch_beside_the_output(scheduler, s3_env, bucket,
                                                                                  workspace, capsys, monkeypatch):
    """Workers elsewhere may share no disk with this machine: the scratch is a prefix beside
    the output in the bucket, which they reach."""
    url = _large_gather(s3_env, bucket, workspace, capsys, monkeypatch, "--scheduler", scheduler)
    assert url.startswith(f"s3://{BUCKET}/{workspace}/.picked.zarr.scratch-"), url


def test_batch_to_space_on_an_external_cluster_passes_its_parts_through_a_prefix_beside_the_output(
        scheduler, s3_env, bucket, workspace, capsys, monkeypatch):
    """With no room for a bundle of its 4 chunks (array.chunk-size lowered to 1 KiB), each
    chunk is downloaded once and its parts go through the run's scratch prefix in the bucket,
    written and read by the workers and removed by them."""
    graphs = sys.modules["ops.space_batch.graph_batch_to_space"]
    chosen = []
    choose = graphs._choose_batch_to_space

    def recording(plan):
        strategy = choose(plan)
        chosen.append((strategy.__name__, plan.scratch and plan.scratch.url))
        return strategy

    monkeypatch.setattr(graphs, "_choose_batch_to_space", recording)
    batch = RNG.standard_normal((4, 8, 6, 3), dtype=np.float32)
    crops = [[1, 0], [0, 1]]
    source = put_array(s3_env, f"{workspace}/batch.zarr", batch, (1, 4, 6, 3))
    with dask.config.set({"array.chunk-size": "1KiB"}):
        code, _, err = main(capsys, "batch_to_space_nd", "--input", source, "--param", "block_shape=[2,2]",
                            "--param", f"crops={crops}".replace(" ", ""),
                            "--output", f"s3://{BUCKET}/{workspace}/space.zarr", "--quiet", "--scheduler", scheduler)
    assert code == 0, err
    assert_same(read_output(s3_env, f"{workspace}/space.zarr", "result").values,
                ops.batch_to_space_nd(batch, [2, 2], crops))
    assert [name for name, _ in chosen] == ["_batch_to_space_scratch_tasks"], chosen
    assert chosen[0][1].startswith(f"s3://{BUCKET}/{workspace}/.space.zarr.scratch-"), chosen
    assert not [p for p in objects(bucket, workspace) if "/." in p]  # no scratch or build prefix left


# --- refusals, before anything is scheduled -------------------------------------------------


def test_refusals_name_the_url(s3_env, bucket, workspace, capsys):
    source = put_array(s3_env, f"{workspace}/image.zarr", IMAGE, (1, 4, 4, 16))
    args = ["depth_to_space", "--param", "block_size=2", "--quiet", *QUICK]
    cases = [
        (["--input", f"s3://{BUCKET}/{workspace}/none.zarr", "--output", f"s3://{BUCKET}/{workspace}/o.zarr"],
         3, f"input s3://{BUCKET}/{workspace}/none.zarr: nothing is stored there"),
        (["--input", source, "--output", source], 2, f"--output {source} is the input x; write the result elsewhere"),
        (["--input", source, "--output", "s3://no-such-bucket/o.zarr"],
         3, "output s3://no-such-bucket/o.zarr: the bucket no-such-bucket does not exist"),
        (["--input", source, "--output", f"s3://{BUCKET}"],
         3, f"output s3://{BUCKET}: give a prefix inside the bucket (s3://{BUCKET}/out.zarr), not the bucket itself"),
        (["--input", f"s3://{BUCKET}/{workspace}", "--output", f"s3://{BUCKET}/{workspace}/o.zarr"],
         3, f"input s3://{BUCKET}/{workspace} is not a readable Zarr array or group"),
    ]
    before = objects(bucket)
    for flags, want_code, message in cases:
        code, _, err = main(capsys, *args, *flags)
        assert code == want_code, (flags, err)
        assert err.startswith(f"chunked-tensor-ops run: error: {message}"), err
        assert len(err.strip().splitlines()) == 1, err
    assert objects(bucket) == before


def test_an_unreachable_endpoint_is_exit_3_within_seconds(monkeypatch, capsys):
    monkeypatch.setenv("CHUNKED_TENSOR_OPS_S3_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("CHUNKED_TENSOR_OPS_S3_KEY", KEY)
    monkeypatch.setenv("CHUNKED_TENSOR_OPS_S3_SECRET", SECRET)
    monkeypatch.setenv("CHUNKED_TENSOR_OPS_STORAGE_OPTIONS", '{"config_kwargs": {"connect_timeout": 1, '
                                                             '"retries": {"max_attempts": 1}}}')
    code, _, err = main(capsys, "depth_to_space", "--input", "s3://b/in.zarr", "--param", "block_size=2",
                        "--output", "/tmp/never.zarr", *QUICK)
    assert code == 3, err
    assert err.startswith("chunked-tensor-ops run: error: input s3://b/in.zarr cannot be read: "), err
