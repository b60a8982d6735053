"""Faults on a real multi-process Dask cluster: a scheduler and two ``dask worker`` processes
(each under its nanny) on 127.0.0.1, started here and torn down at the end.

- a worker process killed mid-job (its nanny restarts it): the job still succeeds, bit-exact;
- every worker killed again and again: the job fails saying workers died (``KilledWorker``),
  the service keeps answering, no output, nothing left under ``tmp``;
- the service process killed mid-job and started again on the same data root: the job is
  ``failed`` (interrupted), no partial array, ``tmp`` empty, a new job succeeds;
- the disk full (a small tmpfs as data root, when this sandbox may mount one): a job fails
  naming the error, an NPY upload answers 507, nothing half-written, earlier arrays intact;
  with the disk full, arrays and job records still read, writes are refused with 507;
- the scheduler frozen (SIGSTOP), then killed: a running job gives it up, ``/healthz`` and
  executions answer 503 within bounded time, never hang; a new scheduler on the same port (and
  a new worker): the service recovers by itself.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from distributed import Client
from fastapi.testclient import TestClient

import ops
from service.api.app import create_app
from tests.service.cluster_jobs import (assert_bit_exact, bounded, download, execute_body, job_leftovers, processing,
                                        submit, upload, wait_job, workers_idle)
from tests.service.conftest import NPY, eventually, load_npy, make_settings, npy_bytes
from tests.service.processes import DASK, REPO, free_port

CLUSTER_UNAVAILABLE = "https://chunked-tensor-ops.readthedocs.io/exceptions/cluster-unavailable"
INSUFFICIENT_STORAGE = "https://chunked-tensor-ops.readthedocs.io/exceptions/insufficient-storage"
FINAL = ("successful", "failed", "dismissed")
# The scheduler's limit of workers that may die running one task (Dask's default is 3): with 1,
# a job whose workers are all killed fails after one or two rounds of kills (each round costs
# the workers' restarts) instead of four, and a job still survives one killed worker.
ALLOWED_FAILURES = 1
# The service's chunk_bytes: also the piece size of a download, which costs ~20 ms a piece
# (a 50 MiB result in 64 KiB pieces took 15-40 s to download, in 1 MiB pieces under 1 s).
CHUNK_BYTES = 2**20
# On the 3 MiB disk, uploads are written in 64 KiB pieces: the disk fills in the middle of one.
DISK_CHUNK_BYTES = 64 * 1024


# --- a cluster of processes that the tests may break --------------------------------------------


class ProcessCluster:
    """``dask scheduler`` + ``dask worker`` processes (nanny + worker each) on 127.0.0.1, and a
    driver ``Client`` to look at them. The scheduler can be killed and started again on the
    same port; workers can be killed (their nanny restarts them) or added."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.scheduler: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self._client: Client | None = None
        self._count = 0

    def _spawn(self, name: str, *args: str) -> subprocess.Popen:
        self._count += 1
        env = {**os.environ, "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": str(ALLOWED_FAILURES)}
        with open(self.logs / f"{self._count:02d}-{name}.log", "wb") as log:
            return subprocess.Popen([str(DASK), *args], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env)

    def start_scheduler(self) -> None:
        assert self.scheduler is None or self.scheduler.poll() is not None
        self.scheduler = self._spawn("scheduler", "scheduler", "--host", "127.0.0.1", "--port", str(self.port),
                                     "--no-dashboard")

    def start_workers(self, n: int = 2) -> None:
        for k in range(n):
            self.workers.append(self._spawn(f"worker-{k}", "worker", self.address, "--host", "127.0.0.1",
                                            "--nworkers", "1", "--nthreads", "1", "--memory-limit", "1GiB",
                                            "--no-dashboard"))

    @property
    def client(self) -> Client:
        """The driver client, (re)connected to the current scheduler."""
        if self._client is not None and self._client.status != "running":
            self._client.close(timeout=2)
            self._client = None
        if self._client is None:
            deadline = time.monotonic() + 60
            while self._client is None:  # the scheduler may not listen yet
                try:
                    self._client = Client(self.address, timeout=5, set_as_default=False)
                except (OSError, TimeoutError):
                    assert self.scheduler.poll() is None, "the scheduler exited"
                    assert time.monotonic() < deadline, "the scheduler does not answer"
                    time.sleep(0.2)
        return self._client

    def worker_pids(self) -> dict[str, int]:
        """Worker address -> pid of the worker process (the nanny's child)."""
        return self.client.run(os.getpid, on_error="return")

    def ready(self, n: int = 2, timeout: float = 60) -> dict[str, int]:
        """Wait until ``n`` workers are connected and answer; their pids."""
        deadline = time.monotonic() + timeout
        while True:
            pids = {k: v for k, v in self.worker_pids().items() if isinstance(v, int)}
            if len(pids) >= n:
                return pids
            assert time.monotonic() < deadline, f"{len(pids)} workers after {timeout} s"
            time.sleep(0.1)

    def executing(self) -> dict[str, int]:
        """Worker address -> how many tasks it is executing now."""
        counts = self.client.run(lambda dask_worker: dask_worker.state.executing_count, on_error="return")
        return {k: v for k, v in counts.items() if isinstance(v, int)}

    def kill_scheduler(self) -> None:
        self.scheduler.send_signal(signal.SIGKILL)
        self.scheduler.wait(timeout=10)
        if self._client is not None:
            self._client.close(timeout=2)
            self._client = None

    def stop_workers(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.workers:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.workers = []

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close(timeout=5)
            self._client = None
        self.stop_workers()  # first, so that none waits for a gone scheduler
        if self.scheduler is not None and self.scheduler.poll() is None:
            self.scheduler.terminate()
            try:
                self.scheduler.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.scheduler.kill()
                self.scheduler.wait(timeout=10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    procs = ProcessCluster(tmp_path_factory.mktemp("fault-logs"))
    try:
        procs.start_scheduler()
        procs.start_workers(2)
        procs.ready(2)
        yield procs
    finally:
        procs.close()
    assert procs.scheduler.poll() is not None


@pytest.fixture
def healthy(cluster):
    """The cluster, with its scheduler and two workers up (a test before may have broken it)."""
    if cluster.scheduler.poll() is not None:
        cluster.stop_workers()
        cluster.start_scheduler()
    cluster.start_workers(2 - sum(proc.poll() is None for proc in cluster.workers))
    cluster.ready(2)
    return cluster


@contextlib.contextmanager
def service_app(root: Path, address: str, chunk_bytes: int = CHUNK_BYTES, **overrides):
    settings = make_settings(root, scheduler=address, chunk_bytes=chunk_bytes, **overrides)
    with TestClient(create_app(settings)) as api:
        yield api


def gather_inputs(api, rows: int, block: int, prefix: str) -> tuple[dict, np.ndarray, np.ndarray]:
    """Stored GatherNd inputs whose output blocks are ``block`` rows of 512 bytes: tasks
    long enough that a job has some running when something breaks. (inputs, params, indices)"""
    rng = np.random.default_rng(rows)
    params = rng.standard_normal((4096, 128), dtype=np.float32)
    indices = rng.integers(0, 4096, size=(rows, 1), dtype=np.int64)
    upload(api, f"{prefix}-params", params)
    upload(api, f"{prefix}-indices", indices, chunks=f"{block},1")
    inputs = {"params": {"href": f"/arrays/{prefix}-params"}, "indices": {"href": f"/arrays/{prefix}-indices"}}
    return inputs, params, indices


def kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def wait_executing(cluster: ProcessCluster, timeout: float = 20.0, every: float = 0.02) -> dict[str, int]:
    """Wait until some worker executes a task; worker address -> executing count."""
    deadline = time.monotonic() + timeout
    while True:
        counts = cluster.executing()
        if any(counts.values()):
            return counts
        assert time.monotonic() < deadline, "no worker executes anything"
        time.sleep(every)


# --- tests --------------------------------------------------------------------------------------


def test_a_worker_killed_mid_job_is_survived(healthy, tmp_path):
    cluster = healthy
    with service_app(tmp_path, cluster.address) as api:
        inputs, params, indices = gather_inputs(api, 100_000, 5_000, "kill1")  # 20 blocks of 2.5 MiB
        job_id = submit(api, "gather_nd", inputs, result_name="kill1-y")
        pids = cluster.ready(2)
        counts = wait_executing(cluster)
        victim = next(address for address, count in counts.items() if count)
        before = api.get(f"/jobs/{job_id}").json()
        kill(pids[victim])
        assert before["status"] == "running" and before["progress"] < 100, before  # it was mid-job
        final, _ = wait_job(api, job_id, timeout=60)
        assert final["status"] == "successful", final
        assert final["progress"] == 100
        assert_bit_exact(download(api, "kill1-y"), ops.gather_nd(params, indices))
        assert job_leftovers(tmp_path, job_id) == []
        # the worker was killed (not merely restarted at leisure), and its nanny started a new one
        after = cluster.ready(2)
        assert pids[victim] not in after.values()


def test_every_worker_killed_again_and_again_fails_the_job_cleanly(healthy, tmp_path):
    cluster = healthy
    with service_app(tmp_path, cluster.address) as api:
        inputs, *_ = gather_inputs(api, 400_000, 10_000, "killall")  # 40 blocks of 5 MiB
        job_id = submit(api, "gather_nd", inputs, result_name="killall-y")
        rounds = 0
        deadline = time.monotonic() + 60
        while api.get(f"/jobs/{job_id}").json()["status"] not in FINAL:
            assert time.monotonic() < deadline, f"the job survived {rounds} rounds of killed workers"
            pids = cluster.ready(2)
            with contextlib.suppress(AssertionError):
                wait_executing(cluster, timeout=5)  # kill them while they work for the job
            for pid in pids.values():
                kill(pid)
            rounds += 1
            time.sleep(0.3)
        final, _ = wait_job(api, job_id)
        assert rounds >= 1, rounds  # (a task handed from a killed worker to the next one may die twice in one round)
        assert final["status"] == "failed", final
        assert "KilledWorker" in final["message"] and "died" in final["message"], final["message"]
        # a task is failed once more workers died running it than the scheduler allows
        assert f"on {ALLOWED_FAILURES + 1} different workers" in final["message"], final["message"]
        results = api.get(f"/jobs/{job_id}/results")
        assert results.status_code == 500, results.text
        assert results.json()["type"].endswith("job-failed")
        assert "KilledWorker" in results.json()["detail"]
        # the service keeps answering; no output, no partial output
        assert api.get("/processes").status_code == 200
        health = api.get("/healthz")
        assert health.status_code == 200, health.text
        assert api.get("/arrays/killall-y/info").status_code == 404
        assert job_leftovers(tmp_path, job_id) == []
        cluster.ready(2)  # the nannies restarted the workers
        assert eventually(lambda: processing(cluster.client) == []), processing(cluster.client)
        assert eventually(lambda: workers_idle(cluster.client))
        assert job_leftovers(tmp_path, job_id) == [], "a task of the failed job wrote after its cleanup"
        assert api.get("/arrays/killall-y/info").status_code == 404
        # and the cluster runs the next job
        small = np.arange(2 * 4 * 4 * 8, dtype=np.float32).reshape(2, 4, 4, 8)
        upload(api, "killall-x", small, chunks="1,2,4,8")
        next_job = submit(api, "depth_to_space", {"x": {"href": "/arrays/killall-x"}, "block_size": 2},
                          result_name="killall-y")
        final, _ = wait_job(api, next_job)
        assert final["status"] == "successful", final
        assert_bit_exact(download(api, "killall-y"), ops.depth_to_space(small, 2))


class ServiceProcess:
    """``python -m service --scheduler ...`` as its own process, on a fixed port and data root."""

    def __init__(self, root: Path, scheduler: str, logs: Path):
        self.root, self.scheduler, self.logs = root, scheduler, logs
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, timeout: float = 60) -> httpx.Client:
        self.starts += 1
        env = {**os.environ, "CHUNKED_TENSOR_OPS_CHUNK_BYTES": str(CHUNK_BYTES)}
        with open(self.logs / f"service-{self.starts}.log", "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(self.port),
                 "--data-root", str(self.root), "--scheduler", self.scheduler, "--log-level", "warning"],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        http = httpx.Client(base_url=self.url, timeout=30)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if http.get("/healthz").status_code == 200:
                    return http
            except httpx.TransportError:
                pass
            assert self.proc.poll() is None, (self.logs / f"service-{self.starts}.log").read_text()
            assert time.monotonic() < deadline, "the service did not start"
            time.sleep(0.1)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def test_the_service_stopped_then_killed_mid_job_and_restarted(healthy, tmp_path):
    """Two interruptions of one service, sharing its three starts (the costly part): two
    ``python -m service`` processes, the ones SIGTERM and SIGKILL stop, then a restart in this
    process (what is tested after the SIGKILL is what a start finds, not the process):

    - stopped (SIGTERM) while a job runs: after the restart a finished job keeps its record and
      result, the running one is failed with a message saying the service stopped, no part of
      its result is visible and its name is free again;
    - killed (SIGKILL) while a job writes its result: the job records are whole; after the
      restart the job is failed (interrupted), nothing is under its name or in tmp/, its tasks
      are gone from the cluster, its inputs are intact, and the name can be used again."""
    cluster = healthy
    root = tmp_path / "root"
    logs = tmp_path / "logs"
    logs.mkdir()
    service = ServiceProcess(root, cluster.address, logs)
    x = np.random.default_rng(7).integers(0, 255, size=(2, 4, 4, 8), dtype=np.uint8)
    try:
        http = service.start()
        upload(http, "restart-x", x)
        done_id = submit(http, "depth_to_space", {"x": {"href": "/arrays/restart-x"}, "block_size": 2},
                         result_name="restart-done")
        assert wait_job(http, done_id)[0]["status"] == "successful"
        inputs, params, _ = gather_inputs(http, 200_000, 5_000, "restart")  # 40 blocks of 2.5 MiB
        indices_before = download(http, "restart-indices")
        stopped_id = submit(http, "gather_nd", inputs, result_name="restart-y")
        wait_executing(cluster)
        service.stop()
        http.close()

        http = service.start()
        listed = {job["jobID"]: job for job in http.get("/jobs").json()["jobs"]}
        assert listed[done_id]["status"] == "successful" and listed[done_id]["processID"] == "depth_to_space"
        related = [link["href"] for link in listed[done_id]["links"] if link["rel"] == "related"]
        assert [href.rstrip("/").rsplit("/", 1)[1] for href in related] == ["restart-done"], listed[done_id]
        status = http.get(f"/jobs/{done_id}").json()
        assert status["status"] == "successful" and status["progress"] == 100, status
        results = http.get(f"/jobs/{done_id}/results")
        assert results.status_code == 200 and results.json()["result"]["href"].endswith("/arrays/restart-done")
        assert_bit_exact(download(http, "restart-done"), ops.depth_to_space(x, 2))
        final = http.get(f"/jobs/{stopped_id}").json()
        assert final["status"] == "failed", final
        assert "interrupted" in final["message"] and "stopped" in final["message"], final
        results = http.get(f"/jobs/{stopped_id}/results")
        problem = results.json()
        assert results.status_code == 500 and problem["status"] == 500, problem
        assert problem["type"].startswith(("http://", "https://")) and "interrupted" in problem["detail"], problem
        assert http.get("/arrays/restart-y/info").status_code == 404
        assert list((root / "tmp").iterdir()) == []
        assert eventually(lambda: processing(cluster.client) == []), processing(cluster.client)

        job_id = submit(http, "gather_nd", inputs, result_name="restart-y")  # the name is free again
        wait_executing(cluster)
        assert eventually(lambda: job_leftovers(root, job_id), timeout=5), "the job wrote nothing yet"
        assert http.get(f"/jobs/{job_id}").json()["status"] == "running"
        service.kill()
        http.close()
        raw = sqlite3.connect(root / "jobs.sqlite")
        try:
            assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        finally:
            raw.close()
        # the killed service's tasks are gone from the cluster once the scheduler sees its client
        # gone (a task that was running ends first): then started again, in this process, which
        # takes a second where a new process takes several (started sooner than the tasks end, a
        # sweep at start could be followed by their writes)
        assert eventually(lambda: processing(cluster.client) == []), processing(cluster.client)
        assert eventually(lambda: workers_idle(cluster.client))
        assert job_leftovers(root, job_id)  # what the sweep has to remove
        with service_app(root, cluster.address) as http:
            assert list((root / "tmp").iterdir()) == []  # swept at start
            assert not (root / "arrays" / "restart-y").exists()
            final = http.get(f"/jobs/{job_id}").json()
            assert final["status"] == "failed", final
            assert "interrupted" in final["message"], final
            assert final["finished"]
            results = http.get(f"/jobs/{job_id}/results")
            assert results.status_code == 500, results.text
            assert "interrupted" in results.json()["detail"]
            assert http.get("/arrays/restart-y/info").status_code == 404
            assert "restart-y" not in [a["name"] for a in http.get("/arrays").json()["arrays"]]
            assert list((root / "tmp").iterdir()) == []
            assert_bit_exact(download(http, "restart-indices"), indices_before)  # the inputs are intact
            # a new job (under the same output name, on a tenth of the indices) runs to success
            upload(http, "restart-fewer", indices_before[:20_000], chunks="2500,1")
            job_id = submit(http, "gather_nd", {**inputs, "indices": {"href": "/arrays/restart-fewer"}},
                            result_name="restart-y")
            final, _ = wait_job(http, job_id, timeout=60)
            assert final["status"] == "successful", final
            assert_bit_exact(download(http, "restart-y"), ops.gather_nd(params, indices_before[:20_000]))
            assert list((root / "tmp").iterdir()) == []
    finally:
        service.stop()

@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs, or a skip where this sandbox may not mount one."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        gc.collect()  # the app's job records hold a connection until collected
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=True)


