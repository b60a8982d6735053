"""The arrays routes (service/api/routers/arrays.py) through FastAPI's TestClient: NPY and
zipped-Zarr uploads with their dims, chunks and dtypes, listing, overwrite and delete, Zarr
over HTTP (keys, ranges, and keys that must not leave the array's group), array names, and
arrays a running job uses. Every download is compared bit for bit with what was uploaded.
"""

from __future__ import annotations

import asyncio
import io
import shutil
import uuid
import zipfile
from urllib.parse import unquote_to_bytes

import httpx
import numpy as np
import pytest
import xarray as xr

import ops
from ops import dtypes
from tests.helpers import assert_same, random_array
from tests.service.api.calls import INVALID, WIRE, check_stored, decode, execute, ints, put_array, rng_for, unique, wire
from tests.service.conftest import NPY, assert_problem, inline, load_npy, npy_bytes


# ---------------------------------------------------------------------------------------------
# uploads and downloads


@pytest.mark.parametrize("dtype", [dtypes.bfloat16, dtypes.complex32], ids=["bfloat16", "complex32"])
def test_special_dtype_upload_info_and_download(client, dtype):
    array = random_array(rng_for("special", dtypes.name(dtype)), (3, 5), dtype)
    name = unique("special")
    info = put_array(client, name, array).json()
    assert info["dtype"] == dtypes.name(dtype) and info["shape"] == [3, 5]
    download = client.get(f"/arrays/{name}")
    assert download.headers["x-array-dtype"] == dtypes.name(dtype)
    assert load_npy(download.content).dtype == WIRE[dtypes.name(dtype)]
    assert_same(decode(download), array)
    # without the header the raw bits are just uint16/uint32
    plain = unique("plain")
    raw, _ = wire(array)
    response = client.put(f"/arrays/{plain}", content=npy_bytes(raw), headers={"Content-Type": NPY})
    assert response.status_code == 201
    assert response.json()["dtype"] == str(raw.dtype)
    # a declared dtype that does not fit the NPY is refused
    bad = client.put(f"/arrays/{unique('bad')}", content=npy_bytes(np.zeros(3, np.int32)),
                     headers={"Content-Type": NPY, "X-Array-Dtype": dtypes.name(dtype)})
    assert_problem(bad, 400, INVALID)


@pytest.mark.smoke
def test_put_with_dims_and_chunks(client):
    x = random_array(rng_for("dims"), (2, 6, 5, 3), np.uint16)
    name = unique("dims")
    response = put_array(client, name, x, params={"dims": "n,y,x,band", "chunks": "1,4,-1,2"})
    assert response.headers["location"].endswith(f"/arrays/{name}")
    info = response.json()
    assert info["shape"] == [2, 6, 5, 3] and info["dtype"] == "uint16"
    assert info["dims"] == ["n", "y", "x", "band"] and info["chunks"] == [1, 4, 5, 2]
    assert client.get(f"/arrays/{name}/info").json() == info
    assert_same(decode(client.get(f"/arrays/{name}")), x)
    assert_problem(client.put(f"/arrays/{unique()}", content=npy_bytes(x), headers={"Content-Type": NPY},
                              params={"dims": "a,b"}), 400, INVALID)
    assert_problem(client.put(f"/arrays/{unique()}", content=npy_bytes(x), headers={"Content-Type": NPY},
                              params={"chunks": "1,0,1,1"}), 400, INVALID)


def test_fortran_order_npy(client):
    x = np.asfortranarray(random_array(rng_for("fortran"), (3, 4, 5), np.float64))
    buffer = io.BytesIO()
    np.save(buffer, x)
    assert b"'fortran_order': True" in buffer.getvalue()[:128]
    name = unique("fortran")
    response = client.put(f"/arrays/{name}", content=buffer.getvalue(), headers={"Content-Type": NPY})
    assert response.status_code == 201
    assert response.json()["shape"] == [3, 4, 5]
    assert_same(decode(client.get(f"/arrays/{name}")), np.ascontiguousarray(x))


