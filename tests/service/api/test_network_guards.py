"""The network edge (service/api/edge.py, state.py, health.py, cli/main.py): JSON bodies must
say so, the Host allow-list, CORS only for configured origins, what /healthz tells whom, the
token from a file, a stalled request cut off, and no server path in an error body."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import socket
import threading
import time
import zipfile

import numpy as np
import pytest
import requests
import uvicorn
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.api.edge import allowed_hosts
from service.api.state import is_json
from service.cli.main import _serve_parser, serve_main, settings_from
from service.errors import HOST_NOT_ALLOWED, REQUEST_TIMEOUT, UNSUPPORTED_MEDIA_TYPE
from service.settings import Settings
from tests.service.conftest import NPY, assert_problem, inline, make_settings, npy_bytes
from tests.service.processes import free_port

EXECUTE = "/processes/depth_to_space/execution"
X = np.arange(16, dtype=np.float32).reshape(1, 2, 2, 4)
BODY = {"inputs": {"x": inline(X), "block_size": 2}, "response": "raw"}


def app_at(root, **overrides) -> TestClient:
    """A TestClient that names its host 127.0.0.1:8000, the address the settings bind by default."""
    values = {"allowed_hosts": None, **overrides}
    return TestClient(create_app(make_settings(root, **values)), base_url="http://127.0.0.1:8000")


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    with app_at(tmp_path_factory.mktemp("guarded")) as client:
        yield client


# --- JSON bodies ------------------------------------------------------------------------------

@pytest.mark.smoke
def test_an_execute_request_must_say_it_is_json(guarded):
    """A page on any site may POST a form or an untyped body to localhost without asking: only
    a declared JSON body (which a browser sends cross-site only after a preflight) runs."""
    data = json.dumps(BODY).encode()
    body = assert_problem(guarded.post(EXECUTE, content=data), 415, UNSUPPORTED_MEDIA_TYPE)
    assert "no" in body["detail"] or "none" in body["detail"]
    for media in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        assert_problem(guarded.post(EXECUTE, content=data, headers={"Content-Type": media}), 415,
                       UNSUPPORTED_MEDIA_TYPE)
    for media in ("application/json", "application/json; charset=utf-8"):
        assert guarded.post(EXECUTE, content=data, headers={"Content-Type": media}).status_code == 200
    assert guarded.get("/processes").status_code == 200  # no body, nothing to declare


def test_json_media_types():
    assert is_json("application/json") and is_json("Application/JSON; charset=utf-8")
    assert is_json("application/problem+json") and is_json("application/vnd.example.v1+json")
    for media in (None, "", "text/json", "application/jsonx", "application/x-npy", "text/plain", "application/+json"):
        assert not is_json(media), media


def test_the_token_is_checked_before_the_media_type(tmp_path):
    with app_at(tmp_path, token="s3cret") as client:
        response = client.post(EXECUTE, content=b"{}")
        assert_problem(response, 401)
        response = client.post(EXECUTE, content=b"{}", headers={"Authorization": "Bearer s3cret"})
        assert_problem(response, 415, UNSUPPORTED_MEDIA_TYPE)


# --- Host ---------------------------------------------------------------------------------------

@pytest.mark.smoke
def test_a_foreign_host_is_refused_before_anything_else(guarded):
    """DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 reaches the
    port, but its requests name evil.example."""
    for host in ("evil.example", "evil.example:8000", "127.0.0.1.evil.example:8000", "localhost:8001",
                 "127.0.0.2:8000", "[::2]:8000", ""):
        for method, url in (("GET", "/"), ("GET", "/healthz"), ("GET", "/arrays"), ("POST", EXECUTE)):
            response = guarded.request(method, url, headers={"Host": host}, json=BODY if method == "POST" else None)
            body = assert_problem(response, 400, HOST_NOT_ALLOWED)
            assert "does not answer" in body["detail"]
    for host in ("127.0.0.1:8000", "127.0.0.1", "localhost:8000", "LOCALHOST", "[::1]:8000", "[::1]"):
        assert guarded.get("/", headers={"Host": host}).status_code == 200, host
    assert guarded.post(EXECUTE, json=BODY).status_code == 200


def test_the_allowed_hosts():
    def hosts(**values):
        return allowed_hosts(Settings(_env_file=None, **values))

    assert hosts() == {f"{name}{port}" for name in ("127.0.0.1", "localhost", "[::1]") for port in ("", ":8000")}
    assert hosts(host="::1", port=9000) >= {"[::1]:9000", "localhost:9000", "127.0.0.1"}
    assert hosts(host="node.example", port=80) == {"node.example", "node.example:80"}
    assert hosts(host="api.internal") == {"api.internal", "api.internal:8000"}
    assert hosts(host="0.0.0.0") is None and hosts(host="::") is None  # every interface: names unknown
    assert hosts(host="0.0.0.0", allowed_hosts=["API.example.org", "api.example.org:8443"]) == {
        "api.example.org", "api.example.org:8443"}
    assert hosts(allowed_hosts=["*"]) is None
    args = _serve_parser(argparse.ArgumentParser()).parse_args(
        ["--allowed-hosts", "a.example, b.example:8000", "--cors-origins", "https://app.example"])
    settings = settings_from(args)
    assert settings.allowed_hosts == ["a.example", "b.example:8000"]
    assert settings.cors_origins == ["https://app.example"]


# --- CORS ---------------------------------------------------------------------------------------

def _preflight(client, origin):
    return client.options(EXECUTE, headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                            "Access-Control-Request-Headers": "content-type, authorization"})


def test_cors_only_for_the_configured_origins(guarded, tmp_path):
    """By default no CORS header at all (a browser then keeps responses from other sites' pages
    and refuses their JSON and token-carrying requests); the configured origins get them."""
    assert "access-control-allow-origin" not in guarded.get("/", headers={"Origin": "https://evil.example"}).headers
    assert "access-control-allow-origin" not in _preflight(guarded, "https://evil.example").headers
    with app_at(tmp_path, cors_origins=["https://app.example"]) as client:
        response = client.get("/", headers={"Origin": "https://app.example"})
        assert response.headers["access-control-allow-origin"] == "https://app.example"
        # what OGC API - Processes clients read of a response: the job's monitor and results
        # links, where a new job is, when to retry a full queue, when results expire
        exposed = {h.strip().lower() for h in response.headers["access-control-expose-headers"].split(",")}
        assert {"link", "location", "retry-after", "expires", "preference-applied"} <= exposed
        preflight = _preflight(client, "https://app.example")
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "https://app.example"
        assert "POST" in preflight.headers["access-control-allow-methods"]
        assert {"content-type", "authorization"} <= {
            h.strip().lower() for h in preflight.headers["access-control-allow-headers"].split(",")}
        assert "credentials" not in " ".join(preflight.headers)  # a bearer token, never cookies
        other = client.get("/", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers
        assert _preflight(client, "https://evil.example").status_code == 400


# --- /healthz and the token ---------------------------------------------------------------------

def test_healthz_tells_only_the_token_holder_where_things_are(tmp_path):
    with app_at(tmp_path, token="s3cret") as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            response = client.get("/healthz", headers=headers)
            assert response.status_code == 200
            assert response.json() == {"status": "ok"}
        full = client.get("/healthz", headers={"Authorization": "Bearer s3cret"}).json()
        assert full["cluster"]["scheduler"].startswith("inproc://")
        assert full["cluster"]["workers"] == 1
        assert full["data_root"] == str(tmp_path.resolve())


@pytest.mark.parametrize("content", ["s3cret\n", "  s3cret  \nsecond line\n"])
def test_the_token_comes_from_a_file(tmp_path, content):
    token_file = tmp_path / "token"
    token_file.write_text(content)
    with app_at(tmp_path / "root", token_file=token_file) as client:
        assert_problem(client.get("/arrays"), 401)
        assert client.get("/arrays", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert "securitySchemes" in client.get("/openapi.json", headers={"Authorization": "Bearer s3cret"}).json()[
            "components"]


def test_a_token_file_that_is_empty_or_doubled_is_refused(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        create_app(make_settings(tmp_path, token_file=token_file))
    token_file.write_text("from-the-file\n")
    with pytest.raises(ValueError, match="twice") as raised:
        create_app(make_settings(tmp_path, token_file=token_file, token="from-the-environment"))
    assert "from-the" not in str(raised.value)
    with pytest.raises(OSError):
        create_app(make_settings(tmp_path, token_file=tmp_path / "missing"))


def test_the_serve_command_warns_about_the_token_flag_and_bounds_the_server(tmp_path, monkeypatch, capsys):
    ran = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: ran.update(options))
    for name in [k for k in os.environ if k.startswith("CHUNKED_TENSOR_OPS_")]:
        monkeypatch.delenv(name)
    assert serve_main(["--token", "the-flag-token", "--data-root", str(tmp_path), "--max-connections", "7",
                       "--read-timeout", "3"]) == 0
    err = capsys.readouterr().err
    assert "visible to every local user" in err and "--token-file" in err and "the-flag-token" not in err
    assert ran["limit_concurrency"] == 7 and ran["timeout_keep_alive"] == 3
    assert ran["h11_max_incomplete_event_size"] == 16 * 1024 and ran["http"].__name__ == "HeadTimedH11Protocol"

    token_file = tmp_path / "token"
    token_file.write_text("the-file-token\n")
    assert serve_main(["--token", "the-flag-token", "--token-file", str(token_file), "--data-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "twice" in err and "the-flag-token" not in err and "the-file-token" not in err
    assert serve_main(["--token-file", str(token_file), "--data-root", str(tmp_path)]) == 0
    assert "visible" not in capsys.readouterr().err


# --- no server path in an error body ----------------------------------------------------------

def _zip(files: dict) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return buffer.getvalue()


ARRAY_AT_ROOT = {"zarr.json": json.dumps({
    "zarr_format": 3, "node_type": "array", "shape": [2], "data_type": "float32",
    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
    "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
    "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]})}


def test_error_bodies_name_no_server_path(tmp_path):
    root = tmp_path / "root"
    with app_at(root) as client:
        assert client.put("/arrays/a", content=npy_bytes(X), headers={"Content-Type": NPY}).status_code == 201
        for chunk in (p for p in root.rglob("*") if p.is_file() and "/c/" in str(p)):
            chunk.write_bytes(b"not a chunk")
        refused = [
            client.put("/arrays/z", content=_zip(ARRAY_AT_ROOT), headers={"Content-Type": "application/zip"}),
            client.put("/arrays/z", content=_zip({"zarr.json": "{"}), headers={"Content-Type": "application/zip"}),
            client.put("/arrays/n", content=b"\x93NUMPY\x01\x00garbage", headers={"Content-Type": NPY}),
            client.put("/arrays/.hidden", content=npy_bytes(X), headers={"Content-Type": NPY}),
            client.get("/arrays/missing"),
            client.get("/arrays/a/zarr/a/c/9/9/9/9"),
            client.post(EXECUTE, json={"inputs": {"x": {"href": "/arrays/a"}, "block_size": 2}, "response": "raw"}),
            client.post(EXECUTE, json={"inputs": {"x": {"href": "file:///etc/passwd"}, "block_size": 2}}),
            client.post(EXECUTE, content=b"{nope", headers={"Content-Type": "application/json"}),
        ]
    for response in refused:
        assert response.status_code >= 400, response.text
        for path in (str(root), str(root.resolve()), str(tmp_path)):
            assert path not in response.text, response.text
        assert "Traceback" not in response.text and 'File "' not in response.text, response.text


# --- a real server: the token flag, stalled requests ------------------------------------------

READ_TIMEOUT = 1.0


class InProcessServer:
    """``serve_main`` (``python -m service``'s code: its flags, settings and the uvicorn server
    it configures) running in a thread of this process; what it printed, and uvicorn's log."""

    def __init__(self, argv: list[str], output: io.StringIO):
        self.output = output
        self.servers: list[uvicorn.Server] = []
        self.exit_code: int | None = None
        servers = self.servers

        class Recorded(uvicorn.Server):  # the one uvicorn.run makes, to stop it
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                servers.append(self)

        def run() -> None:
            self.exit_code = serve_main(argv)

        with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stderr(output), \
                contextlib.redirect_stdout(output):  # (uvicorn's log handlers are made now, on these)
            for name in [k for k in os.environ if k.startswith("CHUNKED_TENSOR_OPS_")]:
                patch.delenv(name)
            patch.setenv("CHUNKED_TENSOR_OPS_CLUSTER_PROCESSES", "false")  # in-process workers
            patch.setattr(importlib.import_module("uvicorn.main"), "Server", Recorded)  # (uvicorn.main: the CLI)
            self.thread = threading.Thread(target=run, name="serve_main", daemon=True)
            self.thread.start()
            deadline = time.monotonic() + 60
            while self.thread.is_alive() and not (servers and servers[0].started) and time.monotonic() < deadline:
                time.sleep(0.02)

    @property
    def started(self) -> bool:
        return bool(self.servers) and self.servers[0].started and self.thread.is_alive()

    def log_tail(self, chars: int = 4000) -> str:
        return self.output.getvalue()[-chars:]

    def stop(self) -> None:
        for server in self.servers:
            server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive(), "the server did not stop"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``python -m service --token ... --read-timeout 1`` with in-process workers, run in this
    process (a quick start: what is tested is the command's server, not a new interpreter)."""
    base = tmp_path_factory.mktemp("edge-server")
    for _ in range(3):  # the port may be taken between choosing and binding it
        port = free_port()
        running = InProcessServer(["--port", str(port), "--data-root", str(base / "root"), "--token", "s3cret",
                                   "--read-timeout", str(READ_TIMEOUT)], io.StringIO())
        running.url = f"http://127.0.0.1:{port}"
        if running.started:
            try:
                yield running
            finally:
                running.stop()
            assert running.exit_code == 0, running.log_tail()
            return
        running.stop()
        if "address already in use" not in running.log_tail().lower():
            pytest.fail(f"the service did not start:\n{running.log_tail()}")
    pytest.fail("no free port")


def _connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=10)


