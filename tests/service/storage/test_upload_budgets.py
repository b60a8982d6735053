"""The budgets of an upload and of a stored array (service.storage.budgets): chunk count, inner
chunks of a shard, decoded chunk size, strings and the disk quota are checked before any work,
and the chunks of a zipped Zarr store are decoded in a subprocess with a bounded address space
(service.storage.chunk_check), never in the API process. Each refusal is a 413 or a 400 whose
detail names the limit, the value and the setting.

Every attack here was sent to ``python -m service`` with the default limits and cost it
seconds to minutes of CPU, or a gigabyte of memory, or a 500. The last test repeats the
decompression bomb against a real service process and watches its memory."""

from __future__ import annotations

import io
import json
import math
import shutil
import struct
import threading
import time
import tracemalloc
import warnings
import zipfile
from pathlib import Path

import dask.array as da
import google_crc32c
import numpy as np
import psutil
import pytest
import requests
import xarray as xr
import zarr
from fastapi.testclient import TestClient
from numcodecs import GZip, Zstd
from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec

from service.api.app import create_app
from service.storage import npy
from service.storage.blocks import DecodedBlocks
from service.storage.budgets import Budgets
from service.storage.chunk_order import c_order_regions
from tests.service.conftest import NPY, assert_problem, load_npy, make_settings, npy_bytes
from tests.service.processes import start_server, stop_server

KiB, MiB = 2**10, 2**20
ZIP = {"Content-Type": "application/zip"}
BOMB_BYTES = 512 * MiB  # what the bomb's one chunk inflates to (it declares 1 MiB)


