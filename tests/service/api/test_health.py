"""/healthz (service/api/routers/health.py)."""

from __future__ import annotations

import pytest


@pytest.mark.smoke
def test_healthz(client, service_root):
    """Without a token configured: the cluster's size, never the scheduler's address or the
    data root (tests/service/api/test_network_guards.py: what the token's holder sees)."""
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["cluster"]["workers"] == 1 and body["cluster"]["threads"] == 2
    assert "data_root" not in body and "scheduler" not in body["cluster"]
    assert str(service_root.resolve()) not in response.text