def _answer(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


@pytest.mark.smoke
def test_the_token_flag_works_and_warns(server):
    assert requests.get(f"{server.url}/arrays", timeout=10).status_code == 401
    ok = requests.get(f"{server.url}/arrays", headers={"Authorization": "Bearer s3cret"}, timeout=10)
    assert ok.status_code == 200
    assert "visible to every local user" in server.log_tail(10**6)
    refused = requests.get(f"{server.url}/healthz", headers={"Host": "evil.example"}, timeout=10)
    assert refused.status_code == 400 and refused.json()["type"] == HOST_NOT_ALLOWED
    assert "s3cret" not in server.log_tail(10**6)


def test_a_body_sent_slower_than_the_read_timeout_is_cut_off(server):
    with _connect(server) as sock:
        started = time.monotonic()
        sock.sendall(f"POST {EXECUTE} HTTP/1.1\r\nHost: {server.url[7:]}\r\nAuthorization: Bearer s3cret\r\n"
                     "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"inputs\": ".encode())
        answer = _answer(sock)
        waited = time.monotonic() - started
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer[:500]
    assert json.loads(body)["type"] == REQUEST_TIMEOUT
    assert READ_TIMEOUT * 0.9 < waited < READ_TIMEOUT + 5, waited


def test_a_request_head_sent_slower_than_the_read_timeout_is_cut_off(server):
    with _connect(server) as sock:
        started = time.monotonic()
        sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: {server.url[7:]}\r\n".encode())  # never ends its head
        assert _answer(sock) == b""
        waited = time.monotonic() - started
    assert READ_TIMEOUT * 0.9 < waited < READ_TIMEOUT + 5, waited
    assert requests.get(f"{server.url}/healthz", timeout=10).json() == {"status": "ok"}
