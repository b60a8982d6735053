"""End-to-end tests against a real ``python -m service`` process on 127.0.0.1, driven by
clients nobody on this project wrote: OWSLib (OGC API - Processes), xarray/zarr over HTTP
(fsspec + aiohttp), and plain ``requests`` as the README's curl session would do it.

One server is started per module, its embedded LocalCluster's worker threads of its own process
(what these clients see does not depend on where the tasks run; a service with worker processes
is tests/service/test_load.py's). The service stopped or killed mid-job and restarted is
tests/service/test_faults.py's.
"""

from __future__ import annotations

import base64
import io
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import requests
import xarray as xr
import zarr
from owslib import ogcapi as owslib_ogcapi
from owslib.ogcapi.processes import Processes

import ops
from ops import dtypes
from tests.service.conftest import NPY, inline, load_npy, npy_bytes
from tests.service.processes import start_server, stop_server

OGC_REL = "http://www.opengis.net/def/rel/ogc/1.0/"
OGC_CONF = "http://www.opengis.net/spec/ogcapi-processes-1/1.0/conf/"
PROCESS_IDS = {"depth_to_space", "space_to_depth", "space_to_batch", "space_to_batch_nd", "batch_to_space_nd",
               "gather_nd", "ascend_dequant"}
JOB_TIMEOUT = 120.0
HTTP_TIMEOUT = 30.0


# --- the server process -------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("e2e")
    srv = start_server(base / "data", base / "server.log", processes=False)
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def url(server) -> str:
    return server.url


@pytest.fixture(autouse=True)
def _owslib_headers():
    """OWSLib 0.35 keeps one module-global headers dict and writes ``Prefer`` into it on every
    execute: start each test without it and restore the dict afterwards."""
    saved = dict(owslib_ogcapi.REQUEST_HEADERS)
    owslib_ogcapi.REQUEST_HEADERS.pop("Prefer", None)
    yield
    owslib_ogcapi.REQUEST_HEADERS.clear()
    owslib_ogcapi.REQUEST_HEADERS.update(saved)


# --- helpers ------------------------------------------------------------------------------

def put_npy(url: str, name: str, array: np.ndarray, **params) -> dict:
    headers = {"Content-Type": NPY}
    wire, declared = array, None
    if array.dtype == dtypes.bfloat16:
        wire, declared = array.view("<u2"), "bfloat16"
        headers["X-Array-Dtype"] = declared
    answer = requests.put(f"{url}/arrays/{name}", data=npy_bytes(wire), headers=headers, params=params,
                          timeout=HTTP_TIMEOUT)
    assert answer.status_code == 201, answer.text
    return answer.json()


def wait_job(url: str, job_id: str, timeout: float = JOB_TIMEOUT) -> tuple[dict, list[int]]:
    """Poll ``/jobs/{id}`` until the job is final; returns the last statusInfo and the progress seen."""
    deadline = time.monotonic() + timeout
    seen: list[int] = []
    while True:
        answer = requests.get(f"{url}/jobs/{job_id}", timeout=HTTP_TIMEOUT)
        assert answer.status_code == 200, answer.text
        info = answer.json()
        if info.get("progress") is not None:
            seen.append(info["progress"])
        if info["status"] in ("successful", "failed", "dismissed"):
            return info, seen
        assert time.monotonic() < deadline, f"job {job_id} still {info['status']} after {timeout} s: {info}"
        time.sleep(0.1)


def run_job(url: str, process_id: str, inputs: dict, result_name: str | None = None) -> dict:
    """Submit an async job (stored result) with requests and wait until it is successful."""
    outputs = {"result": {"transmissionMode": "reference"}}
    if result_name:
        outputs["result"]["name"] = result_name
    answer = requests.post(f"{url}/processes/{process_id}/execution",
                           json={"inputs": inputs, "outputs": outputs},
                           headers={"Prefer": "respond-async"}, timeout=HTTP_TIMEOUT)
    assert answer.status_code == 201, answer.text
    info, _ = wait_job(url, answer.json()["jobID"])
    assert info["status"] == "successful", info
    return info


def decode_value(qualified: dict) -> np.ndarray:
    assert qualified["encoding"] == "base64" and qualified["mediaType"] == NPY, qualified
    return load_npy(base64.b64decode(qualified["value"]))


