"""Route-level tests of the service through FastAPI's TestClient (docs/api.md is the contract).

Every result is compared bit for bit with the ``ops`` NumPy path on the same input, and every
400 for a bad parameter carries exactly the message the ``ops`` function raises for the same
call. One app (the module-scoped ``client``) serves most tests; settings that change the
behaviour (limits, chunk size, token, restart) get their own app on their own data root.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import io
import json
import shutil
import time
import uuid
import zipfile
import zlib
from urllib.parse import unquote_to_bytes

import httpx
import numpy as np
import pytest
import xarray as xr
from fastapi.testclient import TestClient

import ops
from ops import dtypes
from ops.errors import InvalidArgument
from service.api.app import create_app
from service.jobs.records import JobRecords
from tests.helpers import assert_same, random_array
from tests.service.conftest import NPY, assert_problem, inline, load_npy, make_settings, npy_bytes

OGC_EXC = "http://www.opengis.net/def/exceptions/ogcapi-processes-1/1.0/"
INVALID = OGC_EXC + "invalid-parameter"
NO_SUCH_PROCESS = OGC_EXC + "no-such-process"
NO_SUCH_JOB = OGC_EXC + "no-such-job"
RESULT_NOT_READY = OGC_EXC + "result-not-ready"
OGC_REL = "http://www.opengis.net/def/rel/ogc/1.0/"
CONF = "http://www.opengis.net/spec/ogcapi-processes-1/1.0/conf/"

PROCESSES = ("depth_to_space", "space_to_depth", "space_to_batch", "space_to_batch_nd",
             "batch_to_space_nd", "gather_nd", "ascend_dequant")
ARRAY_INPUTS = {"gather_nd": ("params", "indices"), "ascend_dequant": ("src", "deq_scale")}
WIRE = {"bfloat16": np.dtype("<u2"), "complex32": np.dtype("<u4")}
REAL = {"bfloat16": dtypes.bfloat16, "complex32": dtypes.complex32}


# ---------------------------------------------------------------------------------------------
# helpers


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def array_inputs(process: str) -> tuple[str, ...]:
    return ARRAY_INPUTS.get(process, ("x",))


def ops_call(process: str, arrays: dict, kwargs: dict):
    """The ``ops`` NumPy path for the same call the service gets."""
    function = getattr(ops, process)
    return function(*(arrays[k] for k in array_inputs(process)), **kwargs)


def ops_error(process: str, arrays: dict, kwargs: dict) -> str:
    """``str(error)`` of what ``ops`` raises for this call (it must raise)."""
    with pytest.raises((InvalidArgument, IndexError)) as info:
        ops_call(process, arrays, kwargs)
    return str(info.value)


def wire(array: np.ndarray) -> tuple[np.ndarray, str | None]:
    """The array as NPY carries it: raw bits for bfloat16/complex32, plus the declared dtype."""
    name = dtypes.name(np.dtype(array.dtype))
    if name in WIRE:
        return np.asarray(array, order="C").view(WIRE[name]), name
    return array, None


def inline_any(array) -> object:
    """An inline input of any supported dtype (``"dtype"`` for bfloat16/complex32); a Python
    float stays a plain JSON number."""
    if isinstance(array, float):
        return array
    raw, declared = wire(array)
    value = inline(raw)
    if declared:
        value["dtype"] = declared
    return value


def decode(response) -> np.ndarray:
    """An NPY response as its real dtype (``X-Array-Dtype`` names bfloat16/complex32)."""
    array = load_npy(response.content)
    declared = response.headers.get("x-array-dtype")
    if declared is not None:
        assert array.dtype == WIRE[declared], (declared, array.dtype)
        array = array.view(REAL[declared])
    return array


def decode_document(value: dict, declared: str | None = None) -> np.ndarray:
    assert value["encoding"] == "base64" and value["mediaType"] == NPY, value
    array = load_npy(base64.b64decode(value["value"]))
    return array.view(REAL[declared]) if declared else array


def assert_dtype_header(response, dtype) -> None:
    name = dtypes.name(np.dtype(dtype))
    assert response.headers.get("x-array-dtype") == (name if name in WIRE else None), dict(response.headers)


def put_array(client, name: str, array: np.ndarray, *, params: dict | None = None, expect: int = 201):
    raw, declared = wire(array)
    headers = {"Content-Type": NPY}
    if declared:
        headers["X-Array-Dtype"] = declared
    response = client.put(f"/arrays/{name}", content=npy_bytes(raw), headers=headers, params=params or {})
    assert response.status_code == expect, response.text
    return response


def store(client, array: np.ndarray) -> dict:
    """Upload ``array`` under a fresh name; return its href input."""
    name = unique("in")
    put_array(client, name, array)
    return {"href": f"/arrays/{name}"}


def execute(client, process: str, inputs: dict, *, mode: str = "value", response: str = "raw",
            name: str | None = None, headers: dict | None = None):
    output = {"format": {"mediaType": NPY}, "transmissionMode": mode}
    if name:
        output["name"] = name
    body = {"inputs": inputs, "outputs": {"result": output}, "response": response}
    return client.post(f"/processes/{process}/execution", json=body, headers=headers or {})


def wait_job(client, job_id: str, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        response = client.get(f"/jobs/{job_id}")
        assert response.status_code == 200, response.text
        info = response.json()
        if info["status"] not in ("accepted", "running"):
            return info
        assert time.monotonic() < deadline, info
        time.sleep(0.05)


def rng_for(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


@pytest.fixture(scope="module")
def small_root(tmp_path_factory):
    return tmp_path_factory.mktemp("small-root")


@pytest.fixture(scope="module")
def small(small_root):
    """An app with small limits: 4 KiB chunks, 1 KiB inline arrays."""
    with TestClient(create_app(make_settings(small_root, chunk_bytes=4096, max_inline_bytes=1024))) as c:
        yield c


# ---------------------------------------------------------------------------------------------
# 1. landing page, conformance, processes


@pytest.mark.smoke
def test_landing_page_links(client):
    response = client.get("/")
    assert response.status_code == 200
    links = {link["rel"]: link for link in response.json()["links"]}
    desc = links["service-desc"]
    assert desc["href"].endswith("/openapi.json")
    assert desc["type"] == "application/vnd.oai.openapi+json;version=3.0"
    assert links["service-doc"]["href"].endswith("/docs")
    assert links[OGC_REL + "conformance"]["href"].endswith("/conformance")
    assert links[OGC_REL + "processes"]["href"].endswith("/processes")
    assert links[OGC_REL + "job-list"]["href"].endswith("/jobs")
    # the links resolve
    for rel in ("service-desc", "service-doc", OGC_REL + "conformance", OGC_REL + "processes",
                OGC_REL + "job-list"):
        assert client.get(links[rel]["href"]).status_code == 200, rel
    assert client.get(desc["href"]).json()["openapi"].startswith("3.")


def test_healthz(client, service_root):
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["cluster"]["workers"] == 1 and body["cluster"]["threads"] == 2
    assert body["data_root"] == str(service_root.resolve())


def test_conformance(client):
    response = client.get("/conformance")
    assert response.status_code == 200
    assert sorted(response.json()["conformsTo"]) == sorted(
        CONF + c for c in ("core", "json", "oas30", "job-list", "dismiss", "ogc-process-description"))


def test_process_list(client):
    response = client.get("/processes")
    assert response.status_code == 200
    summaries = response.json()["processes"]
    assert [p["id"] for p in summaries] == list(PROCESSES)
    for p in summaries:
        assert p["version"] and isinstance(p["version"], str)
        assert p["title"] and p["description"]
        assert p["jobControlOptions"] == ["sync-execute", "async-execute", "dismiss"]
        assert p["outputTransmission"] == ["value", "reference"]
        hrefs = {link["rel"]: link["href"] for link in p["links"]}
        assert hrefs["self"].endswith(f"/processes/{p['id']}")


@pytest.mark.parametrize("process", PROCESSES)
def test_process_description(client, process):
    response = client.get(f"/processes/{process}")
    assert response.status_code == 200
    body = response.json()
    assert body["id"] == process
    assert body["jobControlOptions"] == ["sync-execute", "async-execute", "dismiss"]
    signature = inspect.signature(getattr(ops, process))
    # GatherNd's scratch is where the service puts a job's files: its choice, never a request's.
    names = [name for name in signature.parameters if name != "scratch"]
    assert "scratch" not in body["inputs"]
    arrays = array_inputs(process)
    assert names[:len(arrays)] == list(arrays)
    inputs = body["inputs"]
    assert list(inputs)[:len(arrays)] == list(arrays)
    for name in arrays:
        schema = inputs[name]["schema"]
        variants = schema["anyOf"]
        assert any(v.get("required") == ["href"] for v in variants)
        assert any(v.get("required") == ["value"] for v in variants)
        assert ({"type": "number"} in variants) == (name == "deq_scale")
        assert inputs[name]["minOccurs"] == 1
    for name in names[len(arrays):]:
        assert name in inputs, name
        schema = inputs[name]["schema"]
        assert isinstance(schema, dict) and schema.keys() & {"type", "enum", "anyOf", "oneOf", "const"}, schema
        required = signature.parameters[name].default is inspect.Parameter.empty
        assert inputs[name]["minOccurs"] == (1 if required else 0), name
    assert set(inputs) - set(names) <= {"dims"}
    assert list(body["outputs"]) == ["result"]
    assert body["outputs"]["result"]["schema"]["contentMediaType"] == NPY


def test_process_description_schemas(client):
    d2s = client.get("/processes/depth_to_space").json()["inputs"]
    assert d2s["block_size"]["schema"]["type"] == "integer"
    assert d2s["block_size"]["schema"]["minimum"] == 2
    assert d2s["data_format"]["schema"]["enum"] == ["NHWC", "NCHW", "NCHW_VECT_C"]
    assert d2s["mode"]["schema"]["enum"] == ["DCR", "CRD"]
    assert d2s["mode"]["schema"]["default"] == "DCR"
    gather = client.get("/processes/gather_nd").json()["inputs"]
    assert gather["negative_index_support"]["schema"]["type"] == "boolean"
    dequant = client.get("/processes/ascend_dequant").json()["inputs"]
    assert dequant["dst_dtype"]["schema"]["enum"] == ["float16", "bfloat16", "float32"]


def test_unknown_process(client):
    assert_problem(client.get("/processes/nope"), 404, NO_SUCH_PROCESS)
    assert_problem(client.post("/processes/nope/execution", json={"inputs": {}}), 404, NO_SUCH_PROCESS)


# ---------------------------------------------------------------------------------------------
# 2. every operator and every dtype, inline and stored, bit-exact against ops


def _dtype_case(process: str, dtype: np.dtype):
    rng = rng_for(process, dtypes.name(dtype))
    if process == "depth_to_space":
        return {"x": random_array(rng, (1, 2, 3, 8), dtype)}, {"block_size": 2, "mode": "CRD"}
    if process == "space_to_depth":
        return {"x": random_array(rng, (2, 4, 2, 3), dtype)}, {"block_size": 2}
    if process == "space_to_batch":
        return {"x": random_array(rng, (2, 3, 4, 2), dtype)}, {"block_size": 2, "paddings": [[1, 0], [0, 2]]}
    if process == "space_to_batch_nd":
        return {"x": random_array(rng, (2, 4, 3, 2), dtype)}, {"block_shape": [2, 3], "paddings": [[0, 0], [1, 2]]}
    if process == "batch_to_space_nd":
        return {"x": random_array(rng, (6, 2, 2, 3), dtype)}, {"block_shape": [2, 3], "crops": [[1, 0], [0, 2]]}
    if process == "gather_nd":
        indices = np.array([[0, 1], [2, -1], [1, 3], [-3, 0]], dtype=np.int64)
        return {"params": random_array(rng, (3, 4, 2), dtype), "indices": indices}, {}
    raise AssertionError(process)


MOVERS = PROCESSES[:-1]
DTYPE_CASES = [pytest.param(p, d, id=f"{p}-{dtypes.name(d)}") for p in MOVERS for d in dtypes.SUPPORTED]


def _dequant_cases():
    """Every supported (src, scale, dst) of AscendDequant: classic vector and scalar, per_token,
    per_group (k_dim 0 and 1)."""
    cases = []
    for dst, scale in (("float16", "uint64"), ("float32", "float32"), ("float32", "bfloat16"),
                       ("bfloat16", "bfloat16"), ("bfloat16", "float32")):
        cases.append(("classic-vector", "int32", scale, dst))
    for dst, scale in (("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float32", "bfloat16"),
                       ("float32", "float32")):
        cases.append(("classic-scalar", "int32", scale, dst))
    for src in ("int32", "float32"):
        for scale, dst in (("float16", "float16"), ("bfloat16", "bfloat16"), ("float32", "float32"),
                           ("float32", "float16"), ("float32", "bfloat16")):
            cases.append(("per_token", src, scale, dst))
    for src, scale, dst in (("int32", "float16", "float16"), ("float32", "bfloat16", "bfloat16"),
                            ("int32", "float32", "bfloat16")):
        cases.append(("per_group-k1", src, scale, dst))
        cases.append(("per_group-k0", src, scale, dst))
    return [pytest.param(*c, id="-".join(c)) for c in cases]


def _dequant_case(kind, src_dtype, scale_dtype, dst):
    rng = rng_for(kind, src_dtype, scale_dtype, dst)
    scale_dtype = dtypes.bfloat16 if scale_dtype == "bfloat16" else np.dtype(scale_dtype)
    if kind == "classic-vector":
        src = random_array(rng, (3, 8), src_dtype)
        return {"src": src, "deq_scale": random_array(rng, (8,), scale_dtype)}, {"dst_dtype": dst}
    if kind == "classic-scalar":
        src = random_array(rng, (3, 8), src_dtype)
        return {"src": src, "deq_scale": random_array(rng, (), scale_dtype)}, {"dst_dtype": dst}
    if kind == "per_token":
        src = random_array(rng, (4, 5), src_dtype)
        return ({"src": src, "deq_scale": random_array(rng, (4, 1), scale_dtype)},
                {"dst_dtype": dst, "policy": "per_token"})
    if kind == "per_group-k1":
        src = random_array(rng, (2, 64), src_dtype)
        return ({"src": src, "deq_scale": random_array(rng, (2, 2), scale_dtype)},
                {"dst_dtype": dst, "policy": "per_group", "group_size": 32, "k_dim": 1})
    src = random_array(rng, (40, 3), src_dtype)
    return ({"src": src, "deq_scale": random_array(rng, (2, 3), scale_dtype)},
            {"dst_dtype": dst, "policy": "per_group", "group_size": 32, "k_dim": 0})


def check_inline(client, process, arrays, kwargs):
    expected = ops_call(process, arrays, kwargs)
    inputs = {k: inline_any(v) for k, v in arrays.items()} | kwargs
    response = execute(client, process, inputs)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == NPY
    assert_dtype_header(response, expected.dtype)
    assert_same(decode(response), expected)


def _check_download(client, result: str, expected: np.ndarray) -> None:
    download = client.get(f"/arrays/{result}")
    assert download.status_code == 200
    assert download.headers["content-type"] == NPY
    assert_dtype_header(download, expected.dtype)
    assert_same(decode(download), expected)
    info = client.get(f"/arrays/{result}/info").json()
    assert info["shape"] == list(expected.shape) and info["dtype"] == dtypes.name(expected.dtype)


def _delete(client, *names: str) -> None:
    """Keep the module's data root small (the array listing opens every array)."""
    for name in names:
        assert client.delete(f"/arrays/{name}").status_code == 204


