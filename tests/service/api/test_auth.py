"""With a token configured, every route but the landing page and /healthz needs it."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

import ops
from service.api.app import create_app
from tests.helpers import assert_same
from tests.service.api.calls import decode, execute, ints
from tests.service.conftest import NPY, assert_problem, make_settings, npy_bytes

OPEN = {"/", "/healthz"}
TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    app = create_app(make_settings(tmp_path_factory.mktemp("auth-root"), token=TOKEN))
    with TestClient(app) as client:
        yield client


def _routes(app):
    """Every operation of the OpenAPI document, plus the API description routes themselves."""
    yield "GET", "/openapi.json"
    yield "GET", "/docs"
    for template, operations in app.openapi()["paths"].items():
        path = template.replace("{key}", "zarr.json").replace("{process_id}", "depth_to_space")
        path = path.replace("{name}", "x").replace("{job_id}", "0" * 32)
        for method in operations:
            yield method.upper(), path


def test_every_route_but_landing_and_health_needs_the_token(guarded):
    seen = set()
    for method, path in _routes(guarded.app):
        seen.add(path)
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                        {"Authorization": TOKEN}):
            response = guarded.request(method, path, headers=headers)
            if path in OPEN:
                assert response.status_code == 200, (method, path)
                continue
            assert response.status_code == 401, (method, path, headers, response.status_code)
            assert response.headers["www-authenticate"] == "Bearer"
            if method != "HEAD":
                body = response.json()
                assert body["status"] == 401 and body["type"].endswith("/unauthorized") and "Bearer" in body["detail"]
    assert {"/openapi.json", "/docs", "/processes", "/jobs", "/arrays"} <= seen


@pytest.mark.smoke
def test_the_right_token_opens_them(guarded):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert guarded.get("/openapi.json", headers=auth).json()["paths"]
    assert guarded.get("/docs", headers=auth).status_code == 200
    assert [p["id"] for p in guarded.get("/processes", headers=auth).json()["processes"]][0] == "depth_to_space"
    assert guarded.get("/arrays/x/info", headers=auth).status_code == 404  # past the check: no such array


def test_the_document_declares_the_token_on_exactly_the_routes_that_check_it(guarded):
    document = guarded.get("/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    (name, scheme), = document["components"]["securitySchemes"].items()
    assert scheme["type"] == "http" and scheme["scheme"] == "bearer"
    templates = document["paths"]
    checked = 0
    for method, path in _routes(guarded.app):
        if path in ("/openapi.json", "/docs"):  # not operations of the document
            continue
        template = next(t for t in templates if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", t), path))
        declared = templates[template][method.lower()].get("security")
        refused = guarded.request(method, path).status_code == 401
        assert declared == ([{name: []}] if refused else None), (method, path, declared)
        checked += 1
    assert checked == sum(len(operations) for operations in templates.values())


def test_without_a_token_the_document_declares_none(tmp_path):
    document = create_app(make_settings(tmp_path)).openapi()
    assert "securitySchemes" not in document.get("components", {})
    assert not [op for operations in document["paths"].values() for op in operations.values() if "security" in op]


def test_token(tmp_path):
    with TestClient(create_app(make_settings(tmp_path, token="s3cret"))) as c:
        assert c.get("/").status_code == 200
        assert c.get("/healthz").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"},
                        {"Authorization": "Bearer s3cret-and-more"}, {"Authorization": "s3cret"}):
            for method, url in (("GET", "/processes"), ("GET", "/conformance"), ("GET", "/jobs"),
                                ("GET", "/arrays"), ("PUT", "/arrays/a"), ("GET", "/processes/gather_nd"),
                                ("POST", "/processes/depth_to_space/execution")):
                response = c.request(method, url, headers=headers)
                assert_problem(response, 401)
                assert response.headers["www-authenticate"] == "Bearer"
        ok = {"Authorization": "Bearer s3cret"}
        assert c.get("/processes", headers=ok).status_code == 200
        assert c.get("/conformance", headers=ok).status_code == 200
        x = ints((1, 2, 2, 4))
        assert c.put("/arrays/a", content=npy_bytes(x), headers={**ok, "Content-Type": NPY}).status_code == 201
        response = execute(c, "depth_to_space", {"x": {"href": "/arrays/a"}, "block_size": 2}, headers=ok)
        assert response.status_code == 200
        assert_same(decode(response), ops.depth_to_space(x, 2))
