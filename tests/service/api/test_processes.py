"""The processes routes (service/api/routers/processes.py) through FastAPI's TestClient
(docs/api.md is the contract): the process list and descriptions, every operator and every
dtype executed inline and on stored inputs, the response forms, and the refusals of bad
parameters and inputs.

Every result is compared bit for bit with the ``ops`` NumPy path on the same input, and every
400 for a bad parameter carries exactly the message the ``ops`` function raises for the same
call. One app (the module-scoped ``client``) serves most tests; the small limits have their own
app (``small``, tests/service/api/conftest.py).
"""

from __future__ import annotations

import base64
import inspect
import io
import json

import numpy as np
import pytest

import ops
from ops import dtypes
from tests.helpers import assert_same, random_array
from tests.service.api.calls import (INVALID, OGC_EXC, array_inputs, assert_dtype_header, assert_raw_reference,
                                     check_stored,
                                     check_stored_jobs, decode, decode_document, execute, ints, ops_call,
                                     ops_error, rng_for, store, unique, wait_job, wire)
from tests.service.conftest import NPY, assert_problem, inline, npy_bytes

NO_SUCH_PROCESS = OGC_EXC + "no-such-process"
PROCESSES = ("depth_to_space", "space_to_depth", "space_to_batch", "space_to_batch_nd",
             "batch_to_space_nd", "gather_nd", "ascend_dequant")


# ---------------------------------------------------------------------------------------------
# helpers


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


# ---------------------------------------------------------------------------------------------
# the process list and descriptions


def test_process_list(client):
    response = client.get("/processes")
    assert response.status_code == 200
    summaries = response.json()["processes"]
    assert [p["id"] for p in summaries] == [*PROCESSES, "echo"]  # the test process last (test_echo.py)
    for p in summaries[:-1]:
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
        variants = schema["oneOf"]  # the forms are mutually exclusive (input-mixed-type)
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
# every operator and every dtype, inline and stored, bit-exact against ops


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


# ---------------------------------------------------------------------------------------------
# every operator with representative parameters


