"""Load benchmark (run by hand, not a test): ``python -m bench.load [--no-record]``.

Starts ``python -m service`` on 127.0.0.1 with its embedded Dask cluster (two worker
processes of one thread) on a temporary data root, and drives it from a pool of client
threads, each with its own keep-alive ``requests.Session``, with a shuffled mix of:

- sync: small synchronous executions of all seven operators, inputs inline as base64 NPY,
  ``response: "raw"`` (1,000 by default);
- job: async jobs (``Prefer: respond-async``) on stored inputs, polled until successful,
  their stored result downloaded (20 by default, all submitted first, so they run together
  with the rest);
- upload: ``PUT /arrays/NAME`` of a new NPY (16-256 KiB), then download it and delete it;
- download: ``GET /arrays/NAME`` of arrays stored before the run (NPY, 256 KiB);

at a concurrency of 32 by default. Every result is compared byte for byte with what the
``ops`` NumPy functions (or the uploaded bytes) give; any difference, non-2xx answer or
exception is an error. It reports p50/p99 latency and throughput per kind (a job's latency
is from its POST to ``successful`` seen; its result download is timed as a download), and
the server process's RSS, open descriptors and threads after a warm-up round and after the
run; the table becomes the ``bench.load`` section of ``bench/RESULTS.md`` (``--no-record``: printed only).

``tests/service/test_load.py`` runs the same workload, smaller, as a test.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import requests

import ops
from bench.common import free_port, load_npy, machine, npy_bytes, record_section, stop_process

NPY = "application/x-npy"
ROOT = Path(__file__).resolve().parent.parent
KINDS = ("sync", "job", "upload", "download", "delete")
HTTP_TIMEOUT = 60.0
JOB_TIMEOUT = 300.0
POLL_SECONDS = 0.05


def inline(array: np.ndarray) -> dict:
    return {"value": base64.b64encode(npy_bytes(array)).decode(), "encoding": "base64", "mediaType": NPY}


class LoadError(AssertionError):
    pass


def expect(response: requests.Response, status: int) -> requests.Response:
    if response.status_code != status:
        raise LoadError(f"{response.request.method} {response.url}: {response.status_code} (wanted {status}) "
                        f"{response.text[:300]}")
    return response


def same_bytes(what: str, content: bytes, expected: np.ndarray) -> None:
    got = load_npy(content)
    expected = np.asarray(expected)
    if got.dtype != expected.dtype or got.shape != expected.shape:
        raise LoadError(f"{what}: got {got.dtype}{list(got.shape)}, expected {expected.dtype}{list(expected.shape)}")
    if np.ascontiguousarray(got).tobytes() != np.ascontiguousarray(expected).tobytes():
        raise LoadError(f"{what}: the bytes differ from the ops result")


# --- the requests -------------------------------------------------------------------------------


def sync_case(rng: np.random.Generator, k: int) -> tuple[str, dict, np.ndarray]:
    """(process, JSON body, expected result): one small call of each operator in turn."""
    which = k % 7
    if which == 0:
        x = rng.standard_normal((2, 8, 8, 16), dtype=np.float32)
        mode = ("DCR", "CRD")[k % 2]
        return "depth_to_space", {"x": inline(x), "block_size": 2, "mode": mode}, ops.depth_to_space(x, 2, mode=mode)
    if which == 1:
        x = rng.integers(-1000, 1000, size=(2, 16, 16, 4), dtype=np.int16)
        return "space_to_depth", {"x": inline(x), "block_size": 2}, ops.space_to_depth(x, 2)
    if which == 2:
        x = rng.standard_normal((2, 8, 8, 3), dtype=np.float32)
        paddings = [[1, 1], [0, 2]]
        return ("space_to_batch", {"x": inline(x), "block_size": 2, "paddings": paddings},
                ops.space_to_batch(x, 2, paddings))
    if which == 3:
        x = rng.integers(0, 255, size=(2, 6, 4, 3), dtype=np.uint8)
        return ("space_to_batch_nd", {"x": inline(x), "block_shape": [3, 2], "paddings": [[0, 0], [0, 0]]},
                ops.space_to_batch_nd(x, [3, 2], [[0, 0], [0, 0]]))
    if which == 4:
        x = rng.standard_normal((12, 4, 3, 2)).astype(np.float64)
        return ("batch_to_space_nd", {"x": inline(x), "block_shape": [3, 2], "crops": [[1, 2], [0, 1]]},
                ops.batch_to_space_nd(x, [3, 2], [[1, 2], [0, 1]]))
    if which == 5:
        params = rng.standard_normal((32, 16), dtype=np.float32)
        indices = rng.integers(-32, 32, size=(64, 1), dtype=np.int64)
        return ("gather_nd", {"params": inline(params), "indices": inline(indices)},
                ops.gather_nd(params, indices))
    src = rng.integers(-2**20, 2**20, size=(8, 32), dtype=np.int32)
    scale = rng.uniform(-2, 2, size=32).astype(np.float32)
    dst = ("float32", "bfloat16")[k % 2]  # bfloat16 travels as raw <u2 bits (X-Array-Dtype)
    expected = ops.ascend_dequant(src, scale, dst_dtype=dst)
    return ("ascend_dequant", {"src": inline(src), "deq_scale": inline(scale), "dst_dtype": dst},
            expected.view(np.uint16) if dst == "bfloat16" else expected)


@dataclass
class Report:
    """What one run saw: latencies (s) per kind, errors, results checked per kind, wall time."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    errors: list[str] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=lambda: {k: 0 for k in KINDS})
    calls: dict[str, int] = field(default_factory=lambda: {k: 0 for k in KINDS})
    wall: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def timed(self, kind: str, started: float) -> None:
        with self._lock:
            self.latencies[kind].append(time.perf_counter() - started)

    def ok(self, kind: str) -> None:
        with self._lock:
            self.checked[kind] += 1

    def error(self, text: str) -> None:
        with self._lock:
            self.errors.append(text)

    def rows(self) -> list[dict]:
        out = []
        for kind in KINDS:
            seen = sorted(self.latencies[kind])
            if not seen:
                continue
            out.append({"kind": kind, "n": len(seen), "p50_ms": 1000 * float(np.percentile(seen, 50)),
                        "p99_ms": 1000 * float(np.percentile(seen, 99)), "max_ms": 1000 * seen[-1],
                        "per_s": len(seen) / self.wall})
        return out


