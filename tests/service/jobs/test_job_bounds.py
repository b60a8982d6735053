"""Work that stops, and job bookkeeping that stays bounded:

- background jobs run on a fixed number of threads (``max_jobs``) fed by a bounded queue
  (``max_queued_jobs``; past it a submission is a 503 with Retry-After naming the setting);
- an array that an active job reads cannot be deleted, however many other jobs are active, and a
  job whose input was deleted between its plan and its record is refused;
- finished jobs expire (``job_retention_seconds``): the sweeper deletes them with their result
  arrays; their records are pruned by count too (``max_job_records``), their result arrays kept;
- a synchronous execution whose client goes away, and one dismissed while it runs, has its tasks
  stopped on the cluster (a real ``python -m service``, its client a raw socket).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest
import requests
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.jobs.records import JobRecords
from service.jobs.sweeper import Sweeper
from tests.service.cluster_jobs import ASYNC, bounded, job_leftovers, upload
from tests.service.conftest import NPY, assert_problem, eventually, inline, make_settings, npy_bytes
from tests.service.processes import descendants, start_server, stop_server

NO_SUCH_JOB = "http://www.opengis.net/def/exceptions/ogcapi-processes-1/1.0/no-such-job"
NO_SUCH_ARRAY = "https://chunked-tensor-ops.readthedocs.io/exceptions/no-such-array"
CONFLICT = "https://chunked-tensor-ops.readthedocs.io/exceptions/conflict"
TOO_MANY_JOBS = "https://chunked-tensor-ops.readthedocs.io/exceptions/too-many-jobs"
DAY = 24 * 3600.0
MAX_JOBS, MAX_QUEUED_JOBS = 4, 16
SUBMISSIONS = 40  # past max_jobs + max_queued_jobs: each one accepted is a job run to its end


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    root = tmp_path_factory.mktemp("bounds-root")
    settings = make_settings(root, max_jobs=MAX_JOBS, max_queued_jobs=MAX_QUEUED_JOBS)
    with TestClient(create_app(settings)) as client:
        yield client


def small_job(api: TestClient, name: str, headers: dict | None = ASYNC):
    """A depth_to_space of a tiny inline array, its result stored as ``name``."""
    x = np.arange(8, dtype=np.float32).reshape(1, 1, 1, 8)
    return api.post("/processes/depth_to_space/execution", headers=headers, json={
        "inputs": {"x": inline(x), "block_size": 2},
        "outputs": {"result": {"transmissionMode": "reference", "name": name}}})


def ago(seconds: float) -> str:
    """A time ``seconds`` ago as the job records write it."""
    moment = datetime.now(timezone.utc) - timedelta(seconds=seconds)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def wait_final(api: TestClient, job_id: str, timeout: float = 60.0) -> dict:
    final = eventually(lambda: (info := api.get(f"/jobs/{job_id}").json())["status"] in
                       ("successful", "failed", "dismissed") and info, timeout=timeout)
    assert final, api.get(f"/jobs/{job_id}").json()
    return final


# --- the job records ----------------------------------------------------------------------------


@pytest.mark.smoke
def test_records_pruned_by_age_and_by_count(tmp_path):
    path = tmp_path / "jobs.sqlite"
    records = JobRecords(path)

    def record(job_id: str, status: str, finished_ago: float | None = None) -> None:
        records.create(job_id, "depth_to_space", ["x"], f"out-{job_id}", "reference", status="running")
        if status != "running":
            records.finish(job_id, status, "over")
        if finished_ago is not None:
            records.update(job_id, created=ago(finished_ago + 60), finished=ago(finished_ago))

    for status in ("successful", "failed", "dismissed"):
        record(f"old-{status}", status, finished_ago=8 * DAY)
    record("old-running", "running")
    records.update("old-running", created=ago(9 * DAY))  # active: kept, however old
    record("recent", "successful", finished_ago=1 * DAY)
    records.close()

    # by age, as the sweeper expires them (these have no stored results)
    records = JobRecords(path, retention_seconds=7 * DAY, max_records=4)
    assert len(records.list()) == 4  # opening them pruned one by count (5 > 4): an old finished one
    assert Sweeper(records, NoResults(), 60).sweep() == 2
    assert {job["id"] for job in records.list()} == {"old-running", "recent"}
    # as jobs are recorded, by count: the ones that finished first go, never an active one
    record("a", "successful", finished_ago=3 * 3600)
    record("b", "failed", finished_ago=2 * 3600)
    assert {job["id"] for job in records.list()} == {"old-running", "recent", "a", "b"}
    record("c", "dismissed", finished_ago=1 * 3600)
    assert {job["id"] for job in records.list()} == {"old-running", "a", "b", "c"}
    record("d", "running")
    assert {job["id"] for job in records.list()} == {"old-running", "b", "c", "d"}
    assert records.get("recent") is None and records.get("a") is None
    assert records.prune() == 0


class NoResults:
    """A store that holds none of the jobs' results."""

    def exists(self, name: str) -> bool:
        return False