def assert_same_bytes(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


def zarr_url(url: str, name: str) -> str:
    return f"{url}/arrays/{name}/zarr"


# --- OWSLib -------------------------------------------------------------------------------

@pytest.mark.smoke
def test_owslib_landing_conformance_and_api(url):
    p = Processes(url)
    rels = {link["rel"]: link for link in p.links}
    desc = rels["service-desc"]
    assert desc["href"].endswith("/openapi.json")
    assert desc["type"] == "application/vnd.oai.openapi+json;version=3.0"
    assert rels["service-doc"]["href"].endswith("/docs")
    for rel, path in (("conformance", "/conformance"), ("processes", "/processes"), ("job-list", "/jobs")):
        assert rels[OGC_REL + rel]["href"].endswith(path), rels
    conforms = p.conformance()["conformsTo"]
    assert OGC_CONF + "core" in conforms
    for cls in ("json", "oas30", "job-list", "dismiss", "ogc-process-description"):
        assert OGC_CONF + cls in conforms
    # OWSLib finds the OpenAPI document through the service-desc link and its media type.
    api = p.api()
    assert api["openapi"].startswith("3.")
    assert "/processes/{process_id}/execution" in api["paths"]


def test_owslib_processes_and_description(url):
    p = Processes(url)
    summaries = p.processes()
    assert [s["id"] for s in summaries][-1] == "echo"  # the test process, last (tests/service/api/test_echo.py)
    summaries = summaries[:-1]
    assert {s["id"] for s in summaries} == PROCESS_IDS and len(summaries) == 7
    for summary in summaries:
        assert summary["version"] and summary["title"]
        assert set(summary["jobControlOptions"]) == {"sync-execute", "async-execute", "dismiss"}
        assert set(summary["outputTransmission"]) == {"value", "reference"}
    description = p.process("depth_to_space")
    assert description["id"] == "depth_to_space"
    assert list(description["inputs"])[:4] == ["x", "block_size", "data_format", "mode"]
    assert set(description["outputs"]) == {"result"}
    with pytest.raises(RuntimeError, match="no-such-process"):
        p.process("no_such_operator")


def test_owslib_sync_execute_document(url):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 5, 8), dtype=np.float32)
    p = Processes(url)
    document = p.execute("depth_to_space", {"x": inline(x), "block_size": 2, "mode": "CRD"},
                         response="document")
    assert p.response_headers["Content-Type"].startswith("application/json")
    assert_same_bytes(decode_value(document["result"]), ops.depth_to_space(x, 2, mode="CRD"))


@pytest.mark.smoke
def test_owslib_async_execute_and_job(url):
    rng = np.random.default_rng(2)
    x = rng.integers(-1000, 1000, size=(2, 4, 6, 12), dtype=np.int16)
    put_npy(url, "owslib_x", x, chunks="1,4,6,12")
    p = Processes(url)
    status = p.execute("depth_to_space", {"x": {"href": "/arrays/owslib_x"}, "block_size": 2,
                                          "data_format": "NHWC"}, async_=True)
    job_id = status["jobID"]
    assert status["processID"] == "depth_to_space" and status["type"] == "process"
    assert status["status"] in ("accepted", "running", "successful")
    headers = p.response_headers
    assert headers["Preference-Applied"] == "respond-async"
    location = requests.compat.urljoin(url + "/", headers["Location"])
    assert location == f"{url}/jobs/{job_id}"

    # OWSLib 0.35 has no job methods: the generic request helper, without the async Prefer.
    p.headers.pop("Prefer", None)
    deadline = time.monotonic() + JOB_TIMEOUT
    while (info := p._request(path=f"jobs/{job_id}"))["status"] in ("accepted", "running"):
        assert time.monotonic() < deadline, info
        time.sleep(0.1)
    assert info["status"] == "successful" and info["progress"] == 100, info
    assert any(link["rel"] == OGC_REL + "results" for link in info["links"])
    results = p._request(path=f"jobs/{job_id}/results")
    expected = ops.depth_to_space(x, 2)
    assert_same_bytes(decode_value(results["result"]), expected)

    # After an async call, a sync execute through the same client really is sync again.
    document = p.execute("space_to_depth", {"x": inline(expected), "block_size": 2}, response="document")
    assert p.response_headers.get("Preference-Applied") is None
    assert_same_bytes(decode_value(document["result"]), x)
    listed = p._request(path="jobs", kwargs={"processID": "depth_to_space"})
    assert job_id in {j["jobID"] for j in listed["jobs"]}


