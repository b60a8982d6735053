"""The jobs routes (service/api/routers/jobs.py) through FastAPI's TestClient: an async job's
life, its results by value and by reference, a failing job, the job list and its filters,
dismissal, and the jobs and arrays that a restarted service keeps.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from fastapi.testclient import TestClient

import ops
from service.api.app import create_app
from service.jobs.records import JobRecords
from tests.helpers import assert_same, random_array
from tests.service.api.calls import (INVALID, OGC_EXC, OGC_REL, assert_raw_reference, decode, decode_document,
                                     execute, ints, ops_error, put_array, rng_for, store, unique, wait_job)
from tests.service.conftest import NPY, assert_problem, make_settings

NO_SUCH_JOB = OGC_EXC + "no-such-job"
RESULT_NOT_READY = OGC_EXC + "result-not-ready"


# ---------------------------------------------------------------------------------------------
# async jobs


@pytest.mark.smoke
def test_async_job_lifecycle(client):
    x = random_array(rng_for("async"), (2, 4, 6, 3), np.float32)
    href = store(client, x)
    response = execute(client, "space_to_depth", {"x": href, "block_size": 2}, response="document",
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
    # response raw (the default) with transmission reference: 204, the result as a Link
    assert_raw_reference(client.get(f"/jobs/{job_id}/results"), name)
    assert_same(decode(client.get(f"/arrays/{name}")), ops.batch_to_space_nd(x, [2, 2], [[0, 1], [1, 0]]))


def test_async_job_that_fails(client):
    x = ints((1, 2, 2, 4))
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
    x = ints((2, 4, 4, 2))
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
    x = ints((4, 8, 8, 4))
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
# restart


def test_restart_keeps_jobs_and_arrays(tmp_path):
    x = random_array(rng_for("restart"), (2, 4, 4, 4), np.float32)
    with TestClient(create_app(make_settings(tmp_path))) as first:
        put_array(first, "input", x)
        response = execute(first, "depth_to_space", {"x": {"href": "/arrays/input"}, "block_size": 2},
                           mode="reference", response="document", name="kept",
                           headers={"Prefer": "respond-async"})
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


def test_a_failed_job_message_names_no_server_path(client):
    """A failure's message may quote a worker's error, which names files under the data root;
    the job document says <server path> instead."""
    svc = client.app.state.services
    job_id = uuid.uuid4().hex
    svc.records.create(job_id, "depth_to_space", [], job_id, "value", status="running")
    root = str(svc.store.root)
    svc.records.finish(job_id, "failed", f"the computation failed: FileNotFoundError: {root}/arrays/x/c/0 is gone")
    body = client.get(f"/jobs/{job_id}").json()
    assert body["status"] == "failed"
    assert root not in body["message"] and "<server path>/arrays/x/c/0 is gone" in body["message"], body
    listed = next(j for j in client.get("/jobs?limit=100").json()["jobs"] if j["jobID"] == job_id)
    assert root not in listed["message"]
