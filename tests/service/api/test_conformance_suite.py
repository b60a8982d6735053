"""OGC API - Processes 1.0, Part 1: Core (and its job-list and dismiss classes) checked against a
live service (``python -m service`` on 127.0.0.1) as OGC's own test suite checks a server
(ets-ogcapi-processes10, Java/TestNG): its assertions ported, every response validated against
the standard's schemas (vendored in tests/ogc_schemas), the echo process as the testable
process the suite drives, and OWSLib's OGC API - Processes client as a client of the service.

Each test names the requirements it checks (``@requirements``); ``make conformance`` runs this
module through tools/conformance.py, which prints one ``PASS``/``FAIL`` line per requirement.
"""

from __future__ import annotations

import base64
import time

import numpy as np
import pytest
import requests
from owslib import ogcapi as owslib_ogcapi
from owslib.ogcapi.processes import Processes

import ops
from tests.service.api.test_echo import results_errors
from tests.service.api.test_ogc_documents import ogc_errors
from tests.service.conftest import NPY, inline, load_npy, npy_bytes
from tests.service.processes import start_server, stop_server

OGC_REL = "http://www.opengis.net/def/rel/ogc/1.0/"
OGC_CONF = "http://www.opengis.net/spec/ogcapi-processes-1/1.0/conf/"
OGC_EXC = "http://www.opengis.net/def/exceptions/ogcapi-processes-1/1.0/"
TEST_STRING = "teststring"  # the value the test suite gives every plain string input
TIMEOUT = 30


def requirements(*ids: str):
    """The requirements a test checks (read by tools/conformance.py)."""
    def mark(test):
        test.requirements = ids
        return test
    return mark


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    base = tmp_path_factory.mktemp("conformance")
    server = start_server(base / "data", base / "server.log", processes=False)
    yield server.url
    stop_server(server)


def get(url: str, **kwargs) -> requests.Response:
    return requests.get(url, timeout=TIMEOUT, **kwargs)


def post(url: str, body: dict, *, asynchronous: bool = False) -> requests.Response:
    headers = {"Prefer": "respond-async"} if asynchronous else {}
    return requests.post(url, json=body, headers=headers, timeout=TIMEOUT)


def json_of(response: requests.Response, schema: str, status: int = 200) -> dict:
    """The body, which must be JSON (problem+json for errors) valid against ``schema``."""
    assert response.status_code == status, (response.status_code, response.text[:500])
    media = response.headers["content-type"].split(";")[0]
    assert media == ("application/json" if status < 400 else "application/problem+json"), media
    document = response.json()
    assert ogc_errors(document, schema) == [], schema
    return document


def exception_type(response: requests.Response, status: int) -> str:
    document = json_of(response, "exception.yaml", status)
    return document["type"]


def rel(document: dict, name: str) -> dict:
    links = [link for link in document["links"] if link["rel"] in (name, OGC_REL + name)]
    assert links, (name, document["links"])
    return links[0]