def check_stored(client, process, arrays, kwargs):
    """Stored inputs, a synchronous execution with a stored (reference) result, downloaded."""
    expected = ops_call(process, arrays, kwargs)
    inputs = {k: store(client, v) for k, v in arrays.items()} | kwargs
    result = unique("out")
    response = execute(client, process, inputs, mode="reference", name=result)
    assert response.status_code == 200, response.text
    assert response.json() == {"href": f"/arrays/{result}", "type": NPY}
    _check_download(client, result, expected)
    _delete(client, result, *(v["href"].rsplit("/", 1)[1] for k, v in inputs.items() if k in arrays))


def check_stored_jobs(client, cases):
    """Like ``check_stored`` for many (process, arrays, kwargs) cases at once, as async jobs
    that run side by side."""
    jobs = []
    for process, arrays, kwargs in cases:
        inputs = {k: store(client, v) for k, v in arrays.items()} | kwargs
        result = unique("out")
        response = execute(client, process, inputs, mode="reference", name=result,
                           headers={"Prefer": "respond-async"})
        assert response.status_code == 201, response.text
        jobs.append((response.json()["jobID"], result, inputs, ops_call(process, arrays, kwargs)))
    for job_id, result, inputs, expected in jobs:
        info = wait_job(client, job_id)
        assert info["status"] == "successful", info
        assert client.get(f"/jobs/{job_id}/results").json() == {"result": {"href": f"/arrays/{result}", "type": NPY}}
        _check_download(client, result, expected)
        _delete(client, result, *(v["href"].rsplit("/", 1)[1] for v in inputs.values() if isinstance(v, dict)))


