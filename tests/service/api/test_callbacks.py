"""Callbacks, OGC API - Processes 1.0's class callback (/req/callback/job-callback, the
``subscriber`` of an execute request; the texts vendored in tests/ogc_schemas): real HTTP
receivers on 127.0.0.1 record what the service sends them, and the bodies are checked against
the standard's schemas (statusInfo.yaml, results.yaml).

Two receivers: ``allowed`` (the service's callback_allow names it) and ``elsewhere`` (another
port of 127.0.0.1, not allowed), which must never see a request."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import yaml
from fastapi.testclient import TestClient
from openapi_schema_validator import OAS30Validator

from schemas.service import ExecuteRequest
from service.api.app import create_app
from service.jobs.callbacks import AllowList, CallbackDispatcher, Target
from tests.service.api.calls import INVALID
from tests.service.api.test_ogc_documents import ogc_errors
from tests.service.conftest import assert_problem, eventually, inline, make_settings

OGC = Path(__file__).resolve().parents[2] / "ogc_schemas" / "core"
CALLBACK = "http://www.opengis.net/spec/ogcapi-processes-1/1.0/conf/callback"
INTERVAL = 0.3  # callback_progress_interval of the module's service
# callback_timeout of the module's service: ample (a machine busy with 100 jobs and other test
# runs can take a second to answer, and a timed-out try is sent again: a duplicate)
TIMEOUT = 5.0


class Receiver:
    """An HTTP server on 127.0.0.1 recording every request; ``plan[path]`` lists what the
    next requests to ``path`` get: a status, or ("sleep", seconds) before a 200."""

    def __init__(self):
        self.requests: list[dict] = []
        self.plan: dict[str, list] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver.lock:
                    receiver.requests.append({"path": self.path, "headers": dict(self.headers), "body": body,
                                              "at": time.monotonic()})
                    steps = receiver.plan.get(self.path)
                    step = steps.pop(0) if steps else 200
                if isinstance(step, tuple) and step[0] == "sleep":
                    time.sleep(step[1])
                    step = 200
                if isinstance(step, tuple) and step[0] == "redirect":
                    self.send_response(302)
                    self.send_header("Location", step[1])
                else:
                    self.send_response(step)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def to(self, path: str) -> list[dict]:
        with self.lock:
            return [r for r in self.requests if r["path"] == path]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def receivers():
    allowed, elsewhere = Receiver(), Receiver()
    yield allowed, elsewhere
    allowed.close()
    elsewhere.close()


@pytest.fixture(scope="module")
def svc(receivers, tmp_path_factory):
    allowed, elsewhere = receivers
    settings = make_settings(tmp_path_factory.mktemp("callbacks-root"), callback_allow=[allowed.url + "/hooks/"],
                             callback_timeout=TIMEOUT, callback_retries=3, callback_backoff=0.05,
                             callback_progress_interval=INTERVAL, max_jobs=4, max_queued_jobs=200)
    with TestClient(create_app(settings)) as client:
        yield client
    # nothing, ever, went to the receiver the service does not allow
    assert elsewhere.requests == []


def _small_job(client, subscriber: dict, inputs: dict | None = None, process: str = "space_to_depth",
               mode: str = "value"):
    inputs = inputs or {"x": inline(np.arange(4, dtype=np.float32).reshape(1, 2, 2, 1)), "block_size": 2}
    body = {"inputs": inputs, "outputs": {"result": {"transmissionMode": mode}}, "response": "document",
            "subscriber": subscriber}
    return client.post(f"/processes/{process}/execution", json=body, headers={"Prefer": "respond-async"})


def _uris(receiver: Receiver, tag: str, *fields: str) -> dict:
    return {field: f"{receiver.url}/hooks/{tag}/{field}" for field in fields}


def _wait_done(client, job_id: str) -> dict:
    info = eventually(lambda: (i := client.get(f"/jobs/{job_id}").json())["status"] not in ("accepted", "running")
                      and i, timeout=60)
    assert info, job_id
    return info


def _path(uri: str) -> str:
    return "/" + uri.split("/", 3)[3]


def _results_errors(document: dict) -> list[str]:
    """Why ``document`` is not a results document of OGC's results.yaml. An inline value is a
    base64 string, which the 1.0 schema's ``inputValueNoObject`` matches twice (as a string and as
    ``binaryInputValue``, format byte) and so its ``oneOf`` refuses every one: the value is
    checked against binaryInputValue.yaml alone, and the rest with an object in its place."""
    errors = []
    for output in document.values():
        if isinstance(output, dict) and isinstance(output.get("value"), str):
            errors += ogc_errors(output["value"], "binaryInputValue.yaml")
    bare = {k: {**v, "value": {}} if isinstance(v, dict) and "value" in v else v for k, v in document.items()}
    return errors + ogc_errors(bare, "results.yaml")


def _monitor(request: dict) -> str:
    return request["headers"].get("Link", "")


# ---------------------------------------------------------------------------------------------


def test_the_callback_class_is_declared_with_its_subscriber_schema(svc):
    assert CALLBACK in svc.get("/conformance").json()["conformsTo"]
    # /req/callback/job-callback as vendored: "The server SHALL support callback functions for jobs."
    requirement = (OGC / "requirements" / "callback" / "REQ_job-creation-callback.adoc").read_text()
    assert "/req/callback/job-callback" in requirement and "SHALL support callback functions" in requirement
    # The 1.0 schema requires "successUrl", a misprint of successUri fixed in the standard's later
    # versions (commit 950dd8d); this service follows its meaning: successUri required.
    schema = yaml.safe_load((OGC / "openapi" / "schemas" / "subscriber.yaml").read_text())
    assert schema["required"] == ["successUrl"]
    schema["required"] = ["successUri"]
    validator = OAS30Validator(schema)
    for subscriber in ({"successUri": "http://a.example/x"},
                       {"successUri": "http://a.example/x", "inProgressUri": "https://b.example:8443/p?q=1",
                        "failedUri": "http://[::1]:9/f"}):
        assert list(validator.iter_errors(subscriber)) == []
        assert ExecuteRequest.model_validate({"subscriber": subscriber}).subscriber.uris() == subscriber
    for subscriber in ({}, {"inProgressUri": "http://a.example/x"}):
        assert list(validator.iter_errors(subscriber))
        with pytest.raises(ValueError, match="successUri"):
            ExecuteRequest.model_validate({"subscriber": subscriber})
    # and the execute operation documents the requests a subscriber receives
    operation = svc.get("/openapi.json").json()["paths"]["/processes/{process_id}/execution"]["post"]
    assert set(operation["callbacks"]) == {"jobCompleted", "jobFailed", "jobInProgress"}
    assert "{$request.body#/subscriber/successUri}" in operation["callbacks"]["jobCompleted"]


@pytest.mark.smoke
def test_a_successful_job_pushes_its_states_and_then_its_results(svc, receivers):
    allowed, _ = receivers
    uris = _uris(allowed, "ok", "successUri", "inProgressUri", "failedUri")
    answer = _small_job(svc, uris)
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["jobID"]
    assert _wait_done(svc, job_id)["status"] == "successful"
    success = eventually(lambda: allowed.to(_path(uris["successUri"])), timeout=10)
    assert len(success) == 1
    request = success[0]
    assert request["headers"]["Content-Type"] == "application/json"
    assert _monitor(request) == f'<http://testserver/jobs/{job_id}>; rel="monitor"'
    results = json.loads(request["body"])
    assert _results_errors(results) == []
    assert results == svc.get(f"/jobs/{job_id}/results").json()  # as GET gives it (response document)
    progress = allowed.to(_path(uris["inProgressUri"]))
    documents = [json.loads(r["body"]) for r in progress]
    for document in documents:
        assert ogc_errors(document, "statusInfo.yaml") == [], document
        assert document["jobID"] == job_id
    assert [d["status"] for d in documents] == ["accepted", "running"]
    assert allowed.to(_path(uris["failedUri"])) == []
    # the pushes to inProgressUri came at most one per interval
    assert all(b["at"] - a["at"] >= INTERVAL * 0.3 for a, b in zip(progress, progress[1:]))


def test_a_failed_job_pushes_its_status_to_failed_uri(svc, receivers):
    allowed, _ = receivers
    uris = _uris(allowed, "bad", "successUri", "failedUri")
    inputs = {"params": inline(np.arange(12).reshape(3, 4)), "indices": inline(np.array([[5, 1]]))}
    answer = _small_job(svc, uris, inputs, process="gather_nd")
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["jobID"]
    status = _wait_done(svc, job_id)
    assert status["status"] == "failed"
    failed = eventually(lambda: allowed.to(_path(uris["failedUri"])), timeout=10)
    assert len(failed) == 1
    document = json.loads(failed[0]["body"])
    assert ogc_errors(document, "statusInfo.yaml") == []
    assert document == svc.get(f"/jobs/{job_id}").json() == status
    assert "out of range" in document["message"]
    time.sleep(0.2)
    assert allowed.to(_path(uris["successUri"])) == []


def test_a_delivery_answered_503_twice_is_tried_again(svc, receivers):
    allowed, _ = receivers
    uris = _uris(allowed, "busy", "successUri")
    allowed.plan[_path(uris["successUri"])] = [503, 503]
    job_id = _small_job(svc, uris, mode="reference").json()["jobID"]
    assert _wait_done(svc, job_id)["status"] == "successful"
    tries = eventually(lambda: t if len(t := allowed.to(_path(uris["successUri"]))) >= 3 else None, timeout=10)
    assert tries and len(tries) == 3
    assert len({r["body"] for r in tries}) == 1
    link = json.loads(tries[0]["body"])
    assert ogc_errors(link, "results.yaml") == [] and link == svc.get(f"/jobs/{job_id}/results").json()
    # backed off: 0.05 s, then 0.1 s
    assert tries[1]["at"] - tries[0]["at"] >= 0.04 and tries[2]["at"] - tries[1]["at"] >= 0.09
    time.sleep(0.3)
    assert len(allowed.to(_path(uris["successUri"]))) == 3  # answered 200: no more


def test_a_receiver_slower_than_the_timeout_is_given_up_and_tried_again(receivers):
    allowed, _ = receivers
    uris = _uris(allowed, "slow", "successUri")
    allowed.plan[_path(uris["successUri"])] = [("sleep", 3.0)]
    timeout = 0.5
    dispatcher = CallbackDispatcher(AllowList([allowed.url + "/hooks/"]), dict, lambda job: {"result": job["id"]},
                                    timeout=timeout, retries=2, backoff=0.05)
    dispatcher.changed({"id": "slow", "subscriber": json.dumps(uris), "status": "successful", "progress": 100,
                        "updated": "1"})
    tries = eventually(lambda: t if len(t := allowed.to(_path(uris["successUri"]))) >= 2 else None, timeout=10)
    dispatcher.close()
    assert tries and len(tries) == 2 and tries[0]["body"] == tries[1]["body"] == b'{"result": "slow"}'
    # the first try was abandoned at the timeout (+ the backoff), not after the receiver's 3 s
    assert timeout <= tries[1]["at"] - tries[0]["at"] < 2.0


@pytest.mark.parametrize("field", ["successUri", "inProgressUri", "failedUri"])
def test_a_uri_the_allow_list_does_not_name_is_refused_before_any_job(svc, receivers, field):
    allowed, elsewhere = receivers
    before = len(svc.get("/jobs", params={"limit": 10000}).json()["jobs"])
    cases = [elsewhere.url + "/hooks/x",              # another port
             allowed.url + "/other/x",                # another path
             allowed.url.replace("http:", "https:") + "/hooks/x",  # another scheme
             allowed.url.replace("127.0.0.1", "localhost") + "/hooks/x"]  # another host (same address)
    for uri in cases:
        subscriber = {"successUri": allowed.url + "/hooks/fine", field: uri}
        body = assert_problem(_small_job(svc, subscriber), 400, INVALID)
        assert f"subscriber.{field}" in body["detail"] and repr(uri) in body["detail"], body["detail"]
        assert "callback_allow" in body["detail"]
    assert len(svc.get("/jobs", params={"limit": 10000}).json()["jobs"]) == before
    assert allowed.to("/hooks/fine") == [] and elsewhere.requests == []


def test_a_bad_subscriber_is_a_400_naming_its_field(svc):
    for subscriber, words in (({"successUri": "ftp://127.0.0.1/x"}, "subscriber.successUri"),
                              ({"successUri": "http://127.0.0.1:1/x", "failedUri": "/relative"},
                               "subscriber.failedUri"),
                              ({"inProgressUri": "http://127.0.0.1:1/x"}, "subscriber.successUri"),
                              ({"successUri": "http://127.0.0.1:1/x", "successUrl": "x"}, "subscriber.successUrl")):
        assert words in assert_problem(_small_job(svc, subscriber), 400, INVALID)["detail"]
    # a synchronous execution answers itself: a subscriber there is refused too
    body = {"inputs": {"x": inline(np.zeros((1, 2, 2, 1), np.float32)), "block_size": 2},
            "subscriber": {"successUri": "http://127.0.0.1:1/x"}}
    assert "respond-async" in assert_problem(svc.post("/processes/space_to_depth/execution", json=body), 400,
                                             INVALID)["detail"]


def test_redirects_are_not_followed(svc, receivers):
    allowed, elsewhere = receivers
    uris = _uris(allowed, "moved", "successUri")
    allowed.plan[_path(uris["successUri"])] = [("redirect", elsewhere.url + "/stolen")]
    job_id = _small_job(svc, uris).json()["jobID"]
    assert _wait_done(svc, job_id)["status"] == "successful"
    assert len(eventually(lambda: allowed.to(_path(uris["successUri"])), timeout=10)) == 1
    time.sleep(0.3)
    assert len(allowed.to(_path(uris["successUri"]))) == 1 and elsewhere.requests == []


def test_the_allow_list_compares_scheme_host_port_and_path_and_checks_what_a_name_resolves_to():
    allow = AllowList(["http://hooks.example:8080/cb/", "https://127.0.0.1:8443/"])
    assert allow.match("http://HOOKS.example:8080/cb/job?x=1") is not None
    assert allow.match("http://hooks.example:8080/cb") is not None
    for refused in ("http://hooks.example:8080/cbx/1", "http://hooks.example/cb/1", "https://hooks.example:8080/cb/",
                    "http://127.0.0.1:8443/", "https://127.0.0.1/", "http://hooks.example.evil:8080/cb/"):
        assert allow.match(refused) is None, refused
    assert Target.of("https://[::1]/x").host == "::1" and Target.of("https://[::1]/x").port == 443

    def resolver(*addresses):
        return lambda host, port, type=None: [(2, 1, 6, "", (a, port)) for a in addresses]

    assert allow.addresses("http://hooks.example:8080/cb/", resolver("93.184.215.14")) == ["93.184.215.14"]
    # (loopback and unspecified addresses: any address Python does not call global is refused)
    for inner in ("127.0.0.1", "127.0.0.2", "::1", "0.0.0.0"):
        with pytest.raises(ValueError, match="non-public address"):
            allow.addresses("http://hooks.example:8080/cb/", resolver("93.184.215.14", inner))
    trusting = AllowList(["http://hooks.internal/"], private_addresses=True)
    assert trusting.addresses("http://hooks.internal/x", resolver("127.0.0.1")) == ["127.0.0.1"]
    assert allow.addresses("https://127.0.0.1:8443/x") == ["127.0.0.1"]  # allowed as an address: no lookup


def test_progress_pushes_are_rate_limited_and_the_latest_state_and_the_end_are_delivered(receivers):
    allowed, _ = receivers
    uris = _uris(allowed, "rate", "successUri", "inProgressUri")
    interval = 0.25
    dispatcher = CallbackDispatcher(AllowList([allowed.url + "/hooks/"]), lambda job: dict(job),
                                    lambda job: {"result": job["id"]}, timeout=2, retries=0,
                                    progress_interval=interval)
    job = {"id": "rate", "subscriber": json.dumps(uris), "base_url": "http://s", "progress": 0}
    states = [("accepted", 0), ("running", 0)] + [("running", p) for p in range(1, 100)] + [("successful", 100)]
    started = time.monotonic()
    for i, (status, progress) in enumerate(states):
        dispatcher.changed({**job, "status": status, "progress": progress, "updated": f"{i:04d}"})
        time.sleep(0.01)  # about 1 s of changes, 100 a second
    took = time.monotonic() - started
    assert eventually(lambda: allowed.to(_path(uris["successUri"])), timeout=5)
    dispatcher.close()
    pushes = allowed.to(_path(uris["inProgressUri"]))
    seen = [(json.loads(p["body"])["status"], json.loads(p["body"])["progress"]) for p in pushes]
    # each status once, the first push at once; running's, waiting for the interval, took the
    # progress that came meanwhile
    assert seen[0] == ("accepted", 0) and seen[1][0] == "running"
    assert seen[-1] == ("running", 99)  # the latest state before the end
    assert len(seen) == len(set(seen)) and seen == sorted(seen, key=states.index)
    assert 3 <= len(seen) <= took / interval + 4  # 101 changes in `took` seconds
    # spaced by the interval when sent; as they arrive here (a busy machine delays one now and
    # then), on average by the interval, each by much more than the changes' 10 ms
    gaps = [b["at"] - a["at"] for a, b in zip(pushes, pushes[1:])]
    assert sum(gaps) / len(gaps) >= interval * 0.8 and min(gaps) >= interval * 0.3, gaps
    success = allowed.to(_path(uris["successUri"]))
    assert [json.loads(s["body"]) for s in success] == [{"result": "rate"}]
    assert success[0]["at"] >= pushes[-1]["at"]  # after the job's last progress


def test_100_jobs_get_every_callback_once_per_status_change(svc, receivers):
    allowed, elsewhere = receivers
    started = time.monotonic()
    jobs = {}
    for i in range(100):
        uris = _uris(allowed, f"many-{i}", "successUri", "inProgressUri", "failedUri")
        answer = _small_job(svc, uris)
        assert answer.status_code == 201, answer.text
        jobs[answer.json()["jobID"]] = uris
    for job_id in jobs:
        assert _wait_done(svc, job_id)["status"] == "successful"
    assert eventually(lambda: all(allowed.to(_path(u["successUri"])) for u in jobs.values()), timeout=30)
    time.sleep(0.5)  # anything extra would come now
    for job_id, uris in jobs.items():
        success = allowed.to(_path(uris["successUri"]))
        assert len(success) == 1 and _monitor(success[0]) == f'<http://testserver/jobs/{job_id}>; rel="monitor"'
        assert json.loads(success[0]["body"]) == svc.get(f"/jobs/{job_id}/results").json()
        progress = [json.loads(r["body"]) for r in allowed.to(_path(uris["inProgressUri"]))]
        # the job's history: accepted (its record's first state), running, successful; each state
        # once to the URI that gets it
        assert [(p["jobID"], p["status"]) for p in progress] == [(job_id, "accepted"), (job_id, "running")]
        assert allowed.to(_path(uris["failedUri"])) == []
    assert elsewhere.requests == []
    assert time.monotonic() - started < 60


def test_a_database_from_before_subscribers_opens_and_keeps_its_jobs(tmp_path, receivers):
    """The subscriber and base_url columns are added to an existing database (its rows read
    NULL: no callbacks), and a new job with a subscriber is recorded in it."""
    import sqlite3

    from service.jobs.callbacks import SubscribedRecords

    path = tmp_path / "jobs.sqlite"
    with sqlite3.connect(path) as db:  # the table as the first release made it
        db.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY, process_id TEXT NOT NULL, status TEXT NOT NULL, "
                   "message TEXT, created TEXT, started TEXT, finished TEXT, updated TEXT, progress INTEGER, "
                   "reads TEXT NOT NULL, writes TEXT, transmission TEXT, error_status INTEGER, error_type TEXT)")
        db.execute("INSERT INTO jobs (id, process_id, status, reads, created, finished) VALUES "
                   "('old', 'gather_nd', 'successful', '[]', '2026-01-01T00:00:00.000Z', '2026-01-01T00:00:01.000Z')")
    allowed, _ = receivers
    told = []
    dispatcher = CallbackDispatcher(AllowList([allowed.url + "/hooks/"]), lambda job: dict(job), lambda job: {})
    dispatcher.changed = told.append
    records = SubscribedRecords(path, dispatcher)
    try:
        assert records.get("old")["subscriber"] is None and records.get("old")["status"] == "successful"
        subscriber = json.dumps({"successUri": allowed.url + "/hooks/db"})
        records.create("new", "gather_nd", [], "out", "reference", subscriber=subscriber, base_url="http://s")
        records.update("new", status="running")
        records.finish("new", "successful", "done", progress=100)
        records.update("old", message="touched")  # no subscriber: nothing told
        assert [(job["id"], job["status"]) for job in told] == [("new", "accepted"), ("new", "running"),
                                                              ("new", "successful")]
        assert told[0]["subscriber"] == subscriber and told[0]["base_url"] == "http://s"
    finally:
        records.close()
        dispatcher.close()


def test_a_subscriber_past_the_pending_bound_is_a_503_and_no_job(svc, receivers, monkeypatch):
    allowed, _ = receivers
    callbacks = svc.app.state.services.callbacks
    monkeypatch.setattr(callbacks, "max_pending", 0)  # as if that many jobs' deliveries waited
    before = len(svc.get("/jobs", params={"limit": 10000}).json()["jobs"])
    answer = _small_job(svc, _uris(allowed, "full", "successUri"))
    assert answer.status_code == 503 and answer.headers["Retry-After"]
    assert "callback_max_pending" in answer.json()["detail"]
    assert len(svc.get("/jobs", params={"limit": 10000}).json()["jobs"]) == before
    # a job without a subscriber is not held up by the callbacks' bound
    plain = {"inputs": {"x": inline(np.zeros((1, 2, 2, 1), np.float32)), "block_size": 2}}
    assert svc.post("/processes/space_to_depth/execution", json=plain,
                    headers={"Prefer": "respond-async"}).status_code == 201


def _echo_job(client, subscriber: dict, inputs: dict, response: str = "document"):
    body = {"inputs": inputs, "response": response, "subscriber": subscriber}
    return client.post("/processes/echo/execution", json=body, headers={"Prefer": "respond-async"})


def test_an_echo_job_pushes_its_states_and_then_its_results(svc, receivers):
    allowed, _ = receivers
    uris = _uris(allowed, "echo-ok", "successUri", "inProgressUri", "failedUri")
    inputs = {"string_input": "teststring", "integer_input": 7, "boolean_input": True,
              "bbox_input": {"bbox": [51.9, 7.0, 52.0, 7.1]}, "object_input": {"a": [1, 2]}}
    answer = _echo_job(svc, uris, inputs)
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["jobID"]
    assert _wait_done(svc, job_id)["status"] == "successful"
    assert eventually(lambda: allowed.to(_path(uris["successUri"])), timeout=10)
    time.sleep(0.3)  # anything extra would come now
    success = allowed.to(_path(uris["successUri"]))
    assert len(success) == 1
    assert success[0]["headers"]["Content-Type"] == "application/json"
    assert _monitor(success[0]) == f'<http://testserver/jobs/{job_id}>; rel="monitor"'
    results = json.loads(success[0]["body"])
    assert results == svc.get(f"/jobs/{job_id}/results").json()  # as GET gives it (response document)
    assert results["string_input"] == "teststring" and results["object_input"]["value"] == {"a": [1, 2]}
    documents = [json.loads(r["body"]) for r in allowed.to(_path(uris["inProgressUri"]))]
    for document in documents:
        assert ogc_errors(document, "statusInfo.yaml") == [], document
        assert document["jobID"] == job_id and document["processID"] == "echo"
    assert [d["status"] for d in documents] == ["accepted", "running"]
    assert allowed.to(_path(uris["failedUri"])) == []
    # a synchronous echo with a subscriber is refused as an operator's is, and nothing is sent
    sync = {"inputs": {"string_input": "x"}, "subscriber": _uris(allowed, "echo-sync", "successUri")}
    assert "respond-async" in assert_problem(svc.post("/processes/echo/execution", json=sync), 400,
                                             INVALID)["detail"]
    refused = {"successUri": allowed.url + "/other/x"}  # not allowed: a 400 naming the setting
    assert "callback_allow" in assert_problem(_echo_job(svc, refused, {"string_input": "x"}), 400,
                                              INVALID)["detail"]
    time.sleep(0.2)
    assert allowed.to("/hooks/echo-sync/successUri") == [] and allowed.to("/other/x") == []


def test_a_dismissed_echo_job_pushes_its_status_to_failed_uri(svc, receivers):
    allowed, _ = receivers
    uris = _uris(allowed, "echo-dismissed", "successUri", "failedUri")
    answer = _echo_job(svc, uris, {"string_input": "teststring", "pause": 10})
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["jobID"]
    assert eventually(lambda: svc.get(f"/jobs/{job_id}").json()["status"] == "running", timeout=10)
    assert svc.delete(f"/jobs/{job_id}").json()["status"] == "dismissed"
    failed = eventually(lambda: allowed.to(_path(uris["failedUri"])), timeout=10)
    assert len(failed) == 1
    assert _monitor(failed[0]) == f'<http://testserver/jobs/{job_id}>; rel="monitor"'
    document = json.loads(failed[0]["body"])
    assert ogc_errors(document, "statusInfo.yaml") == []
    assert document["status"] == "dismissed" and document["processID"] == "echo"
    assert document == svc.get(f"/jobs/{job_id}").json()
    time.sleep(0.3)
    assert allowed.to(_path(uris["successUri"])) == [] and len(allowed.to(_path(uris["failedUri"]))) == 1
