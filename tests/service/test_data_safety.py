"""Data safety: job records that survive a crash, inputs that no job can modify, overwrites
that readers see whole (the old array or the new one, never a mix, never a missing name),
and jobs that fail or are dismissed leaving nothing under their output name."""

from __future__ import annotations

import gc
import hashlib
import math
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dask
import numpy as np
import pytest
import xarray as xr

import ops
from bench.overwrites import hammer
from service.errors import ServiceError
from service.jobs.records import JobRecords
from service.storage import publish
from service.storage.local import ArrayStore
from tests.helpers import assert_same, stores_as_made
from tests.service.conftest import NPY, eventually, inline, load_npy, npy_bytes
from tests.service.processes import served

REPO = Path(__file__).resolve().parents[2]
ASYNC = {"Prefer": "respond-async"}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"




def tree_digest(path: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``path``: its sha256 and its mtime (ns)."""
    return {str(f.relative_to(path)): (hashlib.sha256(f.read_bytes()).hexdigest(), f.stat().st_mtime_ns)
            for f in sorted(path.rglob("*")) if f.is_file()}


# --- job records survive a crash ---------------------------------------------------------------

# Writers are forks of one process that has imported the job records (importing them loads the
# service, seconds a process): each is a process of its own that opens the database itself.
FORKER = textwrap.dedent("""
    import os, sys
    from service.jobs.records import JobRecords, now

    def write(db, tag, out):
        records = JobRecords(db)
        for i in range(100000):
            job = f"{tag}-{i:06d}"
            records.create(job, "depth_to_space", ["in"], "out-" + job, "reference")
            print("accepted", job, file=out, flush=True)
            records.update(job, status="running", started=now(), message="running on the cluster", progress=i % 100)
            print("running", job, file=out, flush=True)
            records.finish(job, "successful", "done", progress=100)
            print("successful", job, file=out, flush=True)

    for command in sys.stdin:
        what, *args = command.split()
        if what == "fork":  # fork DB TAG FIFO: a writer on DB acknowledging each write to FIFO
            pid = os.fork()
            if pid == 0:
                try:
                    with open(args[2], "w") as out:
                        write(args[0], args[1], out)
                finally:
                    os._exit(0)
            print(pid, flush=True)
        elif what == "wait":  # wait PID: the signal that ended it (0 if none did)
            _, status = os.waitpid(int(args[0]), 0)
            print(os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0, flush=True)
""")


class Forker:
    """The process that forks the writers; its error output goes to ``log``."""

    def __init__(self, log: Path):
        self.log = log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", FORKER], cwd=REPO, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, text=True)

    def ask(self, command: str) -> int:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, f"the forker died: {self.log.read_text()}"
        return int(answer)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)
        self.proc.stdout.close()


def _kill_writers_midway(forker: Forker, db: Path, tags: list[str], acks_before_kill: int) -> dict[str, str]:
    """Start one writer per tag on ``db``, SIGKILL them all once each acknowledged
    ``acks_before_kill`` writes; returns the last acknowledged status of each job."""
    writers = []  # (pid, its acknowledgements)
    for tag in tags:
        fifo = db.parent / f"{tag}.acks"
        os.mkfifo(fifo)
        pid = forker.ask(f"fork {db} {tag} {fifo}")
        writers.append((pid, open(fifo)))  # (waits for the writer to open it)
    acked: dict[str, str] = {}
    try:
        for _, acks in writers:
            for _ in range(acks_before_kill):
                line = acks.readline()
                assert line, f"the writer died: {forker.log.read_text()}"
                status, job = line.split()
                acked[job] = status
    finally:
        for pid, _ in writers:
            os.kill(pid, signal.SIGKILL)  # no cleanup, no checkpoint, a write may be half done
        for _, acks in writers:
            # What it wrote after the last line we read was committed too: read the rest, but not
            # a line the kill cut short (the write it names was committed; the ack is incomplete).
            rest = acks.read()
            for line in rest.split("\n")[:-1]:
                status, job = line.split()
                acked[job] = status
            acks.close()
    assert [forker.ask(f"wait {pid}") for pid, _ in writers] == [signal.SIGKILL] * len(writers)
    return acked


def test_job_records_survive_sigkill(tmp_path):
    db = tmp_path / "jobs.sqlite"
    JobRecords(db)
    raw = sqlite3.connect(db)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    raw.close()
    forker = Forker(tmp_path / "forker.log")
    try:
        for round_, acks in enumerate((150, 40, 97)):  # killed at different points of a job's three writes
            _check_a_round_of_kills(forker, db, f"r{round_}", acks)
    finally:
        forker.close()


def _check_a_round_of_kills(forker: Forker, db: Path, tag: str, acks: int) -> None:
    acked = _kill_writers_midway(forker, db, [f"{tag}a", f"{tag}b"], acks)
    # A fresh connection replays the log: the database is whole and every acknowledged write is in it.
    raw = sqlite3.connect(db)
    try:
        assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        raw.close()
    records = JobRecords(db)
    rows = {job["id"]: job for job in records.list(limit=10**6) if job["id"].startswith(tag)}
    order = ("accepted", "running", "successful")
    for job, status in acked.items():
        assert job in rows, f"acknowledged {status} of {job} is lost"
        assert order.index(rows[job]["status"]) >= order.index(status), (job, status, rows[job])
    assert len(rows) <= len({j for j in acked}) + 2  # at most one unacknowledged create per writer
    for job in rows.values():  # every row is one of the three whole states, never a mix
        if job["status"] == "accepted":
            assert job["started"] is None and job["finished"] is None and job["progress"] == 0, job
        elif job["status"] == "running":
            assert job["started"] and job["finished"] is None and job["message"] == "running on the cluster", job
        else:
            assert job["status"] == "successful" and job["finished"] and job["progress"] == 100, job
        assert job["reads"] == ["in"] and job["writes"] == "out-" + job["id"], job
    # A restarted service fails what was left active, in one transaction.
    active = [job["id"] for job in rows.values() if job["status"] in ("accepted", "running")]
    assert records.mark_interrupted() == len(active)
    assert not records.list(status=["accepted", "running"])
    assert all(records.get(job)["status"] == "failed" for job in active)


def test_a_failed_write_is_rolled_back(tmp_path):
    records = JobRecords(tmp_path / "jobs.sqlite")
    records.create("one", "depth_to_space", [], "out", "value")
    with pytest.raises(sqlite3.IntegrityError):
        records.create("one", "gather_nd", ["x"], "other", "reference")
    with pytest.raises(KeyError):
        records.finish("one", "failed", "no", no_such_column=1)
    # No transaction is left open: the next writer goes on at once.
    started = time.monotonic()
    records.update("one", message="still here")
    assert time.monotonic() - started < 5
    job = records.get("one")
    assert job["process_id"] == "depth_to_space" and job["status"] == "accepted" and job["message"] == "still here"


def test_records_leave_no_open_connection(tmp_path):
    import psutil

    records = JobRecords(tmp_path / "jobs.sqlite")
    me = psutil.Process()
    records.create("first", "depth_to_space", [], None, "value")
    # SQLite keeps (and reuses) the descriptor of a closed connection while another connection
    # of the process holds the file (closing it would drop that one's POSIX locks): so count
    # after a first call.
    before = len(me.open_files())
    for k in range(50):
        records.create(f"j{k}", "depth_to_space", [], None, "value")
        records.get(f"j{k}")
        records.list()
    assert len(me.open_files()) == before
    records.close()  # the idle connection that keeps -wal and -shm (see test_faults: a full disk)
    assert len(me.open_files()) < before


# --- the array store: atomic overwrite, stable reads -------------------------------------------

@pytest.fixture
def store(tmp_path) -> ArrayStore:
    return ArrayStore(tmp_path / "root", chunk_bytes=4096, max_upload_bytes=2**30)


def put(store: ArrayStore, name: str, array: np.ndarray, overwrite: bool = False, chunks: str | None = None):
    upload = store.npy_upload(name, dims=None, chunks=chunks, declared_dtype=None, overwrite=overwrite)
    try:
        upload.feed(npy_bytes(array))
        return upload.finish()
    finally:
        upload.abort()


def leftovers(store: ArrayStore) -> list[str]:
    return sorted(p.name for p in store.tmp.iterdir())


@pytest.mark.smoke
def test_overwrite_swaps_in_one_step(store, monkeypatch):
    """On Linux the replacement is one renameat2(RENAME_EXCHANGE): the name is never absent."""
    if not sys.platform.startswith("linux"):
        pytest.skip("renameat2 is Linux's")
    calls = []
    real = publish._rename2

    def spy(src, dst, flags):
        done = real(src, dst, flags)
        calls.append((flags, done))
        return done

    monkeypatch.setattr(publish, "_rename2", spy)
    put(store, "a", np.full((8, 64), 1, np.int32))
    put(store, "a", np.full((8, 64), 2, np.int32), overwrite=True)
    assert calls == [(publish._RENAME_NOREPLACE, True), (publish._RENAME_EXCHANGE, True)]
    assert (store.read_small("a", 2**20) == 2).all()
    assert leftovers(store) == []


def test_publish_without_renameat2_falls_back(store, monkeypatch):
    monkeypatch.setattr(publish, "_renameat2", None)
    put(store, "a", np.full((8, 64), 1, np.int32))
    with pytest.raises(ServiceError) as taken:
        put(store, "a", np.full((8, 64), 2, np.int32))
    assert taken.value.status == 409
    put(store, "a", np.full((8, 64), 3, np.int32), overwrite=True)
    assert (store.read_small("a", 2**20) == 3).all()
    assert leftovers(store) == []


def test_concurrent_publishers_of_a_new_name(store):
    """Of several uploads of one new name without overwrite one wins, the others get 409
    (never a 500 from a rename onto a group that appeared meanwhile) and leave nothing."""
    def attempt(value: int):
        try:
            put(store, "race", np.full((16, 64), value, np.int32))
            return value
        except ServiceError as error:
            assert error.status == 409, error
            return None

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(attempt, range(1, 17)))
    winners = [v for v in outcomes if v is not None]
    assert len(winners) == 1
    assert (store.read_small("race", 2**20) == winners[0]).all()
    assert leftovers(store) == []


def test_concurrent_overwrites(store):
    put(store, "many", np.full((16, 64), 0, np.int32))
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda v: put(store, "many", np.full((16, 64), v, np.int32), overwrite=True), range(1, 25)))
    final = store.read_small("many", 2**20)
    assert final.min() == final.max() and 1 <= final[0, 0] <= 24
    assert store.names() == ["many"]
    assert eventually(lambda: leftovers(store) == [])


@pytest.mark.parametrize("op, shape, chunks, params", [
    # BatchToSpaceND's bundles: P = 4 chunks of one batch row each make 4 output blocks.
    (ops.batch_to_space_nd, (8, 4, 6, 2), "1,-1,-1,-1", ([2, 2], [[0, 1], [1, 0]])),
    # SpaceToBatchND's windows (a halo each, read by its owner): 4 group blocks each.
    (ops.space_to_batch_nd, (4, 8, 6, 2), "2,4,-1,-1", ([2, 2], [[1, 1], [0, 2]])),
])
def test_a_job_result_is_stored_by_the_tasks_that_make_it(store, op, shape, chunks, params):
    # The store graph of a job's result (write_skeleton): a task that makes several output
    # blocks writes them itself (ops.fusing_stores), the same bytes.
    x = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    put(store, "rows", x, chunks=chunks)
    rows = store.open("rows").array
    y = xr.DataArray(op(rows.data, *params), dims=rows.dims)
    built = store.new_version("bundles-")
    fill = store.write_skeleton(built, y, tuple(c[0] for c in y.chunks), "bundled")
    assert stores_as_made(dask.optimize(fill)[0])  # optimized where it is computed
    fill.compute(scheduler="sync")
    store.publish(built, "bundled", overwrite=False)
    assert_same(store.read_small("bundled", 2**20), op(x, *params))


def test_pinned_read_keeps_its_version(store):
    put(store, "v", np.full((32, 64), 1, np.int32), chunks="1,-1")  # 32 chunks
    old = store.open("v", pinned=True).array
    put(store, "v", np.full((32, 64), 2, np.int32), overwrite=True, chunks="4,-1")
    assert (store.read_small("v", 2**20) == 2).all()
    assert (np.asarray(old.values) == 1).all()  # read after the overwrite: the old version, whole
    kept = store._pins.waiting()
    assert len(kept) == 1 and kept[0].is_dir()
    del old
    gc.collect()
    assert eventually(lambda: not store._pins.waiting() and leftovers(store) == [])
    assert not kept[0].exists()


def test_download_started_before_an_overwrite_is_the_old_array(store):
    x = np.arange(64 * 64, dtype=np.int32).reshape(64, 64)
    put(store, "d", x, chunks="1,-1")
    dtype, length, pieces = store.iter_npy("d", piece_bytes=1024)  # 4 rows a piece
    first = [next(pieces), next(pieces)]  # the header and the first slab
    put(store, "d", np.full((64, 64), -1, np.int32), overwrite=True, chunks="8,-1")
    body = b"".join(first + list(pieces))
    assert len(body) == length
    assert np.array_equal(load_npy(body), x)
    del pieces
    assert eventually(lambda: leftovers(store) == [])
    # A download whose body was never read lets go of its version too.
    _, _, unread = store.iter_npy("d")
    put(store, "d", x, overwrite=True)
    assert len(store._pins.waiting()) == 1
    del unread
    gc.collect()
    assert eventually(lambda: leftovers(store) == [] and not store._pins.waiting())


def test_delete_while_read(store):
    put(store, "gone", np.full((16, 16), 7, np.uint8), chunks="1,-1")
    arr = store.open("gone", pinned=True).array
    store.delete("gone")
    assert not store.exists("gone") and store.names() == []
    assert (np.asarray(arr.values) == 7).all()
    del arr
    gc.collect()
    assert eventually(lambda: leftovers(store) == [])
    with pytest.raises(ServiceError) as missing:
        store.open("gone", pinned=True)
    assert missing.value.status == 404


def test_inputs_are_opened_read_only(store, monkeypatch):
    import xarray as xr

    put(store, "ro", np.ones((4, 4), np.float32))
    seen = []
    real = xr.open_zarr

    def spy(source, *args, **kwargs):
        seen.append(source)
        return real(source, *args, **kwargs)

    monkeypatch.setattr(xr, "open_zarr", spy)
    store.open("ro")
    store.open("ro", pinned=True)
    assert len(seen) == 2 and all(source.read_only for source in seen)


# --- the service: a job cannot modify its input; failed jobs leave nothing --------------------

@pytest.mark.smoke
def test_jobs_cannot_modify_their_inputs(client, service_root):
    rng = np.random.default_rng(11)
    x = rng.integers(-100, 100, size=(2, 8, 8, 8), dtype=np.int16)
    params = rng.standard_normal((64, 16)).astype(np.float32)
    indices = rng.integers(0, 64, size=(200, 1), dtype=np.int64)
    for name, array, chunks in (("ro-x", x, "1,4,4,8"), ("ro-params", params, "16,16"),
                                ("ro-indices", indices, "50,1")):
        response = client.put(f"/arrays/{name}", content=npy_bytes(array), headers={"Content-Type": NPY},
                              params={"chunks": chunks})
        assert response.status_code == 201, response.text
    before = {name: tree_digest(service_root / "arrays" / name) for name in ("ro-x", "ro-params", "ro-indices")}

    ref = {"x": {"href": "/arrays/ro-x"}}
    requests_ = [
        ("depth_to_space", {**ref, "block_size": 2}, ops.depth_to_space(x, 2)),
        ("space_to_depth", {**ref, "block_size": 2}, ops.space_to_depth(x, 2)),
        ("space_to_batch", {**ref, "block_size": 2, "paddings": [[0, 0], [0, 0]]},
         ops.space_to_batch(x, 2, [[0, 0], [0, 0]])),
        ("gather_nd", {"params": {"href": "/arrays/ro-params"}, "indices": {"href": "/arrays/ro-indices"}},
         ops.gather_nd(params, indices)),
    ]
    jobs = []
    for process, inputs, expected in requests_:
        # sync, value
        response = client.post(f"/processes/{process}/execution", json={"inputs": inputs, "response": "raw"})
        assert response.status_code == 200, response.text
        assert load_npy(response.content).tobytes() == np.ascontiguousarray(expected).tobytes()
        # async, stored
        response = client.post(f"/processes/{process}/execution", headers=ASYNC, json={
            "inputs": inputs, "outputs": {"result": {"transmissionMode": "reference"}}})
        assert response.status_code == 201, response.text
        jobs.append((response.json()["jobID"], expected))
    for job_id, expected in jobs:
        assert eventually(lambda: client.get(f"/jobs/{job_id}").json()["status"] not in ("accepted", "running"),
                          timeout=30)
        assert client.get(f"/jobs/{job_id}").json()["status"] == "successful"
        got = load_npy(client.get(f"/arrays/{job_id}").content)
        assert got.tobytes() == np.ascontiguousarray(expected).tobytes()
    for name in before:  # downloads and Zarr reads of the inputs too
        assert client.get(f"/arrays/{name}").status_code == 200
        assert client.get(f"/arrays/{name}/zarr/zarr.json").status_code == 200
    after = {name: tree_digest(service_root / "arrays" / name) for name in before}
    assert after == before


def test_sync_stored_result_that_fails_leaves_nothing(client, service_root):
    params = np.zeros((16, 4), np.float32)
    indices = np.zeros((40, 1), np.int64)
    indices[33, 0] = 16  # out of range, in the last of 4 blocks
    for name, array, chunks in (("fail-params", params, "16,4"), ("fail-indices", indices, "10,1")):
        assert client.put(f"/arrays/{name}", content=npy_bytes(array), headers={"Content-Type": NPY},
                          params={"chunks": chunks}).status_code == 201
    response = client.post("/processes/gather_nd/execution", json={
        "inputs": {"params": {"href": "/arrays/fail-params"}, "indices": {"href": "/arrays/fail-indices"}},
        "outputs": {"result": {"transmissionMode": "reference", "name": "sync-fail-y"}}})
    assert response.status_code == 400, response.text
    assert client.get("/arrays/sync-fail-y/info").status_code == 404
    assert not (service_root / "arrays" / "sync-fail-y").exists()
    assert eventually(lambda: not list((service_root / "tmp").glob("job-*")))


def test_two_jobs_for_one_output_name(client, service_root):
    """Two jobs accepted for one new output name: one stores its result, the other fails with
    409 and leaves the winner's array as it was."""
    executor = client.app.state.services.executor
    held = 0
    try:  # hold every job slot, so that both jobs are accepted before either runs
        while executor._slots.acquire(blocking=False):
            held += 1
        ids = []
        for block in (2, 4):
            x = np.arange(block * block * 4, dtype=np.float32).reshape(1, 1, 1, block * block * 4)
            response = client.post("/processes/depth_to_space/execution", headers=ASYNC, json={
                "inputs": {"x": inline(x), "block_size": block},
                "outputs": {"result": {"transmissionMode": "reference", "name": "contested"}}})
            assert response.status_code == 201, response.text
            ids.append((response.json()["jobID"], ops.depth_to_space(x, block)))
    finally:
        for _ in range(held):
            executor._slots.release()
    final = {}
    for job_id, _ in ids:
        assert eventually(lambda: client.get(f"/jobs/{job_id}").json()["status"] not in ("accepted", "running"),
                          timeout=30)
        final[job_id] = client.get(f"/jobs/{job_id}").json()
    statuses = sorted(info["status"] for info in final.values())
    assert statuses == ["failed", "successful"], final
    winner = next(expected for job_id, expected in ids if final[job_id]["status"] == "successful")
    loser = next(job_id for job_id, _ in ids if final[job_id]["status"] == "failed")
    assert client.get(f"/jobs/{loser}/results").status_code == 409
    assert load_npy(client.get("/arrays/contested").content).tobytes() == winner.tobytes()
    assert eventually(lambda: not list((service_root / "tmp").glob(f"job-{loser}-*")))


def test_dismiss_a_queued_job(client, service_root):
    """A job waiting for a slot (every slot busy) is dismissed at once, not after the running
    jobs, and never runs: nothing appears under its output name."""
    executor = client.app.state.services.executor
    held = 0
    try:
        while executor._slots.acquire(blocking=False):
            held += 1
        x = np.zeros((1, 2, 2, 4), np.float32)
        response = client.post("/processes/depth_to_space/execution", headers=ASYNC, json={
            "inputs": {"x": inline(x), "block_size": 2},
            "outputs": {"result": {"transmissionMode": "reference", "name": "queued-y"}}})
        assert response.status_code == 201, response.text
        job_id = response.json()["jobID"]
        assert client.get(f"/jobs/{job_id}").json()["status"] == "accepted"
        started = time.monotonic()
        dismissed = client.delete(f"/jobs/{job_id}")
        assert time.monotonic() - started < 5, "the dismiss of a queued job waited for a slot"
        assert dismissed.status_code == 200 and dismissed.json()["status"] == "dismissed", dismissed.text
    finally:
        for _ in range(held):
            executor._slots.release()
    time.sleep(0.5)  # slots free: the job must not run now
    assert client.get(f"/jobs/{job_id}").json()["status"] == "dismissed"
    assert client.get("/arrays/queued-y/info").status_code == 404
    assert not list((service_root / "tmp").glob(f"job-{job_id}-*"))


# --- over HTTP: overwrites seen whole -----------------------------------------------------------

def test_overwrite_while_readers_hammer_it(client, service_root):
    """Readers download ``/arrays/NAME`` (NPY) and ``/arrays/NAME/zarr/zarr.json`` in a loop
    while the array is overwritten with constant arrays of other values: every answer is 200
    and every download is one of the versions, whole. The module's app, served by uvicorn in a
    thread (real connections, concurrent requests); 16 chunks, 8 overwrites (``python -m
    bench.overwrites``: a service process, 64 chunks, 100 overwrites)."""
    with served(client.app) as url:
        report = hammer(url, rows=16, overwrites=8)
    assert not report.problems, report.problems[:10]
    assert report.counts()["npy"] >= 10 and report.counts()["zarr.json"] >= 10, report.counts()
    assert len(set(report.seen["npy"])) > 1, "no download saw an overwrite"
    assert (report.final == 9).all()
    # The replaced versions are gone once nobody reads them.
    tmp = service_root / "tmp"
    assert eventually(lambda: not any(tmp.iterdir()), timeout=10), list(tmp.iterdir())