# --- Zarr over HTTP -----------------------------------------------------------------------

def test_zarr_over_http_job_result(url):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 4, 6, 8), dtype=np.float32)
    put_npy(url, "zarr_x", x, chunks="1,4,6,8")
    run_job(url, "depth_to_space", {"x": {"href": "/arrays/zarr_x"}, "block_size": 2}, "zarr_d2s")
    expected = ops.depth_to_space(x, 2)

    ds = xr.open_zarr(zarr_url(url, "zarr_d2s"), consolidated=True, zarr_format=3)
    assert list(ds.data_vars) == ["zarr_d2s"]
    remote = ds["zarr_d2s"]
    assert remote.shape == expected.shape
    assert_same_bytes(remote.values, expected)
    info = requests.get(f"{url}/arrays/zarr_d2s/info", timeout=HTTP_TIMEOUT).json()
    assert list(remote.dims) == info["dims"]

    group = zarr.open_group(zarr_url(url, "zarr_d2s"), mode="r")
    array = group["zarr_d2s"]
    assert_same_bytes(array[...], expected)
    direct = zarr.open_array(f"{zarr_url(url, 'zarr_d2s')}/zarr_d2s", mode="r")
    assert_same_bytes(direct[...], expected)
    assert_same_bytes(direct[1:2, 3:7, :, :], expected[1:2, 3:7])

    # A chunk key, whole and as byte ranges; an absent key is 404.
    meta = requests.get(f"{zarr_url(url, 'zarr_d2s')}/zarr.json", timeout=HTTP_TIMEOUT).json()
    variable = meta["consolidated_metadata"]["metadata"]["zarr_d2s"]
    encoding = variable["chunk_key_encoding"]
    separator = encoding.get("configuration", {}).get("separator", "/")
    assert encoding["name"] == "default"
    key = "c" + separator + separator.join("0" * len(expected.shape))
    chunk_url = f"{zarr_url(url, 'zarr_d2s')}/zarr_d2s/{key}"
    whole = requests.get(chunk_url, timeout=HTTP_TIMEOUT)
    assert whole.status_code == 200 and len(whole.content) > 20
    part = requests.get(chunk_url, headers={"Range": "bytes=4-19"}, timeout=HTTP_TIMEOUT)
    assert part.status_code == 206
    assert part.headers["Content-Range"] == f"bytes 4-19/{len(whole.content)}"
    assert part.content == whole.content[4:20]
    suffix = requests.get(chunk_url, headers={"Range": "bytes=-7"}, timeout=HTTP_TIMEOUT)
    assert suffix.status_code == 206 and suffix.content == whole.content[-7:]
    beyond = requests.get(chunk_url, headers={"Range": f"bytes={len(whole.content) + 10}-"}, timeout=HTTP_TIMEOUT)
    assert beyond.status_code == 416
    absent = requests.get(f"{zarr_url(url, 'zarr_d2s')}/zarr_d2s/c{separator}99{separator}0{separator}0"
                          f"{separator}0", timeout=HTTP_TIMEOUT)
    assert absent.status_code == 404
    assert absent.json()["status"] == 404


def _zipped_store(ds: xr.Dataset, where: Path) -> bytes:
    store = where / "image.zarr"
    with warnings.catch_warnings():  # zarr: consolidated metadata and fixed-length strings are not in v3 yet
        warnings.simplefilter("ignore")
        ds.to_zarr(store, zarr_format=3, consolidated=True, mode="w")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(store.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(where).as_posix())
    return buffer.getvalue()


