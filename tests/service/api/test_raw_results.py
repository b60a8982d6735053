"""Results in the form the execute request's ``response`` asked for, checked against OGC API -
Processes 1.0's own texts (vendored in tests/ogc_schemas, see its README):

- /req/core/job-results-async-raw-value-one: a job run with ``"response": "raw"`` answers
  ``GET /jobs/{jobID}/results`` with the output itself (the NPY a synchronous raw execution
  returns), not a results document;
- /req/core/process-execute-sync-raw-ref and /req/core/job-results-async-raw-ref: raw with
  transmission reference is ``204 No Content`` with a ``Link`` header to each output (the 1.0
  API's execute and results operations answer 204 with the ExecuteSyncRawRef response, whose
  only member is that header);
- a job record made before the response was recorded keeps its results document.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest
import yaml

import ops
from service.jobs.records import JobRecords
from tests.helpers import assert_same
from tests.service.api.calls import assert_raw_reference, decode, execute, ints, store, unique, wait_job
from tests.service.conftest import NPY, inline

OGC = Path(__file__).resolve().parents[2] / "ogc_schemas" / "core"
ASYNC = {"Prefer": "respond-async"}


def _job(client, inputs: dict, *, mode: str, response: str, name: str | None = None) -> str:
    submitted = execute(client, "depth_to_space", inputs, mode=mode, response=response, name=name, headers=ASYNC)
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["jobID"]
    assert wait_job(client, job_id)["status"] == "successful"
    return job_id


# ---------------------------------------------------------------------------------------------
# /req/core/job-results-async-raw-value-one


@pytest.mark.smoke
def test_an_async_raw_value_job_answers_its_output_itself(client):
    x = ints((1, 2, 2, 8), dtype=np.float32)
    job_id = _job(client, {"x": store(client, x), "block_size": 2}, mode="value", response="raw")
    results = client.get(f"/jobs/{job_id}/results")
    assert results.status_code == 200, results.text
    assert results.headers["content-type"] == NPY
    assert_same(decode(results), ops.depth_to_space(x, 2))
    # the very bytes a synchronous raw execution of the same request answers
    sync = execute(client, "depth_to_space", {"x": inline(x), "block_size": 2}, mode="value", response="raw")
    assert sync.status_code == 200 and sync.content == results.content


def test_an_async_document_job_still_answers_a_results_document(client):
    x = ints((1, 2, 2, 4), dtype=np.int16)
    job_id = _job(client, {"x": store(client, x), "block_size": 2}, mode="value", response="document")
    results = client.get(f"/jobs/{job_id}/results")
    assert results.status_code == 200 and results.headers["content-type"] == "application/json"
    assert set(results.json()) == {"result"} and results.json()["result"]["mediaType"] == NPY


# ---------------------------------------------------------------------------------------------
# /req/core/process-execute-sync-raw-ref, /req/core/job-results-async-raw-ref


def test_the_standard_answers_raw_references_with_204_and_link_headers():
    """What the tests below hold the service to, read from the 1.0 texts themselves."""
    api = yaml.safe_load((OGC / "examples" / "openapi" / "ogcapi-processes-1-example.yaml").read_text())
    for path, method in (("/processes/{processID}/execution", "post"), ("/jobs/{jobID}/results", "get")):
        assert api["paths"][path][method]["responses"]["204"]["$ref"].endswith("/ExecuteSyncRawRef.yaml")
    response = yaml.safe_load((OGC / "openapi" / "responses" / "ExecuteSyncRawRef.yaml").read_text())
    assert "content" not in response and set(response["headers"]) == {"Link"}
    assert "each raw output" in response["headers"]["Link"]["description"]
    for test in ("ATS_process-execute-success.adoc", "ATS_job-results-success.adoc"):
        text = (OGC / "abstract_tests" / "core" / test).read_text()
        assert "raw-ref" in text  # the raw + ref row of the execution-parameter tables


@pytest.mark.smoke
def test_a_sync_raw_reference_execution_is_204_with_a_link_to_the_output(client):
    x = ints((1, 2, 2, 4), dtype=np.uint8)
    name = unique("raw-ref")
    answer = execute(client, "depth_to_space", {"x": store(client, x), "block_size": 2}, mode="reference",
                     response="raw", name=name)
    assert_raw_reference(answer, name)
    assert answer.links["monitor"]["url"].startswith("http://testserver/jobs/")
    assert_same(decode(client.get(answer.links["related"]["url"])), ops.depth_to_space(x, 2))


def test_an_async_raw_reference_job_answers_204_with_a_link_to_the_output(client):
    x = ints((1, 2, 2, 4), dtype=np.float64)
    name = unique("raw-ref-job")
    job_id = _job(client, {"x": store(client, x), "block_size": 2}, mode="reference", response="raw", name=name)
    results = client.get(f"/jobs/{job_id}/results")
    assert_raw_reference(results, name)
    assert_same(decode(client.get(results.links["related"]["url"])), ops.depth_to_space(x, 2))
    # the same job asked for a document answers the link in one
    document = _job(client, {"x": store(client, x), "block_size": 2}, mode="reference", response="document")
    assert client.get(f"/jobs/{document}/results").json()["result"]["href"] == f"/arrays/{document}"


# ---------------------------------------------------------------------------------------------
# the records: the response is kept, and a database made before it opens as it was

_OLD_TABLE = ("CREATE TABLE jobs (id TEXT PRIMARY KEY, process_id TEXT NOT NULL, status TEXT NOT NULL, message TEXT, "
              "created TEXT, started TEXT, finished TEXT, updated TEXT, progress INTEGER, reads TEXT NOT NULL, "
              "writes TEXT, transmission TEXT, error_status INTEGER, error_type TEXT)")


def test_the_records_keep_the_response_and_open_a_database_made_without_it(tmp_path):
    path = tmp_path / "jobs.sqlite"
    with sqlite3.connect(path) as db:
        db.execute(_OLD_TABLE)
        db.execute("INSERT INTO jobs VALUES ('old', 'depth_to_space', 'successful', 'done', '2026-01-01T00:00:00.000Z',"
                   " NULL, '2026-01-01T00:00:01.000Z', NULL, 100, '[]', 'old', 'value', NULL, NULL)")
    records = JobRecords(path)
    try:
        assert records.get("old")["response"] is None  # served as a results document, as it was
        records.create("new", "depth_to_space", [], "new", "value", response="raw")
        assert records.get("new")["response"] == "raw"
    finally:
        records.close()
    reopened = JobRecords(path)  # a second opening adds nothing twice
    try:
        assert [job["id"] for job in reopened.list()] == ["new", "old"]
    finally:
        reopened.close()
