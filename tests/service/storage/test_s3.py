"""The service on an object store: a data root ``s3://bucket/prefix`` on a real S3-compatible
server (moto in server mode, started on 127.0.0.1 for this module), with Dask worker
processes that read and write the bucket themselves.

The API process's own S3 calls are recorded (a wrapper on s3fs's one entry point to the S3
API, in this process only: the workers are separate processes), so a test can check that a
job's chunk bytes never pass through it.
"""

from __future__ import annotations

import dataclasses
import io
import json
import threading
import time
import zipfile
from pathlib import Path

import dask
import numpy as np
import pytest
import s3fs
import uvicorn
import xarray as xr
from fastapi.testclient import TestClient

import ops
from ops import dtypes
from service.api.app import create_app
from service.api.state import services
from service.jobs.execution import Executor
from service.storage.s3 import STORAGE_UNAVAILABLE, ObjectArrayStore, StorageUnavailable, open_store
from tests.service.conftest import NPY, assert_problem, eventually, inline, load_npy, make_settings, npy_bytes
from tests.service.processes import dask_processes, free_port
from tests.service.storage.moto_server import KEY, SECRET, moto_bucket, raw_fs, start_moto, stop_moto

BUCKET = "tensors"
PREFIX = "service"
CHUNK_BYTES = 64 * 1024


# --- the S3 server and the service on it --------------------------------------------------

@pytest.fixture(scope="module")
def endpoint():
    with moto_bucket(BUCKET) as url:
        yield url


class S3Calls:
    """The S3 API calls this process makes (method, key), while recording."""

    def __init__(self):
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def install(self, monkeypatch) -> None:
        original = s3fs.S3FileSystem._call_s3
        calls = self

        async def recorded(fs, method, *args, **kwargs):
            with calls.lock:
                calls.calls.append((method, str(kwargs.get("Key", ""))))
            return await original(fs, method, *args, **kwargs)

        monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", recorded)

    def clear(self) -> None:
        with self.lock:
            self.calls.clear()

    def gets(self, key_part: str) -> list[str]:
        with self.lock:
            return [key for method, key in self.calls if method == "get_object" and key_part in key]


@pytest.fixture(scope="module")
def s3_calls():
    patch = pytest.MonkeyPatch()
    calls = S3Calls()
    calls.install(patch)
    yield calls
    patch.undo()


def s3_settings(endpoint: str, state_dir: Path, **overrides):
    values = dict(data_root=f"s3://{BUCKET}/{PREFIX}", state_dir=state_dir, s3_endpoint_url=endpoint,
                  s3_key=KEY, s3_secret=SECRET, chunk_bytes=CHUNK_BYTES)
    values.update(overrides)
    return make_settings(values.pop("data_root"), **values)


@pytest.fixture(scope="module")
def client(endpoint, s3_calls, tmp_path_factory):
    """The service on s3://tensors/service with one Dask worker process."""
    settings = s3_settings(endpoint, tmp_path_factory.mktemp("state"), cluster_processes=True, n_workers=1,
                           threads_per_worker=2, memory_limit="1GiB")
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def bucket(endpoint):
    return raw_fs(endpoint)


def store_of(client) -> ObjectArrayStore:
    return client.app.state.services.store


# --- helpers --------------------------------------------------------------------------------

def put(client, name: str, array: np.ndarray, **params):
    headers = {"Content-Type": NPY}
    wire = array
    if array.dtype == dtypes.bfloat16:
        wire = array.view("<u2")
        headers["X-Array-Dtype"] = "bfloat16"
    response = client.put(f"/arrays/{name}", content=npy_bytes(wire), headers=headers, params=params)
    assert response.status_code == 201, response.text
    return response.json()


def execute(client, process: str, inputs: dict, *, mode: str, name: str | None = None, headers=None):
    output = {"format": {"mediaType": NPY}, "transmissionMode": mode}
    if name:
        output["name"] = name
    return client.post(f"/processes/{process}/execution", headers=headers or {},
                       json={"inputs": inputs, "outputs": {"result": output}, "response": "raw"})


