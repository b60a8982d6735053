"""The embedded Dask cluster lets in only the service (service/jobs/cluster.py): worker processes
and the scheduler speak TLS on 127.0.0.1 with credentials held in the service's memory;
in-process workers speak inproc://; without a dashboard asked for, the cluster's HTTP servers
answer only /health; and a running service names none of it."""

from __future__ import annotations

import asyncio
import contextlib
import os
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


def test_the_embedded_scheduler_lets_in_only_the_service(tmp_path):
    settings = make_settings(tmp_path, cluster_processes=True, memory_limit="1GiB")
    with started(Cluster(settings)) as cluster:
        address = cluster._local.scheduler_address
        nobody_gets_in([int(address.rsplit(":", 1)[1])])
        assert cluster.live_client().run_on_scheduler(os.getpid) == os.getpid()  # the service itself
        assert address.startswith("tls://127.0.0.1:"), address
        workers = list(cluster._local.scheduler_info["workers"])
        assert workers and all(w.startswith("tls://127.0.0.1:") for w in workers), workers


def _listening(pid: int) -> set[int]:
    try:
        return {c.laddr.port for c in psutil.Process(pid).net_connections(kind="inet") if c.status == "LISTEN"}
    except psutil.NoSuchProcess:
        return set()


def _answers_http(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    except requests.RequestException:  # a TLS port closes on plain text
        return False


def test_a_running_service_names_and_opens_nothing_of_its_cluster(tmp_path):
    """``python -m service`` with its embedded cluster of worker processes: /healthz names no
    scheduler or data root; no port of the service or its workers runs a stranger's code or
    shows a dashboard page; the credentials are in no process's command line or environment."""
    server = start_server(tmp_path / "root", tmp_path / "server.log")
    try:
        health = requests.get(f"{server.url}/healthz", timeout=10)
        assert health.status_code == 200
        assert set(health.json()) == {"status", "cluster"}
        assert set(health.json()["cluster"]) <= {"workers", "threads", "memory_limit", "embedded"}
        for text in (str(server.root), str(Path(server.root).resolve()), "tls://", "tcp://", "inproc://"):
            assert text not in health.text

        processes = {server.proc.pid, *descendants(server.proc.pid)}
        ports = set().union(*(_listening(pid) for pid in processes)) - {int(server.url.rsplit(":", 1)[1])}
        web = {port for port in ports if _answers_http(port)}  # the scheduler's and workers' HTTP servers
        assert web and ports - web, (ports, web)
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
