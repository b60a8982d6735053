"""/docs works on a machine without internet: Swagger UI's files come from the service itself,
and a real headless browser (Chromium), denied every host name, renders the API's operations.

Without Chromium the browser test is skipped, except under CI (the CI variable set), where
.ci/run installs it and its absence is a failure."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
import requests
from fastapi.testclient import TestClient

from service.api.app import create_app
from tests.service.conftest import make_settings
from tests.service.processes import start_server, stop_server

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# Every host name resolves to nothing, but the service's own address: no CDN, no internet.
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"


class _References(HTMLParser):
    """The URLs a page loads: script src, link href."""

    def __init__(self):
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script" and attrs.get("src"):
            self.urls.append(attrs["src"])
        if tag == "link" and attrs.get("href"):
            self.urls.append(attrs["href"])


def browser() -> str:
    found = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"no headless browser ({', '.join(BROWSERS)}) under CI: .ci/run installs chromium")
        pytest.skip(f"no headless browser ({', '.join(BROWSERS)}): apt-get install chromium to run this test")
    return found


def rendered(url: str, profile) -> str:
    """The DOM of ``url`` once Swagger UI has run, as headless Chromium renders it offline."""
    command = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--no-first-run", f"--user-data-dir={profile}", OFFLINE, "--virtual-time-budget=15000",
               "--dump-dom", url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("docs-root")
    running = start_server(root / "data", root / "service.log", processes=False)  # pages, no tasks
    try:
        yield running
    finally:
        stop_server(running)


@pytest.mark.smoke
def test_swagger_ui_renders_every_operation_without_internet(server, tmp_path):
    dom = rendered(f"{server.url}/docs", tmp_path / "profile")
    document = requests.get(f"{server.url}/openapi.json", timeout=30).json()
    assert re.search(r'<h[12] class="title">\s*chunked-tensor-ops\b', dom), dom[-3000:]
    blocks = re.findall(r'class="opblock opblock-(get|post|put|delete|head)\b', dom)
    operations = [(method, path) for path, item in document["paths"].items() for method in item]
    assert len(blocks) == len(operations), (len(blocks), len(operations))
    shown = set(re.findall(r'class="opblock-summary-path" data-path="([^"]+)"', dom))
    assert shown == set(document["paths"]), set(document["paths"]) ^ shown
    assert "Failed to load API definition" not in dom


def test_the_page_loads_only_the_services_own_files(client):
    page = client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    references = _References()
    references.feed(page.text)
    assert len(references.urls) >= 3, references.urls  # script, style, icon
    for url in references.urls:
        assert url.startswith("/") and not url.startswith("//"), url
        asset = client.get(url)
        assert asset.status_code == 200 and len(asset.content) > 1000, url
    assert "SwaggerUIBundle" in client.get("/docs/swagger-ui-bundle.js").text
    assert not re.search(r"https?://", page.text), "the page names a server of the internet"


def test_swagger_uis_files_are_behind_the_token_like_the_page(tmp_path):
    token = "docs-token"
    with TestClient(create_app(make_settings(tmp_path / "root", token=token))) as guarded:
        for path in ("/docs", "/docs/swagger-ui-bundle.js", "/docs/swagger-ui.css", "/docs/favicon.png"):
            assert guarded.get(path).status_code == 401, path
            assert guarded.get(path, headers={"Authorization": f"Bearer {token}"}).status_code == 200, path


def test_without_a_browser_it_skips_but_fails_under_ci(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium"):
        browser()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="under CI"):
        browser()
