"""The jobs of OGC API - Processes 1.0 against the standard's own texts (the requirements and
schemas vendored in tests/ogc_schemas, see its README): the job a synchronous execution
creates (/req/core/job-results-success-sync), the exception bodies of the jobs routes
(/req/core/job-results-exception/...) and of every error, served as RFC 7807's
``application/problem+json`` (exception.yaml is "based on RFC 7807"), and the job list class
(/req/job-list/...)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest
import yaml
from starlette.responses import PlainTextResponse
from starlette.testclient import TestClient

from service.api.app import create_app
from service.api.edge import HostGuard
from service.api.routers import jobfilters
from service.jobs.records import now
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
    # raw with reference: 204 No Content, the output as a Link (/req/core/process-execute-sync-raw-ref)
    assert answer.status_code == (204 if (mode, response) == ("reference", "raw") else 200), answer.text
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


# ---------------------------------------------------------------------------------------------
# the job list class, /req/job-list/...

REQUIREMENTS = Path(__file__).resolve().parents[2] / "ogc_schemas" / "core" / "requirements" / "job-list"


def _fragments() -> dict[str, dict]:
    """The parameters of GET /jobs as the requirements state them (their OpenAPI 3.0 fragments)."""
    fragments = {}
    for path in sorted(REQUIREMENTS.glob("REQ_*-def.adoc")):
        for text in re.findall(r"\[source,yaml\]\n----\n(.*?)\n----", path.read_text(), re.S):
            fragment = yaml.safe_load(text)
            fragments[fragment["name"]] = fragment
    return fragments


def test_get_jobs_declares_the_parameters_as_the_standard_words_them():
    fragments = _fragments()
    assert set(fragments) == {"type", "processID", "status", "datetime", "minDuration", "maxDuration", "limit"}
    document = create_app().openapi()
    operation = document["paths"]["/jobs"]["get"]
    declared = {p["name"]: p for p in operation["parameters"]}
    for name, fragment in fragments.items():
        parameter = declared[name]
        for key, value in fragment.items():
            if key != "schema":
                assert parameter[key] == value, (name, key)
        schema = parameter["schema"]
        # status may name the states (statusCode.yaml), datetime give its syntax as a pattern
        assert {k: v for k, v in schema.items() if k != "pattern"} == fragment["schema"] or (
            name == "status" and schema["items"]["enum"] == ["accepted", "running", "successful", "failed",
                                                             "dismissed"]), (name, schema)
    # as OGC's test suite (ets-ogcapi-processes10) looks the operations up
    ids = {op["operationId"]: (path, method) for path, ops in document["paths"].items() for method, op in ops.items()}
    assert ids["getJobs"] == ("/jobs", "get") and ids["getStatus"] == ("/jobs/{job_id}", "get")
    assert ids["getResult"] == ("/jobs/{job_id}/results", "get") and ids["dismiss"] == ("/jobs/{job_id}", "delete")


def test_the_datetime_pattern_takes_what_the_abnf_takes():
    pattern = re.compile(jobfilters.DATETIME_PATTERN)
    for good in ("2001-01-02T03:04:05Z", "2001-01-02t03:04:05.123+05:30", "2001-01-02T03:04:05Z/..",
                 "../2001-01-02T03:04:05Z", "/2001-01-02T03:04:05Z", "2001-01-02T03:04:05Z/",
                 "2001-01-02T03:04:05Z/2001-02-03T00:00:00-01:00"):
        assert pattern.match(good), good
    for bad in ("2001-01-02", "../..", "/", "2001-13-02T03:04:05Z", "2001-01-02T03:04:05", "0000-01-01T00:00:00Z"):
        assert not pattern.match(bad), bad


@pytest.fixture(scope="module")
def timed_jobs(client):
    """Five jobs of one made-up process, at known times: {letter: jobID} and the process."""
    records, process = client.app.state.services.records, f"p-{uuid.uuid4().hex[:8]}"
    ids = {letter: uuid.uuid4().hex for letter in "ABCDE"}
    for letter, job_id in ids.items():
        records.create(job_id, process, [], f"none-{job_id}", "value", status="accepted")
    day = "2001-01-0{}T00:00:00.000Z".format
    records.update(ids["A"], created=day(1), started=day(1), finished="2001-01-01T00:00:10.000Z",
                   status="successful")  # 10 s
    records.update(ids["B"], created=day(2), started=day(2), finished="2001-01-02T00:01:40.000Z",
                   status="failed")  # 100 s
    records.update(ids["C"], created=day(3))  # accepted: no duration
    records.update(ids["D"], created=day(4), started=now(50), status="running")  # 50 s so far
    records.update(ids["E"], created=day(5), finished=day(5), status="dismissed")  # never started
    yield ids, process
    for job_id in (ids["C"], ids["D"]):  # no job of this module waits behind them
        records.finish(job_id, "dismissed", "dismissed by the test")


def _listed(client, ids: dict, params: list) -> str:
    response = client.get("/jobs", params=params)
    assert response.status_code == 200, response.text
    assert ogc_errors(response.json(), "jobList.yaml") == []
    letters = {job_id: letter for letter, job_id in ids.items()}
    return "".join(letters.get(job["jobID"], "?") for job in response.json()["jobs"])


@pytest.mark.parametrize("params,expected", [
    ([], "EDCBA"),
    ([("type", "process")], "EDCBA"),
    ([("type", "other")], ""),
    ([("status", "successful"), ("status", "failed")], "BA"),
    ([("datetime", "2001-01-02T00:00:00Z")], "B"),
    ([("datetime", "2001-01-02T01:00:00+01:00")], "B"),
    ([("datetime", "2001-01-02T00:00:00.0001Z")], ""),
    ([("datetime", "2001-01-02T00:00:00Z/..")], "EDCB"),
    ([("datetime", "2001-01-02T00:00:00Z/")], "EDCB"),
    ([("datetime", "../2001-01-02T00:00:00Z")], "BA"),
    ([("datetime", "/2001-01-02T00:00:00Z")], "BA"),
    ([("datetime", "2001-01-01T12:00:00Z/2001-01-03T00:00:00Z")], "CB"),
    ([("minDuration", "20")], "DB"),
    ([("maxDuration", "60")], "DA"),
    ([("minDuration", "20"), ("maxDuration", "60")], "D"),
    ([("maxDuration", "60,200")], "DA"),
    ([("minDuration", "5"), ("status", "successful")], "A"),
])
def test_the_job_list_filters(client, timed_jobs, params, expected):
    ids, process = timed_jobs
    assert _listed(client, ids, [("processID", process), *params]) == expected


def test_an_unknown_process_lists_no_jobs(client):
    assert client.get("/jobs", params={"processID": "no-such-process"}).json()["jobs"] == []


def test_the_job_list_honours_limit_and_leads_on_with_next_and_prev(client, timed_jobs):
    ids, process = timed_jobs
    url, pages = f"/jobs?processID={process}&limit=2", []
    while url is not None:
        body = client.get(url).json()
        assert ogc_errors(body, "jobList.yaml") == [] and len(body["jobs"]) <= 2
        rels = {link["rel"]: link["href"] for link in body["links"]}
        assert "self" in rels and (("prev" in rels) == bool(pages))
        pages.append(_listed(client, ids, list(parse_qsl(urlsplit(rels["self"]).query))))
        url = rels.get("next")
        assert url is None or url.startswith("http://testserver/jobs?")
    assert pages == ["ED", "CB", "A"]
    # without limit: the requirement's default, 10
    records, many = client.app.state.services.records, f"p-{uuid.uuid4().hex[:8]}"
    for _ in range(11):
        records.create(job_id := uuid.uuid4().hex, many, [], "none", "value")
        records.finish(job_id, "dismissed", "dismissed by the test")
    body = client.get("/jobs", params={"processID": many}).json()
    assert len(body["jobs"]) == 10 and "next" in {link["rel"] for link in body["links"]}


@pytest.mark.parametrize("query", ["limit=0", "limit=10001", "status=sleeping", "datetime=yesterday",
                                   "datetime=../..", "datetime=2001-02-29T00:00:00Z", "minDuration=x",
                                   "maxDuration=1,x", "offset=-1"])
def test_a_job_list_parameter_out_of_its_definition_is_a_400(client, query):
    response = client.get(f"/jobs?{query}")
    assert _ogc_exception(response, 400) == OGC_EXC + "invalid-parameter"
    assert query.split("=")[0] in response.json()["detail"]