def test_big_endian_npy(client):
    x = random_array(rng_for("be"), (4, 3), np.dtype(">f4"))
    name = unique("be")
    response = client.put(f"/arrays/{name}", content=npy_bytes(x), headers={"Content-Type": NPY})
    assert response.status_code == 201
    assert response.json()["dtype"] == "float32"
    back = decode(client.get(f"/arrays/{name}"))
    assert back.shape == (4, 3) and back.dtype.kind == "f" and back.dtype.itemsize == 4
    assert back.astype(">f4").view(">u4").tolist() == x.view(">u4").tolist()  # same bits, NaNs included
    # and it computes like the little-endian array
    y = ops.depth_to_space(x.astype("<f4").reshape(1, 1, 3, 4), 2)
    response = execute(client, "depth_to_space", {"x": inline(x.reshape(1, 1, 3, 4)), "block_size": 2})
    assert decode(response).astype("<f4").tobytes() == y.tobytes()


@pytest.mark.parametrize("shape", [(), (0,), (0, 3), (4, 0, 2)], ids=str)
def test_zero_d_and_zero_sized(client, shape):
    x = random_array(rng_for("small", shape), shape, np.int64)
    name = unique("edge")
    info = put_array(client, name, x).json()
    assert info["shape"] == list(shape)
    assert info["dims"] == [f"dim_{k}" for k in range(len(shape))]
    back = decode(client.get(f"/arrays/{name}"))
    assert_same(back, x)


def test_npy_larger_than_chunk_bytes(small, small_root):
    x = random_array(rng_for("big"), (64, 32), np.float64)  # 16 KiB, chunks of 4 KiB
    name = unique("big")
    info = put_array(small, name, x).json()
    assert info["chunks"] == [16, 32]
    chunk_files = [p for p in (small_root / "arrays" / name / name).rglob("*")
                   if p.is_file() and p.name != "zarr.json"]
    assert len(chunk_files) == 4
    assert_same(decode(small.get(f"/arrays/{name}")), x)
    # a 3-D one that splits inside a row, in Fortran order, with explicit chunks
    y = np.asfortranarray(random_array(rng_for("big3"), (3, 5, 300), np.int32))
    buffer = io.BytesIO()
    np.save(buffer, y)
    name = unique("big3")
    response = small.put(f"/arrays/{name}", content=buffer.getvalue(), headers={"Content-Type": NPY})
    assert response.status_code == 201
    assert response.json()["chunks"] == [1, 3, 300]
    assert_same(decode(small.get(f"/arrays/{name}")), np.ascontiguousarray(y))
    # an operator on a multi-chunk stored input, written back in chunks
    z = random_array(rng_for("big-op"), (2, 16, 16, 8), np.float32)
    check_stored(small, "depth_to_space", {"x": z}, {"block_size": 2})


def _dataset() -> xr.Dataset:
    rng = rng_for("zip")
    temp = rng.standard_normal((3, 4, 5)).astype(np.float32)
    rain = rng.integers(0, 100, (3, 4, 5)).astype(np.int16)
    ds = xr.Dataset(
        {"temp": (("time", "y", "x"), temp, {"units": "K", "long_name": "temperature"}),
         "rain": (("time", "y", "x"), rain, {"units": "mm"})},
        coords={"time": np.array([0, 6, 12], np.int64), "y": np.linspace(50, 53, 4), "x": np.arange(5) * 0.5},
        attrs={"source": "test"},
    )
    return ds


def _zip_store(ds: xr.Dataset, tmp_path, folder: str | None = None) -> bytes:
    path = tmp_path / f"store-{uuid.uuid4().hex[:6]}.zarr"
    ds.to_zarr(path, zarr_format=3, mode="w")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in sorted(path.rglob("*")):
            if file.is_file():
                inner = file.relative_to(path).as_posix()
                archive.write(file, f"{folder}/{inner}" if folder else inner)
    shutil.rmtree(path)
    return buffer.getvalue()