@pytest.mark.parametrize(("process", "dtype"), DTYPE_CASES)
def test_dtype_inline(client, process, dtype):
    check_inline(client, process, *_dtype_case(process, dtype))


@pytest.mark.parametrize("dtype", dtypes.SUPPORTED, ids=dtypes.name)
def test_dtype_stored(client, dtype):
    """Every mover on stored inputs of ``dtype``, as jobs side by side (the synchronous path
    with stored inputs is the one of test_representative_stored)."""
    check_stored_jobs(client, [(p, *_dtype_case(p, dtype)) for p in MOVERS])


@pytest.mark.parametrize(("kind", "src", "scale", "dst"), _dequant_cases())
def test_dequant_dtypes_inline(client, kind, src, scale, dst):
    check_inline(client, "ascend_dequant", *_dequant_case(kind, src, scale, dst))


@pytest.mark.parametrize("kind", ["classic-vector", "classic-scalar", "per_token", "per_group-k1", "per_group-k0"])
def test_dequant_dtypes_stored(client, kind):
    cases = [p.values[1:] for p in _dequant_cases() if p.values[0] == kind]
    assert cases
    check_stored_jobs(client, [("ascend_dequant", *_dequant_case(kind, *c)) for c in cases])


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


# ---------------------------------------------------------------------------------------------
# 3. every operator with representative parameters


def _ints(shape, dtype=np.int32):
    return np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)


REPRESENTATIVE = [
    ("depth_to_space", {"x": _ints((1, 1, 1, 4))}, {"block_size": 2}),
    ("depth_to_space", {"x": _ints((2, 2, 3, 8))}, {"block_size": 2, "data_format": "NHWC", "mode": "DCR"}),
    ("depth_to_space", {"x": _ints((2, 2, 3, 8))}, {"block_size": 2, "data_format": "NHWC", "mode": "CRD"}),
    ("depth_to_space", {"x": _ints((1, 18, 2, 2))}, {"block_size": 3, "data_format": "NCHW", "mode": "DCR"}),
    ("depth_to_space", {"x": _ints((1, 18, 2, 2))}, {"block_size": 3, "data_format": "NCHW", "mode": "CRD"}),
    ("depth_to_space", {"x": _ints((1, 4, 2, 3, 4), np.int8)}, {"block_size": 2, "data_format": "NCHW_VECT_C"}),
    ("depth_to_space", {"x": _ints((1, 4, 2, 3, 4), np.int8)},
     {"block_size": 2, "data_format": "NCHW_VECT_C", "mode": "CRD"}),
    ("space_to_depth", {"x": _ints((2, 4, 6, 3))}, {"block_size": 2}),
    ("space_to_depth", {"x": _ints((2, 4, 6, 3))}, {"block_size": 2, "mode": "CRD"}),
    ("space_to_depth", {"x": _ints((1, 2, 6, 3))}, {"block_size": 3, "data_format": "NCHW", "mode": "CRD"}),
    ("space_to_depth", {"x": _ints((1, 1, 4, 6, 4), np.int8)}, {"block_size": 2, "data_format": "NCHW_VECT_C"}),
    ("space_to_batch", {"x": _ints((2, 3, 5, 2))}, {"block_size": 2, "paddings": [[1, 0], [1, 2]]}),
    ("space_to_batch", {"x": _ints((1, 4, 4, 1))}, {"block_size": 1, "paddings": [[0, 0], [0, 0]]}),
    ("space_to_batch_nd", {"x": _ints((2, 5, 4, 3))}, {"block_shape": [3, 2], "paddings": [[1, 0], [2, 0]]}),
    ("space_to_batch_nd", {"x": _ints((1, 5, 2))}, {"block_shape": [4], "paddings": [[2, 1]]}),
    ("batch_to_space_nd", {"x": _ints((12, 2, 3, 2))}, {"block_shape": [3, 2], "crops": [[1, 2], [0, 1]]}),
    ("batch_to_space_nd", {"x": _ints((8, 3, 1))}, {"block_shape": [4], "crops": [[3, 4]]}),
    ("gather_nd", {"params": np.array([[0, 1], [2, 3]]), "indices": np.array([[0, 0], [1, 1]])}, {}),
    ("gather_nd", {"params": np.array([[0, 1], [2, 3]]), "indices": np.array([[1], [0]])}, {}),
    ("gather_nd", {"params": _ints((2, 2, 2)), "indices": np.array([[[0, 1]], [[1, 0]]])}, {}),
    ("gather_nd", {"params": _ints((2, 2, 2)), "indices": np.array([[1], [0]])}, {"batch_dims": 1}),
    ("gather_nd", {"params": _ints((3, 4, 5)), "indices": np.array([[[-1, 2], [0, -4]], [[1, 1], [2, 3]],
                                                                    [[0, 0], [-2, -1]]], np.int32)},
     {"batch_dims": 1}),
    ("gather_nd", {"params": _ints((3, 4)), "indices": np.array([[-1, -4], [-3, 0]])}, {}),
    ("ascend_dequant", {"src": np.arange(-16, 16, dtype=np.int32).reshape(4, 8),
                        "deq_scale": np.array([2.2, -2.2, 2.2, -2.2, 2.2, -2.2, 0, 0], np.float32)},
     {"dst_dtype": "float32", "calc_count": 6}),
    ("ascend_dequant", {"src": np.arange(-16, 16, dtype=np.int32).reshape(4, 8),
                        "deq_scale": np.array([2.2, -2.2, 2.2, -2.2, 2.2, -2.2, 0, 0], np.float32)},
     {"dst_dtype": "bfloat16", "calc_count": 6, "mode": "multi_row"}),
    ("ascend_dequant", {"src": np.arange(-8, 24, dtype=np.int32).reshape(4, 8), "deq_scale": 0.37},
     {"dst_dtype": "float32"}),
    ("ascend_dequant", {"src": np.arange(-8, 24, dtype=np.int32).reshape(4, 8), "deq_scale": -1.5},
     {"dst_dtype": "bfloat16", "align_output": True}),
    ("ascend_dequant", {"src": np.arange(16, dtype=np.int32), "deq_scale": np.float32(0.25).reshape(())},
     {"dst_dtype": "float32", "calc_count": 8}),
    ("ascend_dequant", {"src": np.linspace(-3, 3, 15, dtype=np.float32).reshape(3, 5),
                        "deq_scale": np.array([0.5, -2, 3.25], np.float32)},
     {"dst_dtype": "float16", "policy": "per_token"}),
    ("ascend_dequant", {"src": np.arange(-64, 64, dtype=np.int32).reshape(2, 64),
                        "deq_scale": np.array([[0.5, 2], [-1, 0.125]], np.float32)},
     {"dst_dtype": "float32", "policy": "per_group", "group_size": 32}),
    ("ascend_dequant", {"src": np.arange(-70, 70, dtype=np.int32).reshape(35, 4),
                        "deq_scale": np.array([[0.5, 2, 3, 4], [-1, 0.125, 7, 8]], np.float16)},
     {"dst_dtype": "float16", "policy": "per_group", "group_size": 32, "k_dim": 0, "calc_count": 120}),
]