def test_xarray_zip_upload_over_http(url, tmp_path):
    rng = np.random.default_rng(4)
    data = rng.standard_normal((6, 10, 4)).astype(np.float32)
    image = xr.DataArray(
        data, dims=("y", "x", "band"),
        coords={"y": np.linspace(50.0, 49.5, 6), "x": np.arange(10) * 0.25 + 7.0,
                "band": np.array([490, 560, 665, 842], dtype=np.int32),
                "band_name": ("band", np.array(["blue", "green", "red", "nir"]))},
        attrs={"units": "reflectance", "long_name": "top of atmosphere", "scale": 0.5},
        name="refl",
    )
    ds = image.to_dataset().chunk({"y": 3, "x": 5, "band": 4})
    ds.attrs["source"] = "e2e test"
    answer = requests.put(f"{url}/arrays/zip_image", data=_zipped_store(ds, tmp_path),
                          headers={"Content-Type": "application/zip"}, timeout=HTTP_TIMEOUT)
    assert answer.status_code == 201, answer.text
    assert answer.json()["dims"] == ["y", "x", "band"]

    remote = xr.open_zarr(zarr_url(url, "zip_image"), consolidated=True, zarr_format=3)
    assert list(remote.data_vars) == ["refl"]
    got = remote["refl"].load()
    assert got.dims == ("y", "x", "band")
    assert set(got.coords) == {"y", "x", "band", "band_name"}
    for name in ("y", "x", "band"):
        assert_same_bytes(got[name].values, image[name].values)
    assert list(got["band_name"].values) == ["blue", "green", "red", "nir"]
    assert remote.attrs == ds.attrs
    assert got.attrs == image.attrs
    assert_same_bytes(got.values, data)
    xr.testing.assert_identical(got, image)

    # Through the accessor (dims by name): coordinates and attrs as the accessor keeps them.
    info = run_job(url, "depth_to_space", {"x": {"href": "/arrays/zip_image"}, "block_size": 2}, "zip_d2s")
    assert info["processID"] == "depth_to_space"
    # 'band_name' differs within each group of 4 bands that DepthToSpace merges: dropped, said.
    with pytest.warns(ops.CoordinateDropped, match="'band_name'"):
        want = image.ops.depth_to_space(2)
    # The result keeps the input's variable name (refl) and the group's attrs stay the group's.
    stored = xr.open_zarr(zarr_url(url, "zip_d2s"), consolidated=True, zarr_format=3)
    assert list(stored.data_vars) == ["refl"] and stored.attrs == ds.attrs
    result = stored["refl"].load()
    assert result.dims == want.dims
    assert set(result.coords) == set(want.coords)
    for name in want.coords:
        assert result[name].dims == want[name].dims
        np.testing.assert_array_equal(result[name].values, want[name].values)
    assert result.attrs == want.attrs
    assert_same_bytes(result.values, np.asarray(want.values))


def test_bfloat16_result_over_zarr_http(url):
    rng = np.random.default_rng(5)
    src = rng.integers(-30000, 30000, size=(8, 64), dtype=np.int32)
    scale = rng.uniform(-0.01, 0.01, size=64).astype(np.float32)
    put_npy(url, "bf_src", src, chunks="4,64")
    put_npy(url, "bf_scale", scale)
    run_job(url, "ascend_dequant", {"src": {"href": "/arrays/bf_src"}, "deq_scale": {"href": "/arrays/bf_scale"},
                                    "dst_dtype": "bfloat16", "mode": "multi_row"}, "bf_out")
    expected = ops.ascend_dequant(src, scale, dst_dtype="bfloat16", mode="multi_row")
    assert expected.dtype == dtypes.bfloat16
    bits = expected.view(np.uint16)

    array = zarr.open_group(zarr_url(url, "bf_out"), mode="r")["bf_out"]
    assert array.dtype == np.uint16
    assert array.attrs["ops_dtype"] == "bfloat16"
    assert_same_bytes(array[...], bits)
    ds = xr.open_zarr(zarr_url(url, "bf_out"), consolidated=True, zarr_format=3)
    assert ds["bf_out"].attrs["ops_dtype"] == "bfloat16"
    assert_same_bytes(ds["bf_out"].values, bits)

    # The NPY download carries the raw bits with X-Array-Dtype.
    download = requests.get(f"{url}/arrays/bf_out", timeout=HTTP_TIMEOUT)
    assert download.status_code == 200
    assert download.headers["X-Array-Dtype"] == "bfloat16"
    assert_same_bytes(load_npy(download.content), bits)


# --- the README's curl session, with requests alone ---------------------------------------

