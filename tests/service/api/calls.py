"""What the route tests of tests/service/api share: the NPY wire forms of bfloat16 and
complex32, the calls of the API (upload, execute, wait for a job), and the checks of a stored
result against the ``ops`` NumPy path."""

from __future__ import annotations

import base64
import time
import uuid
import zlib

import numpy as np
import pytest

import ops
from ops import dtypes
from ops.errors import InvalidArgument
from tests.helpers import assert_same
from tests.service.conftest import NPY, load_npy, npy_bytes

OGC_EXC = "http://www.opengis.net/def/exceptions/ogcapi-processes-1/1.0/"
INVALID = OGC_EXC + "invalid-parameter"
OGC_REL = "http://www.opengis.net/def/rel/ogc/1.0/"

ARRAY_INPUTS = {"gather_nd": ("params", "indices"), "ascend_dequant": ("src", "deq_scale")}
WIRE = {"bfloat16": np.dtype("<u2"), "complex32": np.dtype("<u4")}
REAL = {"bfloat16": dtypes.bfloat16, "complex32": dtypes.complex32}


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


def assert_raw_reference(response, name: str | None = None) -> str:
    """The answer to ``response: raw`` with transmission reference, as OGC API - Processes 1.0
    gives it: 204 No Content and the stored result in a ``Link`` header (rel related, titled
    with the output's id, result). Returns the result's array name."""
    assert response.status_code == 204, response.text
    assert response.content == b""
    link = response.links["related"]
    assert link["title"] == "result" and link["type"] == NPY, link
    stored = link["url"].rsplit("/arrays/", 1)[1]
    assert name is None or stored == name, (stored, name)
    return stored


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


def ints(shape, dtype=np.int32):
    return np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)


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
    assert_raw_reference(execute(client, process, inputs, mode="reference", name=result), result)
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
        assert_raw_reference(client.get(f"/jobs/{job_id}/results"), result)
        _check_download(client, result, expected)
        _delete(client, result, *(v["href"].rsplit("/", 1)[1] for v in inputs.values() if isinstance(v, dict)))