REPRESENTATIVE = [
    ("depth_to_space", {"x": ints((1, 1, 1, 4))}, {"block_size": 2}),
    ("depth_to_space", {"x": ints((2, 2, 3, 8))}, {"block_size": 2, "data_format": "NHWC", "mode": "DCR"}),
    ("depth_to_space", {"x": ints((2, 2, 3, 8))}, {"block_size": 2, "data_format": "NHWC", "mode": "CRD"}),
    ("depth_to_space", {"x": ints((1, 18, 2, 2))}, {"block_size": 3, "data_format": "NCHW", "mode": "DCR"}),
    ("depth_to_space", {"x": ints((1, 18, 2, 2))}, {"block_size": 3, "data_format": "NCHW", "mode": "CRD"}),
    ("depth_to_space", {"x": ints((1, 4, 2, 3, 4), np.int8)}, {"block_size": 2, "data_format": "NCHW_VECT_C"}),
    ("depth_to_space", {"x": ints((1, 4, 2, 3, 4), np.int8)},
     {"block_size": 2, "data_format": "NCHW_VECT_C", "mode": "CRD"}),
    ("space_to_depth", {"x": ints((2, 4, 6, 3))}, {"block_size": 2}),
    ("space_to_depth", {"x": ints((2, 4, 6, 3))}, {"block_size": 2, "mode": "CRD"}),
    ("space_to_depth", {"x": ints((1, 2, 6, 3))}, {"block_size": 3, "data_format": "NCHW", "mode": "CRD"}),
    ("space_to_depth", {"x": ints((1, 1, 4, 6, 4), np.int8)}, {"block_size": 2, "data_format": "NCHW_VECT_C"}),
    ("space_to_batch", {"x": ints((2, 3, 5, 2))}, {"block_size": 2, "paddings": [[1, 0], [1, 2]]}),
    ("space_to_batch", {"x": ints((1, 4, 4, 1))}, {"block_size": 1, "paddings": [[0, 0], [0, 0]]}),
    ("space_to_batch_nd", {"x": ints((2, 5, 4, 3))}, {"block_shape": [3, 2], "paddings": [[1, 0], [2, 0]]}),
    ("space_to_batch_nd", {"x": ints((1, 5, 2))}, {"block_shape": [4], "paddings": [[2, 1]]}),
    ("batch_to_space_nd", {"x": ints((12, 2, 3, 2))}, {"block_shape": [3, 2], "crops": [[1, 2], [0, 1]]}),
    ("batch_to_space_nd", {"x": ints((8, 3, 1))}, {"block_shape": [4], "crops": [[3, 4]]}),
    ("gather_nd", {"params": np.array([[0, 1], [2, 3]]), "indices": np.array([[0, 0], [1, 1]])}, {}),
    ("gather_nd", {"params": np.array([[0, 1], [2, 3]]), "indices": np.array([[1], [0]])}, {}),
    ("gather_nd", {"params": ints((2, 2, 2)), "indices": np.array([[[0, 1]], [[1, 0]]])}, {}),
    ("gather_nd", {"params": ints((2, 2, 2)), "indices": np.array([[1], [0]])}, {"batch_dims": 1}),
    ("gather_nd", {"params": ints((3, 4, 5)), "indices": np.array([[[-1, 2], [0, -4]], [[1, 1], [2, 3]],
                                                                    [[0, 0], [-2, -1]]], np.int32)},
     {"batch_dims": 1}),
    ("gather_nd", {"params": ints((3, 4)), "indices": np.array([[-1, -4], [-3, 0]])}, {}),
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
    x = ints((1, 2, 2, 4))
    href = store(client, x)["href"]
    response = execute(client, "depth_to_space", {"x": {"href": "http://testserver" + href}, "block_size": 2})
    assert response.status_code == 200, response.text
    assert_same(decode(response), ops.depth_to_space(x, 2))
    response = execute(client, "depth_to_space", {"x": {"href": href.lstrip("/")}, "block_size": 2})
    assert response.status_code == 200, response.text
    assert_same(decode(response), ops.depth_to_space(x, 2))


# ---------------------------------------------------------------------------------------------
# sync response forms


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
    x = ints((1, 2, 2, 4))
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
    response = execute(client, "space_to_depth", {"x": inline(ints((1, 2, 2, 1))), "block_size": 2},
                       mode="reference")
    name = assert_raw_reference(response)
    assert client.get(f"/jobs/{name}").json()["processID"] == "space_to_depth"
    assert decode(client.get(f"/arrays/{name}")).tolist() == [[[[0, 1, 2, 3]]]]


# ---------------------------------------------------------------------------------------------
# zero-sized and 0-d arrays through the operators


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
                       response="document", headers={"Prefer": "respond-async"})
    job_id = response.json()["jobID"]
    assert wait_job(client, job_id)["status"] == "successful"
    results = client.get(f"/jobs/{job_id}/results")
    assert_same(decode_document(results.json()["result"], results.headers.get("x-array-dtype")), expected)


# ---------------------------------------------------------------------------------------------
# errors


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
    x = inline(ints((1, 2, 2, 4)))
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
    good = inline(ints((1, 2, 2, 4)))
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
    assert_raw_reference(response, "big-output")
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
    assert_raw_reference(response, name)
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
    body = json.dumps({"inputs": {"x": inline(ints((1, 2, 2, 4))), "block_size": 2}}).encode()
    assert_problem(client.post(url, content=body, headers={"Content-Type": "text/plain"}), 415)
    assert_problem(client.post(url, content=body, headers={"Content-Type": "application/x-www-form-urlencoded"}), 415)
    response = client.put(f"/arrays/{unique()}", content=npy_bytes(ints((2,))),
                          headers={"Content-Type": "text/plain"})
    assert_problem(response, 415)
    response = client.put(f"/arrays/{unique()}", content=npy_bytes(ints((2,))))
    assert_problem(response, 415)


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