def wait_job_thread(api, job_id: str, timeout: float = 120.0) -> dict:
    """Wait until the service's job thread has ended (it records the final status last), then
    read the status once. (Polling it while the disk is full is test_job_records_on_a_full_disk.)"""
    running = api.app.state.services.executor._running
    assert eventually(lambda: job_id not in running, timeout=timeout), f"job {job_id} still running"
    response = api.get(f"/jobs/{job_id}")
    assert response.status_code == 200, response.text
    return response.json()


def fill(path: Path) -> None:
    """Write zeros to ``path`` until the disk is full."""
    with open(path, "wb") as out, contextlib.suppress(OSError):
        while True:
            out.write(bytes(64 * 1024))
            out.flush()
    with pytest.raises(OSError) as full, open(path, "ab") as out:
        out.write(bytes(64 * 1024))
        out.flush()
    assert full.value.errno == errno.ENOSPC


@pytest.mark.smoke
def test_disk_full_mid_job_and_mid_upload(healthy, small_disk):
    """A job, then an upload, that fill the disk: each fails naming the error, leaves nothing
    half-written, and earlier arrays stay intact."""
    cluster = healthy
    root = small_disk / "root"
    rng = np.random.default_rng(9)
    keep = rng.integers(0, 2**32, size=(256, 256), dtype=np.uint32)  # 256 KiB that do not compress
    with service_app(root, cluster.address, chunk_bytes=DISK_CHUNK_BYTES) as api:
        upload(api, "keep", keep)
        kept = api.get("/arrays/keep").content
        params = rng.integers(0, 2**32, size=(64, 1024), dtype=np.uint32)  # 256 KiB
        indices = rng.integers(0, 64, size=(1024, 1), dtype=np.int64)
        upload(api, "full-params", params)
        upload(api, "full-indices", indices, chunks="64,1")
        # a job whose 4 MiB output does not fit on the 3 MiB disk: it fails, naming the error
        job_id = submit(api, "gather_nd", {"params": {"href": "/arrays/full-params"},
                                           "indices": {"href": "/arrays/full-indices"}}, result_name="full-y")
        final = wait_job_thread(api, job_id)
        assert final["status"] == "failed", final
        assert os.strerror(errno.ENOSPC) in final["message"], final["message"]
        results = api.get(f"/jobs/{job_id}/results")
        assert results.status_code == 507, results.text
        assert results.json()["type"] == INSUFFICIENT_STORAGE
        assert os.strerror(errno.ENOSPC) in results.json()["detail"]
        assert api.get("/arrays/full-y/info").status_code == 404
        assert eventually(lambda: workers_idle(cluster.client))
        assert list((root / "tmp").iterdir()) == []
        # an upload that does not fit: 507, nothing left behind
        big = rng.integers(0, 256, size=4 * 2**20, dtype=np.uint8)
        response = api.put("/arrays/full-upload", content=npy_bytes(big), headers={"Content-Type": NPY})
        assert response.status_code == 507, response.text
        assert response.headers["content-type"].startswith("application/problem+json")
        problem = response.json()
        assert problem["type"] == INSUFFICIENT_STORAGE and problem["status"] == 507
        assert os.strerror(errno.ENOSPC) in problem["detail"]
        assert api.get("/arrays/full-upload/info").status_code == 404
        assert list((root / "tmp").iterdir()) == []
        # earlier arrays intact, and the service works again once there is room
        assert api.get("/arrays/keep").content == kept
        assert_bit_exact(load_npy(kept), keep)
        assert api.get("/healthz").status_code == 200
        small = indices[:64]
        upload(api, "full-small", small, chunks="64,1")
        job_id = submit(api, "gather_nd", {"params": {"href": "/arrays/full-params"},
                                           "indices": {"href": "/arrays/full-small"}}, result_name="full-y")
        final, _ = wait_job(api, job_id)
        assert final["status"] == "successful", final
        assert_bit_exact(download(api, "full-y"), ops.gather_nd(params, small))