def wait_job(url: str, job_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        info = json_of(get(f"{url}/jobs/{job_id}"), "statusInfo.yaml")
        if info["status"] not in ("accepted", "running"):
            return info
        assert time.monotonic() < deadline, info
        time.sleep(0.05)


# --- landing page, conformance, API definition ---------------------------------------------


@pytest.mark.smoke
@requirements("/req/core/landingpage-op", "/req/core/landingpage-success", "/req/core/http")
def test_landing_page(url):
    landing = json_of(get(f"{url}/"), "landingPage.yaml")
    for name in ("service-desc", "service-doc", "conformance", "processes", "job-list"):
        assert get(rel(landing, name)["href"]).status_code == 200, name


@requirements("/req/core/conformance-op", "/req/core/conformance-success")
def test_conformance(url):
    declared = json_of(get(f"{url}/conformance"), "confClasses.yaml")["conformsTo"]
    for name in ("core", "json", "oas30", "job-list", "dismiss", "ogc-process-description"):
        assert OGC_CONF + name in declared, name


@requirements("/req/core/api-definition-op", "/req/core/api-definition-success", "/req/oas30/oas-definition-1")
def test_api_definition(url):
    landing = get(f"{url}/").json()
    answer = get(rel(landing, "service-desc")["href"])
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/vnd.oai.openapi+json;version=3.0"
    document = answer.json()
    assert document["openapi"].startswith("3.0.")
    # the operations OGC's test suite looks up by operationId
    operations = {op.get("operationId") for path in document["paths"].values() for op in path.values()}
    assert {"getProcesses", "getProcessDescription", "execute", "getJobs", "getStatus", "getResult",
            "dismiss"} <= operations


# --- processes ------------------------------------------------------------------------------


@requirements("/req/core/process-list-op", "/req/core/process-list-success", "/req/core/pl-limit-definition",
              "/req/core/pl-limit-response")
def test_process_list_and_its_limit(url):
    listed = json_of(get(f"{url}/processes", params={"limit": 10000}), "processList.yaml")
    ids = [summary["id"] for summary in listed["processes"]]
    assert "echo" in ids
    for summary in listed["processes"]:
        assert get(rel(summary, "self")["href"]).status_code == 200
    seen, page = [], f"{url}/processes?limit=2"
    while page:
        body = json_of(get(page), "processList.yaml")
        assert len(body["processes"]) <= 2
        seen += [summary["id"] for summary in body["processes"]]
        nexts = [link["href"] for link in body["links"] if link["rel"] == "next"]
        page = nexts[0] if nexts else None
    assert seen == ids
    assert exception_type(get(f"{url}/processes", params={"limit": 0}), 400)


@requirements("/req/core/process-description-op", "/req/core/process-description-success",
              "/req/ogc-process-description/json-encoding", "/req/core/process-exception-no-such-process")
def test_process_descriptions(url):
    for summary in get(f"{url}/processes", params={"limit": 10000}).json()["processes"]:
        description = json_of(get(f"{url}/processes/{summary['id']}"), "process.yaml")
        assert description["id"] == summary["id"]
        assert rel(description, "execute")["href"].endswith(f"/processes/{summary['id']}/execution")
    assert exception_type(get(f"{url}/processes/no-such-process"), 404) == OGC_EXC + "no-such-process"


# --- execution ------------------------------------------------------------------------------

EVERY_KIND = {
    "string_input": TEST_STRING, "double_input": 1.5, "integer_input": 2, "boolean_input": True,
    "object_input": {"value": TEST_STRING}, "array_input": [1, 2, 3],
    "bbox_input": {"bbox": [51.9, 7, 52, 7.1], "crs": "http://www.opengis.net/def/crs/OGC/1.3/CRS84"},
    "binary_input": {"value": base64.b64encode(b"II*\x00").decode(), "format": {"mediaType": "image/tiff",
                                                                               "encoding": "base64"}},
}


@requirements("/req/core/process-execute-op", "/req/core/process-execute-request", "/req/core/process-execute-inputs",
              "/req/core/process-execute-input-inline-object", "/req/core/process-execute-input-inline-bbox",
              "/req/core/process-execute-input-inline-binary", "/req/core/process-execute-input-inline-mixed",
              "/req/core/process-execute-input-array", "/req/core/process-execute-default-outputs",
              "/req/core/process-execute-sync-document", "/req/core/job-results-success-sync", "/req/core/test-process")
def test_execute_sync_document(url):
    answer = post(f"{url}/processes/echo/execution", {"inputs": EVERY_KIND, "response": "document"})
    assert answer.status_code == 200, answer.text
    assert results_errors(answer.json()) == []
    assert set(answer.json()) == set(EVERY_KIND)  # every output, none asked for
    assert answer.json()["string_input"] == TEST_STRING
    monitor = answer.links["monitor"]["url"]
    assert json_of(get(monitor), "statusInfo.yaml")["status"] == "successful"


@requirements("/req/core/process-execute-sync-one", "/req/core/process-execute-sync-raw-value-one",
              "/req/core/process-execute-sync-raw-value-multi", "/req/core/process-execute-default-execution-mode")
def test_execute_sync_raw(url):
    one = post(f"{url}/processes/echo/execution", {"inputs": EVERY_KIND, "response": "raw",
                                                   "outputs": {"string_input": {"transmissionMode": "value"}}})
    assert one.status_code == 200 and one.text == TEST_STRING
    several = post(f"{url}/processes/echo/execution", {"inputs": EVERY_KIND, "response": "raw"})
    assert several.status_code == 200 and several.headers["content-type"].startswith("multipart/related")
    assert TEST_STRING in several.text
    x = np.arange(16, dtype=np.float32).reshape(1, 2, 2, 4)
    npy = post(f"{url}/processes/depth_to_space/execution", {"inputs": {"x": inline(x), "block_size": 2}})
    assert npy.status_code == 200 and npy.headers["content-type"] == NPY
    assert np.array_equal(load_npy(npy.content), ops.depth_to_space(x, 2))


@requirements("/req/core/process-execute-sync-raw-ref", "/req/core/job-results-async-raw-ref")
def test_raw_by_reference(url):
    x = np.arange(16, dtype=np.int16).reshape(1, 2, 2, 4)
    assert requests.put(f"{url}/arrays/conf-x", data=npy_bytes(x), headers={"Content-Type": NPY},
                        timeout=TIMEOUT).status_code == 201
    body = {"inputs": {"x": {"href": "/arrays/conf-x"}, "block_size": 2}, "response": "raw",
            "outputs": {"result": {"transmissionMode": "reference"}}}
    sync = post(f"{url}/processes/depth_to_space/execution", body)
    assert sync.status_code == 204 and sync.content == b""
    assert np.array_equal(load_npy(get(sync.links["related"]["url"]).content), ops.depth_to_space(x, 2))
    job = post(f"{url}/processes/depth_to_space/execution", body, asynchronous=True)
    assert wait_job(url, job.json()["jobID"])["status"] == "successful"
    results = get(f"{url}/jobs/{job.json()['jobID']}/results")
    assert results.status_code == 204 and results.content == b""
    assert np.array_equal(load_npy(get(results.links["related"]["url"]).content), ops.depth_to_space(x, 2))


@pytest.mark.smoke
@requirements("/req/core/process-execute-success-async", "/req/core/process-execute-auto-execution-mode",
              "/req/core/job-op", "/req/core/job-success", "/req/core/job-results-op",
              "/req/core/job-results-async-raw-value-one", "/req/core/job-results-async-document")
def test_execute_async_and_its_results(url):
    body = {"inputs": {"string_input": TEST_STRING}, "response": "raw",
            "outputs": {"string_input": {"transmissionMode": "value"}}}
    submitted = post(f"{url}/processes/echo/execution", body, asynchronous=True)
    info = json_of(submitted, "statusInfo.yaml", 201)
    assert submitted.headers["location"] == f"{url}/jobs/{info['jobID']}"
    assert wait_job(url, info["jobID"])["status"] == "successful"
    status = get(submitted.headers["location"]).json()
    results = get(rel(status, "results")["href"])
    assert results.status_code == 200 and TEST_STRING in results.text  # as the test suite checks it
    document = post(f"{url}/processes/echo/execution", {**body, "response": "document"}, asynchronous=True)
    assert wait_job(url, document.json()["jobID"])["status"] == "successful"
    results = get(f"{url}/jobs/{document.json()['jobID']}/results")
    assert results.status_code == 200 and results_errors(results.json()) == []


@requirements("/req/core/job-exception-no-such-job", "/req/core/job-results-exception-no-such-job",
              "/req/core/job-results-exception-results-not-ready", "/req/core/job-results-failed")
def test_job_exceptions(url):
    unknown = "0" * 32
    assert exception_type(get(f"{url}/jobs/{unknown}"), 404) == OGC_EXC + "no-such-job"
    assert exception_type(get(f"{url}/jobs/{unknown}/results"), 404) == OGC_EXC + "no-such-job"
    paused = post(f"{url}/processes/echo/execution", {"inputs": {"string_input": "x", "pause": 5}},
                  asynchronous=True).json()["jobID"]
    assert exception_type(get(f"{url}/jobs/{paused}/results"), 404) == OGC_EXC + "result-not-ready"
    requests.delete(f"{url}/jobs/{paused}", timeout=TIMEOUT)
    x = np.arange(16, dtype=np.float32).reshape(1, 2, 2, 4)
    assert requests.put(f"{url}/arrays/conf-fail", data=npy_bytes(x), headers={"Content-Type": NPY},
                        timeout=TIMEOUT).status_code == 201
    failing = post(f"{url}/processes/depth_to_space/execution",  # 2 x 2 is not divisible by 3
                   {"inputs": {"x": {"href": "/arrays/conf-fail"}, "block_size": 3}}, asynchronous=True)
    if failing.status_code == 201:  # refused when planned, or failed as a job: either is an exception
        assert wait_job(url, failing.json()["jobID"])["status"] == "failed"
        failing = get(f"{url}/jobs/{failing.json()['jobID']}/results")
    assert exception_type(failing, 400) == OGC_EXC + "invalid-parameter"


# --- job list and dismiss -------------------------------------------------------------------


@requirements("/req/job-list/job-list-op", "/req/job-list/job-list-success", "/req/job-list/limit-definition",
              "/req/job-list/processID-definition", "/req/job-list/status-definition")
def test_job_list(url):
    post(f"{url}/processes/echo/execution", {"inputs": {"string_input": "listed"}})
    jobs = json_of(get(f"{url}/jobs", params={"limit": 10000}), "jobList.yaml")["jobs"]
    assert jobs and all(ogc_errors(job, "statusInfo.yaml") == [] for job in jobs)
    echoes = json_of(get(f"{url}/jobs", params={"processID": "echo", "status": "successful", "limit": 1}),
                     "jobList.yaml")
    assert len(echoes["jobs"]) == 1 and echoes["jobs"][0]["processID"] == "echo"
    assert {link["rel"] for link in echoes["links"]} >= {"self", "next"}


@requirements("/req/dismiss/job-dismiss-op", "/req/dismiss/job-dismiss-success")
def test_dismiss(url):
    job_id = post(f"{url}/processes/echo/execution", {"inputs": {"string_input": "x", "pause": 10}},
                  asynchronous=True).json()["jobID"]
    dismissed = json_of(requests.delete(f"{url}/jobs/{job_id}", timeout=TIMEOUT), "statusInfo.yaml")
    assert dismissed["status"] == "dismissed"
    assert get(f"{url}/jobs/{job_id}").json()["status"] == "dismissed"
    unknown = requests.delete(f"{url}/jobs/{'0' * 32}", timeout=TIMEOUT)
    assert exception_type(unknown, 404) == OGC_EXC + "no-such-job"


# --- OWSLib, a client nobody on this project wrote -------------------------------------------


@requirements("/req/core/process-list-op", "/req/core/process-description-op", "/req/core/process-execute-op")
def test_owslib_lists_describes_and_executes(url):
    saved = dict(owslib_ogcapi.REQUEST_HEADERS)  # OWSLib keeps Prefer in a module-global dict
    try:
        client = Processes(url)
        assert "echo" in {summary["id"] for summary in client.processes()}
        assert set(client.process("echo")["inputs"]) >= {"string_input", "bbox_input", "pause"}
        document = client.execute("echo", {"string_input": TEST_STRING, "integer_input": 3}, response="document")
        assert document == {"string_input": TEST_STRING, "integer_input": 3}
    finally:
        owslib_ogcapi.REQUEST_HEADERS.clear()
        owslib_ogcapi.REQUEST_HEADERS.update(saved)