@pytest.mark.parametrize(("process", "arrays", "kwargs"), REPRESENTATIVE)
def test_representative_inline(client, process, arrays, kwargs):
    check_inline(client, process, arrays, kwargs)


@pytest.mark.parametrize(("process", "arrays", "kwargs"),
                         [case for case in REPRESENTATIVE if not any(isinstance(v, float) for v in case[1].values())])
def test_representative_stored(client, process, arrays, kwargs):
    check_stored(client, process, arrays, kwargs)


def test_spec_examples(client):
    x = np.arange(1, 17, dtype=np.int32).reshape(1, 2, 2, 4)
    response = execute(client, "depth_to_space", {"x": inline(x), "block_size": 2})
    assert decode(response)[0, :, :, 0].tolist() == [[1, 2, 5, 6], [3, 4, 7, 8], [9, 10, 13, 14],
                                                     [11, 12, 15, 16]]
    src = np.arange(-16, 16, dtype=np.int32).reshape(4, 8)
    scale = np.array([2.2, -2.2, 2.2, -2.2, 2.2, -2.2, 0, 0], np.float32)
    response = execute(client, "ascend_dequant", {"src": inline(src), "deq_scale": inline(scale),
                                                  "dst_dtype": "float32", "calc_count": 6})
    np.testing.assert_allclose(decode(response)[0], [-35.2, 33, -30.8, 28.6, -26.4, 24.2, -10, -9], rtol=1e-6)


def test_gather_nd_indices_by_href(client):
    params = random_array(rng_for("gather-href"), (3, 4, 5), np.float32)
    indices = np.array([[[1, -1], [0, 0]], [[3, 2], [-4, 4]], [[2, 0], [0, -5]]], dtype=np.int64)
    expected = ops.gather_nd(params, indices, batch_dims=1)
    for params_input in (inline(params), store(client, params)):
        response = execute(client, "gather_nd", {"params": params_input, "indices": store(client, indices),
                                                 "batch_dims": 1})
        assert response.status_code == 200, response.text
        assert_same(decode(response), expected)


def test_absolute_href_of_this_service(client):
    x = _ints((1, 2, 2, 4))
    href = store(client, x)["href"]
    response = execute(client, "depth_to_space", {"x": {"href": "http://testserver" + href}, "block_size": 2})
    assert response.status_code == 200, response.text
    assert_same(decode(response), ops.depth_to_space(x, 2))
    response = execute(client, "depth_to_space", {"x": {"href": href.lstrip("/")}, "block_size": 2})
    assert response.status_code == 200, response.text
    assert_same(decode(response), ops.depth_to_space(x, 2))


# ---------------------------------------------------------------------------------------------
# 4. sync response forms


def test_document_value(client):
    x = random_array(rng_for("doc"), (1, 2, 2, 8), np.float64)
    response = execute(client, "depth_to_space", {"x": inline(x), "block_size": 2}, response="document")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert list(body) == ["result"]
    assert set(body["result"]) == {"value", "encoding", "mediaType"}
    assert_same(decode_document(body["result"]), ops.depth_to_space(x, 2))


def test_document_value_bfloat16(client):
    x = random_array(rng_for("doc-bf16"), (1, 2, 2, 4), dtypes.bfloat16)
    response = execute(client, "depth_to_space", {"x": inline_any(x), "block_size": 2}, response="document")
    assert response.status_code == 200
    assert response.headers["x-array-dtype"] == "bfloat16"
    assert_same(decode_document(response.json()["result"], "bfloat16"), ops.depth_to_space(x, 2))


def test_document_reference_and_name_conflict(client):
    x = _ints((1, 2, 2, 4))
    name = unique("named")
    response = execute(client, "depth_to_space", {"x": inline(x), "block_size": 2}, mode="reference",
                       response="document", name=name)
    assert response.status_code == 200, response.text
    assert response.json() == {"result": {"href": f"/arrays/{name}", "type": NPY}}
    assert_same(decode(client.get(f"/arrays/{name}")), ops.depth_to_space(x, 2))
    info = client.get(f"/arrays/{name}/info").json()
    assert info["dims"] == ["n", "h", "w", "c"]
    # the name is taken now
    again = execute(client, "depth_to_space", {"x": inline(x), "block_size": 2}, mode="reference", name=name)
    assert_problem(again, 409)
    assert_same(decode(client.get(f"/arrays/{name}")), ops.depth_to_space(x, 2))
    # nor may a result overwrite its own input
    clash = execute(client, "depth_to_space", {"x": {"href": f"/arrays/{name}"}, "block_size": 1},
                    mode="reference", name=name)
    assert_problem(clash, 409)


def test_unnamed_reference_is_named_after_the_job(client):
    response = execute(client, "space_to_depth", {"x": inline(_ints((1, 2, 2, 1))), "block_size": 2},
                       mode="reference")
    assert response.status_code == 200
    href = response.json()["href"]
    name = href.rsplit("/", 1)[1]
    assert client.get(f"/jobs/{name}").json()["processID"] == "space_to_depth"
    assert decode(client.get(href)).tolist() == [[[[0, 1, 2, 3]]]]


# ---------------------------------------------------------------------------------------------
# 5. async jobs


def test_async_job_lifecycle(client):
    x = random_array(rng_for("async"), (2, 4, 6, 3), np.float32)
    href = store(client, x)
    response = execute(client, "space_to_depth", {"x": href, "block_size": 2},
                       headers={"Prefer": "respond-async"})
    assert response.status_code == 201, response.text
    info = response.json()
    job_id = info["jobID"]
    assert response.headers["location"].endswith(f"/jobs/{job_id}")
    assert response.headers["preference-applied"] == "respond-async"
    assert info["type"] == "process" and info["processID"] == "space_to_depth"
    assert info["status"] in ("accepted", "running", "successful")
    assert info["created"]
    done = wait_job(client, job_id)
    assert done["status"] == "successful", done
    assert done["progress"] == 100
    assert done["created"] <= done["started"] <= done["finished"]
    rels = {link["rel"]: link["href"] for link in done["links"]}
    assert rels[OGC_REL + "results"].endswith(f"/jobs/{job_id}/results")
    results = client.get(f"/jobs/{job_id}/results")
    assert results.status_code == 200
    assert_same(decode_document(results.json()["result"]), ops.space_to_depth(x, 2))


def test_async_job_reference(client):
    x = random_array(rng_for("async-ref"), (4, 2, 2, 3), np.int16)
    name = unique("async-out")
    response = execute(client, "batch_to_space_nd", {"x": store(client, x), "block_shape": [2, 2],
                                                     "crops": [[0, 1], [1, 0]]},
                       mode="reference", name=name, headers={"Prefer": "respond-async"})
    assert response.status_code == 201
    job_id = response.json()["jobID"]
    assert wait_job(client, job_id)["status"] == "successful"
    assert client.get(f"/jobs/{job_id}/results").json() == {"result": {"href": f"/arrays/{name}", "type": NPY}}
    assert_same(decode(client.get(f"/arrays/{name}")), ops.batch_to_space_nd(x, [2, 2], [[0, 1], [1, 0]]))