def test_disk_filled_by_another_writer(healthy, small_disk):
    """The data root filled by something else: stored arrays still read (NPY and Zarr keys),
    the service answers; once there is room again, uploads and jobs work."""
    cluster = healthy
    root = small_disk / "root"
    x = np.random.default_rng(11).standard_normal((2, 8, 8, 16), dtype=np.float32)
    with service_app(root, cluster.address, chunk_bytes=DISK_CHUNK_BYTES) as api:
        upload(api, "other-x", x, chunks="1,4,4,16")
        stored = api.get("/arrays/other-x").content
        fill(small_disk / "filler")
        assert api.get("/arrays/other-x").content == stored
        assert api.get("/arrays/other-x/info").status_code == 200
        assert api.get("/arrays/other-x/zarr/zarr.json").status_code == 200
        assert "other-x" in [a["name"] for a in api.get("/arrays").json()["arrays"]]
        assert api.get("/healthz").status_code == 200
        assert api.get("/processes").status_code == 200
        (small_disk / "filler").unlink()
        job_id = submit(api, "depth_to_space", {"x": {"href": "/arrays/other-x"}, "block_size": 2},
                        result_name="other-y")
        final, _ = wait_job(api, job_id)
        assert final["status"] == "successful", final
        assert_bit_exact(download(api, "other-y"), ops.depth_to_space(x, 2))
        assert list((root / "tmp").iterdir()) == []