def test_requests_session(url):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 8, 8, 16), dtype=np.float32)
    put = requests.put(f"{url}/arrays/session_x", data=npy_bytes(x), headers={"Content-Type": NPY},
                       params={"chunks": "1,8,8,16"}, timeout=HTTP_TIMEOUT)
    assert put.status_code == 201, put.text
    assert put.json()["shape"] == [4, 8, 8, 16] and put.json()["dtype"] == "float32"
    again = requests.put(f"{url}/arrays/session_x", data=npy_bytes(x), headers={"Content-Type": NPY},
                         timeout=HTTP_TIMEOUT)
    assert again.status_code == 409 and again.headers["Content-Type"].startswith("application/problem+json")
    expected = ops.depth_to_space(x, 2)

    # Sync, raw: the NPY bytes come back.
    sync = requests.post(f"{url}/processes/depth_to_space/execution", timeout=HTTP_TIMEOUT, json={
        "inputs": {"x": {"href": "/arrays/session_x"}, "block_size": 2},
        "outputs": {"result": {"format": {"mediaType": NPY}, "transmissionMode": "value"}},
        "response": "raw"})
    assert sync.status_code == 200, sync.text
    assert sync.headers["Content-Type"] == NPY
    assert_same_bytes(load_npy(sync.content), expected)

    # Async: 201 + Location, poll until successful with progress reaching 100.
    submit = requests.post(f"{url}/processes/depth_to_space/execution", timeout=HTTP_TIMEOUT,
                           headers={"Prefer": "respond-async"}, json={
                               "inputs": {"x": {"href": "arrays/session_x"}, "block_size": 2},
                               "outputs": {"result": {"transmissionMode": "reference", "name": "session_y"}}})
    assert submit.status_code == 201, submit.text
    assert submit.headers["Preference-Applied"] == "respond-async"
    job_id = submit.json()["jobID"]
    location = requests.compat.urljoin(url + "/", submit.headers["Location"])
    assert location == f"{url}/jobs/{job_id}"
    info, seen = wait_job(url, job_id)
    assert info["status"] == "successful", info
    assert seen and seen[-1] == 100 and seen == sorted(seen), seen
    assert all(0 <= p <= 100 for p in seen)
    for stamp in ("created", "started", "finished"):
        assert info.get(stamp), info
    results = requests.get(f"{url}/jobs/{job_id}/results", timeout=HTTP_TIMEOUT)
    assert results.status_code == 204  # response raw (the default) with transmission reference
    assert results.links["related"]["url"].endswith("/arrays/session_y"), results.headers

    listing = requests.get(f"{url}/arrays", timeout=HTTP_TIMEOUT).json()
    assert "session_y" in {a["name"] for a in listing["arrays"]}
    download = requests.get(f"{url}/arrays/session_y", timeout=HTTP_TIMEOUT)
    assert download.status_code == 200 and download.headers["Content-Type"] == NPY
    assert int(download.headers["Content-Length"]) == len(download.content)
    assert_same_bytes(load_npy(download.content), expected)

    deleted = requests.delete(f"{url}/arrays/session_y", timeout=HTTP_TIMEOUT)
    assert deleted.status_code == 204 and deleted.content == b""
    gone = requests.get(f"{url}/arrays/session_y", timeout=HTTP_TIMEOUT)
    assert gone.status_code == 404
    problem = gone.json()
    assert problem["status"] == 404 and problem["type"] and problem["title"]
    missing_job = requests.get(f"{url}/jobs/{'0' * 32}", timeout=HTTP_TIMEOUT)
    assert missing_job.status_code == 404
    assert missing_job.json()["type"].endswith("/no-such-job")


def test_bad_parameter_is_400_with_ops_message(url):
    x = np.zeros((1, 2, 2, 4), np.float32)
    answer = requests.post(f"{url}/processes/depth_to_space/execution", timeout=HTTP_TIMEOUT,
                           json={"inputs": {"x": inline(x), "block_size": 1}})
    assert answer.status_code == 400, answer.text
    assert answer.headers["Content-Type"].startswith("application/problem+json")
    with pytest.raises(ops.InvalidArgument) as raised:
        ops.depth_to_space(x, 1)
    assert answer.json()["detail"] == str(raised.value)


# --- restart --------------------------------------------------------------------------------

def test_healthz_reports_the_cluster(url):
    """``/healthz`` describes the embedded cluster the flags asked for."""
    health = requests.get(f"{url}/healthz", timeout=HTTP_TIMEOUT).json()
    assert health["status"] == "ok"
    assert health["cluster"]["workers"] == 1 and health["cluster"]["threads"] == 2
    assert health["cluster"]["memory_limit"] == 2**30
