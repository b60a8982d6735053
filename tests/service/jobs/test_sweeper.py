"""Result retention: a finished job says when it ``expires`` (its statusInfo) and its results
carry ``Expires``; then the service's sweeper deletes the job and its stored result together,
never half: not while the job runs, not while an active job reads the result, a download under
way reads to its end, and a failed deletion leaves both for the next sweep."""

from __future__ import annotations

import time
from datetime import timedelta
from email.utils import parsedate_to_datetime

import numpy as np
import pytest
from fastapi.testclient import TestClient

import ops
from service.api.app import create_app
from service.jobs.records import now, parse_stamp
from service.jobs.sweeper import Sweeper
from tests.helpers import assert_same
from tests.service.api.calls import decode, execute, ints, store, wait_job
from tests.service.conftest import assert_problem, eventually, inline, make_settings

RETENTION = 1.0


def _service(tmp_path_factory, name: str, retention: float, sweep_interval: float):
    """A service (its test client) keeping finished jobs ``retention`` s, swept every ``sweep_interval`` s."""
    settings = make_settings(tmp_path_factory.mktemp(name), job_retention_seconds=retention,
                             job_sweep_interval=sweep_interval)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """A service that keeps a finished job one second, and sweeps every 0.1 s."""
    yield from _service(tmp_path_factory, "retention", RETENTION, 0.1)


def _stored_job(client, name: str, **inputs) -> str:
    x = inputs.pop("x", ints((1, 2, 2, 4)))
    submitted = execute(client, "depth_to_space", {"x": inline(x), "block_size": 2}, mode="reference",
                        response="document", name=name, headers={"Prefer": "respond-async"})
    assert submitted.status_code == 201, submitted.text
    return submitted.json()["jobID"]


@pytest.mark.smoke
def test_a_job_expires_and_is_swept_with_its_result(client):
    job_id = _stored_job(client, "kept-a-second")
    info = wait_job(client, job_id)
    assert info["status"] == "successful"
    expires = parse_stamp(info["expires"])
    assert expires - parse_stamp(info["finished"]) == timedelta(seconds=RETENTION)
    results = client.get(f"/jobs/{job_id}/results")
    assert results.status_code == 200
    assert abs(parsedate_to_datetime(results.headers["expires"]) - expires) < timedelta(seconds=1)
    assert client.get("/arrays/kept-a-second/info").status_code == 200
    assert eventually(lambda: client.get(f"/jobs/{job_id}").status_code == 404, timeout=10)
    assert_problem(client.get("/arrays/kept-a-second/info"), 404)  # gone with it
    assert_problem(client.get(f"/jobs/{job_id}/results"), 404)


def test_a_running_job_is_not_swept(client):
    submitted = client.post("/processes/echo/execution", json={"inputs": {"string_input": "x", "pause": 2.5}},
                            headers={"Prefer": "respond-async"})
    job_id = submitted.json()["jobID"]
    time.sleep(2 * RETENTION)  # older than the retention, and swept at meanwhile
    assert client.get(f"/jobs/{job_id}").json()["status"] == "running"
    assert "expires" not in client.get(f"/jobs/{job_id}").json()
    assert wait_job(client, job_id)["status"] == "successful"
    assert eventually(lambda: client.get(f"/jobs/{job_id}").status_code == 404, timeout=10)


# --- the steps of a sweep, on the records of a service whose own sweeper is idle --------------


IDLE_RETENTION = 3600.0  # the jobs of these tests expire when they say so, not by themselves


@pytest.fixture(scope="module")
def idle(tmp_path_factory):
    yield from _service(tmp_path_factory, "idle-sweeper", IDLE_RETENTION, 3600)


def _expired(client, name: str) -> str:
    job_id = _stored_job(client, name)
    assert wait_job(client, job_id)["status"] == "successful"
    client.app.state.services.records.update(job_id, finished=now(2 * IDLE_RETENTION))
    return job_id


def _sweeper(client) -> Sweeper:
    services = client.app.state.services
    return Sweeper(services.records, services.store, 3600)


def test_a_result_that_an_active_job_reads_is_kept_until_it_ends(idle):
    job_id = _expired(idle, "read-by-another")
    records = idle.app.state.services.records
    records.create("reader", "depth_to_space", ["read-by-another"], "reader-out", "reference", status="running")
    assert _sweeper(idle).sweep() == 0
    assert idle.get(f"/jobs/{job_id}").status_code == 200
    assert idle.get("/arrays/read-by-another/info").status_code == 200
    records.finish("reader", "failed", "over")
    assert _sweeper(idle).sweep() == 1
    assert_problem(idle.get("/arrays/read-by-another/info"), 404)


def test_a_download_under_way_reads_to_its_end(idle):
    x = np.arange(4 * 8 * 8 * 4, dtype=np.float32).reshape(4, 8, 8, 4)
    job_id = _stored_job(idle, "being-read", x=x)
    assert wait_job(idle, job_id)["status"] == "successful"
    idle.app.state.services.records.update(job_id, finished=now(2 * IDLE_RETENTION))
    reading = idle.app.state.services.store.open("being-read", pinned=True)  # as a download holds it
    assert _sweeper(idle).sweep() == 1
    assert_problem(idle.get("/arrays/being-read/info"), 404)
    assert_same(reading.array.values, ops.depth_to_space(x, 2))


def test_a_failed_deletion_keeps_the_job_for_the_next_sweep(idle, monkeypatch):
    job_id = _expired(idle, "undeletable")
    store = idle.app.state.services.store

    def refuse(name):
        raise OSError("the disk said no")

    monkeypatch.setattr(store, "delete", refuse)
    assert _sweeper(idle).sweep() == 0
    assert idle.get(f"/jobs/{job_id}").status_code == 200  # both still there
    monkeypatch.undo()
    assert _sweeper(idle).sweep() == 1
    assert idle.get(f"/jobs/{job_id}").status_code == 404
    assert_problem(idle.get("/arrays/undeletable/info"), 404)


def test_a_result_name_a_later_job_wrote_again_stays_with_that_job(idle):
    first = _expired(idle, "written-twice")
    assert idle.delete("/arrays/written-twice").status_code == 204
    x = ints((1, 2, 2, 8))
    second = _stored_job(idle, "written-twice", x=x)
    assert wait_job(idle, second)["status"] == "successful"
    assert _sweeper(idle).sweep() == 1  # the first job's record only
    assert idle.get(f"/jobs/{first}").status_code == 404 and idle.get(f"/jobs/{second}").status_code == 200
    assert_same(decode(idle.get("/arrays/written-twice")), ops.depth_to_space(x, 2))


def test_a_swept_jobs_stored_input_stays(idle):
    # its input is an array of the client's, no job's result: only the job's own result goes
    x = ints((1, 2, 2, 4))
    stored = store(idle, x)
    submitted = execute(idle, "depth_to_space", {"x": stored, "block_size": 2}, mode="reference",
                        response="document", name="from-stored", headers={"Prefer": "respond-async"})
    job_id = submitted.json()["jobID"]
    assert wait_job(idle, job_id)["status"] == "successful"
    idle.app.state.services.records.update(job_id, finished=now(2 * IDLE_RETENTION))
    assert _sweeper(idle).sweep() == 1
    assert_problem(idle.get("/arrays/from-stored/info"), 404)
    assert_same(decode(idle.get(stored["href"])), x)