def test_an_expired_job_is_404_and_its_result_is_gone(api):
    response = small_job(api, "pruned-result")
    assert response.status_code == 201, response.text
    job_id = response.json()["jobID"]
    assert wait_final(api, job_id)["status"] == "successful"
    records = api.app.state.services.records
    records.update(job_id, created=ago(8 * DAY + 60), finished=ago(8 * DAY))  # past the 7-day retention
    services = api.app.state.services
    assert Sweeper(services.records, services.store, 60).sweep() == 1  # as the service's sweeper does
    assert_problem(api.get(f"/jobs/{job_id}"), 404, NO_SUCH_JOB)
    assert_problem(api.get(f"/jobs/{job_id}/results"), 404, NO_SUCH_JOB)
    assert job_id not in [job["jobID"] for job in api.get("/jobs", params={"limit": 10000}).json()["jobs"]]
    assert_problem(api.get("/arrays/pruned-result/info"), 404)


# --- job threads and the queue --------------------------------------------------------------------


def test_job_threads_stay_bounded_and_a_full_queue_is_503(api, monkeypatch):
    """40 submissions while every job blocks in its build: max_jobs run, max_queued_jobs wait,
    the rest are refused; the process gains at most max_jobs threads (one per job before)."""
    executor = api.app.state.services.executor
    release = threading.Event()
    build = executor._build_with_scratch

    def blocked_build(plan, scratch):
        release.wait(60)
        return build(plan, scratch)

    assert small_job(api, "threads-warm-up", headers=None).status_code == 204  # the request threads exist
    monkeypatch.setattr(executor, "_build_with_scratch", blocked_build)
    before = peak = threading.active_count()
    accepted, refused = [], []
    try:
        for k in range(SUBMISSIONS):
            response = small_job(api, f"threads-{k}")
            peak = max(peak, threading.active_count())
            if response.status_code == 201:
                accepted.append(response.json()["jobID"])
            else:
                refused.append(response)
    finally:
        release.set()
    assert peak - before <= MAX_JOBS + 2, f"{before} threads before, {peak} at the peak"
    assert len(accepted) == MAX_JOBS + MAX_QUEUED_JOBS, (len(accepted), refused[:1] and refused[0].text)
    assert len(refused) == SUBMISSIONS - len(accepted)
    body = assert_problem(refused[0], 503, TOO_MANY_JOBS)
    assert "max_queued_jobs" in body["detail"] and "CHUNKED_TENSOR_OPS_MAX_QUEUED_JOBS" in body["detail"]
    assert int(refused[0].headers["Retry-After"]) > 0
    for job_id in accepted:
        assert wait_final(api, job_id)["status"] == "successful"
    response = small_job(api, "threads-after")  # the queue has room again
    assert response.status_code == 201, response.text
    assert wait_final(api, response.json()["jobID"])["status"] == "successful"
    job_threads = [t.name for t in threading.enumerate() if t.name.removeprefix("job-").isdigit()]  # job-0...
    assert len(job_threads) == MAX_JOBS, job_threads


# --- arrays in use ------------------------------------------------------------------------------


def test_an_input_of_an_active_job_cannot_be_deleted_among_many_active_jobs(api):
    records = api.app.state.services.records
    upload(api, "busy-in", np.zeros((2, 2), np.float32))
    records.create("busy-job", "depth_to_space", ["busy-in"], "busy-out", "reference", status="running")
    records.update("busy-job", created=ago(3600))  # the oldest active job
    try:
        for k in range(1200):  # newer active jobs, more than any page of them
            records.create(f"filler-{k}", "gather_nd", [f"other-{k}"], f"filler-out-{k}", "reference")
        assert_problem(api.delete("/arrays/busy-in"), 409, CONFLICT)
        replaced = api.put("/arrays/busy-in", params={"overwrite": "true"}, content=npy_bytes(np.ones(3)),
                           headers={"Content-Type": NPY})
        assert_problem(replaced, 409, CONFLICT)
        assert records.busy_with("busy-out") == "busy-job"
        assert records.busy_with("other-0") == "filler-0"
    finally:
        records.mark_interrupted()  # the records above, and nothing else of this module is active
    assert api.delete("/arrays/busy-in").status_code == 204


def test_no_job_is_recorded_while_an_array_is_held_unused(tmp_path):
    """``JobRecords.unused``: the check that no active job uses an array and what the block
    does with it (a delete, a replace) are one step for ``create``, which waits."""
    records = JobRecords(tmp_path / "jobs.sqlite")
    order = []
    with records.unused("held") as busy:
        assert busy is None
        recording = threading.Thread(target=lambda: (records.create("reader", "depth_to_space", ["held"], "out",
                                                                    "reference"), order.append("recorded")))
        recording.start()
        time.sleep(0.3)
        order.append("deleted")
    recording.join(10)
    assert order == ["deleted", "recorded"]
    with records.unused("held") as busy:
        assert busy == "reader"


