"""HEAD on every resource that answers GET (RFC 9110 section 9.3.2): the GET's status and
headers, no content; the token check and the Host guard still apply."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from tests.service.api.calls import execute, put_array, unique, wait_job
from tests.service.conftest import NPY, make_settings

TOKEN = "head-token"


@pytest.fixture(scope="module")
def resources(client) -> dict[str, str]:
    """Path parameters naming real resources: an array, a finished job with a stored result."""
    name = unique("head")
    put_array(client, name, np.arange(2 * 2 * 2 * 4, dtype=np.float32).reshape(1, 2, 2, 8))
    job = execute(client, "depth_to_space", {"x": {"href": f"/arrays/{name}"}, "block_size": 2},
                  mode="reference", response="document", headers={"Prefer": "respond-async"})
    assert job.status_code == 201, job.text
    job_id = job.json()["jobID"]
    assert wait_job(client, job_id)["status"] == "successful"
    return {"name": name, "job_id": job_id, "process_id": "depth_to_space", "key": "zarr.json"}


def _get_paths(client, resources) -> list[str]:
    """Every GET of the OpenAPI document with real resources in its path, and /openapi.json, /docs."""
    paths = ["/openapi.json", "/docs"]
    for template, operations in client.get("/openapi.json").json()["paths"].items():
        if "get" in operations:
            paths.append(template.format(**resources))
    return paths


@pytest.mark.smoke
def test_head_answers_what_get_answers_without_the_content(client, resources):
    paths = _get_paths(client, resources)
    assert {"/", "/conformance", "/processes", "/processes/depth_to_space", "/jobs", f"/jobs/{resources['job_id']}",
            f"/jobs/{resources['job_id']}/results", "/arrays", f"/arrays/{resources['name']}"} <= set(paths)
    for path in paths:
        get = client.get(path)
        head = client.head(path)
        assert get.status_code == 200, (path, get.text)
        assert head.status_code == get.status_code, path
        assert head.content == b"", path
        volatile = {"content-length"} if path in ("/healthz", "/jobs") else set()  # progress, load change
        assert {k: v for k, v in head.headers.items() if k not in volatile} == {
            k: v for k, v in get.headers.items() if k not in volatile}, path
        assert "content-length" in volatile or int(head.headers["content-length"]) == len(get.content), path


def test_head_of_a_missing_resource_is_the_gets_404(client):
    for path in ("/processes/nope", "/jobs/" + "0" * 32, "/arrays/nothing-here", "/arrays/nothing-here/info",
                 "/no/such/route"):
        get, head = client.get(path), client.head(path)
        assert get.status_code == 404 and head.status_code == 404, path
        assert head.content == b"" and head.headers["content-type"] == "application/problem+json", path


def test_head_of_a_streamed_array_ends_at_its_headers(client):
    # the NPY of GET /arrays/NAME is produced block by block; HEAD stops it after the headers
    name = unique("head-big")
    array = np.arange(64 * 1024, dtype=np.float64).reshape(256, 256)
    put_array(client, name, array, params={"chunks": "16,256"})
    head = client.head(f"/arrays/{name}")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == NPY
    assert int(head.headers["content-length"]) == len(client.get(f"/arrays/{name}").content)


def test_methods_allowed_name_head_beside_get(client):
    response = client.put("/processes")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, HEAD"
    response = client.head("/processes/depth_to_space/execution")  # POST only: no GET, no HEAD
    assert response.status_code == 405 and response.headers["allow"] == "POST"
    assert response.content == b""


def test_head_passes_the_token_check_and_the_host_guard(tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("head-root"), token=TOKEN, allowed_hosts=["testserver"])
    with TestClient(create_app(settings)) as guarded:
        for path in ("/conformance", "/processes", "/jobs", "/arrays", "/openapi.json", "/docs"):
            refused = guarded.head(path)
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer", path
            assert refused.content == b""
            assert guarded.head(path, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200, path
        assert guarded.head("/").status_code == 200  # open, as its GET
        other_host = guarded.head("/", headers={"Host": "elsewhere.example"})
        assert other_host.status_code == 400 and other_host.content == b""
