"""What the tests of the service on a cluster of processes share (tests/service/jobs/test_cluster.py
and tests/service/test_faults.py): the API calls of a job (upload, submit, wait, download)
through a TestClient, and looks at the cluster (what it is processing, whether the workers are
idle, what a job left in the data root)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np
from distributed import Client
from fastapi.testclient import TestClient

from tests.service.conftest import NPY, load_npy, npy_bytes

ASYNC = {"Prefer": "respond-async"}


def upload(api: TestClient, name: str, array: np.ndarray, chunks: str | None = None) -> dict:
    params = {"chunks": chunks} if chunks else None
    response = api.put(f"/arrays/{name}", content=npy_bytes(array), headers={"Content-Type": NPY}, params=params)
    assert response.status_code == 201, response.text
    return response.json()


def execute_body(inputs: dict, result_name: str | None = None) -> dict:
    output = {"format": {"mediaType": NPY}, "transmissionMode": "reference"}
    if result_name:
        output["name"] = result_name
    return {"inputs": inputs, "outputs": {"result": output}, "response": "document"}


def submit(api: TestClient, process: str, inputs: dict, result_name: str | None = None) -> str:
    response = api.post(f"/processes/{process}/execution", json=execute_body(inputs, result_name), headers=ASYNC)
    assert response.status_code == 201, response.text
    assert response.headers["Preference-Applied"] == "respond-async"
    job_id = response.json()["jobID"]
    assert response.headers["Location"].endswith(f"/jobs/{job_id}")
    return job_id


def wait_job(api: TestClient, job_id: str, timeout: float = 120.0, every: float = 0.05):
    """Poll the job until it is final; return (final statusInfo, every progress value seen)."""
    seen = []
    deadline = time.monotonic() + timeout
    while True:
        response = api.get(f"/jobs/{job_id}")
        assert response.status_code == 200, response.text
        info = response.json()
        seen.append(info["progress"])
        if info["status"] in ("successful", "failed", "dismissed"):
            return info, seen
        assert time.monotonic() < deadline, f"job {job_id} still {info['status']} after {timeout} s"
        time.sleep(every)


def download(api: TestClient, name: str) -> np.ndarray:
    response = api.get(f"/arrays/{name}")
    assert response.status_code == 200, response.text
    return load_npy(response.content)


def assert_bit_exact(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(expected).tobytes()


def job_leftovers(data_root: Path, job_id: str) -> list[Path]:
    return sorted((data_root / "tmp").glob(f"job-{job_id}-*"))


def processing(client: Client) -> list:
    return client.run_on_scheduler(
        lambda dask_scheduler: [str(ts.key) for ts in dask_scheduler.tasks.values() if ts.state == "processing"])


@contextlib.contextmanager
def bounded(seconds: float):
    """Assert the block took less than ``seconds``."""
    start = time.monotonic()
    yield
    elapsed = time.monotonic() - start
    assert elapsed < seconds, f"took {elapsed:.1f} s (limit {seconds} s)"


def workers_idle(client: Client) -> bool:
    """No worker is executing anything (a task cancelled while it ran still runs to its end)."""
    counts = client.run(lambda dask_worker: dask_worker.state.executing_count)
    return not any(counts.values())