def test_zip_upload_keeps_dims_coords_attrs(client, service_root, tmp_path):
    ds = _dataset()[["temp"]]
    name = unique("zip")
    response = client.put(f"/arrays/{name}", content=_zip_store(ds, tmp_path),
                          headers={"Content-Type": "application/zip"})
    assert response.status_code == 201, response.text
    info = response.json()
    assert info["shape"] == [3, 4, 5] and info["dtype"] == "float32"
    assert info["dims"] == ["time", "y", "x"]
    assert info["attrs"]["units"] == "K" and info["attrs"]["long_name"] == "temperature"
    assert info["attrs"]["source"] == "test"  # the Dataset's own attrs too
    assert client.get(f"/arrays/{name}/info").json()["dims"] == ["time", "y", "x"]
    stored = xr.open_zarr(service_root / "arrays" / name, zarr_format=3, consolidated=True)
    assert list(stored.data_vars) == ["temp"]
    assert stored["temp"].dims == ("time", "y", "x")
    for coord in ("time", "y", "x"):
        np.testing.assert_array_equal(stored[coord].values, ds[coord].values)
    assert stored["temp"].attrs["units"] == "K" and stored.attrs["source"] == "test"
    np.testing.assert_array_equal(stored["temp"].values, ds["temp"].values)
    assert_same(decode(client.get(f"/arrays/{name}")), ds["temp"].values)


def test_zip_upload_variable_choice(client, service_root, tmp_path):
    ds = _dataset()
    archive = _zip_store(ds, tmp_path, folder="cube.zarr")
    headers = {"Content-Type": "application/zip"}
    assert_problem(client.put(f"/arrays/{unique()}", content=archive, headers=headers), 400, INVALID)
    assert_problem(client.put(f"/arrays/{unique()}", content=archive, headers=headers,
                              params={"variable": "snow"}), 400, INVALID)
    name = unique("rain")
    response = client.put(f"/arrays/{name}", content=archive, headers=headers,
                          params={"variable": "rain", "dims": "t,row,col", "chunks": "1,2,-1"})
    assert response.status_code == 201, response.text
    info = response.json()
    assert info["dtype"] == "int16" and info["dims"] == ["t", "row", "col"] and info["chunks"] == [1, 2, 5]
    assert info["attrs"]["units"] == "mm"
    assert_same(decode(client.get(f"/arrays/{name}")), ds["rain"].values)
    assert_problem(client.put(f"/arrays/{unique()}", content=b"not a zip", headers=headers), 400)


def test_a_name_that_is_one_of_its_dims_is_refused(client, tmp_path):
    """xarray reads a variable named like one of its dims as that dim's coordinate:
    xr.open_zarr showed such an array as a Dataset without data. Refused before anything is
    stored, at upload and for a job's result."""
    headers = {"Content-Type": NPY}
    for name in ("y", "x"):
        refused = assert_problem(client.put(f"/arrays/{name}", content=npy_bytes(ints((1, 2, 2, 1))),
                                            headers=headers, params={"dims": "time,y,x,band"}), 400, INVALID)
        assert f"array name {name!r} is also one of its dims ('time', 'y', 'x', 'band')" in refused["detail"]
        assert client.get(f"/arrays/{name}/info").status_code == 404
    archive = _zip_store(_dataset()[["temp"]], tmp_path)
    refused = assert_problem(client.put(f"/arrays/{unique()}", content=archive, params={"dims": "temp,y,x"},
                                        headers={"Content-Type": "application/zip"}), 400, INVALID)
    assert "variable 'temp' is also one of its dims" in refused["detail"]
    source = unique("image")
    put_array(client, source, ints((1, 2, 2, 4)), params={"dims": "time,y,x,band"})
    response = execute(client, "depth_to_space", {"x": {"href": f"/arrays/{source}"}, "block_size": 2},
                       mode="reference", name="y")
    refused = assert_problem(response, 400, INVALID)
    assert "outputs.result.name 'y' is also one of its dims" in refused["detail"]
    assert client.get("/arrays/y/info").status_code == 404


