"""A bounded load test on loopback against a real ``python -m service`` process: sync small
executions of every operator (inline NPY, ``response: raw``) at a concurrency of 16, async
jobs on stored inputs running meanwhile, uploads and downloads interleaved (the workload of
``bench/load.py``, smaller). Zero errors, every result byte for byte the ``ops`` result, and
the server's memory, open descriptors and threads back near where a warm-up round left them.
"""

from __future__ import annotations

import time

import pytest

from bench.load import resources, run_load
from tests.service.conftest import eventually
from tests.service.processes import start_server, stop_server

SETTLE_S = 15.0
# The server after the run against the server after the warm-up round (same workload, smaller).
RSS_MARGIN = 96 * 2**20   # allocator high-water marks, Dask's and uvicorn's caches
FDS_MARGIN = 8            # keep-alive sockets the clients just closed, still being torn down
THREADS_MARGIN = 4
# SQLite's -wal/-shm files and the log are opened and closed on their own schedule: one more
# connection at the moment of measuring is its database, -wal and -shm. A leak per request
# would show as hundreds of files after this run, not three.
FILES_MARGIN = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("load")
    srv = start_server(base / "data", base / "server.log")
    yield srv
    stop_server(srv)


def _settled(pid: int, baseline: dict) -> dict:
    """The server's resources once descriptors, open files and threads are back within the
    margins (or after SETTLE_S): connections close, readers let go of their arrays and pool
    threads idle asynchronously."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        now = resources(pid)
        settled = (now["fds"] <= baseline["fds"] + FDS_MARGIN and now["files"] <= baseline["files"] + FILES_MARGIN
                   and now["threads"] <= baseline["threads"] + THREADS_MARGIN)
        if settled or time.monotonic() > deadline:
            return now
        time.sleep(0.25)


@pytest.mark.smoke
def test_load(server):
    pid = server.proc.pid
    started = time.monotonic()
    workload = dict(n_sync=120, concurrency=16, n_jobs=3, n_uploads=12, n_downloads=12)
    # The warm-up round is the same workload: the service's thread pools (anyio's, up to 40
    # threads, and Dask's per calling thread) and caches grow to what it drives, and stay.
    warm = run_load(server.url, **workload, seed=1)
    assert not warm.errors, warm.errors[:10]
    time.sleep(1.0)
    baseline = resources(pid)

    report = run_load(server.url, **workload, seed=2)
    assert not report.errors, f"{len(report.errors)} errors: {report.errors[:10]}\n{server.log_tail()}"
    expected = {"sync": 120, "job": 3, "upload": 12, "download": 12}
    assert {k: report.calls[k] for k in expected} == expected
    # Every call was answered and its result compared byte for byte: none lost, none corrupted.
    assert {k: report.checked[k] for k in expected} == expected
    assert len(report.latencies["download"]) == 12 + 12 + 3  # plus each upload's and each job's result

    after = _settled(pid, baseline)
    summary = (f"baseline {baseline}, after {after}; wall {report.wall:.1f} s; "
               + ", ".join(f"{r['kind']} p50 {r['p50_ms']:.0f} ms p99 {r['p99_ms']:.0f} ms" for r in report.rows()))
    print(summary)
    assert after["fds"] <= baseline["fds"] + FDS_MARGIN, summary
    assert after["files"] <= baseline["files"] + FILES_MARGIN, summary  # no arrays or databases left open
    assert after["threads"] <= baseline["threads"] + THREADS_MARGIN, summary
    assert after["rss"] <= baseline["rss"] + RSS_MARGIN, summary
    # Nothing the run stored is left, nor any replaced or half-built array.
    assert eventually(lambda: not any((server.root / "tmp").iterdir())), list((server.root / "tmp").iterdir())
    assert time.monotonic() - started < 90, summary
