"""The jobs of OGC API - Processes 1.0 against the standard's own texts (the requirements and
schemas vendored in tests/ogc_schemas, see its README): the job a synchronous execution
creates (/req/core/job-results-success-sync), the exception bodies of the jobs routes
(/req/core/job-results-exception/...) and of every error, served as RFC 7807's
``application/problem+json`` (exception.yaml is "based on RFC 7807"), and the job list class
(/req/job-list/...)."""

from __future__ import annotations

import re

import pytest
from starlette.responses import PlainTextResponse
from starlette.testclient import TestClient

from service.api.app import create_app
from service.api.edge import HostGuard
from tests.service.api.calls import OGC_EXC, execute, ints, store
from tests.service.api.test_ogc_documents import ogc_errors


def _links(header: str) -> dict[str, str]:
    """An RFC 8288 ``Link`` header as {rel: target} (a rel named twice: the last one)."""
    links = {}
    for target, params in re.findall(r"<([^>]*)>\s*((?:;[^,<]*)*)", header):
        for rel in re.findall(r';\s*rel="?([^";]+)"?', params):
            for name in rel.split():
                links[name] = target
    return links


# ---------------------------------------------------------------------------------------------
# /req/core/job-results-success-sync


@pytest.mark.smoke
@pytest.mark.parametrize("mode,response", [("value", "raw"), ("value", "document"), ("reference", "raw")])
def test_a_synchronous_execution_links_to_its_job_as_monitor(client, mode, response):
    answer = execute(client, "space_to_depth", {"x": store(client, ints((1, 4, 4, 1))), "block_size": 2},
                     mode=mode, response=response)
    assert answer.status_code == 200, answer.text
    monitor = _links(answer.headers.get("link", "")).get("monitor")
    assert monitor is not None, dict(answer.headers)
    assert monitor.startswith("http://testserver/jobs/"), monitor  # absolute, as the service's other links
    job_id = monitor.rsplit("/", 1)[1]
    assert job_id in [job["jobID"] for job in client.get("/jobs?limit=10000").json()["jobs"]]
    status = client.get(monitor)
    assert status.status_code == 200
    assert status.headers["content-type"].split(";")[0] == "application/json"
    assert ogc_errors(status.json(), "statusInfo.yaml") == []
    assert status.json()["jobID"] == job_id and status.json()["status"] == "successful"


def test_the_link_header_parser_reads_several_links():
    header = '</arrays/a>; rel="related", <http://h/jobs/1>; rel=monitor'
    assert _links(header) == {"related": "/arrays/a", "monitor": "http://h/jobs/1"}
    assert ogc_errors({"jobID": "1", "status": "done", "type": "process"}, "statusInfo.yaml")  # can fail


# ---------------------------------------------------------------------------------------------
# the exception bodies of the jobs routes: OGC's exception.yaml, and OGC's own types


OGC_TYPES = {OGC_EXC + "no-such-job", OGC_EXC + "result-not-ready"}


def _ogc_exception(response, status: int) -> str:
    """The type of an OGC exception body, checked against exception.yaml (its status is ``status``)."""
    assert response.status_code == status, response.text
    assert ogc_errors(response.json(), "exception.yaml") == []
    assert response.json()["status"] == status
    return response.json()["type"]


def test_the_results_of_a_synchronous_job_that_stored_none_are_an_ogc_exception(client):
    answer = execute(client, "space_to_depth", {"x": store(client, ints((1, 4, 4, 1))), "block_size": 2})
    assert answer.status_code == 200, answer.text
    job = _links(answer.headers["link"])["monitor"]
    assert client.get(job).json()["status"] == "successful"
    assert _ogc_exception(client.get(f"{job}/results"), 404) in OGC_TYPES


def test_an_unknown_job_is_no_such_job_on_every_route(client):
    # /req/core/job-exception-no-such-job, /req/core/job-results-exception/no-such-job
    for response in (client.get("/jobs/" + "0" * 32), client.get(f"/jobs/{'0' * 32}/results"),
                     client.delete("/jobs/" + "0" * 32)):
        assert _ogc_exception(response, 404) == OGC_EXC + "no-such-job"
    assert ogc_errors({"title": "no type"}, "exception.yaml")  # the check can fail


# ---------------------------------------------------------------------------------------------
# RFC 7807: problem details are application/problem+json

PROBLEM = "application/problem+json"


def test_every_kind_of_error_is_served_as_problem_json(client):
    answers = {
        "a service error (no such job)": client.get("/jobs/" + "0" * 32),
        "a request validation error": client.get("/jobs?limit=0"),
        "a route that does not exist": client.get("/no/such/route"),
        "a method not allowed": client.put("/jobs"),
        "an execute request that is not JSON": client.post("/processes/depth_to_space/execution", content=b"x",
                                                           headers={"Content-Type": "text/plain"}),
        "an operator's refusal": execute(client, "depth_to_space", {"x": store(client, ints((1, 2, 2, 4))),
                                                                    "block_size": 3}),
    }
    for what, response in answers.items():
        assert response.status_code >= 400, what
        assert response.headers["content-type"].split(";")[0] == PROBLEM, (what, response.headers)
        assert ogc_errors(response.json(), "exception.yaml") == [], what


def test_the_host_guard_refuses_with_problem_json():
    guarded = HostGuard(PlainTextResponse("never"), frozenset({"127.0.0.1"}))
    response = TestClient(guarded, base_url="http://elsewhere.example").get("/")
    assert response.status_code == 400
    assert response.headers["content-type"].split(";")[0] == PROBLEM
    assert ogc_errors(response.json(), "exception.yaml") == []


def test_the_document_says_problem_json_for_every_exception_body():
    document = create_app().openapi()
    exception = {"$ref": "#/components/schemas/Exception_"}
    documented = 0
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for code, response in operation["responses"].items():
                for media, content in response.get("content", {}).items():
                    if content.get("schema") == exception:
                        assert media == PROBLEM, (path, method, code)
                        documented += 1
    assert documented > 20
