"""The embedded Dask cluster lets in only the service (service/jobs/cluster.py): worker processes
and the scheduler speak TLS on 127.0.0.1 with credentials held in the service's memory;
in-process workers speak inproc://; without a dashboard asked for, the cluster's HTTP servers
answer only /health; and a running service names none of it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
from pathlib import Path

import dask
import psutil
import pytest
import requests
from distributed import Client
from distributed.security import Security

from service.jobs.cluster import Cluster
from tests.service.conftest import make_settings
from tests.service.processes import descendants, start_server, stop_server

CONNECT_SECONDS = 3


async def _stranger_runs_code(address: str, security: Security | None) -> int | None:
    """The pid a client without the service's credentials got ``run_on_scheduler`` to return,
    or None if it could not connect or run anything (refused, closed or timed out)."""
    async def run() -> int:
        async with Client(address, asynchronous=True, timeout=CONNECT_SECONDS, security=security,
                          set_as_default=False) as client:
            return await client.run_on_scheduler(os.getpid)

    try:
        return await asyncio.wait_for(run(), 3 * CONNECT_SECONDS)
    except Exception:
        return None


def nobody_gets_in(ports) -> None:
    """Every way a local user might try each port: plain TCP, and TLS with a certificate of
    their own making (TLS without one the client itself refuses), all at once."""
    own = Security.temporary()
    attempts = [(f"{protocol}://127.0.0.1:{port}", security)
                for port in ports for protocol, security in (("tcp", None), ("tls", own))]

    async def everyone() -> list:
        return await asyncio.gather(*(_stranger_runs_code(*attempt) for attempt in attempts))

    with dask.config.set({"distributed.comm.timeouts.connect": f"{CONNECT_SECONDS}s"}):
        got = asyncio.run(everyone())
    assert got == [None] * len(attempts), [(a[0], pid) for a, pid in zip(attempts, got) if pid]


@contextlib.contextmanager
def started(cluster: Cluster):
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.mark.smoke
def test_in_process_workers_listen_on_no_port(tmp_path):
    with started(Cluster(make_settings(tmp_path))) as cluster:
        assert cluster._local.scheduler_address.startswith("inproc://")
        assert all(w.startswith("inproc://") for w in cluster._local.scheduler_info["workers"])
        health = cluster.health()
        assert health["workers"] == 1 and health["dashboard"] is None


def _listening(pid: int) -> dict[int, str]:
    """Port -> the address it is bound to, of every socket ``pid`` listens on."""
    try:
        return {c.laddr.port: c.laddr.ip for c in psutil.Process(pid).net_connections(kind="inet")
                if c.status == "LISTEN"}
    except psutil.NoSuchProcess:
        return {}


def _server_certificate(port: int) -> bytes | None:
    """The certificate a TLS handshake with ``port`` shows (not checked: whether the port
    speaks TLS at all), None if the handshake fails."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, context.wrap_socket(raw) as tls:
            return tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError):
        return None


def _answers_http(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    except requests.RequestException:  # a TLS port closes on plain text
        return False


def test_a_running_service_names_and_opens_nothing_of_its_cluster(tmp_path):
    """``python -m service`` with its embedded cluster of worker processes: /healthz names no
    scheduler or data root; the scheduler, nannies and workers listen on 127.0.0.1 only and
    speak TLS, and no port of theirs runs a stranger's code or shows a dashboard page, while
    the service itself gets in; the credentials are in no process's command line or
    environment. (The one start of a cluster of worker processes in this module: the service's.)"""
    server = start_server(tmp_path / "root", tmp_path / "server.log")
    try:
        health = requests.get(f"{server.url}/healthz", timeout=10)
        assert health.status_code == 200
        assert set(health.json()) == {"status", "cluster"}
        assert set(health.json()["cluster"]) <= {"workers", "threads", "memory_limit", "embedded"}
        assert health.json()["cluster"]["workers"] == 1  # asked of the scheduler now: the service gets in
        for text in (str(server.root), str(Path(server.root).resolve()), "tls://", "tcp://", "inproc://"):
            assert text not in health.text

        processes = {server.proc.pid, *descendants(server.proc.pid)}
        bound = {port: ip for pid in processes for port, ip in _listening(pid).items()}
        assert set(bound.values()) == {"127.0.0.1"}, bound
        ports = set(bound) - {int(server.url.rsplit(":", 1)[1])}
        web = {port for port in ports if _answers_http(port)}  # the scheduler's and workers' HTTP servers
        assert web and ports - web, (ports, web)
        assert all(_server_certificate(port) for port in ports - web), ports - web  # TLS, every one
        nobody_gets_in(ports - web)
        for port in web:
            for page in ("/info/main/workers.html", "/json/identity.json", "/status", "/metrics"):
                assert requests.get(f"http://127.0.0.1:{port}{page}", timeout=10).status_code == 404, (port, page)
        for pid in processes:
            with contextlib.suppress(OSError):
                for name in ("cmdline", "environ"):
                    assert b"PRIVATE KEY" not in Path(f"/proc/{pid}/{name}").read_bytes(), (pid, name)
    finally:
        stop_server(server)