def test_overwrite_list_and_delete(client):
    name = unique("life")
    first, second = ints((2, 3)), ints((4,), np.int8)
    put_array(client, name, first)
    conflict = client.put(f"/arrays/{name}", content=npy_bytes(second), headers={"Content-Type": NPY})
    assert_problem(conflict, 409)
    assert_same(decode(client.get(f"/arrays/{name}")), first)
    put_array(client, name, second, params={"overwrite": "true"})
    assert_same(decode(client.get(f"/arrays/{name}")), second)

    listing = client.get("/arrays").json()
    entry = {a["name"]: a for a in listing["arrays"]}[name]
    assert entry["shape"] == [4] and entry["dtype"] == "int8" and entry["dims"] == ["dim_0"]
    assert {link["rel"] for link in entry["links"]} >= {"enclosure", "describedby"}

    assert client.delete(f"/arrays/{name}").status_code == 204
    assert name not in [a["name"] for a in client.get("/arrays").json()["arrays"]]
    for response in (client.get(f"/arrays/{name}"), client.get(f"/arrays/{name}/info"),
                     client.delete(f"/arrays/{name}"), client.get(f"/arrays/{name}/zarr/zarr.json")):
        body = assert_problem(response, 404)
        assert body["type"].endswith("/no-such-array")


def test_npy_upload_refusals(client):
    headers = {"Content-Type": NPY}
    body = npy_bytes(ints((5, 5)))
    assert_problem(client.put(f"/arrays/{unique()}", content=body[:-3], headers=headers), 400, INVALID)
    assert_problem(client.put(f"/arrays/{unique()}", content=body + b"xx", headers=headers), 400, INVALID)
    assert_problem(client.put(f"/arrays/{unique()}", content=b"garbage!" * 20, headers=headers), 400, INVALID)
    pickled = io.BytesIO()
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    refused = assert_problem(client.put(f"/arrays/{unique()}", content=pickled.getvalue(), headers=headers),
                             400, INVALID)
    assert "|O" in refused["detail"]


# ---------------------------------------------------------------------------------------------
# Zarr over HTTP


@pytest.fixture(scope="module")
def zarr_array(client, service_root):
    name = unique("zarr")
    x = random_array(rng_for("zarr"), (4, 6), np.float32)
    put_array(client, name, x, params={"chunks": "2,3"})
    return name, service_root / "arrays" / name, x


def test_zarr_metadata(client, zarr_array):
    name, path, x = zarr_array
    response = client.get(f"/arrays/{name}/zarr/zarr.json")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    meta = response.json()
    assert meta["node_type"] == "group"
    consolidated = meta["consolidated_metadata"]["metadata"]
    assert consolidated[name]["shape"] == [4, 6]
    assert consolidated[name]["dimension_names"] == ["dim_0", "dim_1"]
    assert response.content == (path / "zarr.json").read_bytes()
    array_meta = client.get(f"/arrays/{name}/zarr/{name}/zarr.json")
    assert array_meta.status_code == 200 and array_meta.json()["node_type"] == "array"