def test_async_job_that_fails(client):
    x = _ints((1, 2, 2, 4))
    response = execute(client, "depth_to_space", {"x": store(client, x), "block_size": 3},
                       headers={"Prefer": "respond-async"})
    assert response.status_code == 201
    job_id = response.json()["jobID"]
    done = wait_job(client, job_id)
    message = ops_error("depth_to_space", {"x": x}, {"block_size": 3})
    assert done["status"] == "failed" and message in done["message"]
    body = assert_problem(client.get(f"/jobs/{job_id}/results"), 400, INVALID)
    assert message in body["detail"]


def test_job_list_filters(client):
    x = _ints((2, 4, 4, 2))
    ids = {}
    for process, kwargs in (("space_to_depth", {"block_size": 2}), ("space_to_batch",
                            {"block_size": 2, "paddings": [[0, 0], [0, 0]]})):
        response = execute(client, process, {"x": store(client, x), **kwargs}, headers={"Prefer": "respond-async"})
        assert response.status_code == 201
        ids[process] = response.json()["jobID"]
    for job_id in ids.values():
        assert wait_job(client, job_id)["status"] == "successful"

    every = client.get("/jobs").json()
    listed = [j["jobID"] for j in every["jobs"]]
    assert set(ids.values()) <= set(listed)
    assert any(link["rel"] == "self" for link in every["links"])
    created = [j["created"] for j in every["jobs"]]
    assert created == sorted(created, reverse=True)

    only = client.get("/jobs", params={"processID": "space_to_batch"}).json()["jobs"]
    assert only and {j["processID"] for j in only} == {"space_to_batch"}
    assert ids["space_to_batch"] in [j["jobID"] for j in only]
    assert ids["space_to_depth"] not in [j["jobID"] for j in only]

    both = client.get("/jobs", params=[("processID", "space_to_batch"), ("processID", "space_to_depth")]).json()
    assert set(ids.values()) <= {j["jobID"] for j in both["jobs"]}
    assert {j["processID"] for j in both["jobs"]} <= {"space_to_batch", "space_to_depth"}

    successful = client.get("/jobs", params={"status": "successful"}).json()["jobs"]
    assert successful and {j["status"] for j in successful} == {"successful"}
    assert set(ids.values()) <= {j["jobID"] for j in successful}
    assert ids["space_to_batch"] not in [j["jobID"] for j in
                                         client.get("/jobs", params={"status": "failed"}).json()["jobs"]]

    limited = client.get("/jobs", params={"limit": 1}).json()["jobs"]
    assert len(limited) == 1 and limited[0]["jobID"] == listed[0]
    assert len(client.get("/jobs", params={"limit": 2}).json()["jobs"]) == 2

    assert_problem(client.get("/jobs", params={"status": "sleeping"}), 400, INVALID)
    assert_problem(client.get("/jobs", params={"limit": 0}), 400, INVALID)


def test_unknown_job(client):
    assert_problem(client.get("/jobs/unknown"), 404, NO_SUCH_JOB)
    assert_problem(client.get("/jobs/unknown/results"), 404, NO_SUCH_JOB)
    assert_problem(client.delete("/jobs/unknown"), 404, NO_SUCH_JOB)


def test_dismiss_twice_and_results_not_ready(client):
    x = _ints((4, 8, 8, 4))
    response = execute(client, "space_to_depth", {"x": store(client, x), "block_size": 2},
                       headers={"Prefer": "respond-async"})
    assert response.status_code == 201
    job_id = response.json()["jobID"]
    first = client.delete(f"/jobs/{job_id}")
    assert first.status_code == 200, first.text
    assert first.json()["status"] == "dismissed" and first.json()["jobID"] == job_id
    second = client.delete(f"/jobs/{job_id}")
    assert second.status_code == 200
    assert second.json()["status"] == "dismissed"
    assert client.get(f"/jobs/{job_id}").json()["status"] == "dismissed"
    assert_problem(client.get(f"/jobs/{job_id}/results"), 404, RESULT_NOT_READY)
    listed = client.get("/jobs", params={"status": "dismissed"}).json()["jobs"]
    assert job_id in [j["jobID"] for j in listed]


def test_results_of_an_accepted_job_are_not_ready(client):
    records = client.app.state.services.records
    job_id = uuid.uuid4().hex
    records.create(job_id, "depth_to_space", [], unique("never"), "value", status="accepted")
    try:
        assert client.get(f"/jobs/{job_id}").json()["status"] == "accepted"
        assert_problem(client.get(f"/jobs/{job_id}/results"), 404, RESULT_NOT_READY)
    finally:
        assert client.delete(f"/jobs/{job_id}").json()["status"] == "dismissed"


# ---------------------------------------------------------------------------------------------
# 6. arrays


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


@pytest.mark.smoke
def test_zero_sized_through_an_operator(client):
    x = np.zeros((0, 4, 4, 8), np.float32)
    check_inline(client, "depth_to_space", {"x": x}, {"block_size": 2})
    check_stored(client, "depth_to_space", {"x": x}, {"block_size": 2})


@pytest.mark.parametrize("dtype", [np.float64, dtypes.bfloat16, dtypes.complex32], ids=dtypes.name)
def test_zero_d_results(client, dtype):
    """GatherNd with one full index tuple into a 1-D params gives a 0-d result, in every form."""
    params = random_array(rng_for("0d", dtypes.name(dtype)), (5,), dtype)
    indices = np.array([-2], np.int64)
    expected = ops.gather_nd(params, indices)
    assert expected.shape == ()
    check_inline(client, "gather_nd", {"params": params, "indices": indices}, {})
    check_stored(client, "gather_nd", {"params": params, "indices": indices}, {})
    document = execute(client, "gather_nd", {"params": inline_any(params), "indices": inline(indices)},
                       response="document")
    assert document.status_code == 200
    assert_same(decode_document(document.json()["result"], document.headers.get("x-array-dtype")), expected)
    response = execute(client, "gather_nd", {"params": store(client, params), "indices": inline(indices)},
                       headers={"Prefer": "respond-async"})
    job_id = response.json()["jobID"]
    assert wait_job(client, job_id)["status"] == "successful"
    results = client.get(f"/jobs/{job_id}/results")
    assert_same(decode_document(results.json()["result"], results.headers.get("x-array-dtype")), expected)


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


def test_overwrite_list_and_delete(client):
    name = unique("life")
    first, second = _ints((2, 3)), _ints((4,), np.int8)
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
    body = npy_bytes(_ints((5, 5)))
    assert_problem(client.put(f"/arrays/{unique()}", content=body[:-3], headers=headers), 400, INVALID)
    assert_problem(client.put(f"/arrays/{unique()}", content=body + b"xx", headers=headers), 400, INVALID)
    assert_problem(client.put(f"/arrays/{unique()}", content=b"garbage!" * 20, headers=headers), 400, INVALID)
    pickled = io.BytesIO()
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    refused = assert_problem(client.put(f"/arrays/{unique()}", content=pickled.getvalue(), headers=headers),
                             400, INVALID)
    assert "|O" in refused["detail"]


# ---------------------------------------------------------------------------------------------
# 7. Zarr over HTTP


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
        put_array(client, other, _ints((3,)))
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
# 8. errors


def _f32(shape):
    return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)