def test_job_records_on_a_full_disk(healthy, small_disk):
    """With the disk full: the jobs are still listed and their status read (the job records
    live on the data root too); an upload and an execution are refused with 507 (nothing
    could be stored)."""
    cluster = healthy
    root = small_disk / "root"
    x = np.random.default_rng(12).standard_normal((2, 8, 8, 16), dtype=np.float32)
    inputs = {"x": {"href": "/arrays/records-x"}, "block_size": 2}
    with service_app(root, cluster.address, chunk_bytes=DISK_CHUNK_BYTES) as api:
        upload(api, "records-x", x, chunks="1,4,4,16")
        done = submit(api, "depth_to_space", inputs, result_name="records-y")
        assert wait_job(api, done)[0]["status"] == "successful"
        fill(small_disk / "filler")
        status = api.get(f"/jobs/{done}")
        assert status.status_code == 200, status.text
        assert status.json()["status"] == "successful"
        assert done in [job["jobID"] for job in api.get("/jobs").json()["jobs"]]
        response = api.put("/arrays/records-upload", content=npy_bytes(x), headers={"Content-Type": NPY})
        assert response.status_code == 507, response.text
        assert response.json()["type"] == INSUFFICIENT_STORAGE
        response = api.post("/processes/depth_to_space/execution", json=execute_body(inputs, "records-sync"))
        assert response.status_code == 507, response.text
        assert response.json()["type"] == INSUFFICIENT_STORAGE
        assert api.get("/arrays/records-sync/info").status_code == 404
        assert list((root / "tmp").iterdir()) == []


