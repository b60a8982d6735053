"""Fixtures of the route tests: an app with small limits (the module-scoped ``client`` is
tests/service/conftest.py's)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from tests.service.conftest import make_settings


@pytest.fixture(scope="module")
def small_root(tmp_path_factory):
    return tmp_path_factory.mktemp("small-root")


@pytest.fixture(scope="module")
def small(small_root):
    """An app with small limits: 4 KiB chunks, 1 KiB inline arrays."""
    with TestClient(create_app(make_settings(small_root, chunk_bytes=4096, max_inline_bytes=1024))) as c:
        yield c