SRC = np.arange(-8, 8, dtype=np.int32).reshape(2, 8)
ERROR_CASES = [
    ("depth_to_space", {"x": _f32((1, 2, 2, 8))}, {"block_size": 0}),
    ("depth_to_space", {"x": _f32((1, 2, 2, 8))}, {"block_size": 1}),
    ("depth_to_space", {"x": _f32((1, 2, 2, 8))}, {"block_size": -1}),
    ("depth_to_space", {"x": _f32((1, 2, 2, 8))}, {"block_size": -1879048192}),
    ("depth_to_space", {"x": _f32((1, 2, 2, 8))}, {"block_size": 2**62}),
    ("depth_to_space", {"x": _f32((1, 2, 2, 8))}, {"block_size": 2.0}),
    ("depth_to_space", {"x": _f32((1, 2, 2, 8))}, {"block_size": True}),
    ("depth_to_space", {"x": _f32((1, 2, 2, 8))}, {"block_size": "2"}),
    ("depth_to_space", {"x": _f32((1, 2, 2, 8))}, {"block_size": 3}),
    ("depth_to_space", {"x": _f32((2, 2, 8))}, {"block_size": 2}),
    ("depth_to_space", {"x": _f32((1, 2, 2, 8))}, {"block_size": 2, "data_format": "NWHC"}),
    ("depth_to_space", {"x": _f32((1, 2, 2, 8))}, {"block_size": 2, "mode": "ABC"}),
    ("depth_to_space", {"x": _f32((1, 1, 2, 2, 4))}, {"block_size": 2, "data_format": "NCHW_VECT_C"}),
    ("space_to_depth", {"x": _f32((1, 3, 4, 2))}, {"block_size": 2}),
    ("space_to_depth", {"x": _f32((1, 4, 4, 2))}, {"block_size": 2**62}),
    ("space_to_batch", {"x": _f32((1, 4, 4, 1))}, {"block_size": 0, "paddings": [[0, 0], [0, 0]]}),
    ("space_to_batch", {"x": _f32((1, 4, 4, 1))}, {"block_size": -1879048192, "paddings": [[0, 0], [0, 0]]}),
    ("space_to_batch", {"x": _f32((1, 4, 4, 1))}, {"block_size": 2, "paddings": [[-1, 1], [0, 0]]}),
    ("space_to_batch", {"x": _f32((1, 4, 4, 1))}, {"block_size": 2, "paddings": [1, 1, 0]}),
    ("space_to_batch", {"x": _f32((1, 4, 4, 1))}, {"block_size": 2, "paddings": [[0, 0], [0.0, 0]]}),
    ("space_to_batch", {"x": _f32((1, 4, 4, 1))}, {"block_size": 3, "paddings": [[0, 0], [0, 0]]}),
    ("space_to_batch", {"x": _f32((4, 4, 1))}, {"block_size": 2, "paddings": [[0, 0], [0, 0]]}),
    ("space_to_batch_nd", {"x": _f32((1, 4, 4, 1))}, {"block_shape": [2, 2], "paddings": [[0, 0], [-2, 0]]}),
    ("space_to_batch_nd", {"x": _f32((1, 4, 4, 1))}, {"block_shape": [2, 2], "paddings": [[0, 0]]}),
    ("space_to_batch_nd", {"x": _f32((1, 4, 4, 1))}, {"block_shape": [[2, 2]], "paddings": [[0, 0], [0, 0]]}),
    ("space_to_batch_nd", {"x": _f32((1, 4, 4, 1))}, {"block_shape": [2**32, 2**32], "paddings": [[0, 0], [0, 0]]}),
    ("space_to_batch_nd", {"x": _f32((1, 4, 4, 1))}, {"block_shape": [0, 2], "paddings": [[0, 0], [0, 0]]}),
    ("space_to_batch_nd", {"x": _f32((1, 4, 4, 1))}, {"block_shape": [2.0, 2], "paddings": [[0, 0], [0, 0]]}),
    ("space_to_batch_nd", {"x": _f32((1, 4, 4, 1))}, {"block_shape": [True, 2], "paddings": [[0, 0], [0, 0]]}),
    ("space_to_batch_nd", {"x": _f32((1, 4, 4, 1))}, {"block_shape": [3, 2], "paddings": [[0, 0], [0, 0]]}),
    ("space_to_batch_nd", {"x": _f32((1, 4, 4, 1))},
     {"block_shape": [2, 2, 2, 2], "paddings": [[0, 0]] * 4}),
    ("batch_to_space_nd", {"x": _f32((4, 2, 2, 1))}, {"block_shape": [2, 2], "crops": [[0, 0], [0, 5]]}),
    ("batch_to_space_nd", {"x": _f32((4, 2, 2, 1))}, {"block_shape": [2, 2], "crops": [[-1, 0], [0, 0]]}),
    ("batch_to_space_nd", {"x": _f32((3, 2, 2, 1))}, {"block_shape": [2, 2], "crops": [[0, 0], [0, 0]]}),
    ("batch_to_space_nd", {"x": _f32((4, 2, 2, 1))}, {"block_shape": [2, 2, 1, 1], "crops": [[0, 0]] * 4}),
    ("batch_to_space_nd", {"x": _f32((4, 2, 2, 1))}, {"block_shape": [-1879048192, 2], "crops": [[0, 0], [0, 0]]}),
    ("gather_nd", {"params": _f32((2, 3)), "indices": np.array([[0, 3]])}, {}),
    ("gather_nd", {"params": _f32((2, 3)), "indices": np.array([[0, 1], [0, -4]])}, {}),
    ("gather_nd", {"params": _f32((2, 3)), "indices": np.array([[0, -1]])}, {"negative_index_support": False}),
    ("gather_nd", {"params": _f32((2, 3)), "indices": np.array([[0.0, 1.0]])}, {}),
    ("gather_nd", {"params": _f32((2, 3)), "indices": np.array([[0, 1]], np.int16)}, {}),
    ("gather_nd", {"params": _f32((2, 3)), "indices": np.zeros((2, 0), np.int64)}, {}),
    ("gather_nd", {"params": _f32((2, 3)), "indices": np.zeros((1, 3), np.int64)}, {}),
    ("gather_nd", {"params": _f32((2, 3)), "indices": np.zeros((2, 1), np.int64)}, {"batch_dims": 2}),
    ("gather_nd", {"params": _f32((2, 3)), "indices": np.zeros((2, 1), np.int64)}, {"batch_dims": -1}),
    ("gather_nd", {"params": _f32((0, 3)), "indices": np.zeros((1, 1), np.int64)}, {}),
    ("gather_nd", {"params": _f32((2, 3)), "indices": np.zeros((1, 1), np.int64)}, {"negative_index_support": 1}),
    ("ascend_dequant", {"src": SRC, "deq_scale": np.ones(8, np.float64)}, {"dst_dtype": "float32"}),
    ("ascend_dequant", {"src": SRC, "deq_scale": np.ones(8, np.float32)}, {"dst_dtype": "int8"}),
    ("ascend_dequant", {"src": SRC.astype(np.float32), "deq_scale": np.ones(8, np.float32)},
     {"dst_dtype": "float32"}),
    ("ascend_dequant", {"src": SRC, "deq_scale": np.ones(8, np.float32)}, {"dst_dtype": "float32", "calc_count": 9}),
    ("ascend_dequant", {"src": SRC, "deq_scale": np.ones(4, np.float32)}, {"dst_dtype": "float32"}),
    ("ascend_dequant", {"src": SRC, "deq_scale": np.ones((2, 1), np.float32)},
     {"dst_dtype": "float32", "policy": "per_group", "group_size": 33}),
    ("ascend_dequant", {"src": SRC, "deq_scale": np.ones((2, 1), np.float32)},
     {"dst_dtype": "float32", "policy": "per_token", "calc_count": 5}),
    ("ascend_dequant", {"src": np.ones((2, 3), np.int32), "deq_scale": np.ones(3, np.float32)},
     {"dst_dtype": "float32", "align_output": True}),
    ("ascend_dequant", {"src": SRC, "deq_scale": np.ones(8, np.float32)}, {"dst_dtype": "float32", "offset": 1}),
]
ERROR_IDS = [f"{i}-{c[0]}" for i, c in enumerate(ERROR_CASES)]


