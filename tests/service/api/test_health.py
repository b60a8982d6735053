"""/healthz (service/api/routers/health.py)."""

from __future__ import annotations

import pytest


@pytest.mark.smoke
def test_healthz(client, service_root):
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["cluster"]["workers"] == 1 and body["cluster"]["threads"] == 2
    assert body["data_root"] == str(service_root.resolve())