# --- the scheduler frozen, then gone (last: it leaves the cluster one worker) ---------------------

def assert_cluster_unavailable(api, tmp_path: Path, name: str, running: str | None = None) -> None:
    """``/healthz`` and a sync execution answer 503 within bounded time; a job submitted now
    fails, saying why, and leaves nothing behind (nothing but what job ``running``, still
    waiting for the scheduler, has written)."""
    with bounded(15):
        health = api.get("/healthz")
    assert health.status_code == 503, health.text
    assert health.json()["status"] == "unavailable"
    assert health.json()["cluster"]["error"]
    inputs = {"x": {"href": "/arrays/sched-x"}, "block_size": 2}
    with bounded(15):
        response = api.post("/processes/depth_to_space/execution", json=execute_body(inputs, f"{name}-sync"))
    assert response.status_code == 503, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["type"] == CLUSTER_UNAVAILABLE
    assert problem["status"] == 503 and problem["detail"]
    assert api.get(f"/arrays/{name}-sync/info").status_code == 404
    with bounded(25):
        job_id = submit(api, "depth_to_space", inputs, result_name=f"{name}-async")
        final, _ = wait_job(api, job_id, timeout=25)
    assert final["status"] == "failed", final
    assert_failed_for_the_cluster(api, job_id)
    assert api.get(f"/arrays/{name}-async/info").status_code == 404
    assert [p for p in (tmp_path / "tmp").iterdir() if not p.name.startswith(f"job-{running}-")] == []


