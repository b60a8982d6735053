"""The processes the service tests start and stop: free ports of 127.0.0.1, a ``dask
scheduler`` with ``dask worker`` processes, a ``python -m service`` server (or, where the
process is not what a test is about, a started app served by uvicorn in a thread of the test's
own process), and the look at /proc that checks none of them outlives its test. Shared by tests/service/jobs/test_cluster.py,
test_faults.py, test_e2e_http.py, test_data_safety.py, test_load.py, the cli tests and
tests/test_deploy.py."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from distributed import Client

REPO = Path(__file__).resolve().parents[2]
DASK = Path(sys.executable).parent / "dask"
START_TIMEOUT = 120.0
STOP_TIMEOUT = 20.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (Linux /proc), e.g. the Dask nanny and worker processes."""
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                kids = {int(k) for k in children.read_text().split()}
            except OSError:
                continue
            for kid in kids - found:
                found.add(kid)
                todo.append(kid)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


# --- a Dask scheduler and workers ---------------------------------------------------------

def _stop_dask(procs: list[subprocess.Popen]) -> None:
    """Terminate (then kill) the workers, then the scheduler; each must exit."""
    workers, scheduler = procs[1:], procs[:1]
    for group in (workers, scheduler):  # workers first, so that none waits for a gone scheduler
        for proc in group:
            if proc.poll() is None:
                proc.terminate()
        for proc in group:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    assert all(proc.poll() is not None for proc in procs)


@contextlib.contextmanager
def dask_processes(logs: Path, *, workers: int, nthreads: int, memory_limit: str = "1GiB"):
    """(scheduler address, [scheduler, worker...] processes, a driver Client): ``dask scheduler``
    and ``workers`` x ``dask worker``, each its own process on 127.0.0.1, like ``docker
    compose`` would start them; stopped (workers first) afterwards."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []

    def spawn(name: str, *args: str) -> None:
        with open(logs / f"{name}.log", "wb") as log:
            procs.append(subprocess.Popen([str(DASK), *args], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL))

    try:
        spawn("scheduler", "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard")
        for k in range(workers):
            spawn(f"worker-{k}", "worker", address, "--host", "127.0.0.1", "--nworkers", "1", "--nthreads",
                  str(nthreads), "--memory-limit", memory_limit, "--no-dashboard")
        client = None
        deadline = time.monotonic() + 60
        while client is None:  # the scheduler may not listen yet
            try:
                client = Client(address, timeout=5, set_as_default=False)
            except (OSError, TimeoutError):
                if time.monotonic() > deadline or procs[0].poll() is not None:
                    raise
                time.sleep(0.2)
        try:
            client.wait_for_workers(workers, timeout=60)
            yield address, procs, client
        finally:
            client.close(timeout=10)
    finally:
        procs[0].send_signal(signal.SIGCONT)  # in case a test left it frozen
        _stop_dask(procs)


# --- the service --------------------------------------------------------------------------

@contextlib.contextmanager
def served(app, timeout: float = 30.0):
    """The URL of ``app`` (already started, e.g. by a TestClient) served over HTTP on a free
    port of 127.0.0.1 by uvicorn in a thread of this process: real connections and uvicorn's
    concurrency without starting a service process (seconds of imports and its own cluster)."""
    import uvicorn

    for attempt in range(3):  # the port may be taken between choosing and binding it
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off",
                                               log_level="warning"))
        thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if server.started:
            break
        server.should_exit = True
        thread.join(10)
        assert attempt < 2 and not thread.is_alive(), f"uvicorn did not start on 127.0.0.1:{port}"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)
        assert not thread.is_alive(), "uvicorn did not stop"


@dataclass
class Server:
    """A running ``python -m service`` subprocess."""

    url: str
    root: Path
    log: Path
    proc: subprocess.Popen
    children: set[int] = field(default_factory=set)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "<no log>"


def start_server(root: Path, log: Path, attempts: int = 3, *, processes: bool = True) -> Server:
    """Start the service on a free port of 127.0.0.1 and wait (bounded) for ``/healthz`` 200;
    its embedded cluster has one worker process, or with ``processes=False`` its worker is
    threads of the service's own process (a start seconds quicker, where the worker is not
    what a test is about).

    The port is free when chosen, but the service's embedded Dask cluster binds ports of its
    own before uvicorn binds this one, and may take it: uvicorn then exits with 3 ("address
    already in use"), and the service is started again on another port."""
    for attempt in range(attempts):
        try:
            return _start_server_once(root, log, processes)
        except _PortTaken:
            if attempt == attempts - 1:
                raise


class _PortTaken(Exception):
    pass


def _start_server_once(root: Path, log: Path, processes: bool) -> Server:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHUNKED_TENSOR_OPS_")}
    if not processes:
        env["CHUNKED_TENSOR_OPS_CLUSTER_PROCESSES"] = "false"
    env["DASK_TEMPORARY_DIRECTORY"] = str(root.parent)
    env.setdefault("PYTHONUNBUFFERED", "1")
    out = open(log, "ab")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port), "--data-root", str(root),
             "--n-workers", "1", "--threads-per-worker", "2", "--memory-limit", "1GiB"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    finally:
        out.close()
    server = Server(f"http://127.0.0.1:{port}", root, log, proc)
    deadline = time.monotonic() + START_TIMEOUT
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            if proc.returncode == 3 and "address already in use" in server.log_tail(10**7).lower():
                raise _PortTaken(port)
            pytest.fail(f"the service exited with {proc.returncode} while starting:\n{server.log_tail()}")
        try:
            answer = requests.get(f"{server.url}/healthz", timeout=5)
            last = answer.status_code
            if answer.status_code == 200:
                server.children = descendants(proc.pid)
                return server
        except requests.RequestException as error:
            last = error
        time.sleep(0.25)
    stop_server(server)
    pytest.fail(f"/healthz did not answer 200 within {START_TIMEOUT} s (last: {last}):\n{server.log_tail()}")


def stop_server(server: Server) -> None:
    """SIGTERM, then SIGKILL after a timeout; the service must exit on SIGTERM and take its
    Dask worker processes with it."""
    proc = server.proc
    children = server.children | descendants(proc.pid)
    graceful = True
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            graceful = False
            proc.kill()
            proc.wait(10)
    assert proc.returncode is not None, "the service process did not exit"
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline and any(alive(pid) for pid in children):
        time.sleep(0.2)
    left = sorted(pid for pid in children if alive(pid))
    for pid in left:  # ours (the server's workers): do not leak them past the test
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert graceful, f"the service did not exit within {STOP_TIMEOUT} s of SIGTERM:\n{server.log_tail()}"
    assert not left, f"processes of the service outlived it: {left}\n{server.log_tail()}"
    assert proc.returncode in (0, -signal.SIGTERM), f"exit code {proc.returncode}:\n{server.log_tail()}"
