"""API fuzzing with schemathesis: every operation of the OpenAPI document, every default check.

Schemathesis generates requests from the document (its examples, then boundary and invalid
values of every parameter and body, and methods the document does not list) and checks each
answer against it: no 5xx, a documented status code, content type, headers and body schema,
schema-violating requests refused with a 4xx, schema-valid ones not refused with 400/422,
405 with a right ``Allow`` for undocumented methods. Two checks are not run on a few
operations: positive_data_acceptance where refusals depend on more than JSON Schema can say
(shapes, NPY and zip contents, a failed job's error), and use_after_free (stateful only) on
reading a dismissed job, which OGC keeps; ``bench/fuzzing.py`` lists them and says
why. The long run, with the stateful phase (links between operations), is ``python -m
bench.fuzz`` (``make fuzz``).

The service runs with an in-process Dask cluster on a temporary data root, started once for
the module. The tests below the fuzzing pin what it found, so that a regression fails with a
plain message rather than only when schemathesis happens to draw it again.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import settings

from service.api.app import create_app
from bench import fuzzing
from tests.service.conftest import NPY, inline, make_settings, npy_bytes

# Built from the document of an app not started (serving /openapi.json needs the lifespan);
# test_the_fuzzed_document_is_the_served_one checks it is what the started app serves.
schema = fuzzing.load_schema()


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with TestClient(create_app(make_settings(tmp_path_factory.mktemp("fuzz-root")))) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def live(client):
    """The started app, as schemathesis calls it."""
    return fuzzing.Started(client.app)


@pytest.mark.smoke
def test_the_fuzzed_document_is_the_served_one(client):
    served = client.get("/openapi.json")
    assert served.status_code == 200
    assert served.json() == json.loads(json.dumps(fuzzing.document()))


@schema.parametrize()
@settings(max_examples=20, deadline=None)
def test_every_operation(case, live):
    case.call_and_validate(app=live)


def _checked(live, path: str, method: str, **data):
    """A request made up here rather than generated, answered and checked by the same checks
    (those that judge generated data, positive/negative, have nothing to judge)."""
    case = schema[path][method].Case(**data)
    return case.call_and_validate(app=live)


def _finished(live, job_id: dict) -> str:
    """The status of the job once it has finished (polled through the checked operation)."""
    for _ in range(600):
        status = _checked(live, "/jobs/{job_id}", "GET", path_parameters=job_id).json()["status"]
        if status not in ("accepted", "running"):
            return status
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still {status}")


def test_the_answers_fuzzing_rarely_reaches_conform(client, live):
    # random names, keys and job ids are mostly 404s: here the 2xx and 4xx of real resources
    x = np.arange(48, dtype=np.float32).reshape(1, 2, 2, 12)
    put = _checked(live, "/arrays/{name}", "PUT", path_parameters={"name": "fuzz-x"}, query={"chunks": "1,1,2,12"},
                   body=npy_bytes(x), media_type=NPY)
    assert put.status_code == 201, put.text
    zarr = "/arrays/{name}/zarr/{key}"
    assert _checked(live, zarr, "GET", path_parameters={"name": "fuzz-x", "key": "zarr.json"}).status_code == 200
    chunk = {"name": "fuzz-x", "key": "fuzz-x/c/0/0/0/0"}
    assert _checked(live, zarr, "GET", path_parameters=chunk).headers["content-type"] == ["application/octet-stream"]
    assert _checked(live, zarr, "HEAD", path_parameters=chunk).status_code == 200
    assert _checked(live, zarr, "GET", path_parameters=chunk, headers={"Range": "bytes=0-3"}).status_code == 206
    assert _checked(live, zarr, "GET", path_parameters=chunk, headers={"Range": "bytes=99999-"}).status_code == 416
    assert _checked(live, "/arrays/{name}", "GET", path_parameters={"name": "fuzz-x"}).status_code == 200
    assert _checked(live, "/arrays/{name}/info", "GET", path_parameters={"name": "fuzz-x"}).status_code == 200
    for name in ("fuzz-x", "fuzz-x"):
        again = _checked(live, "/arrays/{name}", "PUT", path_parameters={"name": name}, body=npy_bytes(x),
                         media_type=NPY)
        assert again.status_code == 409
    execution = "/processes/depth_to_space/execution"
    for outputs, response in (({"transmissionMode": "value"}, "raw"), ({"transmissionMode": "value"}, "document"),
                              ({"transmissionMode": "reference", "name": "fuzz-y"}, "raw"),
                              ({"transmissionMode": "reference", "name": "fuzz-z"}, "document")):
        body = {"inputs": {"x": {"href": "/arrays/fuzz-x"}, "block_size": 2},
                "outputs": {"result": outputs}, "response": response}
        raw_reference = response == "raw" and outputs["transmissionMode"] == "reference"  # 204, a Link
        assert _checked(live, execution, "POST", body=body, media_type="application/json").status_code == (
            204 if raw_reference else 200)
    for outputs in ({"transmissionMode": "value"}, {"transmissionMode": "reference"}):
        body = {"inputs": {"x": {"href": "/arrays/fuzz-x"}, "block_size": 2}, "outputs": {"result": outputs}}
        job = _checked(live, execution, "POST", body=body, media_type="application/json",
                       headers={"Prefer": "respond-async"})
        assert job.status_code == 201, job.text
        job_id = {"job_id": job.json()["jobID"]}
        assert _finished(live, job_id) == "successful"
        assert _checked(live, "/jobs/{job_id}/results", "GET", path_parameters=job_id).status_code == (
            204 if outputs["transmissionMode"] == "reference" else 200)  # response raw (the default)
        assert _checked(live, "/jobs/{job_id}", "DELETE", path_parameters=job_id).status_code == 200
    failed = _checked(live, execution, "POST", media_type="application/json", headers={"Prefer": "respond-async"},
                      body={"inputs": {"x": {"href": "/arrays/fuzz-x"}, "block_size": 5}})
    assert failed.status_code == 201, failed.text  # block_size 5 does not divide 2: found when the job runs
    job_id = {"job_id": failed.json()["jobID"]}
    assert _finished(live, job_id) == "failed"
    assert _checked(live, "/jobs/{job_id}/results", "GET", path_parameters=job_id).status_code == 400
    assert _checked(live, "/jobs", "GET", query={"status": ["successful", "dismissed"]}).status_code == 200
    assert _checked(live, "/arrays", "GET").status_code == 200
    for name in ("fuzz-x", "fuzz-y", "fuzz-z"):
        assert _checked(live, "/arrays/{name}", "DELETE", path_parameters={"name": name}).status_code == 204
        assert _checked(live, "/arrays/{name}/info", "GET", path_parameters={"name": name}).status_code == 404


# --- what the fuzzing found -----------------------------------------------------------------

def _problem(response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status and body["type"] and body["detail"]
    return body


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("OPTIONS", "/jobs/0123", "GET, HEAD, DELETE"),
    ("POST", "/arrays/x", "GET, HEAD, PUT, DELETE"),
    ("PATCH", "/arrays/x/zarr/zarr.json", "GET, HEAD"),
    ("GET", "/processes/depth_to_space/execution", "POST"),
    ("DELETE", "/", "GET, HEAD"),
])
def test_405_allows_every_method_of_the_resource(client, method, path, allowed):
    # Starlette's own 405 named only the methods of the first route matching the path
    response = client.request(method, path)
    assert _problem(response, 405)["type"].endswith("/method-not-allowed")
    assert response.headers["allow"] == allowed


def test_an_href_that_is_no_url_is_a_400(client):
    # urlsplit raised ValueError (an unclosed IPv6 host): a 500
    body = {"inputs": {"x": {"href": "http://[/arrays/x"}, "block_size": 2}}
    assert "href" in _problem(client.post("/processes/depth_to_space/execution", json=body), 400)["detail"]


def test_an_empty_result_name_is_a_400(client):
    # "" was taken for "no name" (the job id) where the document says 1-128 characters
    body = {"inputs": {"x": inline(np.zeros((1, 2, 2, 4), np.float32)), "block_size": 2},
            "outputs": {"result": {"name": ""}}}
    detail = _problem(client.post("/processes/depth_to_space/execution", json=body), 400)["detail"]
    assert "outputs.result.name" in detail


@pytest.mark.parametrize("dims", [{"H": {}}, {"Q": "y"}, ["H"], "NHWC", {"H": 1}])
def test_dims_that_map_no_roles_to_names_are_a_400(client, dims):
    # ignored (200) when every input was inline
    body = {"inputs": {"x": inline(np.zeros((1, 2, 2, 4), np.float32)), "block_size": 2, "dims": dims}}
    assert "dims" in _problem(client.post("/processes/depth_to_space/execution", json=body), 400)["detail"]


def test_null_dims_and_dtype_are_not_given(client):
    x = {**inline(np.zeros((1, 2, 2, 4), np.float32)), "dtype": None}
    response = client.post("/processes/depth_to_space/execution",
                           json={"inputs": {"x": x, "block_size": 2, "dims": None}})
    assert response.status_code == 200 and response.headers["content-type"] == NPY


def test_chunks_past_the_axis_are_the_whole_axis(client):
    # ?chunks=932770305952 on a (3,) array made Zarr allocate a 1.7 TiB chunk: a 500
    response = client.put("/arrays/fuzz-chunks?chunks=932770305952", content=npy_bytes(np.zeros(3, np.float16)),
                          headers={"Content-Type": NPY})
    assert response.status_code == 201, response.text
    assert response.json()["chunks"] == [3]


@pytest.mark.parametrize(("query", "needle"), [("status=done", "status"), ("datetime=true", "datetime"),
                                               ("limit=0", "limit"), ("limit=x", "limit")])
def test_bad_job_filters_are_a_400(client, query, needle):
    assert needle in _problem(client.get(f"/jobs?{query}"), 400)["detail"]


def test_a_process_id_of_no_process_lists_no_jobs(client):
    # /req/job-list/processid-response: processID is any string (the requirement's schema)
    assert client.get("/jobs?processID=true").json()["jobs"] == []


def test_an_unknown_process_is_still_a_404(client):
    # each operator has its own execution operation in the document; any other id is routed too
    body = _problem(client.post("/processes/nope/execution", json={"inputs": {}}), 404)
    assert body["type"].endswith("/no-such-process")


def test_a_sync_value_job_links_to_no_results(client):
    # its statusInfo linked to /jobs/ID/results and /arrays/ID, both 404: nothing was stored
    body = {"inputs": {"x": inline(np.zeros((1, 2, 2, 4), np.float32)), "block_size": 2}}
    assert client.post("/processes/depth_to_space/execution", json=body).status_code == 200
    job = next(j for j in client.get("/jobs").json()["jobs"] if j["processID"] == "depth_to_space")
    assert job["status"] == "successful" and [link["rel"] for link in job["links"]] == ["self"]
    detail = _problem(client.get(f"/jobs/{job['jobID']}/results"), 404)["detail"]
    assert "stores none" in detail
    stored = client.post("/processes/depth_to_space/execution",
                         json={**body, "outputs": {"result": {"transmissionMode": "reference", "name": "fuzz-kept"}}})
    assert stored.status_code == 204, stored.text  # response raw (the default) with reference: a Link
    job = next(j for j in client.get("/jobs").json()["jobs"] if j["status"] == "successful")
    assert {link["rel"].rsplit("/", 1)[-1] for link in job["links"]} == {"self", "results", "related"}


def test_a_process_named_twice_lists_its_jobs_once(client):
    # the fuzzer's ?processID=a&processID=a listed every job of a twice
    body = {"inputs": {"x": inline(np.zeros((1, 4, 4, 1), np.float32)), "block_size": 2}}
    assert client.post("/processes/space_to_depth/execution", json=body).status_code == 200
    once = client.get("/jobs", params={"processID": "space_to_depth"}).json()["jobs"]
    twice = client.get("/jobs", params=[("processID", "space_to_depth")] * 2).json()["jobs"]
    assert once and [j["jobID"] for j in twice] == [j["jobID"] for j in once]