def assert_failed_for_the_cluster(api, job_id: str) -> None:
    results = api.get(f"/jobs/{job_id}/results")
    assert results.status_code == 503, results.text
    assert results.json()["type"] == CLUSTER_UNAVAILABLE
    assert "scheduler" in results.json()["detail"] or "cluster" in results.json()["detail"]


def test_the_scheduler_frozen_or_gone_is_503_then_recovered(healthy, tmp_path):
    """Frozen (SIGSTOP: its connections stay open, nothing answers), then killed, then a new
    scheduler on the same port: 503s within bounded time, never a hang, and then recovery."""
    cluster = healthy
    x = np.random.default_rng(5).standard_normal((2, 8, 8, 16), dtype=np.float32)
    # A 2 s scheduler timeout (a job gives a silent scheduler up after 3 x 2 s): each wait for
    # the frozen or gone scheduler below is one of these. (A scheduler that has just started,
    # on a busy machine, may take seconds to answer: the bounds below are "never a hang", not
    # speed.)
    with service_app(tmp_path, cluster.address, scheduler_timeout=2) as api:
        upload(api, "sched-x", x, chunks="1,4,4,16")
        assert api.get("/healthz").status_code == 200
        inputs, *_ = gather_inputs(api, 400_000, 10_000, "frozen")  # 40 blocks of 5 MiB
        running = submit(api, "gather_nd", inputs, result_name="frozen-y")
        wait_executing(cluster)
        cluster.scheduler.send_signal(signal.SIGSTOP)
        try:
            with bounded(30):
                # meanwhile (the running job waits for the scheduler): 503s in bounded time
                assert_cluster_unavailable(api, tmp_path, "frozen", running=running)
                # the job that was running gives the frozen scheduler up, in bounded time
                final, _ = wait_job(api, running, timeout=30)
            assert final["status"] == "failed", final
            assert "not answered" in final["message"], final
            assert_failed_for_the_cluster(api, running)
            assert api.get("/arrays/frozen-y/info").status_code == 404
            assert job_leftovers(tmp_path, running) == []
            assert list((tmp_path / "tmp").iterdir()) == []
        finally:
            cluster.kill_scheduler()  # a stopped process dies of SIGKILL too
        assert_cluster_unavailable(api, tmp_path, "gone")  # killed: refused connections now
        # a new scheduler on the same port and a new worker (one: the last test of the module,
        # ``healthy`` makes it two for any test after): the service reconnects without a restart
        cluster.stop_workers()
        cluster.start_scheduler()
        cluster.start_workers(1)
        cluster.ready(1)
        health = eventually(lambda: api.get("/healthz").status_code == 200 and api.get("/healthz"), timeout=15)
        assert health, api.get("/healthz").text
        assert health.json()["cluster"]["workers"] == 1
        response = api.post("/processes/depth_to_space/execution", json=execute_body(
            {"x": {"href": "/arrays/sched-x"}, "block_size": 2}, "sched-y"))
        assert response.status_code == 200, response.text
        assert_bit_exact(download(api, "sched-y"), ops.depth_to_space(x, 2))
        job_id = submit(api, "depth_to_space", {"x": {"href": "/arrays/sched-x"}, "block_size": 2})
        final, _ = wait_job(api, job_id)
        assert final["status"] == "successful", final
        assert_bit_exact(download(api, job_id), ops.depth_to_space(x, 2))