def wait_job(client, job_id: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        info = client.get(f"/jobs/{job_id}").json()
        if info["status"] not in ("accepted", "running"):
            return info
        assert time.monotonic() < deadline, info
        time.sleep(0.05)


def depth_to_space(x: np.ndarray, block: int) -> np.ndarray:
    """NHWC DepthToSpace (DCR) written out with NumPy reshapes: the truth for the service."""
    n, h, w, c = x.shape
    y = x.reshape(n, h, w, block, block, c // (block * block)).transpose(0, 1, 3, 2, 4, 5)
    return y.reshape(n, h * block, w * block, c // (block * block))


def same_bytes(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


def version_of(bucket, name: str) -> str:
    return json.loads(bucket.cat_file(f"{BUCKET}/{PREFIX}/refs/{name}"))["version"]


def versions(bucket) -> set[str]:
    try:
        return {p.rsplit("/", 1)[-1] for p in bucket.ls(f"{BUCKET}/{PREFIX}/versions", detail=False)}
    except FileNotFoundError:
        return set()


# --- uploads and downloads ----------------------------------------------------------------

@pytest.mark.smoke
def test_npy_upload_and_download_byte_for_byte(client, bucket):
    x = np.random.default_rng(1).standard_normal((6, 40, 30, 8), dtype=np.float32)  # 230 KiB: 4+ chunks
    info = put(client, "s3_npy", x)
    assert info["shape"] == list(x.shape) and info["dtype"] == "float32"
    downloaded = client.get("/arrays/s3_npy")
    assert downloaded.status_code == 200
    assert downloaded.content == npy_bytes(x)
    # stored as a version under the prefix, named by the pointer; nothing array-like left locally
    version = version_of(bucket, "s3_npy")
    keys = bucket.find(f"{BUCKET}/{PREFIX}/versions/{version}")
    assert f"{BUCKET}/{PREFIX}/versions/{version}/zarr.json" in keys
    assert len([k for k in keys if "/s3_npy/c/" in k]) >= 4
    assert "s3_npy" in [a["name"] for a in client.get("/arrays").json()["arrays"]]
    state = client.app.state.services.settings.state_dir
    assert sorted(p.name for p in state.iterdir() if not p.name.startswith("jobs.sqlite")) == ["tmp"]
    assert list((state / "tmp").iterdir()) == []


def test_bfloat16_fortran_and_rechunked_uploads(client):
    bf = np.arange(2 * 60 * 70, dtype=np.float32).reshape(2, 60, 70).astype(dtypes.bfloat16)
    put(client, "s3_bf16", bf, chunks="1,32,-1")
    got = client.get("/arrays/s3_bf16")
    assert got.headers["x-array-dtype"] == "bfloat16"
    same_bytes(load_npy(got.content).view(dtypes.bfloat16), bf)
    assert client.get("/arrays/s3_bf16/info").json()["chunks"] == [1, 32, 70]
    f = np.asfortranarray(np.arange(300 * 90, dtype=np.int32).reshape(300, 90))
    put(client, "s3_fortran", f)
    same_bytes(load_npy(client.get("/arrays/s3_fortran").content), np.ascontiguousarray(f))


def test_zipped_zarr_upload(client, tmp_path):
    values = np.random.default_rng(2).integers(-1000, 1000, (2, 8, 6, 4)).astype(np.int16)
    ds = xr.Dataset({"image": (("n", "y", "x", "band"), values, {"units": "counts"})},
                    coords={"y": np.arange(8) * 10.0}, attrs={"title": "zip on s3"})
    ds.to_zarr(tmp_path / "in.zarr", zarr_format=3, consolidated=True)
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted((tmp_path / "in.zarr").rglob("*")):
            if path.is_file():
                zf.write(path, path.relative_to(tmp_path / "in.zarr").as_posix())
    response = client.put("/arrays/s3_zip", content=archive.getvalue(), headers={"Content-Type": "application/zip"})
    assert response.status_code == 201, response.text
    info = client.get("/arrays/s3_zip/info").json()
    assert info["dims"] == ["n", "y", "x", "band"] and info["attrs"]["units"] == "counts"
    assert info["attrs"]["title"] == "zip on s3"
    same_bytes(load_npy(client.get("/arrays/s3_zip").content), values)


# --- executions ----------------------------------------------------------------------------

def test_sync_inline_and_reference(client):
    x = np.random.default_rng(3).integers(0, 100, (1, 4, 4, 8)).astype(np.int32)
    inline_value = execute(client, "depth_to_space", {"x": inline(x), "block_size": 2}, mode="value")
    assert inline_value.status_code == 200, inline_value.text
    same_bytes(load_npy(inline_value.content), depth_to_space(x, 2))
    stored = execute(client, "depth_to_space", {"x": inline(x), "block_size": 2}, mode="reference",
                     name="s3_sync_inline")
    assert stored.status_code == 204, stored.text  # response raw, transmission reference: a Link
    same_bytes(load_npy(client.get("/arrays/s3_sync_inline").content), depth_to_space(x, 2))

    big = np.random.default_rng(4).standard_normal((4, 32, 32, 16), dtype=np.float32)  # 256 KiB: 4 chunks
    put(client, "s3_sync_in", big)
    response = execute(client, "depth_to_space", {"x": {"href": "/arrays/s3_sync_in"}, "block_size": 2},
                       mode="reference", name="s3_sync_out")
    assert response.status_code == 204, response.text
    assert response.links["related"]["url"].endswith("/arrays/s3_sync_out"), response.headers
    same_bytes(load_npy(client.get("/arrays/s3_sync_out").content), depth_to_space(big, 2))


def test_async_job_chunks_never_pass_through_the_api(client, bucket, s3_calls):
    x = np.random.default_rng(5).standard_normal((8, 32, 32, 16), dtype=np.float32)  # 512 KiB: 8 chunks
    put(client, "s3_job_in", x)
    input_version = version_of(bucket, "s3_job_in")
    s3_calls.clear()
    response = execute(client, "depth_to_space", {"x": {"href": "/arrays/s3_job_in"}, "block_size": 2},
                       mode="reference", name="s3_job_out", headers={"Prefer": "respond-async"})
    assert response.status_code == 201, response.text
    job_id = response.json()["jobID"]
    assert wait_job(client, job_id)["status"] == "successful"
    output_version = version_of(bucket, "s3_job_out")
    assert output_version.startswith(f"job-{job_id}-")
    chunk_keys = [k for k in bucket.find(f"{BUCKET}/{PREFIX}/versions/{output_version}") if "/c/" in k]
    assert len(chunk_keys) >= 8  # the workers wrote the result's chunks ...
    # ... and read the input's, while this process read only metadata and pointers
    read_here = s3_calls.gets(f"versions/{input_version}/") + s3_calls.gets(f"versions/{output_version}/")
    assert read_here and all(key.endswith("zarr.json") for key in read_here), read_here
    assert not any(method == "put_object" and "/c/" in key for method, key in s3_calls.calls)

    # the recorder does see chunk reads made here: the download reads every output chunk
    s3_calls.clear()
    same_bytes(load_npy(client.get("/arrays/s3_job_out").content), depth_to_space(x, 2))
    assert len([k for k in s3_calls.gets(f"versions/{output_version}/") if "/c/" in k]) == len(chunk_keys)
    status = json.dumps(client.get(f"/jobs/{job_id}").json())
    assert SECRET not in status and KEY not in status


def test_job_failing_on_the_workers_leaves_no_version(client, bucket):
    params = np.random.default_rng(6).standard_normal((64, 256), dtype=np.float32)
    indices = np.random.default_rng(7).integers(0, 64, size=(4000, 1), dtype=np.int64)
    indices[3900, 0] = 64  # out of range in the last of 8 blocks: the first ones are written
    put(client, "s3_fail_params", params)
    put(client, "s3_fail_indices", indices, chunks="500,1")
    before = versions(bucket)
    response = execute(client, "gather_nd", {"params": {"href": "/arrays/s3_fail_params"},
                                             "indices": {"href": "/arrays/s3_fail_indices"}},
                       mode="reference", name="s3_fail_out", headers={"Prefer": "respond-async"})
    assert response.status_code == 201
    info = wait_job(client, response.json()["jobID"])
    assert info["status"] == "failed" and "out of range" in info["message"], info
    assert_problem(client.get("/arrays/s3_fail_out/info"), 404)
    assert eventually(lambda: versions(bucket) == before), versions(bucket) - before


def _scratch_objects(bucket, prefix: str = PREFIX) -> list[str]:
    bucket.invalidate_cache()
    return bucket.find(f"{BUCKET}/{prefix}/scratch")


# Function scope: gone before a later test starts an app with worker processes (a live app's
# thread pool, in Dask's global config, cannot be sent to a new worker process).
@pytest.fixture
def external_client(endpoint, s3_calls, tmp_path_factory):
    """The service on s3://tensors/external with an external Dask scheduler (``dask scheduler``
    and one ``dask worker`` process): workers that may share no disk with the service."""
    with dask_processes(tmp_path_factory.mktemp("dask-logs"), workers=1, nthreads=2) as (address, _, _):
        settings = s3_settings(endpoint, tmp_path_factory.mktemp("state"), data_root=f"s3://{BUCKET}/external",
                               scheduler=address)
        with TestClient(create_app(settings)) as test_client:
            yield test_client


def _large_gather(client, monkeypatch, s3_calls) -> list[str]:
    """Run GatherNd past the broadcast limit (array.chunk-size lowered to 256 KiB) as a job,
    check its result byte for byte and that its scratch plan ran; the scratch URLs it used."""
    params = np.random.default_rng(8).standard_normal((2048, 64), dtype=np.float32)  # 512 KiB
    indices = np.random.default_rng(9).integers(-2048, 2048, size=(6000, 1), dtype=np.int64)
    put(client, "scratch_params", params, chunks="256,64")
    put(client, "scratch_indices", indices, chunks="1000,1")
    store, used = store_of(client), []
    scratch = store.scratch

    def recording(prefix):
        location, remove = scratch(prefix)
        used.append(location["url"])
        return location, remove

    monkeypatch.setattr(store, "scratch", recording)
    s3_calls.clear()
    with dask.config.set({"array.chunk-size": "256KiB"}):
        response = execute(client, "gather_nd", {"params": {"href": "/arrays/scratch_params"},
                                                 "indices": {"href": "/arrays/scratch_indices"}},
                           mode="reference", name="scratch_out", headers={"Prefer": "respond-async"})
        assert response.status_code == 201, response.text
        info = wait_job(client, response.json()["jobID"])
    assert info["status"] == "successful", info
    dask_client = client.app.state.services.cluster.live_client()
    prefixes = dask_client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.task_prefixes))
    assert {"gather_nd-split", "gather_nd-serve"} <= set(prefixes)  # the scratch plan ran
    # The workers wrote and read the scratch files; this process only removed them.
    here = {method for method, key in s3_calls.calls if "/scratch/" in key}
    assert not here & {"get_object", "put_object", "create_multipart_upload", "upload_part"}, here
    same_bytes(load_npy(client.get("/arrays/scratch_out").content), ops.gather_nd(params, indices))
    return used


def test_a_large_gather_on_an_external_cluster_goes_through_scratch_objects_in_the_bucket(
        external_client, bucket, s3_calls, monkeypatch):
    """Workers of an external scheduler reach the bucket: the all-to-all writes its
    intermediate objects under scratch/ in the data root, and none is left when the job ends."""
    used = _large_gather(external_client, monkeypatch, s3_calls)
    assert len(used) == 1 and used[0].startswith(f"s3://{BUCKET}/external/scratch/job-"), used
    assert _scratch_objects(bucket, "external") == []


def test_a_large_gather_on_the_embedded_cluster_keeps_its_scratch_on_local_disk(client, bucket, s3_calls,
                                                                               monkeypatch):
    """The embedded cluster's workers are processes on this machine: the gathered rows go
    through a directory under the state dir's tmp/, not through the bucket, which is gone
    when the job ends."""
    used = _large_gather(client, monkeypatch, s3_calls)
    tmp = store_of(client).tmp
    assert len(used) == 1 and Path(used[0]).parent == tmp, (used, tmp)
    assert not Path(used[0]).exists()
    assert _scratch_objects(bucket) == []
    assert not [key for _, key in s3_calls.calls if "/scratch/" in key]


def test_scratch_files_upload_in_small_parts(endpoint, bucket):
    """A serve task writes one file per group of params blocks (tens of MiB): it goes up in
    5 MiB parts as it is written, not buffered whole in the task's memory first."""
    from ops._scratch import UPLOAD_PART_BYTES, Scratch

    options = {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": endpoint}}
    run = Scratch(f"s3://{BUCKET}/{PREFIX}/scratch/parts-test", options)
    piece = bytes(range(256)) * (2**20 // 256)  # 1 MiB
    with run.open_write("pieces/0-0") as f:
        for _ in range(12):
            f.write(piece)
            assert f.buffer.tell() < UPLOAD_PART_BYTES + len(piece)  # never more than a part
        assert len(f.parts) == 2  # 10 of the 12 MiB are uploaded already
    assert run.read("pieces/0-0") == piece * 12
    run.remove()
    assert _scratch_objects(bucket) == []


@pytest.mark.parametrize("mib", [1, 12])
def test_a_scratch_file_whose_writer_fails_is_not_published(endpoint, bucket, mib):
    """Small (one PUT) or in parts (a multipart upload): an error while writing leaves no
    object, and no multipart upload open on the server."""
    from ops._scratch import Scratch

    options = {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": endpoint}}
    run = Scratch(f"s3://{BUCKET}/{PREFIX}/scratch/failed-write", options)
    with pytest.raises(RuntimeError, match="the task failed"):
        with run.open_write("pieces/0-0") as f:
            for _ in range(mib):
                f.write(b"x" * 2**20)
            raise RuntimeError("the task failed")
    assert _scratch_objects(bucket) == []
    uploads = bucket.call_s3("list_multipart_uploads", Bucket=BUCKET)
    assert uploads.get("Uploads", []) == []


def test_scratch_files_up_to_four_parts_go_up_in_one_put(endpoint, bucket, s3_calls):
    """A piece file a little over a part (a serve task's rows for one batch) is one PUT, not
    a multipart upload of two parts (four requests, and a server that joins the parts copies
    them again); a larger one still goes up in parts. Whole-file writes are one PUT too."""
    from ops._scratch import SINGLE_UPLOAD_BYTES, UPLOAD_PART_BYTES, Scratch

    options = {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": endpoint}}
    run = Scratch(f"s3://{BUCKET}/{PREFIX}/scratch/single-put", options)
    small = np.random.default_rng(3).integers(0, 256, UPLOAD_PART_BYTES + 12345, dtype=np.uint8)
    large = np.random.default_rng(4).integers(0, 256, SINGLE_UPLOAD_BYTES + 1, dtype=np.uint8)
    layout = [("pieces/0-0", 0, small.nbytes), ("pieces/0-1", small.nbytes, large.nbytes)]
    s3_calls.clear()
    with run.open_write_at(layout) as out:
        out.write_at(small.nbytes, large.data)
        out.write_at(0, small.data)
    run.write("requests/0", memoryview(small))  # a memoryview, as the split task writes
    puts = [key.rsplit("/single-put/", 1)[1] for method, key in s3_calls.calls
            if method == "put_object" and "/single-put/" in key]
    assert puts == ["pieces/0-0", "requests/0"], s3_calls.calls
    # The server's own account: a multipart object's ETag ends in "-<number of parts>".
    names = ("pieces/0-0", "pieces/0-1", "requests/0")
    etags = {name: bucket.info(run.path(name))["ETag"].strip('"') for name in names}
    assert "-" not in etags["pieces/0-0"] and "-" not in etags["requests/0"], etags
    assert etags["pieces/0-1"].endswith("-5"), etags
    assert run.read("pieces/0-0") == small.tobytes() and run.read("pieces/0-1") == large.tobytes()
    assert run.read("requests/0") == small.tobytes()
    run.remove()
    assert _scratch_objects(bucket) == []


def test_scratch_files_written_at_offsets_go_up_whole_at_the_end(endpoint, bucket):
    """A serve task writes its piece files out of order (block by block): through a local
    temporary file, then one upload per file; nothing is published if the task fails."""
    from ops._scratch import Scratch

    options = {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": endpoint}}
    run = Scratch(f"s3://{BUCKET}/{PREFIX}/scratch/write-at", options)
    first, second = bytes(range(256)) * 4096, bytes(range(255, -1, -1)) * 8192  # 1 MiB, 2 MiB
    layout = [("pieces/0-0", 100, len(first)), ("pieces/0-1", 100 + len(first), len(second))]
    with pytest.raises(RuntimeError, match="the task failed"):
        with run.open_write_at(layout) as out:
            out.write_at(100, first)
            raise RuntimeError("the task failed")
    assert _scratch_objects(bucket) == []
    with run.open_write_at(layout) as out:
        out.write_at(100 + len(first) - 10, first[-10:] + second[:1000])  # across the two files
        out.write_at(100 + len(first) + 1000, second[1000:])
        out.write_at(100, first[:-10])
        assert _scratch_objects(bucket) == []  # published at the end only
    assert run.read("pieces/0-0") == first and run.read("pieces/0-1") == second
    run.remove()


def test_zarr_chunks_go_up_as_the_codec_made_them(endpoint, bucket, monkeypatch):
    """Jobs write through ``service.storage.fsspec_store.ObjectStore``: the request body of a chunk is
    the ``bytes`` object the codec produced (zarr's own ``FsspecStore`` sends a copy of it, 16
    MiB more per write on a worker), and what is stored reads back as written."""
    import zarr
    from zarr.codecs import ZstdCodec
    from zarr.core.buffer import cpu
    from zarr.core.sync import sync
    from zarr.storage import FsspecStore

    from service.storage.fsspec_store import ObjectStore

    bodies, encoded = {}, []
    send, encode = s3fs.S3FileSystem._call_s3, ZstdCodec._encode_single

    async def sent(fs, method, *args, **kwargs):
        if method == "put_object":
            bodies[kwargs["Key"]] = kwargs["Body"]
        return await send(fs, method, *args, **kwargs)

    async def encoded_by_zstd(codec, chunk, spec):
        out = await encode(codec, chunk, spec)
        encoded.append(out.as_numpy_array().base)
        return out

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", sent)
    monkeypatch.setattr(ZstdCodec, "_encode_single", encoded_by_zstd)
    options = {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": endpoint}}
    url = f"s3://{BUCKET}/{PREFIX}/no-copy-test.zarr"
    key = f"{PREFIX}/no-copy-test.zarr"
    store = ObjectStore.from_url(url, storage_options=options, read_only=False)
    data = bytes(range(256)) * 4096
    sync(store.set("whole", cpu.Buffer.from_bytes(data)))
    assert bodies[f"{key}/whole"] is data
    sync(store.set("part", cpu.Buffer.from_bytes(data)[16:]))  # a view of part of it: copied
    assert bodies[f"{key}/part"] == data[16:]
    x = np.random.default_rng(5).random((4, 64, 32), dtype=np.float32)
    z = zarr.create_array(store, name="x", shape=x.shape, chunks=(1, 64, 32), dtype=x.dtype,
                          compressors=[ZstdCodec(level=0)])
    z[...] = x
    chunks = [body for k, body in bodies.items() if k.startswith(f"{key}/x/c/")]
    assert len(chunks) == 4 and all(any(body is made for made in encoded) for body in chunks)
    plain = FsspecStore.from_url(url, storage_options=options, read_only=True)
    same_bytes(zarr.open_array(plain, path="x")[...], x)
    bucket.rm(f"{BUCKET}/{key}", recursive=True)


def test_a_chunk_is_read_with_one_get(endpoint, bucket, monkeypatch, tmp_path):
    """With the service's s3fs options a whole-object read is one GET: s3fs's default
    (max_concurrency 10) asks for the object's size with a HEAD before every chunk it reads.
    A max_concurrency in the configured storage options still wins."""
    import zarr

    from service.storage.fsspec_store import ObjectStore
    from service.storage.s3_config import storage_options

    methods = []
    send = s3fs.S3FileSystem._call_s3

    async def sent(fs, method, *args, **kwargs):
        methods.append(method)
        return await send(fs, method, *args, **kwargs)

    settings = s3_settings(endpoint, tmp_path)
    options = storage_options(settings)
    assert options["max_concurrency"] == 1
    assert storage_options(s3_settings(endpoint, tmp_path, storage_options={"max_concurrency": 4}))[
        "max_concurrency"] == 4
    url = f"s3://{BUCKET}/{PREFIX}/one-get-test.zarr"
    x = np.arange(4 * 64, dtype=np.float32).reshape(4, 64)
    z = zarr.create_array(ObjectStore.from_url(url, storage_options=options, read_only=False),
                          shape=x.shape, chunks=(1, 64), dtype=x.dtype)
    z[...] = x
    reader = zarr.open_array(ObjectStore.from_url(url, storage_options=options, read_only=True))
    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", sent)
    same_bytes(reader[...], x)
    assert methods.count("get_object") == 4 and "head_object" not in methods, methods
    bucket.rm(f"{BUCKET}/{PREFIX}/one-get-test.zarr", recursive=True)


def test_the_start_up_sweep_removes_scratch_left_by_a_stopped_service(client, bucket):
    bucket.pipe(f"{BUCKET}/{PREFIX}/scratch/job-x-1/gather_nd-abc/requests/0", b"left")
    store_of(client).sweep()
    assert _scratch_objects(bucket) == []


def test_a_worker_losing_the_store_is_a_503(client):
    from botocore.exceptions import EndpointConnectionError

    store = store_of(client)
    error = store.storage_error(EndpointConnectionError(endpoint_url="http://127.0.0.1:9/tensors"))
    assert error.status == 503 and error.type == STORAGE_UNAVAILABLE and f"s3://{BUCKET}/{PREFIX}" in error.detail
    assert store.storage_error(ValueError("a bug")) is None
    leaked = store.storage_error(PermissionError(f"denied for {KEY} / {SECRET}"))
    assert SECRET not in leaked.detail and KEY not in leaked.detail


# --- replacing and deleting ---------------------------------------------------------------

def test_overwrite_keeps_the_old_version_for_readers_that_started(client, bucket):
    old = np.arange(64 * 1024, dtype=np.float64).reshape(32, 2048)  # 512 KiB: many pieces
    new = -np.arange(10 * 10, dtype=np.int8).reshape(10, 10)
    put(client, "s3_over", old)
    old_version = version_of(bucket, "s3_over")
    store = store_of(client)
    dtype, length, pieces = store.iter_npy("s3_over", piece_bytes=16 * 1024)  # a download under way
    first = next(pieces)
    put(client, "s3_over", new, overwrite="true")
    assert version_of(bucket, "s3_over") != old_version
    same_bytes(load_npy(client.get("/arrays/s3_over").content), new)
    assert old_version in versions(bucket)  # kept for the reader
    body = first + b"".join(pieces)
    assert len(body) == length and dtype == old.dtype
    same_bytes(load_npy(body), old)
    del pieces
    assert eventually(lambda: old_version not in versions(bucket) and not store._pins.waiting())
    # without ?overwrite the name is taken
    assert_problem(client.put("/arrays/s3_over", content=npy_bytes(new), headers={"Content-Type": NPY}), 409)


def test_delete(client, bucket):
    put(client, "s3_delete", np.ones((3, 3), np.uint8))
    version = version_of(bucket, "s3_delete")
    assert client.delete("/arrays/s3_delete").status_code == 204
    assert_problem(client.get("/arrays/s3_delete/info"), 404)
    assert_problem(client.delete("/arrays/s3_delete"), 404)
    assert "s3_delete" not in [a["name"] for a in client.get("/arrays").json()["arrays"]]
    assert version not in versions(bucket)


# --- Zarr over HTTP -----------------------------------------------------------------------

def test_zarr_keys_ranges_and_path_safety(client, bucket):
    x = np.arange(4 * 100, dtype=np.int32).reshape(4, 100)
    put(client, "s3_keys", x, chunks="1,100")
    version = version_of(bucket, "s3_keys")
    stored = bucket.cat_file(f"{BUCKET}/{PREFIX}/versions/{version}/s3_keys/c/2/0")
    whole = client.get("/arrays/s3_keys/zarr/s3_keys/c/2/0")
    assert whole.status_code == 200 and whole.content == stored
    part = client.get("/arrays/s3_keys/zarr/s3_keys/c/2/0", headers={"Range": "bytes=3-10"})
    assert part.status_code == 206 and part.content == stored[3:11]
    assert part.headers["content-range"] == f"bytes 3-10/{len(stored)}"
    head = client.head("/arrays/s3_keys/zarr/zarr.json")
    assert head.status_code == 200 and int(head.headers["content-length"]) > 0
    assert_problem(client.get("/arrays/s3_keys/zarr/s3_keys/c/2/0", headers={"Range": "bytes=9999-"}), 416)
    meta = client.get("/arrays/s3_keys/zarr/zarr.json").json()
    assert meta["consolidated_metadata"]["metadata"]["s3_keys"]["shape"] == [4, 100]
    # keys outside the array's version are never served
    put(client, "s3_other", np.zeros(3, np.int8))
    for key in ("../s3_other/zarr.json", "..%2Fs3_other%2Fzarr.json", "s3_keys/c", "nope", "s3_keys/c/9/0",
                "../../refs/s3_other", "..%2F..%2Frefs%2Fs3_other"):
        response = client.get(f"/arrays/s3_keys/zarr/{key}")
        assert response.status_code in (400, 404), (key, response.status_code)
    store = store_of(client)  # past the HTTP client's own normalisation of ".."
    for key in ("../s3_other/zarr.json", "../../refs/s3_other", "./zarr.json", "s3_keys//c/2/0", "/zarr.json"):
        assert store.open_key("s3_keys", key) is None, key
    assert store.open_key("s3_keys", "s3_keys/c/2/0").read(0, len(stored)) == stored


def test_xarray_open_zarr_over_http(client):
    x = np.random.default_rng(7).standard_normal((2, 16, 16, 4), dtype=np.float32)
    put(client, "s3_http", x, dims="n,y,x,c", chunks="1,8,16,4")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(client.app, host="127.0.0.1", port=port, lifespan="off",
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert eventually(lambda: server.started, timeout=10)
        ds = xr.open_zarr(f"http://127.0.0.1:{port}/arrays/s3_http/zarr", consolidated=True, zarr_format=3)
        assert list(ds["s3_http"].dims) == ["n", "y", "x", "c"]
        same_bytes(ds["s3_http"].values, x)
    finally:
        server.should_exit = True
        thread.join(10)


# --- bad settings and a failing store -----------------------------------------------------

def test_missing_bucket_refuses_to_start(endpoint, tmp_path):
    settings = s3_settings(endpoint, tmp_path, data_root="s3://no-such-bucket/x")
    with pytest.raises(StorageUnavailable, match=r"s3://no-such-bucket/x.*bucket 'no-such-bucket' does not exist"):
        open_store(settings)
    with pytest.raises(StorageUnavailable, match="does not exist"):  # the app does not start either
        with TestClient(create_app(settings)):
            pass
    created = open_store(s3_settings(endpoint, tmp_path, data_root="s3://made-at-start/x", s3_create_bucket=True))
    assert created.names() == [] and raw_fs(endpoint).exists("made-at-start")


def test_unreachable_endpoint_refuses_to_start(tmp_path):
    port = free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(StorageUnavailable) as caught:
        open_store(s3_settings(f"http://127.0.0.1:{port}", tmp_path))
    message = str(caught.value)
    assert f"s3://{BUCKET}/{PREFIX}" in message and f"127.0.0.1:{port}" in message, message
    assert SECRET not in message
    assert time.monotonic() - started < 20


def test_bad_data_root_url(tmp_path):
    with pytest.raises(StorageUnavailable, match="s3://BUCKET"):
        open_store(make_settings("gs://somewhere/x", state_dir=tmp_path))


def test_store_going_away_is_a_503(client, tmp_path):
    """The module's app, its routes served from a store on a second S3 server that stops."""
    process, url = start_moto()
    try:
        raw_fs(url).mkdir(BUCKET)
        no_retries = {"config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 1}}}
        doomed = open_store(s3_settings(url, tmp_path, storage_options=no_retries))
        real = client.app.state.services
        executor = Executor(doomed, real.records, real.cluster, max_inline_bytes=real.executor.max_inline_bytes)
        client.app.dependency_overrides[services] = lambda: dataclasses.replace(real, store=doomed,
                                                                                 executor=executor)
        put(client, "doomed", np.ones(4, np.int16))
        stop_moto(process)
        for response in (client.get("/arrays"), client.get("/arrays/doomed"),
                         client.get("/arrays/doomed/zarr/zarr.json"), client.delete("/arrays/doomed"),
                         client.put("/arrays/more", content=npy_bytes(np.ones(3)), headers={"Content-Type": NPY}),
                         execute(client, "depth_to_space", {"x": {"href": "/arrays/doomed"}, "block_size": 2},
                                 mode="value")):
            body = assert_problem(response, 503, STORAGE_UNAVAILABLE)
            assert f"s3://{BUCKET}/{PREFIX}" in body["detail"] and SECRET not in body["detail"], body
    finally:
        client.app.dependency_overrides.clear()
        stop_moto(process)
    assert client.get("/arrays").status_code == 200  # the module's store again