def test_zarr_chunk_keys_and_ranges(client, zarr_array):
    name, path, x = zarr_array
    chunk_files = sorted(p for p in (path / name).rglob("*") if p.is_file() and p.name != "zarr.json")
    assert len(chunk_files) == 4
    chunk = chunk_files[0]
    key = chunk.relative_to(path).as_posix()
    data = chunk.read_bytes()
    assert len(data) > 15
    response = client.get(f"/arrays/{name}/zarr/{key}")
    assert response.status_code == 200
    assert response.content == data

    ranged = client.get(f"/arrays/{name}/zarr/{key}", headers={"Range": "bytes=0-9"})
    assert ranged.status_code == 206
    assert ranged.headers["content-range"] == f"bytes 0-9/{len(data)}"
    assert ranged.content == data[:10]

    suffix = client.get(f"/arrays/{name}/zarr/{key}", headers={"Range": "bytes=-5"})
    assert suffix.status_code == 206
    assert suffix.content == data[-5:]
    assert suffix.headers["content-range"] == f"bytes {len(data) - 5}-{len(data) - 1}/{len(data)}"

    bad = client.get(f"/arrays/{name}/zarr/{key}", headers={"Range": f"bytes={len(data) + 10}-{len(data) + 20}"})
    assert_problem(bad, 416)
    assert bad.headers["content-range"] == f"bytes */{len(data)}"

    head = client.head(f"/arrays/{name}/zarr/{key}")
    assert head.status_code == 200 and int(head.headers["content-length"]) == len(data)

    assert_problem(client.get(f"/arrays/{name}/zarr/{name}/c/9/9"), 404)
    assert_problem(client.get(f"/arrays/{name}/zarr/nothing.json"), 404)


def test_zarr_read_with_zarr_and_xarray_clients(client, zarr_array):
    """The HTTP keys are exactly what a Zarr reader needs: read them through a store that
    fetches every key from the route."""
    import zarr
    from zarr.storage import MemoryStore

    name, path, x = zarr_array
    mapping = {}
    for file in path.rglob("*"):
        if file.is_file():
            key = file.relative_to(path).as_posix()
            response = client.get(f"/arrays/{name}/zarr/{key}")
            assert response.status_code == 200
            mapping[key] = response.content
    from zarr.core.buffer import cpu
    memory = MemoryStore({k: cpu.Buffer.from_bytes(v) for k, v in mapping.items()})
    group = zarr.open_group(memory, mode="r", zarr_format=3)
    np.testing.assert_array_equal(group[name][...], x)
    ds = xr.open_zarr(memory, zarr_format=3, consolidated=True)
    assert ds[name].dims == ("dim_0", "dim_1")


def _raw_get(client, raw_path: bytes) -> httpx.Response:
    """GET ``raw_path`` exactly as given: straight to the ASGI app, since httpx would resolve
    literal ``..`` segments before sending."""
    async def run():
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
                 "scheme": "http", "path": unquote_to_bytes(raw_path).decode("latin-1"), "raw_path": raw_path,
                 "query_string": b"", "root_path": "", "headers": [(b"host", b"testserver")],
                 "client": ("127.0.0.1", 5000), "server": ("testserver", 80)}
        sent, start, done, asked = [], {}, asyncio.Event(), []

        async def receive():
            if not asked:
                asked.append(True)
                return {"type": "http.request", "body": b"", "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                sent.append(message.get("body", b""))
                if not message.get("more_body"):
                    done.set()

        await client.app(scope, receive, send)
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in start["headers"]]
        return httpx.Response(start["status"], headers=headers, content=b"".join(sent))

    return asyncio.run(run())


def test_raw_get_sends_dot_segments(client, zarr_array):
    name, path, x = zarr_array
    ok = _raw_get(client, f"/arrays/{name}/zarr/zarr.json".encode())
    assert ok.status_code == 200 and ok.content == (path / "zarr.json").read_bytes()
    # the literal dot segments reach the route as they are
    moved = _raw_get(client, f"/arrays/{name}/zarr/../info".encode())
    assert "'../info'" in assert_problem(moved, 404)["detail"]