def test_an_input_deleted_between_plan_and_record_is_refused(api, monkeypatch):
    """A delete that lands after a job's plan but before its record: the job is refused (404)
    rather than run on a missing array (from its record on, deletes are refused)."""
    services = api.app.state.services
    plan = services.executor.plan

    def plan_then_delete(*args):
        planned = plan(*args)
        services.store.delete("raced-in")
        return planned

    monkeypatch.setattr(services.executor, "plan", plan_then_delete)
    for headers in (ASYNC, None):
        upload(api, "raced-in", np.zeros((1, 1, 1, 4), np.float32))
        before = len(services.records.list(limit=10**6))
        response = api.post("/processes/depth_to_space/execution", headers=headers, json={
            "inputs": {"x": {"href": "/arrays/raced-in"}, "block_size": 2},
            "outputs": {"result": {"transmissionMode": "reference", "name": "raced-out"}}})
        assert_problem(response, 404, NO_SUCH_ARRAY)
        assert api.get("/arrays/raced-out/info").status_code == 404
        if headers:  # a refused submission leaves no job behind
            assert len(services.records.list(limit=10**6)) == before


# --- executions that stop (a real server) ------------------------------------------------------


# 16 input chunks, ~3000 small output chunks: a minute of work for the server's one worker,
# uploaded in moments.
SLOW_INPUTS = {"x": {"href": "/arrays/slow-x"}, "block_shape": [2, 2], "paddings": [[0, 200], [0, 200]]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    where = tmp_path_factory.mktemp("bounds-server")
    server = start_server(where / "data", where / "server.log")
    try:
        response = requests.put(f"{server.url}/arrays/slow-x", data=npy_bytes(np.ones((1, 16, 16, 1), np.float32)),
                                headers={"Content-Type": NPY}, params={"chunks": "1,4,4,1"}, timeout=60)
        assert response.status_code == 201, response.text
        yield server
    finally:
        stop_server(server)


def post_sync(server, name: str) -> socket.socket:
    """A synchronous execution of the slow job sent on a raw connection (closed by the test)."""
    url = urlsplit(server.url)
    body = json.dumps({"inputs": SLOW_INPUTS, "outputs": {"result": {"transmissionMode": "reference",
                                                                     "name": name}}}).encode()
    sock = socket.create_connection((url.hostname, url.port), timeout=60)
    sock.sendall(f"POST /processes/space_to_batch_nd/execution HTTP/1.1\r\nHost: {url.netloc}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def running_with_progress(server) -> str:
    """The id of the server's one running job, once the cluster has done some of it."""
    def running():
        jobs = requests.get(f"{server.url}/jobs", params={"status": "running"}, timeout=10).json()["jobs"]
        return jobs and jobs[0]["progress"] > 0 and jobs[0]["jobID"]

    job_id = eventually(running, timeout=60, every=0.2)
    assert job_id, f"no job made progress:\n{server.log_tail()}"
    return job_id


def cpu_seconds(pids: set[int]) -> float:
    """User + system CPU time of these processes so far (Linux /proc)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def assert_workers_idle(server, seconds: float = 1.0) -> None:
    """The cluster's processes (the server's descendants) use almost no CPU: no task runs."""
    pids = descendants(server.proc.pid)
    start = cpu_seconds(pids)
    time.sleep(seconds)
    used = cpu_seconds(pids) - start
    assert used < 0.25 * seconds, f"the workers used {used:.2f} s of CPU in {seconds} s: tasks still run"


def assert_stopped(server, job_id: str, name: str, message: str) -> None:
    """The job is dismissed saying ``message``, its tasks no longer run, nothing was stored."""
    info = requests.get(f"{server.url}/jobs/{job_id}", timeout=10).json()
    assert info["status"] == "dismissed" and message in info["message"], info
    assert eventually(lambda: not job_leftovers(server.root, job_id))
    assert_workers_idle(server)
    assert requests.get(f"{server.url}/arrays/{name}/info", timeout=10).status_code == 404
    assert not job_leftovers(server.root, job_id)


def test_a_sync_execution_whose_client_goes_away_is_cancelled(server):
    sock = post_sync(server, "gone-y")
    job_id = running_with_progress(server)
    sock.close()  # the client goes away
    final = eventually(lambda: requests.get(f"{server.url}/jobs/{job_id}", timeout=10).json()["status"] != "running",
                       timeout=10)
    assert final, f"the job still runs 10 s after its client went away:\n{server.log_tail()}"
    assert_stopped(server, job_id, "gone-y", "the client closed the connection")


def test_a_dismissed_sync_execution_stops_its_tasks(server):
    sock = post_sync(server, "dismissed-sync-y")
    try:
        job_id = running_with_progress(server)
        with bounded(15):
            response = requests.delete(f"{server.url}/jobs/{job_id}", timeout=30)
        assert response.status_code == 200 and response.json()["status"] == "dismissed", response.text
        sock.settimeout(15)
        answer = sock.recv(65536).decode(errors="replace")  # the execution's own answer: 409
        assert answer.startswith("HTTP/1.1 409"), answer[:500]
        assert "was stopped (dismissed by the client)" in answer, answer[-500:]
    finally:
        sock.close()
    assert_stopped(server, job_id, "dismissed-sync-y", "dismissed by the client")
