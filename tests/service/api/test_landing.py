"""The landing page and /conformance (service/api/routers/landing.py)."""

from __future__ import annotations

import pytest

from tests.service.api.calls import OGC_REL

CONF = "http://www.opengis.net/spec/ogcapi-processes-1/1.0/conf/"


@pytest.mark.smoke
def test_landing_page_links(client):
    response = client.get("/")
    assert response.status_code == 200
    links = {link["rel"]: link for link in response.json()["links"]}
    desc = links["service-desc"]
    assert desc["href"].endswith("/openapi.json")
    assert desc["type"] == "application/vnd.oai.openapi+json;version=3.0"
    assert links["service-doc"]["href"].endswith("/docs")
    assert links[OGC_REL + "conformance"]["href"].endswith("/conformance")
    assert links[OGC_REL + "processes"]["href"].endswith("/processes")
    assert links[OGC_REL + "job-list"]["href"].endswith("/jobs")
    # the links resolve
    for rel in ("service-desc", "service-doc", OGC_REL + "conformance", OGC_REL + "processes",
                OGC_REL + "job-list"):
        assert client.get(links[rel]["href"]).status_code == 200, rel
    assert client.get(desc["href"]).json()["openapi"].startswith("3.")


def test_conformance(client):
    response = client.get("/conformance")
    assert response.status_code == 200
    assert sorted(response.json()["conformsTo"]) == sorted(
        CONF + c for c in ("core", "json", "oas30", "job-list", "dismiss", "ogc-process-description", "callback"))