@pytest.mark.parametrize(("process", "arrays", "kwargs"), ERROR_CASES, ids=ERROR_IDS)
def test_bad_parameters_inline(client, process, arrays, kwargs):
    if "offset" in kwargs:
        with pytest.raises(TypeError):
            ops_call(process, arrays, kwargs)
        response = execute(client, process, {k: inline_any(v) for k, v in arrays.items()} | kwargs)
        body = assert_problem(response, 400, INVALID)
        assert "offset" in body["detail"]
        return
    message = ops_error(process, arrays, kwargs)
    response = execute(client, process, {k: inline_any(v) for k, v in arrays.items()} | kwargs)
    assert_problem(response, 400, INVALID, message)


@pytest.mark.parametrize(("process", "arrays", "kwargs"),
                         [c for c in ERROR_CASES if "offset" not in c[2]],
                         ids=[i for i, c in zip(ERROR_IDS, ERROR_CASES) if "offset" not in c[2]])
def test_bad_parameters_stored(client, process, arrays, kwargs):
    """The same refusals with stored (lazy, Dask) inputs: the same messages, and for the
    value checks of stored indices, when computed on the cluster."""
    message = ops_error(process, arrays, kwargs)
    inputs = {k: store(client, v) for k, v in arrays.items()} | kwargs
    assert_problem(execute(client, process, inputs), 400, INVALID, message)
    result = unique("never")
    assert_problem(execute(client, process, inputs, mode="reference", name=result), 400, INVALID, message)
    assert_problem(client.get(f"/arrays/{result}/info"), 404)


def _pickled_npy(array: np.ndarray) -> dict:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return {"value": base64.b64encode(buffer.getvalue()).decode(), "encoding": "base64", "mediaType": NPY}


@pytest.mark.parametrize(("process", "name", "dtype"), [
    ("depth_to_space", "x", object),
    ("depth_to_space", "x", "<U3"),
    ("gather_nd", "params", object),
    ("gather_nd", "indices", object),
    ("ascend_dequant", "src", object),
    ("space_to_batch_nd", "x", "S2"),
])
def test_object_and_string_dtypes(client, process, name, dtype):
    arrays = {"depth_to_space": {"x": np.zeros((1, 2, 2, 8))},
              "space_to_batch_nd": {"x": np.zeros((1, 2, 2, 1))},
              "gather_nd": {"params": np.zeros((2, 3)), "indices": np.zeros((1, 2), np.int64)},
              "ascend_dequant": {"src": np.zeros((2, 8), np.int32), "deq_scale": np.ones(8, np.float32)}}[process]
    kwargs = {"depth_to_space": {"block_size": 2}, "space_to_batch_nd": {"block_shape": [2], "paddings": [[0, 0]]},
              "gather_nd": {}, "ascend_dequant": {"dst_dtype": "float32"}}[process]
    arrays = dict(arrays)
    arrays[name] = np.zeros(arrays[name].shape, dtype=dtype)
    message = ops_error(process, arrays, kwargs)
    inputs = {k: (_pickled_npy(v) if k == name else inline(v)) for k, v in arrays.items()} | kwargs
    assert_problem(execute(client, process, inputs), 400, INVALID, message)


def test_unknown_and_missing_inputs(client):
    x = inline(_ints((1, 2, 2, 4)))
    body = assert_problem(execute(client, "depth_to_space", {"x": x, "block_size": 2, "blocksize": 2}), 400, INVALID)
    assert "blocksize" in body["detail"]
    body = assert_problem(execute(client, "depth_to_space", {"block_size": 2}), 400, INVALID)
    assert "'x'" in body["detail"]
    body = assert_problem(execute(client, "depth_to_space", {"x": x}), 400, INVALID)
    assert "block_size" in body["detail"]
    body = assert_problem(execute(client, "depth_to_space", {"x": 3, "block_size": 2}), 400, INVALID)
    assert_problem(execute(client, "depth_to_space", {"x": {"url": "/arrays/a"}, "block_size": 2}), 400, INVALID)
    response = client.post("/processes/depth_to_space/execution",
                           json={"inputs": {"x": x, "block_size": 2}, "outputs": {"other": {}}})
    assert_problem(response, 400, INVALID)
    response = client.post("/processes/depth_to_space/execution",
                           json={"inputs": {"x": x, "block_size": 2}, "response": "everything"})
    assert_problem(response, 400, INVALID)
    response = client.post("/processes/depth_to_space/execution",
                           json={"inputs": {"x": x, "block_size": 2},
                                 "outputs": {"result": {"format": {"mediaType": "image/png"}}}})
    assert_problem(response, 400, INVALID)


def test_bad_inline_encodings(client):
    good = inline(_ints((1, 2, 2, 4)))
    for value in ({**good, "value": "!!!not base64###"}, {**good, "value": good["value"][:-3]},
                  {**good, "encoding": "hex"}, {**good, "mediaType": "image/png"},
                  {**good, "value": base64.b64encode(b"not an npy at all").decode()},
                  {**good, "value": 12},
                  {**good, "dtype": "bfloat16"}):
        body = assert_problem(execute(client, "depth_to_space", {"x": value, "block_size": 2}), 400, INVALID)
        assert "'x'" in body["detail"], body


def test_inline_input_over_the_limit(small):
    x = np.zeros((1, 4, 4, 64), np.float32)  # 4 KiB > 1 KiB
    body = assert_problem(execute(small, "depth_to_space", {"x": inline(x), "block_size": 2}), 413)
    assert "PUT /arrays/" in body["detail"] and "href" in body["detail"], body
    # the same array uploaded and referenced works, and its result comes back by reference
    assert small.put("/arrays/big-input", content=npy_bytes(x), headers={"Content-Type": NPY}).status_code == 201
    response = execute(small, "depth_to_space", {"x": {"href": "/arrays/big-input"}, "block_size": 2},
                       mode="reference", name="big-output")
    assert response.status_code == 200, response.text
    assert_same(decode(small.get("/arrays/big-output")), ops.depth_to_space(x, 2))
    # a body far over the limit is refused before it is parsed
    huge = {"value": "A" * (3 * 2**20), "encoding": "base64", "mediaType": NPY}
    body = assert_problem(execute(small, "depth_to_space", {"x": huge, "block_size": 2}), 413)
    assert "/arrays/" in body["detail"]


def test_inline_result_over_the_limit(small):
    x = np.ones((1, 4, 4, 4), np.float64)  # 512 B in, 8 KiB out
    kwargs = {"block_size": 2, "paddings": [[6, 6], [6, 6]]}
    body = assert_problem(execute(small, "space_to_batch", {"x": inline(x), **kwargs}), 413)
    assert "reference" in body["detail"] and "/arrays/" in body["detail"], body
    body = assert_problem(execute(small, "space_to_batch", {"x": inline(x), **kwargs}, response="document"), 413)
    # computed from inline inputs in the service's own process, a stored result has the same limit
    body = assert_problem(execute(small, "space_to_batch", {"x": inline(x), **kwargs}, mode="reference"), 413)
    assert "PUT /arrays/" in body["detail"] and "reference" in body["detail"], body
    # from a stored input the cluster computes it
    name = unique("padded")
    response = execute(small, "space_to_batch", {"x": store(small, x), **kwargs}, mode="reference", name=name)
    assert response.status_code == 200, response.text
    assert_same(decode(small.get(f"/arrays/{name}")), ops.space_to_batch(x, 2, [[6, 6], [6, 6]]))
    # an async job asked for an inline result over the limit fails with that error, before computing
    response = execute(small, "space_to_batch", {"x": {"href": f"/arrays/{name}"}, "block_size": 1,
                                                 "paddings": [[0, 0], [0, 0]]}, headers={"Prefer": "respond-async"})
    assert response.status_code == 201
    job_id = response.json()["jobID"]
    done = wait_job(small, job_id)
    assert done["status"] == "failed" and "inline limit" in done["message"], done
    body = assert_problem(small.get(f"/jobs/{job_id}/results"), 413)
    assert "reference" in body["detail"] and "/arrays/" in body["detail"]