def store_entries(ds: xr.Dataset, tmp: Path, encoding: dict | None = None) -> dict[str, bytes]:
    """The files of ``ds`` written as a Zarr v3 store, by their keys."""
    path = tmp / "store.zarr"
    shutil.rmtree(path, ignore_errors=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # consolidated metadata is not in the Zarr v3 spec
        ds.to_zarr(path, zarr_format=3, consolidated=True, encoding=encoding)
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def zip_of(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def edited(entries: dict[str, bytes], variable: str, change) -> dict[str, bytes]:
    """``entries`` with ``change`` applied to the metadata of ``variable``, in its own
    zarr.json and in the consolidated metadata of the root one."""
    own, root = json.loads(entries[f"{variable}/zarr.json"]), json.loads(entries["zarr.json"])
    change(own)
    change(root["consolidated_metadata"]["metadata"][variable])
    return {**entries, f"{variable}/zarr.json": json.dumps(own).encode(), "zarr.json": json.dumps(root).encode()}


def zeros_entries(tmp: Path, n: int, chunk: int) -> dict[str, bytes]:
    """A uint8 variable ``v`` of ``n`` zeros in chunks of ``chunk``: no chunk is stored (each
    one is the fill value), so the tests add the chunk files they mean."""
    ds = xr.Dataset({"v": (("x",), np.zeros(n, np.uint8))})
    return store_entries(ds, tmp, {"v": {"chunks": (chunk,), "fill_value": 0}})


def refused(response, status: int, *needles: str) -> dict:
    body = assert_problem(response, status)
    for needle in needles:
        assert needle in body["detail"], body["detail"]
    return body


@pytest.fixture(scope="module")
def small_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("small-root")


@pytest.fixture(scope="module")
def small(small_root):
    """A service with small budgets: 4 KiB stored chunks, 64 KiB decoded chunks, 1 MiB of disk."""
    settings = make_settings(small_root, chunk_bytes=4 * KiB, max_chunk_bytes=64 * KiB, disk_quota_bytes=MiB)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("stores")


def arrays_in(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "arrays").iterdir())


# --- the wording ------------------------------------------------------------------------------


@pytest.mark.smoke
def test_a_refusal_names_the_limit_and_the_setting():
    budgets = Budgets.of()
    assert budgets.over("max_chunks") == \
        "more than the 10000 of the max_chunks setting (CHUNKED_TENSOR_OPS_MAX_CHUNKS)"
    with pytest.raises(ValueError, match=r"cut shape \[0, 100000\] into 100000 chunks, more than the 10000"):
        budgets.check_grid("x", (0, 100_000), (1, 1), 1, ValueError)  # a zero-length axis counts as 1
    budgets.check_grid("x", (0, 100_000), (1, 10), 1, ValueError)


# --- finding 1: decompression bombs and huge strings ------------------------------------------


def test_a_zstd_bomb_in_a_zipped_store_is_refused_without_decoding_it(client, service_root, tmp):
    """One chunk declared 1 MiB holds a zstd frame of 512 MiB of zeros (16 KiB compressed): the
    service used to inflate it in its own process (a 500). The checker sees the frame's
    content size and stops: a 400 naming the chunk, and the API process allocates nothing."""
    entries = zeros_entries(tmp, 3 * MiB, MiB)
    body = zip_of({**entries, "v/c/0": Zstd(level=1).encode(np.zeros(BOMB_BYTES, np.uint8))})
    assert len(body) < 64 * KiB
    before = arrays_in(service_root)
    tracemalloc.start()
    try:
        response = client.put("/arrays/bomb", content=body, headers=ZIP)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    refused(response, 400, "'v/c/0'", "decodes to more than the 1048576 bytes")
    assert peak < 64 * MiB, peak
    assert arrays_in(service_root) == before


def test_a_huge_string_in_a_coordinate_is_refused(client, service_root, tmp):
    """A vlen-utf8 coordinate holding one string of 1 MiB (past max_string_bytes, 64 KiB) used to
    be stored, and every later open (and every Zarr-over-HTTP reader) inflated it."""
    ds = xr.Dataset({"v": (("x",), np.zeros(2, np.float32))},
                    coords={"x": np.array(["a", "b" * MiB], dtype=object)})
    response = client.put("/arrays/long-string", content=zip_of(store_entries(ds, tmp)), headers=ZIP)
    refused(response, 413, "'x/c/0'", "a string is more than the 65536 of the max_string_bytes setting "
            "(CHUNKED_TENSOR_OPS_MAX_STRING_BYTES)")
    assert "long-string" not in arrays_in(service_root)


def test_strings_within_the_budgets_and_every_codec_are_stored(client, tmp):
    """What xarray and zarr write (vlen and fixed-length strings, zstd, gzip, blosc, crc32c, a
    sharded array) passes the checker and comes back whole."""
    values = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    ds = xr.Dataset({"v": (("y", "x"), values)},
                    coords={"y": np.array([f"row {i}" for i in range(64)], dtype=object),
                            "x": [f"c{i}" for i in range(32)]})
    encodings = {
        "sharded": {"v": {"chunks": (8, 8), "shards": (32, 16), "compressors": [BloscCodec(), Crc32cCodec()]}},
        "gzip": {"v": {"chunks": (16, 32), "compressors": [GzipCodec()]}},
        "zstd": None,
    }
    for name, encoding in encodings.items():
        response = client.put(f"/arrays/codecs-{name}", content=zip_of(store_entries(ds, tmp, encoding)), headers=ZIP)
        assert response.status_code == 201, (name, response.text)
        np.testing.assert_array_equal(load_npy(client.get(f"/arrays/codecs-{name}").content), values)
        assert client.delete(f"/arrays/codecs-{name}").status_code == 204


CORRUPT_CHUNKS = {
    "garbage": (b"\x28\xb5\x2f\xfd" + b"\xff" * 64, "'v/c/0' is corrupt"),
    "not-zstd": (b"hello", "'v/c/0' is corrupt: no zstd frame at byte 0"),
    "short": (Zstd().encode(np.zeros(10, np.uint8)), "'v/c/0' is corrupt: it decodes to 10 bytes, not the 1024"),
    "truncated": (Zstd().encode(np.arange(1024, dtype=np.uint8))[:-3], "'v/c/0' is corrupt"),
}


@pytest.mark.parametrize("case", CORRUPT_CHUNKS)
def test_a_corrupt_chunk_is_a_400_naming_its_key(client, tmp, case):
    """A chunk that cannot be decoded, or decodes to another size than declared, is a 400
    naming its key (zarr's own errors used to escape as a 500)."""
    chunk, needle = CORRUPT_CHUNKS[case]
    entries = {**zeros_entries(tmp, 4096, 1024), "v/c/0": chunk}
    refused(client.put(f"/arrays/corrupt-{case}", content=zip_of(entries), headers=ZIP), 400, needle)


def test_a_bad_checksum_or_gzip_member_is_a_400_naming_its_key(client, tmp):
    entries = zeros_entries(tmp, 4096, 1024)
    data = np.arange(1024, dtype=np.uint8)
    with_crc = edited(entries, "v", lambda m: m.update(codecs=[{"name": "bytes"}, {"name": "crc32c"}]))
    crc = struct.pack("<I", google_crc32c.value(data.tobytes()) ^ 1)
    refused(client.put("/arrays/bad-crc", content=zip_of({**with_crc, "v/c/1": data.tobytes() + crc}), headers=ZIP),
            400, "'v/c/1' is corrupt: its crc32c checksum does not match")
    gzipped = edited(entries, "v", lambda m: m.update(codecs=[{"name": "bytes"}, {"name": "gzip"}]))
    bomb = GZip(level=9).encode(np.zeros(4 * MiB, np.uint8))  # 4 KiB: what a chunk may take stored
    refused(client.put("/arrays/gzip-bomb", content=zip_of({**gzipped, "v/c/2": bomb}), headers=ZIP),
            400, "'v/c/2' decodes to more than the 1024 bytes")


# --- finding 2: chunk counts ------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_store_of_100000_one_element_chunks_is_refused_at_once(client, tmp):
    """666 bytes declaring shape [100000] in chunks of [1] took 198 s of the service's CPU."""
    entries = edited(zeros_entries(tmp, 100_000, 100_000), "v",
                     lambda m: m["chunk_grid"]["configuration"].update(chunk_shape=[1]))
    started = time.monotonic()
    response = client.put("/arrays/many-chunks", content=zip_of(entries), headers=ZIP)
    assert time.monotonic() - started < 10
    refused(response, 413, "into 100000 chunks, more than the 10000 of the max_chunks setting "
                           "(CHUNKED_TENSOR_OPS_MAX_CHUNKS)")


def sharded_entries(tmp: Path, inner: int) -> dict[str, bytes]:
    """A uint8 array of 65,536 elements in one shard of ``65536 / inner`` inner chunks, every
    inner chunk stored (the shard written by hand: the index at its end, then its crc32c)."""
    n, count = 65_536, 65_536 // inner
    shard = {"name": "sharding_indexed", "configuration": {
        "chunk_shape": [inner], "codecs": [{"name": "bytes"}],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
        "index_location": "end"}}
    entries = edited(zeros_entries(tmp, n, n), "v", lambda m: m.update(codecs=[shard]))
    index = np.stack([np.arange(count, dtype="<u8") * inner, np.full(count, inner, "<u8")], axis=1).tobytes()
    data = np.arange(n, dtype=np.uint8).tobytes()
    return {**entries, "v/c/0": data + index + struct.pack("<I", google_crc32c.value(index))}


@pytest.mark.timeout(60)
def test_a_shard_of_65536_inner_chunks_is_refused_at_once(client, tmp):
    """A shard of 65,536 one-byte inner chunks took 274 s (zarr's shard reading is quadratic)."""
    started = time.monotonic()
    response = client.put("/arrays/many-inner", content=zip_of(sharded_entries(tmp, 1)), headers=ZIP)
    assert time.monotonic() - started < 10
    refused(response, 413, "hold 65536 inner chunks of [1], more than the 1024 of the max_shard_chunks setting "
                           "(CHUNKED_TENSOR_OPS_MAX_SHARD_CHUNKS)")
    ok = client.put("/arrays/few-inner", content=zip_of(sharded_entries(tmp, 4096)), headers=ZIP)  # 16 inner
    assert ok.status_code == 201, ok.text
    np.testing.assert_array_equal(load_npy(client.get("/arrays/few-inner").content), np.arange(65_536) % 256)


@pytest.mark.timeout(60)
def test_an_npy_header_with_a_zero_length_axis_is_refused_at_once(client, service_root):
    """128 bytes declaring shape (0, 2**42): no data, but 262,144 stream chunks (the count used
    to multiply by the 0); it took 60 s and 1 GiB."""
    body = npy.header_bytes(np.dtype(np.uint8), (0, 2**42))
    assert len(body) == 128
    started = time.monotonic()
    response = client.put("/arrays/zero-axis", content=body, headers={"Content-Type": NPY})
    assert time.monotonic() - started < 10
    refused(response, 413, "into 262144 chunks, more than the 10000 of the max_chunks setting")
    assert "zero-axis" not in arrays_in(service_root)


# --- finding 3: chunk size --------------------------------------------------------------------


def test_chunks_past_max_chunk_bytes_are_refused(small, small_root):
    """?chunks=-1 asks for one chunk of the whole array: past max_chunk_bytes (64 KiB here; the
    default 64 MiB stopped a 2**28-element array that peaked at 3.5 GiB)."""
    body = npy_bytes(np.zeros(128 * KiB, np.uint8))
    refused(small.put("/arrays/one-chunk?chunks=-1", content=body, headers={"Content-Type": NPY}), 400,
            "?chunks=: a chunk of [131072] x 1 bytes is 131072 bytes, more than the 65536 of the max_chunk_bytes "
            "setting (CHUNKED_TENSOR_OPS_MAX_CHUNK_BYTES)")
    assert "one-chunk" not in arrays_in(small_root)


def test_a_download_decodes_each_chunk_once(small, monkeypatch):
    """A chunk of 64 KiB streamed in 4 KiB pieces used to be read and decoded 16 times."""
    values = np.random.default_rng(0).integers(0, 255, 64 * KiB, dtype=np.uint8)
    response = small.put("/arrays/big-chunk?chunks=-1", content=npy_bytes(values), headers={"Content-Type": NPY})
    assert response.status_code == 201, response.text
    reads = []
    get = zarr.storage.LocalStore.get

    async def counted(self, key, *args, **kwargs):
        reads.append(key)
        return await get(self, key, *args, **kwargs)

    monkeypatch.setattr(zarr.storage.LocalStore, "get", counted)
    np.testing.assert_array_equal(load_npy(small.get("/arrays/big-chunk").content), values)
    assert [key for key in reads if "/c/" in key] == ["big-chunk/c/0"], reads
    assert small.delete("/arrays/big-chunk").status_code == 204


@pytest.mark.parametrize(("shape", "chunks", "target"), [
    ((40,), (7,), 8), ((7, 5, 3), (2, 3, 2), 16), ((3, 1000), (2, 300), 256), ((2, 3, 4, 5), (1, 2, 3, 4), 40),
    ((5, 6), (5, 6), 4), ((6, 6), (4, 4), 10**6),
])
@pytest.mark.parametrize("budget", [0, 200, 10**6])
def test_decoded_blocks_give_every_region_of_a_download(shape, chunks, target, budget):
    """Whatever the layout and however few blocks fit, the regions read in turn are the array
    in C order."""
    values = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    data = da.from_array(values, chunks=chunks)
    blocks = DecodedBlocks(data, budget)
    pieces = [blocks.read(region).ravel() for region in c_order_regions(shape, data.chunksize, 8, target)]
    np.testing.assert_array_equal(np.concatenate(pieces), values.ravel())
    assert sum(block.nbytes for block in blocks._kept.values()) <= budget


def test_the_disk_quota_refuses_an_upload_that_would_pass_it(small, small_root):
    """disk_quota_bytes (1 MiB here) bounds all stored arrays together; an overwrite counts
    without the array it replaces."""
    values = np.random.default_rng(1).integers(0, 255, 600 * KiB, dtype=np.uint8)
    put = lambda name, **params: small.put(f"/arrays/{name}", content=npy_bytes(values),  # noqa: E731
                                           headers={"Content-Type": NPY}, params=params)
    assert put("quota-a").status_code == 201
    refused(put("quota-b"), 413, "would bring the stored arrays to", "more than the 1048576 of the "
            "disk_quota_bytes setting (CHUNKED_TENSOR_OPS_DISK_QUOTA_BYTES)")
    assert "quota-b" not in arrays_in(small_root)
    assert put("quota-a", overwrite="true").status_code == 201
    assert small.delete("/arrays/quota-a").status_code == 204
    assert put("quota-b").status_code == 201
    assert small.delete("/arrays/quota-b").status_code == 204


def test_a_job_result_counts_against_the_disk_quota(small, small_root):
    """A job's stored result counts as an upload does: a job whose result would pass
    disk_quota_bytes (1 MiB here) is refused before anything is computed, when run to the end
    (413) or in the background (a failed job whose results are the same 413); a smaller
    result is stored."""
    big = np.random.default_rng(2).integers(0, 255, (1, 80, 80, 96), dtype=np.uint8)  # 600 KiB
    assert small.put("/arrays/quota-in", content=npy_bytes(big), headers={"Content-Type": NPY}).status_code == 201
    before = arrays_in(small_root)

    def execute(x: str, name: str, **headers):
        return small.post("/processes/depth_to_space/execution", headers=headers, json={
            "inputs": {"x": {"href": f"/arrays/{x}"}, "block_size": 2},
            "outputs": {"result": {"transmissionMode": "reference", "name": name}}})

    needles = ("array 'quota-out' (614400 bytes) would bring the stored arrays to",
               "disk_quota_bytes setting (CHUNKED_TENSOR_OPS_DISK_QUOTA_BYTES)")
    refused(execute("quota-in", "quota-out"), 413, *needles)
    accepted = execute("quota-in", "quota-out", Prefer="respond-async")
    assert accepted.status_code == 201, accepted.text
    job_id = accepted.json()["jobID"]
    deadline = time.monotonic() + 60
    while (info := small.get(f"/jobs/{job_id}").json())["status"] in ("accepted", "running"):
        assert time.monotonic() < deadline, info
        time.sleep(0.05)
    assert info["status"] == "failed" and needles[0] in info["message"], info
    refused(small.get(f"/jobs/{job_id}/results"), 413, *needles)
    assert arrays_in(small_root) == before  # nothing stored, nothing half-written

    little = np.arange(4 * 4 * 8, dtype=np.uint8).reshape(1, 4, 4, 8)
    assert small.put("/arrays/quota-small", content=npy_bytes(little),
                     headers={"Content-Type": NPY}).status_code == 201
    assert execute("quota-small", "quota-small-out").status_code == 204
    stored = load_npy(small.get("/arrays/quota-small-out").content)
    np.testing.assert_array_equal(stored, little.reshape(1, 4, 4, 2, 2, 2).transpose(0, 1, 3, 2, 4, 5)
                                  .reshape(1, 8, 8, 2))
    for name in ("quota-in", "quota-small", "quota-small-out"):
        assert small.delete(f"/arrays/{name}").status_code == 204


# --- finding 4: dimension_names ----------------------------------------------------------------


BAD_DIMENSION_NAMES = {
    "too-many": (["x", "y"], "dimension_names must be a list of 1 names"),
    "a-number": ([7], "each must be null or a string"),
    "empty": ([""], "each must be null or a string"),
    "newline": (["a\nb"], "each must be null or a string"),
    "too-long": (["x" * 300], "each must be null or a string"),
    "a-string": ("x", "dimension_names must be a list"),
}


@pytest.mark.parametrize("case", BAD_DIMENSION_NAMES)
def test_bad_dimension_names_are_a_400_naming_them(client, service_root, tmp, case):
    """Zarr's dimension_names become the stored array's dims: the service took some of these
    (201) and answered others with zarr's or xarray's own words."""
    names, needle = BAD_DIMENSION_NAMES[case]
    entries = edited(zeros_entries(tmp, 16, 16), "v", lambda m: m.update(dimension_names=names))
    response = client.put(f"/arrays/dims-{case}", content=zip_of(entries), headers=ZIP)
    refused(response, 400, "dimension_names", needle)
    assert f"dims-{case}" not in arrays_in(service_root)


# --- the bomb against a real service ---------------------------------------------------------


def peak_rss_during(pid: int, action) -> tuple[object, int]:
    """(what ``action()`` returns, the process's peak RSS meanwhile in bytes): the kernel's
    high-water mark reset before (``/proc/PID/clear_refs``) and read after, and RSS sampled
    every 5 ms in case the reset is not allowed."""
    process, peak, done = psutil.Process(pid), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.005)

    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        reset = True
    except OSError:
        reset = False
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = action()
    finally:
        done.set()
        sampler.join()
    if reset:
        status = Path(f"/proc/{pid}/status").read_text()
        peak[0] = max(peak[0], next(int(line.split()[1]) * KiB for line in status.splitlines()
                                    if line.startswith("VmHWM:")))
    return result, peak[0]


