"""Fixtures for the service tests: an app on a temporary data root with an in-process Dask
cluster (fast), and NPY helpers."""

from __future__ import annotations

import base64
import io
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.settings import Settings

NPY = "application/x-npy"


def make_settings(root, **overrides) -> Settings:
    # A scheduler on a busy test machine can take seconds to answer (the service's default
    # gives it 5 s): the tests of timeouts set their own.
    # Any Host: TestClient names it "testserver" and the tests' own uvicorn servers 127.0.0.1:PORT
    # (the Host guard has tests of its own, with its own settings).
    values = dict(data_root=root, n_workers=1, threads_per_worker=2, cluster_processes=False,
                  memory_limit="4GiB", scheduler_timeout=20.0, allowed_hosts=["*"])
    values.update(overrides)
    return Settings(**values)


@pytest.fixture(scope="module")
def service_root(tmp_path_factory):
    return tmp_path_factory.mktemp("data-root")


@pytest.fixture(scope="module")
def client(service_root):
    """A TestClient on one app for the whole module (the cluster starts once)."""
    with TestClient(create_app(make_settings(service_root))) as test_client:
        yield test_client


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def inline(array: np.ndarray) -> dict:
    """An inline NPY input of an ordinary dtype."""
    return {"value": base64.b64encode(npy_bytes(array)).decode(), "encoding": "base64", "mediaType": NPY}


def load_npy(content: bytes) -> np.ndarray:
    return np.load(io.BytesIO(content), allow_pickle=False)


def assert_problem(response, status: int, type_: str | None = None, detail: str | None = None) -> dict:
    """An OGC exception body: problem+json with type/title/status/detail, status as the HTTP status."""
    assert response.status_code == status, (response.status_code, response.text[:2000])
    assert response.headers["content-type"].split(";")[0] == "application/problem+json"
    body = response.json()
    assert set(body) >= {"type", "title", "status", "detail"}, body
    assert body["status"] == status
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    assert isinstance(body["type"], str) and body["type"].startswith("http")
    if type_ is not None:
        assert body["type"] == type_, body
    if detail is not None:
        assert body["detail"] == detail, body
    return body


def eventually(check, timeout: float = 10.0, every: float = 0.05):
    """Call ``check`` until it returns something true or ``timeout`` passes; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)