def test_request_body_errors(client):
    url = "/processes/depth_to_space/execution"
    assert_problem(client.post(url, content=b"{not json", headers={"Content-Type": "application/json"}), 400, INVALID)
    assert_problem(client.post(url, content=b"[1, 2]", headers={"Content-Type": "application/json"}), 400, INVALID)
    assert_problem(client.post(url, content=b'{"inputs": 3}', headers={"Content-Type": "application/json"}),
                   400, INVALID)
    assert_problem(client.post(url, content=b"\xff\xfe", headers={"Content-Type": "application/json"}), 400, INVALID)
    body = json.dumps({"inputs": {"x": inline(_ints((1, 2, 2, 4))), "block_size": 2}}).encode()
    assert_problem(client.post(url, content=body, headers={"Content-Type": "text/plain"}), 415)
    assert_problem(client.post(url, content=body, headers={"Content-Type": "application/x-www-form-urlencoded"}), 415)
    response = client.put(f"/arrays/{unique()}", content=npy_bytes(_ints((2,))),
                          headers={"Content-Type": "text/plain"})
    assert_problem(response, 415)
    response = client.put(f"/arrays/{unique()}", content=npy_bytes(_ints((2,))))
    assert_problem(response, 415)


BAD_NAMES = ["..x", ".hidden", "a" * 129, "a b", "a$b", "é"]


@pytest.mark.parametrize("bad", BAD_NAMES, ids=["dotdot", "hidden", "long", "space", "dollar", "accent"])
def test_bad_array_names(client, bad):
    body = npy_bytes(_ints((2,)))
    assert_problem(client.put(f"/arrays/{bad}", content=body, headers={"Content-Type": NPY}), 400, INVALID)
    assert_problem(client.get(f"/arrays/{bad}/info"), 400, INVALID)
    assert_problem(client.delete(f"/arrays/{bad}"), 400, INVALID)
    x = inline(_ints((1, 2, 2, 4)))
    assert_problem(execute(client, "depth_to_space", {"x": x, "block_size": 2}, mode="reference", name=bad),
                   400, INVALID)
    assert_problem(execute(client, "depth_to_space", {"x": {"href": f"/arrays/{bad}"}, "block_size": 2}),
                   400, INVALID)


def test_good_array_name_edges(client):
    for name in ("a", "A" * 128, "x.y-z_0", "a..b"):
        put_array(client, name, _ints((2,)))
        assert client.get(f"/arrays/{name}/info").json()["name"] == name
        assert client.delete(f"/arrays/{name}").status_code == 204


@pytest.mark.parametrize("href", ["http://169.254.169.254/x", "http://169.254.169.254/arrays/x",
                                  "file:///etc/passwd", "s3://b/k", "../x", "/arrays/../jobs.sqlite",
                                  "/jobs/x", "https://testserver/arrays/x", "/arrays/x?y=1", "",
                                  "//evil.example/arrays/x"])
def test_bad_hrefs(client, href):
    body = assert_problem(execute(client, "depth_to_space", {"x": {"href": href}, "block_size": 2}), 400, INVALID)
    assert "href" in body["detail"]


def test_href_to_a_missing_array(client):
    name = unique("missing")
    body = assert_problem(execute(client, "depth_to_space", {"x": {"href": f"/arrays/{name}"}, "block_size": 2}), 404)
    assert body["type"].endswith("/no-such-array") and name in body["detail"]


# ---------------------------------------------------------------------------------------------
# 9. token


def test_token(tmp_path):
    with TestClient(create_app(make_settings(tmp_path, token="s3cret"))) as c:
        assert c.get("/").status_code == 200
        assert c.get("/healthz").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"},
                        {"Authorization": "Bearer s3cret-and-more"}, {"Authorization": "s3cret"}):
            for method, url in (("GET", "/processes"), ("GET", "/conformance"), ("GET", "/jobs"),
                                ("GET", "/arrays"), ("PUT", "/arrays/a"), ("GET", "/processes/gather_nd"),
                                ("POST", "/processes/depth_to_space/execution")):
                response = c.request(method, url, headers=headers)
                assert_problem(response, 401)
                assert response.headers["www-authenticate"] == "Bearer"
        ok = {"Authorization": "Bearer s3cret"}
        assert c.get("/processes", headers=ok).status_code == 200
        assert c.get("/conformance", headers=ok).status_code == 200
        x = _ints((1, 2, 2, 4))
        assert c.put("/arrays/a", content=npy_bytes(x), headers={**ok, "Content-Type": NPY}).status_code == 201
        response = execute(c, "depth_to_space", {"x": {"href": "/arrays/a"}, "block_size": 2}, headers=ok)
        assert response.status_code == 200
        assert_same(decode(response), ops.depth_to_space(x, 2))


# ---------------------------------------------------------------------------------------------
# 10. restart


def test_restart_keeps_jobs_and_arrays(tmp_path):
    x = random_array(rng_for("restart"), (2, 4, 4, 4), np.float32)
    with TestClient(create_app(make_settings(tmp_path))) as first:
        put_array(first, "input", x)
        response = execute(first, "depth_to_space", {"x": {"href": "/arrays/input"}, "block_size": 2},
                           mode="reference", name="kept", headers={"Prefer": "respond-async"})
        assert response.status_code == 201
        job_id = response.json()["jobID"]
        before = wait_job(first, job_id)
        assert before["status"] == "successful"
        bad = execute(first, "depth_to_space", {"x": {"href": "/arrays/input"}, "block_size": 3},
                      headers={"Prefer": "respond-async"}).json()["jobID"]
        assert wait_job(first, bad)["status"] == "failed"
    JobRecords(tmp_path / "jobs.sqlite").create("was-running", "gather_nd", ["input"], "half", "reference",
                                                status="running")
    JobRecords(tmp_path / "jobs.sqlite").create("was-accepted", "gather_nd", [], "other", "value")
    with TestClient(create_app(make_settings(tmp_path))) as second:
        jobs = {j["jobID"]: j for j in second.get("/jobs").json()["jobs"]}
        assert jobs[job_id]["status"] == "successful"
        assert jobs[job_id]["finished"] == before["finished"]
        assert jobs[bad]["status"] == "failed"
        assert second.get(f"/jobs/{job_id}/results").json() == {"result": {"href": "/arrays/kept", "type": NPY}}
        assert_same(decode(second.get("/arrays/kept")), ops.depth_to_space(x, 2))
        for interrupted in ("was-running", "was-accepted"):
            info = second.get(f"/jobs/{interrupted}").json()
            assert info["status"] == "failed"
            assert "interrupted" in info["message"]
            results = second.get(f"/jobs/{interrupted}/results")  # a failed job gives its error
            assert results.status_code >= 400 and "interrupted" in assert_problem(results, results.status_code)["detail"]
        # the array the interrupted job read is free again
        assert second.delete("/arrays/input").status_code == 204


# ---------------------------------------------------------------------------------------------
# 11. arrays in use


def test_arrays_in_use_by_a_running_job(client):
    records = client.app.state.services.records
    source, target = unique("busy-in"), unique("busy-out")
    put_array(client, source, _ints((2, 2)))
    job_id = uuid.uuid4().hex
    records.create(job_id, "depth_to_space", [source], target, "reference", status="running")
    try:
        body = assert_problem(client.delete(f"/arrays/{source}"), 409)
        assert job_id in body["detail"]
        assert_problem(client.put(f"/arrays/{source}", content=npy_bytes(_ints((3,))),
                                  headers={"Content-Type": NPY}, params={"overwrite": "true"}), 409)
        assert_problem(client.put(f"/arrays/{target}", content=npy_bytes(_ints((3,))),
                                  headers={"Content-Type": NPY}), 409)
        assert_same(decode(client.get(f"/arrays/{source}")), _ints((2, 2)))
    finally:
        records.finish(job_id, "failed", "test over")
    assert client.delete(f"/arrays/{source}").status_code == 204