@pytest.mark.timeout(180)
def test_the_bomb_costs_a_real_service_little(tmp_path):
    """Against ``python -m service`` with its default limits: the 512 MiB bomb is a 4xx and the
    service's RSS stays within 256 MiB of what it was (it used to grow by the bomb's size)."""
    entries = zeros_entries(tmp_path, 3 * MiB, MiB)
    bomb = zip_of({**entries, "v/c/0": Zstd(level=1).encode(np.zeros(BOMB_BYTES, np.uint8))})
    server = start_server(tmp_path / "data", tmp_path / "server.log", processes=False)  # no task runs
    try:
        warm = requests.put(f"{server.url}/arrays/warm", data=zip_of(entries), headers=ZIP, timeout=60)
        assert warm.status_code == 201, warm.text  # imports in place before the baseline
        service = psutil.Process(server.proc.pid)
        rss, cpu = service.memory_info().rss, sum(service.cpu_times()[:2])
        started = time.monotonic()
        response, peak = peak_rss_during(server.proc.pid, lambda: requests.put(
            f"{server.url}/arrays/bomb", data=bomb, headers=ZIP, timeout=120))
        elapsed, spent = time.monotonic() - started, sum(service.cpu_times()[:2]) - cpu
        print(f"answered {response.status_code} in {elapsed:.2f} s; RSS {rss / MiB:.0f} MiB, peak "
              f"+{(peak - rss) / MiB:.1f} MiB; service CPU {spent:.2f} s")
        assert 400 <= response.status_code < 500, response.text
        assert "'v/c/0'" in response.json()["detail"]
        assert peak - rss < 256 * MiB
    finally:
        stop_server(server)