@pytest.mark.parametrize("raw_key", [
    b"../../jobs.sqlite",
    b"..",
    b"../zarr.json",
    b"../OTHER/zarr.json",
    b"../OTHER/OTHER/zarr.json",
    b"../../secret.txt",
    b"%2e%2e/%2e%2e/secret.txt",
    b"%2e%2e/%2e%2e/jobs.sqlite",
    b"%2E%2E%2F%2E%2E%2Fjobs.sqlite",
    b"..%2f..%2fjobs.sqlite",
    b"/etc/passwd",
    b"%2fetc%2fpasswd",
    b"//etc/passwd",
    b"./zarr.json/../../../jobs.sqlite",
    b"c/../../jobs.sqlite",
    b"%00",
    b"zarr.json%00.txt",
])
def test_zarr_keys_never_leave_the_group(client, zarr_array, service_root, raw_key):
    name, path, x = zarr_array
    other = f"other-{name}"
    if not (service_root / "arrays" / other).exists():
        put_array(client, other, ints((3,)))
    (service_root / "secret.txt").write_bytes(b"root: outside the arrays")
    outside = {(service_root / "jobs.sqlite").read_bytes()[:64], b"root:",
               (service_root / "arrays" / other / "zarr.json").read_bytes()[:64],
               (service_root / "arrays" / other / other / "zarr.json").read_bytes()[:64]}
    raw_key = raw_key.replace(b"OTHER", other.encode())
    response = _raw_get(client, b"/arrays/" + name.encode() + b"/zarr/" + raw_key)
    assert response.status_code in (400, 404), (raw_key, response.status_code, response.content[:100])
    assert_problem(response, response.status_code)
    assert not any(secret in response.content for secret in outside)


# ---------------------------------------------------------------------------------------------
# array names


BAD_NAMES = ["..x", ".hidden", "a" * 129, "a b", "a$b", "é"]


@pytest.mark.parametrize("bad", BAD_NAMES, ids=["dotdot", "hidden", "long", "space", "dollar", "accent"])
def test_bad_array_names(client, bad):
    body = npy_bytes(ints((2,)))
    assert_problem(client.put(f"/arrays/{bad}", content=body, headers={"Content-Type": NPY}), 400, INVALID)
    assert_problem(client.get(f"/arrays/{bad}/info"), 400, INVALID)
    assert_problem(client.delete(f"/arrays/{bad}"), 400, INVALID)
    x = inline(ints((1, 2, 2, 4)))
    assert_problem(execute(client, "depth_to_space", {"x": x, "block_size": 2}, mode="reference", name=bad),
                   400, INVALID)
    assert_problem(execute(client, "depth_to_space", {"x": {"href": f"/arrays/{bad}"}, "block_size": 2}),
                   400, INVALID)


def test_good_array_name_edges(client):
    for name in ("a", "A" * 128, "x.y-z_0", "a..b"):
        put_array(client, name, ints((2,)))
        assert client.get(f"/arrays/{name}/info").json()["name"] == name
        assert client.delete(f"/arrays/{name}").status_code == 204


# ---------------------------------------------------------------------------------------------
# arrays in use


def test_arrays_in_use_by_a_running_job(client):
    records = client.app.state.services.records
    source, target = unique("busy-in"), unique("busy-out")
    put_array(client, source, ints((2, 2)))
    job_id = uuid.uuid4().hex
    records.create(job_id, "depth_to_space", [source], target, "reference", status="running")
    try:
        body = assert_problem(client.delete(f"/arrays/{source}"), 409)
        assert job_id in body["detail"]
        assert_problem(client.put(f"/arrays/{source}", content=npy_bytes(ints((3,))),
                                  headers={"Content-Type": NPY}, params={"overwrite": "true"}), 409)
        assert_problem(client.put(f"/arrays/{target}", content=npy_bytes(ints((3,))),
                                  headers={"Content-Type": NPY}), 409)
        assert_same(decode(client.get(f"/arrays/{source}")), ints((2, 2)))
    finally:
        records.finish(job_id, "failed", "test over")
    assert client.delete(f"/arrays/{source}").status_code == 204