class Sessions:
    """One keep-alive ``requests.Session`` per client thread, all closed at the end."""

    def __init__(self):
        self._local = threading.local()
        self._all: list[requests.Session] = []
        self._lock = threading.Lock()

    def get(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            with self._lock:
                self._all.append(session)
        return session

    def close(self) -> None:
        for session in self._all:
            session.close()


def run_load(url: str, *, n_sync: int, concurrency: int, n_jobs: int, n_uploads: int, n_downloads: int,
             seed: int = 0, prefix: str | None = None) -> Report:
    """One bounded load run against the service at ``url``; every call is made once (no
    retries) and its result checked. Arrays it stores are deleted before it returns."""
    prefix = prefix or f"load-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(seed)
    report = Report()
    sessions = Sessions()
    setup = requests.Session()
    stored: list[str] = []

    def put(name: str, array: np.ndarray, **params) -> None:
        expect(setup.put(f"{url}/arrays/{name}", data=npy_bytes(array), headers={"Content-Type": NPY},
                         params=params, timeout=HTTP_TIMEOUT), 201)
        stored.append(name)

    try:
        # Stored inputs of the jobs and the arrays the download calls read (not timed).
        job_inputs = []
        for k in range(max(1, min(n_jobs, 4))):
            x = rng.standard_normal((4, 32, 32, 8), dtype=np.float32)
            put(f"{prefix}-jobin-{k}", x, chunks="1,16,16,8")
            params = rng.standard_normal((256, 64), dtype=np.float32)
            put(f"{prefix}-params-{k}", params, chunks="64,64")
            indices = rng.integers(0, 256, size=(512, 1), dtype=np.int64)
            put(f"{prefix}-indices-{k}", indices, chunks="128,1")
            job_inputs.append((f"{prefix}-jobin-{k}", x, f"{prefix}-params-{k}", params, f"{prefix}-indices-{k}",
                               indices))
        statics = []
        for k in range(max(1, min(n_downloads, 4))):
            array = rng.integers(-2**31, 2**31 - 1, size=(64, 1024), dtype=np.int32)  # 256 KiB
            put(f"{prefix}-static-{k}", array, chunks="16,1024")
            statics.append((f"{prefix}-static-{k}", array))

        calls: list[tuple[str, Callable[[], None]]] = []
        for k in range(n_jobs):
            name, x, params_name, params, indices_name, indices = job_inputs[k % len(job_inputs)]
            if k % 2 == 0:
                process, inputs, expected = "depth_to_space", {"x": {"href": f"/arrays/{name}"}, "block_size": 2}, \
                    ops.depth_to_space(x, 2)
            else:
                process, inputs, expected = "gather_nd", {"params": {"href": f"/arrays/{params_name}"},
                                                          "indices": {"href": f"/arrays/{indices_name}"}}, \
                    ops.gather_nd(params, indices)
            calls.append(("job", _job_call(url, sessions, report, process, inputs, f"{prefix}-jobout-{k}", expected)))
        rest: list[tuple[str, Callable[[], None]]] = []
        for k in range(n_sync):
            process, inputs, expected = sync_case(rng, k)
            body = json.dumps({"inputs": inputs, "outputs": {"result": {"transmissionMode": "value"}},
                               "response": "raw"}).encode()
            rest.append(("sync", _sync_call(url, sessions, report, process, body, expected)))
        for k in range(n_uploads):
            rows = int(rng.integers(16, 257))
            array = rng.standard_normal((rows, 256), dtype=np.float32)  # 16-256 KiB
            rest.append(("upload", _upload_call(url, sessions, report, f"{prefix}-up-{k}", array)))
        for k in range(n_downloads):
            name, array = statics[k % len(statics)]
            rest.append(("download", _download_call(url, sessions, report, name, array)))
        order = rng.permutation(len(rest))
        calls += [rest[i] for i in order]  # the jobs first: they run while the rest goes on
        for kind, _ in calls:
            report.calls[kind] += 1

        def guarded(kind_and_call):
            kind, call = kind_and_call
            try:
                call()
            except Exception as error:  # an error of the service or of the transport: counted
                report.error(f"{kind}: {type(error).__name__}: {error}")

        started = time.perf_counter()
        with ThreadPoolExecutor(concurrency, thread_name_prefix="load") as pool:
            list(pool.map(guarded, calls))
        report.wall = time.perf_counter() - started
    finally:
        sessions.close()
        for name in stored:
            with contextlib.suppress(requests.RequestException):
                setup.delete(f"{url}/arrays/{name}", timeout=HTTP_TIMEOUT)
        setup.close()
    return report


def _sync_call(url, sessions, report, process, body, expected):
    def call():
        started = time.perf_counter()
        response = sessions.get().post(f"{url}/processes/{process}/execution", data=body,
                                       headers={"Content-Type": "application/json"}, timeout=HTTP_TIMEOUT)
        report.timed("sync", started)
        expect(response, 200)
        if not response.headers.get("content-type", "").startswith(NPY):
            raise LoadError(f"sync {process}: Content-Type {response.headers.get('content-type')!r}")
        same_bytes(f"sync {process}", response.content, expected)
        report.ok("sync")
    return call


def _job_call(url, sessions, report, process, inputs, result_name, expected):
    def call():
        session = sessions.get()
        started = time.perf_counter()
        submitted = expect(session.post(f"{url}/processes/{process}/execution", headers={"Prefer": "respond-async"},
                                        json={"inputs": inputs, "outputs": {"result": {
                                            "transmissionMode": "reference", "name": result_name}},
                                            "response": "document"},  # a results document with the link
                                        timeout=HTTP_TIMEOUT), 201)
        job_id = submitted.json()["jobID"]
        deadline = time.monotonic() + JOB_TIMEOUT
        while True:
            info = expect(session.get(f"{url}/jobs/{job_id}", timeout=HTTP_TIMEOUT), 200).json()
            if info["status"] not in ("accepted", "running"):
                break
            if time.monotonic() > deadline:
                raise LoadError(f"job {job_id} ({process}) still {info['status']} after {JOB_TIMEOUT:.0f} s")
            time.sleep(POLL_SECONDS)
        report.timed("job", started)
        if info["status"] != "successful":
            raise LoadError(f"job {job_id} ({process}) is {info['status']}: {info.get('message')}")
        results = expect(session.get(f"{url}/jobs/{job_id}/results", timeout=HTTP_TIMEOUT), 200).json()
        if results != {"result": {"href": f"/arrays/{result_name}", "type": NPY}}:
            raise LoadError(f"job {job_id}: results {results}")
        started = time.perf_counter()
        download = session.get(f"{url}/arrays/{result_name}", timeout=HTTP_TIMEOUT)
        report.timed("download", started)
        expect(download, 200)
        same_bytes(f"job {process} result", download.content, expected)
        report.ok("job")
        started = time.perf_counter()
        expect(session.delete(f"{url}/arrays/{result_name}", timeout=HTTP_TIMEOUT), 204)
        report.timed("delete", started)
    return call


def _upload_call(url, sessions, report, name, array):
    body = npy_bytes(array)

    def call():
        session = sessions.get()
        started = time.perf_counter()
        response = session.put(f"{url}/arrays/{name}", data=body, headers={"Content-Type": NPY}, timeout=HTTP_TIMEOUT)
        report.timed("upload", started)
        info = expect(response, 201).json()
        if info["shape"] != list(array.shape) or info["dtype"] != "float32":
            raise LoadError(f"upload {name}: info {info}")
        started = time.perf_counter()
        download = session.get(f"{url}/arrays/{name}", timeout=HTTP_TIMEOUT)
        report.timed("download", started)
        expect(download, 200)
        if download.content != body:
            raise LoadError(f"upload {name}: the download is not the uploaded NPY")
        report.ok("upload")
        started = time.perf_counter()
        expect(session.delete(f"{url}/arrays/{name}", timeout=HTTP_TIMEOUT), 204)
        report.timed("delete", started)
    return call


def _download_call(url, sessions, report, name, array):
    def call():
        started = time.perf_counter()
        download = sessions.get().get(f"{url}/arrays/{name}", timeout=HTTP_TIMEOUT)
        report.timed("download", started)
        expect(download, 200)
        same_bytes(f"download {name}", download.content, array)
        report.ok("download")
    return call


# --- the server's resources ----------------------------------------------------------------------


def resources(pid: int) -> dict:
    """RSS (bytes), open descriptors and threads of one process (psutil)."""
    import psutil

    proc = psutil.Process(pid)
    with proc.oneshot():
        return {"rss": proc.memory_info().rss, "fds": proc.num_fds(), "files": len(proc.open_files()),
                "threads": proc.num_threads()}


# --- the benchmark -------------------------------------------------------------------------------


def start_service(work: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHUNKED_TENSOR_OPS_")}
    env["DASK_TEMPORARY_DIRECTORY"] = str(work)
    log = open(work / "service.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port),
                             "--data-root", str(work / "data")], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the service exited with {proc.returncode}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{url}/healthz", timeout=5).status_code == 200:
                return proc, url
        time.sleep(0.25)
    stop_service(proc)
    raise TimeoutError("the service did not answer /healthz in 90 s")


def stop_service(proc: subprocess.Popen) -> None:
    stop_process(proc)


def table(report: Report) -> str:
    lines = ["| kind | requests | p50 | p99 | max | throughput |", "|---|---|---|---|---|---|"]
    for row in report.rows():
        lines.append(f"| {row['kind']} | {row['n']} | {row['p50_ms']:.1f} ms | {row['p99_ms']:.1f} ms | "
                     f"{row['max_ms']:.0f} ms | {row['per_s']:.1f}/s |")
    total = sum(len(v) for v in report.latencies.values())
    lines.append(f"| all | {total} | | | | {total / report.wall:.1f}/s |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.splitlines()[0])
    parser.add_argument("--sync", type=int, default=1000, help="sync requests (default 1000)")
    parser.add_argument("--concurrency", type=int, default=32, help="client threads (default 32)")
    parser.add_argument("--jobs", type=int, default=20, help="async jobs (default 20)")
    parser.add_argument("--uploads", type=int, default=100, help="upload+download+delete rounds (default 100)")
    parser.add_argument("--downloads", type=int, default=100, help="downloads of stored arrays (default 100)")
    parser.add_argument("--no-record", action="store_true", help="print only; do not record in bench/RESULTS.md")
    args = parser.parse_args()
    print(machine(), flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench-load-", dir="/tmp"))
    proc = None
    try:
        proc, url = start_service(work)
        warm = run_load(url, n_sync=max(64, args.sync // 10), concurrency=args.concurrency, n_jobs=min(4, args.jobs),
                        n_uploads=10, n_downloads=10, seed=1)
        if warm.errors:
            raise SystemExit(f"errors in the warm-up round: {warm.errors[:5]}")
        time.sleep(2)
        before = resources(proc.pid)
        report = run_load(url, n_sync=args.sync, concurrency=args.concurrency, n_jobs=args.jobs,
                          n_uploads=args.uploads, n_downloads=args.downloads, seed=2)
        time.sleep(2)
        after = resources(proc.pid)
        lost = {k: report.calls[k] - report.checked[k] for k in ("sync", "job", "upload", "download")}
        print(table(report))
        print(f"\nwall {report.wall:.1f} s; errors {len(report.errors)}; unchecked results {lost}")
        print(f"server before/after: RSS {before['rss'] / 2**20:.0f} -> {after['rss'] / 2**20:.0f} MiB, "
              f"fds {before['fds']} -> {after['fds']}, threads {before['threads']} -> {after['threads']}")
        for error in report.errors[:20]:
            print("  ", error)
        if not args.no_record:
            record(args, report, before, after, lost, machine())
        if report.errors or any(lost.values()):
            raise SystemExit(1)
    finally:
        if proc is not None:
            stop_service(proc)
        shutil.rmtree(work, ignore_errors=True)


def record(args, report: Report, before: dict, after: dict, lost: dict, machine_line: str) -> None:
    """This run as the current ``bench.load`` section of bench/RESULTS.md (the one it replaces
    moves to bench/history/)."""
    record_section("bench.load", (
        f"{machine_line.strip()}\n\n{table(report)}\n\n"
        f"{args.sync} sync executions (7 operators, small inline NPY inputs, `response: raw`), {args.jobs} async "
        f"jobs on stored inputs (DepthToSpace / GatherNd, submitted first, result downloaded), {args.uploads} "
        f"upload + download + delete rounds (16-256 KiB NPY) and {args.downloads} downloads of stored 256 KiB "
        f"arrays, shuffled, from {args.concurrency} client threads (one keep-alive `requests.Session` each) "
        f"against `python -m service` with its embedded cluster (2 worker processes x 1 thread) on 127.0.0.1, "
        f"after a warm-up round. Wall {report.wall:.1f} s; errors: {len(report.errors)}; results not matching "
        f"the `ops` result byte for byte (or lost): {sum(lost.values())}. A job's latency is from its POST to "
        f"`successful` seen by polling every {POLL_SECONDS * 1000:.0f} ms (the service runs at most 4 jobs at "
        f"once; the others queue). Server process after the warm-up -> after the run (2 s settle): RSS "
        f"{before['rss'] / 2**20:.0f} -> {after['rss'] / 2**20:.0f} MiB, open descriptors {before['fds']} -> "
        f"{after['fds']}, threads {before['threads']} -> {after['threads']}."
    ))


if __name__ == "__main__":
    main()
