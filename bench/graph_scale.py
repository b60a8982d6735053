"""Graph scaling benchmark (run by hand, not a test): ``python -m bench.graph_scale``.

How the operators' Dask graphs grow with the number of input chunks, on inputs of tiny chunks
(64-byte blocks), for 1e3, 1e4, 1e5 and 1e6 input chunks (``--sizes``):

- build: the client's wall-clock time to *call* the operator on a lazy input (``da.from_zarr``
  of a metadata-only Zarr array in memory: nothing is read or computed);
- tasks per input chunk, raw: the length of the operator's high-level graph (input layer
  included), divided by the input chunks;
- tasks per input chunk as the scheduler sees them: the graph that writes the result into a
  Zarr array (``da.store``, as a Zarr-to-Zarr job does), as the service and the command line
  submit it (``ops._fused_stores.fusing``: multi-output tasks write their own blocks, and a
  tree of "done" tasks, one per 32 output blocks, waits on the tasks that write them), after
  Dask's optimisation (blockwise fusion), counted task by task. A plain Zarr copy
  (``from_zarr -> store``) is the reference line (1.03: a store task per chunk, and the
  tree). Counting materialises the graph, so
  it is done up to ``--max-count-chunks`` (2e5) input chunks; larger sizes show the count per
  chunk of the largest counted size, marked ``*`` (the count per chunk is flat across sizes);
  with ``--graph-memory``, also the bytes those made tasks hold (traced with ``tracemalloc``),
  per input chunk and per task: what the scheduler holds of a job's graph grows with them;
- end to end, up to ``--max-cluster-chunks`` (2e5) input chunks: a real ``dask scheduler`` and
  two ``dask worker`` processes (one thread each) on 127.0.0.1 read a Zarr input from local
  disk, apply the operator and write a Zarr output; against a plain Zarr copy of the same
  chunks on the same cluster, as the ratio of input chunks per second (op / copy). Both are
  submitted as the service and the command line submit a job: one ``client.compute`` of the
  store graph, which the scheduler optimizes and materialises. On such small blocks the time
  is the scheduler's and the workers' per-task overhead. With ``--store memory`` the input and
  output arrays are Zarr arrays in memory instead (each worker reads its own copy of the
  input, sent once with the graph, and writes into its own copy of the output): no file per
  chunk. (Measured: a plain copy of these chunks is no faster from memory than from local
  disk; the per-task costs of the scheduler and the workers bound both.)

Every operator and size runs in a child process with a time limit (``--time-limit``): past it
the child is stopped and the table says "over N s" (a build that takes minutes is a finding,
not a hang). The operators: DepthToSpace and SpaceToDepth bs=2, SpaceToBatchND [2, 2] without
and with paddings 1, BatchToSpaceND [2, 2] without and with crops 1 (all on float32
``[4, H, W, 4]`` chunks ``[1, 2, 2, 4]``), AscendDequant (int32 ``[m, 16]`` chunks ``[4, 16]``,
a float32 vector scale; and per_token, a NumPy scale per row) and GatherNd (params as above,
1e3 lazy index chunks of 8 tuples).

The run is recorded as this benchmark's section of bench/RESULTS.md (``--no-record``: printed
only); ``--previous RESULTS_MD`` shows the tables of that file's section of this benchmark
in the new one as the previous run, for a before/after comparison on the same machine (e.g. a
run on an export of an earlier commit). The build times are plotted (log-log) in
bench/graph_scale.png.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import multiprocessing
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import dask
import dask.array as da
import numpy as np
import zarr

import ops
from ops._fused_stores import fusing
from bench.common import RESULTS, Processes, machine, record_section

ROOT = Path(__file__).resolve().parent.parent
PLOT = ROOT / "bench" / "graph_scale.png"
#: Index tuples per GatherNd index chunk, and the index chunks (fixed: the params grow).
TUPLES_PER_CHUNK, INDEX_CHUNKS = 8, 1000
DEQUANT_COLUMNS, DEQUANT_ROWS = 16, 4
#: Each worker's memory limit. A worker keeps the state of many of the tasks it has run (about
#: 10 KiB each, whatever their results) until the computation ends: at 2e5 chunks, 1 GiB
#: workers paused at 80% of it.
WORKER_MEMORY = "2GiB"


# --- inputs ------------------------------------------------------------------------------------


def image_shape(chunks: int, side: int = 2, channel_chunks: int = 1) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shape, chunk shape) of a float32 [4, H, W, 4] input with about ``chunks`` blocks of
    [1, side, side, 4 / channel_chunks] (H and W even)."""
    per_batch = max(chunks // 4 // channel_chunks, 1)
    even = side % 2 + 1  # an odd side needs an even block count for even H and W
    h = max(int(math.isqrt(per_batch)) // even * even, even)
    w = max(per_batch // h // even * even, even)
    return (4, side * h, side * w, 4), (1, side, side, 4 // channel_chunks)


def inputs_of(chunks: int) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], str]]:
    """name -> (shape, chunk shape, dtype) of every input at this size."""
    return {
        "x": (*image_shape(chunks), "float32"),
        "x_c2": (*image_shape(chunks, channel_chunks=2), "float32"),  # channels in 2 chunks
        "x_3": (*image_shape(chunks, side=3), "float32"),  # H/W chunks of 3: not multiples of 2
        "src": ((DEQUANT_ROWS * chunks, DEQUANT_COLUMNS), (DEQUANT_ROWS, DEQUANT_COLUMNS), "int32"),
        "indices": ((TUPLES_PER_CHUNK * INDEX_CHUNKS, 3), (TUPLES_PER_CHUNK, 3), "int64"),
    }


def metadata_array(store, shape, chunks, dtype) -> zarr.Array:
    """A Zarr array with no chunk written (reads give the fill value)."""
    return zarr.create_array(store, shape=shape, chunks=chunks, dtype=dtype, fill_value=0, zarr_format=3,
                             overwrite=True)


# --- the operators ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    inputs: tuple[str, ...]  # the first one's chunks are "the input chunks"
    build: Callable  # (lazy inputs by name) -> lazy result
    cluster: bool = True  # also run end to end (else build and counts only)


def _per_token_scale(rows: int) -> np.ndarray:
    return np.linspace(0.5, 2.0, rows, dtype=np.float32)


CASES = [
    Case("depth_to_space", ("x",), lambda a: ops.depth_to_space(a["x"], 2)),
    Case("space_to_depth", ("x",), lambda a: ops.space_to_depth(a["x"], 2)),
    Case("depth_to_space, channels in 2 chunks", ("x_c2",), lambda a: ops.depth_to_space(a["x_c2"], 2), False),
    Case("space_to_depth, channels in 2 chunks", ("x_c2",), lambda a: ops.space_to_depth(a["x_c2"], 2), False),
    Case("space_to_depth, H/W chunks of 3", ("x_3",), lambda a: ops.space_to_depth(a["x_3"], 2), False),
    Case("space_to_batch_nd", ("x",), lambda a: ops.space_to_batch_nd(a["x"], [2, 2], [[0, 0], [0, 0]])),
    Case("space_to_batch_nd pad 1", ("x",), lambda a: ops.space_to_batch_nd(a["x"], [2, 2], [[1, 1], [1, 1]])),
    Case("batch_to_space_nd", ("x",), lambda a: ops.batch_to_space_nd(a["x"], [2, 2], [[0, 0], [0, 0]])),
    Case("batch_to_space_nd crop 1", ("x",), lambda a: ops.batch_to_space_nd(a["x"], [2, 2], [[1, 1], [1, 1]])),
    Case("ascend_dequant", ("src",),
         lambda a: ops.ascend_dequant(a["src"], np.linspace(0.5, 2, DEQUANT_COLUMNS, dtype=np.float32),
                                      dst_dtype="float32")),
    Case("ascend_dequant per_token", ("src",),
         lambda a: ops.ascend_dequant(a["src"], _per_token_scale(a["src"].shape[0]), dst_dtype="float32",
                                      policy="per_token")),
    Case("gather_nd", ("x", "indices"), lambda a: ops.gather_nd(a["x"], a["indices"])),
]
COPY = {"x": Case("Zarr copy (float32 x)", ("x",), lambda a: a["x"]),
        "src": Case("Zarr copy (int32 src)", ("src",), lambda a: a["src"])}


def input_chunks(case: Case, chunks: int) -> int:
    """The case's input chunks at this size (GatherNd: params + index chunks)."""
    shapes = inputs_of(chunks)
    return sum(math.prod(-(-s // c) for s, c in zip(*shapes[name][:2])) for name in case.inputs)


def stored_graph(result: da.Array, store) -> da.Array:
    """``result`` written into a new Zarr array in ``store`` (its own chunks when regular, else
    its largest chunk per axis after a rechunk, as a Zarr-to-Zarr job must)."""
    if not all(ops._chunks.zarr_regular(c) for c in result.chunks):
        result = result.rechunk(tuple(max(c) for c in result.chunks))
    z = metadata_array(store, result.shape, tuple(max(c[0], 1) for c in result.chunks), result.dtype)
    return da.store(result, z, lock=False, compute=False)


def scheduler_tasks(result: da.Array) -> int:
    """Tasks of the store graph of ``result`` as a job submits it (``ops._fused_stores.fusing``:
    its tree of "done" tasks included), after its optimisation (materialised)."""
    (optimised,) = dask.optimize(fusing(stored_graph(result, zarr.storage.MemoryStore())))
    return len(dict(optimised.__dask_graph__()))


def scheduler_tasks_and_bytes(holder: list) -> tuple[int, int]:
    """``scheduler_tasks`` of the result in ``holder`` (taken out of it) and the bytes that the
    made tasks hold in this process: allocations traced while the graph is optimised and made
    and still held once the collections are dropped (what their layers cached is not counted),
    i.e. the tasks, their arguments and their dependency sets. The scheduler holds the same
    task objects, one per task."""
    import gc
    import tracemalloc

    stored = fusing(stored_graph(holder.pop(), zarr.storage.MemoryStore()))
    gc.collect()
    tracemalloc.start()
    try:
        (optimised,) = dask.optimize(stored)
        graph = dict(optimised.__dask_graph__())
        del optimised, stored
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return len(graph), held


# --- build measurements, each in a child process with a time limit --------------------------


def _measure(case: Case, chunks: int, count: bool, scratch: str, pipe, graph_memory: bool = False) -> None:
    shapes = inputs_of(chunks)
    lazy = {name: da.from_zarr(metadata_array(zarr.storage.MemoryStore(), *shapes[name]))
            for name in case.inputs}
    with dask.config.set({"chunked-tensor-ops.scratch": scratch}):
        started = time.perf_counter()
        result = case.build(lazy)
        pipe.send({"build": time.perf_counter() - started})
        regular = all(ops._chunks.zarr_regular(c) for c in result.chunks)
        # The length of a lazily made layer is known once its tasks are made: this may
        # materialise them (and run past the limit, then "-").
        pipe.send({"raw": len(result.__dask_graph__()), "zarr_rechunk": not regular})
        if count and graph_memory:
            # Built again, from new inputs: the count above made the lazy layers' tasks, and
            # tasks made before the tracing starts would not be counted.
            del result  # so that what its layers cache is freed before the bytes are read
            fresh = {name: da.from_zarr(metadata_array(zarr.storage.MemoryStore(), *shapes[name]))
                     for name in case.inputs}
            holder = [case.build(fresh)]
            del fresh
            tasks, held = scheduler_tasks_and_bytes(holder)
            pipe.send({"graph_bytes": held, "scheduler": tasks})
        else:
            pipe.send({"scheduler": scheduler_tasks(result) if count else None})


def measure(case: Case, chunks: int, count: bool, limit: float, scratch: str, graph_memory: bool = False) -> dict:
    """{build, raw, scheduler} of ``case`` at ``chunks`` (and graph_bytes, with ``graph_memory``
    where it counts); {"over": limit} when the build (or the count) does not finish within
    ``limit`` seconds (the child is stopped)."""
    context = multiprocessing.get_context("fork")  # the parent holds no threads yet
    parent, child = context.Pipe(duplex=False)
    proc = context.Process(target=_measure, args=(case, chunks, count, scratch, child, graph_memory), daemon=True)
    proc.start()
    child.close()
    found, deadline = {}, time.monotonic() + limit
    try:
        while "scheduler" not in found:
            left = deadline - time.monotonic()
            if left <= 0 or not parent.poll(left):
                return {**found, "over": limit}
            found.update(parent.recv())
    except EOFError:
        return {**found, "error": f"child exited with {proc.exitcode}"}
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
    return found


# --- end to end on a cluster ------------------------------------------------------------------


def _random_block(kind: str, bounds, shape, dtype, block_id=None):
    """A block of random input, seeded by its position (every block of an input has the same shape)."""
    rng = np.random.default_rng([kind == "indices", kind == "src", *block_id])
    if kind == "indices":
        return np.stack([rng.integers(0, b, shape[0]) for b in bounds], axis=1).astype(dtype)
    if kind == "src":
        return rng.integers(-1000, 1000, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _store(root: Path, name: str, memory: bool):
    """A Zarr store for the array ``name``: in memory, or a directory under ``root``."""
    return zarr.storage.MemoryStore() if memory else zarr.storage.LocalStore(root / f"{name}.zarr")


def write_inputs(root: Path, chunks: int, names, memory: bool = False) -> dict[str, zarr.Array]:
    """Each input as a Zarr array of random values under ``root`` (or in memory), written from
    this process (at most tens of megabytes: zarr writes the chunk files concurrently, several
    times faster than a graph of one task per tiny chunk on the cluster)."""
    arrays = {}
    shapes = inputs_of(chunks)
    for name in names:
        shape, chunk, dtype = shapes[name]
        z = metadata_array(_store(root, name, memory), shape, chunk, dtype)
        normalized = da.core.normalize_chunks(chunk, shape)
        blocks = da.map_blocks(_random_block, name, shapes["x"][0][:3], chunk, np.dtype(dtype),
                               chunks=normalized, dtype=dtype, meta=np.empty((0,) * len(shape), dtype))
        z[...] = blocks.compute(scheduler="threads")
        arrays[name] = z
    return arrays


def end_to_end(case: Case, client, arrays, root: Path, limit: float, scratch: str,
               memory: bool = False) -> float | str:
    """Seconds of build + run of ``from_zarr -> case -> store`` on the cluster, submitted as
    the service submits it; "over N s" past the limit. ``memory``: into a Zarr array in memory
    (each worker writes into its own copy), not under ``root``."""
    from bench.out_of_core import compute_store

    out = root / "out.zarr"
    started = time.perf_counter()
    try:
        with dask.config.set({"chunked-tensor-ops.scratch": scratch}):
            result = case.build({name: da.from_zarr(arrays[name]) for name in case.inputs})
        compute_store(client, stored_graph(result, _store(root, "out", memory)),
                      timeout=max(limit - (time.perf_counter() - started), 1), as_the_service_does=True)
        return time.perf_counter() - started
    except TimeoutError:
        return f"over {limit:.0f} s"
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _reset_memory_peak() -> int:
    """In the process it runs in (the scheduler): reset the kernel's RSS high-water mark and
    return the RSS now, in bytes."""
    with contextlib.suppress(OSError):  # clear_refs "5": VmHWM back to the RSS (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    return _status_bytes("VmRSS")


def _memory_peak() -> int:
    """In the process it runs in: its RSS high-water mark (since ``_reset_memory_peak``), bytes."""
    return _status_bytes("VmHWM")


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(f"{field}:")).split()[1]) * 1024


def _add_scheduler_memory(times: dict, key: tuple, before: int, peak: int) -> None:
    """One run's scheduler RSS (before, peak) into ``times[(*key, "scheduler")]``: the RSS
    before the case's first run and the highest peak of its runs."""
    first_before, highest = times.get((*key, "scheduler"), (before, 0))
    times[(*key, "scheduler")] = (first_before, max(highest, peak))


def run_cluster(sizes, cases, limit: float, work: Path, repeat: int, memory: bool = False) -> dict:
    """{(case name, chunks): best seconds or "over N s"}, copies included, on one cluster; each
    case runs ``repeat`` times in rounds (copies first in each), so a slow moment of the shared
    machine does not land on one case only. Also {(case name, chunks, "scheduler"): (RSS before,
    peak RSS)} of the scheduler process in bytes, over the case's runs: what a job's graph
    costs the scheduler (its ordering, its task states) shows there, not in the workers.
    ``memory``: inputs and outputs in memory, not on local disk."""
    from bench.out_of_core import Cluster

    times = {}
    procs = Processes(work)
    try:
        cluster = Cluster(procs, work, memory_limit=WORKER_MEMORY)
        for chunks in sizes:
            root = work / f"data-{chunks}"
            arrays = write_inputs(root, chunks, sorted({n for case in cases for n in case.inputs}), memory)
            needed = {case.inputs[0] for case in cases}
            for _ in range(repeat):
                for case in [COPY[name] for name in COPY if name in needed] + cases:
                    if isinstance(times.get((case.name, chunks)), str):
                        continue  # over the limit in the first round: not again
                    before = cluster.client.run_on_scheduler(_reset_memory_peak)
                    took = end_to_end(case, cluster.client, arrays, root, limit, str(work / "scratch"), memory)
                    peak = cluster.client.run_on_scheduler(_memory_peak)
                    best = times.get((case.name, chunks))
                    if best is None or (not isinstance(took, str) and took < best):
                        times[case.name, chunks] = took  # a time past the limit only when no run finished
                    _add_scheduler_memory(times, (case.name, chunks), before, peak)
                    print(f"  cluster {case.name} @ {chunks}: {_seconds(took)}; scheduler "
                          f"{before // 2**20} -> {peak // 2**20} MiB", flush=True)
            shutil.rmtree(root, ignore_errors=True)
        cluster.close()
    finally:
        procs.stop()
    return times


# --- tables, plot, record -----------------------------------------------------------------------


def _seconds(value) -> str:
    if isinstance(value, str):
        return value
    return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"


def build_table(results: dict, sizes, cases) -> str:
    memory = any("graph_bytes" in got for got in results.values())  # --graph-memory
    lines = ["| operator | input chunks | build | tasks / input chunk, raw | tasks / input chunk, scheduler |"
             + (" graph bytes / input chunk (per task) |" if memory else ""),
             "|---|---|---|---|---|" + ("---|" if memory else "")]
    for case in [COPY["x"], COPY["src"], *cases]:
        per_chunk = None  # the last counted size's, for the sizes not counted
        for size in sizes:
            got = results.get((case.name, size))
            if got is None:
                continue
            n = input_chunks(case, size)
            build = _seconds(got["build"]) if "build" in got else got.get("error") or f"over {got['over']:.0f} s"
            build = "-" if case in COPY.values() else build  # nothing to build: the input itself
            over = f"count over {got['over']:.0f} s" if "over" in got and "build" in got else "-"
            raw = f"{got['raw'] / n:.2f}" if "raw" in got else over
            if got.get("scheduler") is not None:
                per_chunk = got["scheduler"] / n
                sched = f"{per_chunk:.2f}" + (" (r)" if got.get("zarr_rechunk") else "")
            elif "raw" in got and "over" in got:
                sched = over  # the count of the optimised graph ran past the limit
            elif per_chunk is not None and "build" in got:
                sched = f"{per_chunk:.2f}*" + (" (r)" if got.get("zarr_rechunk") else "")
            else:
                sched = "-"
            held = got.get("graph_bytes")
            held = f"{held / n:,.0f} ({held / got['scheduler']:,.0f}) |" if held is not None else "- |"
            lines.append(f"| {case.name} | {n:,} | {build} | {raw} | {sched} |" + (f" {held}" if memory else ""))
    return "\n".join(lines)


def cluster_table(times: dict, sizes, cases) -> str:
    lines = ["| operator | input chunks | copy | operator | copy chunks/s | operator chunks/s | op / copy "
             "| scheduler MiB, copy | scheduler MiB, operator |",
             "|---|---|---|---|---|---|---|---|---|"]
    for case in cases:
        for size in sizes:
            if (case.name, size) not in times:
                continue
            copy = COPY[case.inputs[0]]
            n, n_copy = input_chunks(case, size), input_chunks(copy, size)
            t_copy, t_op = times[copy.name, size], times[case.name, size]
            rate_copy = f"{n_copy / t_copy:,.0f}" if not isinstance(t_copy, str) else "-"
            rate_op = f"{n / t_op:,.0f}" if not isinstance(t_op, str) else "-"
            ratio = (f"{(n / t_op) / (n_copy / t_copy):.2f}x"
                     if not isinstance(t_op, str) and not isinstance(t_copy, str) else "-")
            lines.append(f"| {case.name} | {n:,} | {_seconds(t_copy)} | {_seconds(t_op)} | {rate_copy} | {rate_op} "
                         f"| {ratio} | {_memory(times, copy, size)} | {_memory(times, case, size)} |")
    return "\n".join(lines)


def _memory(times: dict, case: Case, size: int) -> str:
    """The scheduler's RSS before the case's first run -> its peak over the case's runs."""
    got = times.get((case.name, size, "scheduler"))
    return f"{got[0] / 2**20:,.0f} -> {got[1] / 2**20:,.0f}" if got else "-"


def plot(results: dict, sizes, cases, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.set_prop_cycle(color=plt.cm.tab20.colors[:12], marker=["o", "s", "^", "D"] * 3)
    for case in cases:
        points = [(input_chunks(case, s), results[case.name, s]["build"]) for s in sizes
                  if "build" in results.get((case.name, s), {})]
        if points:
            ax.plot(*zip(*points), label=case.name)
    ax.axhline(2.0, color="grey", linestyle="--", label="target: 2 s at 1e6 chunks")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("input chunks")
    ax.set_ylabel("client build time (s)")
    ax.set_title("Time to call the operator on a lazy input (points missing: over the time limit)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def previous_section(results: Path) -> str:
    """The ``bench.graph_scale`` section's run line and tables in ``results`` (a RESULTS.md),
    as an earlier run to compare with."""
    text = results.read_text()
    match = re.search(r"^## `python -m bench\.graph_scale`\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    if match is None:
        return ""
    body = match.group(1)
    body = body.split("\n### Previous run", 1)[0]  # one earlier run is kept, not a chain of them
    run = re.search(r"Latest run: ([^,]+), code at (.+?)\. ", body)
    tables = re.findall(r"(?:^\|.*\n)+", body, flags=re.M)
    if not run or not tables:
        return ""
    return (f"### Previous run ({run.group(1)}, code at {run.group(2)}), same machine\n\n"
            + "\n".join(tables).rstrip("\n") + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1e3,1e4,1e5,1e6", help="input chunk counts, comma-separated")
    parser.add_argument("--ops", help="only the operators whose name contains one of these (comma-separated; "
                                      "'=name': that name exactly, e.g. '=space_to_batch_nd' without 'pad 1')")
    parser.add_argument("--no-cluster", action="store_true", help="build and task counts only")
    parser.add_argument("--max-cluster-chunks", type=float, default=2e5)
    parser.add_argument("--max-count-chunks", type=float, default=2e5,
                        help="count scheduler tasks up to this size (the count materialises the graph)")
    parser.add_argument("--graph-memory", action="store_true",
                        help="where tasks are counted, also trace the bytes the made graph holds (slower counts)")
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per operator and size")
    parser.add_argument("--repeat", type=int, default=2, help="end-to-end runs of each case (the best counts)")
    parser.add_argument("--store", choices=["local", "memory"], default="local",
                        help="end to end: Zarr arrays on local disk (default) or in memory, one copy per worker")
    parser.add_argument("--no-record", action="store_true", help="print only")
    parser.add_argument("--from-log", type=Path, metavar="LOG",
                        help="make the tables, plot and record from the printed output of a run (same options)")
    parser.add_argument("--previous", type=Path, metavar="RESULTS_MD",
                        help="a RESULTS.md whose bench.graph_scale section is shown as the previous run "
                             "(a before/after comparison on the same machine)")
    args = parser.parse_args(argv)
    sizes = sorted(int(float(s)) for s in args.sizes.split(","))
    wanted = [w.strip() for w in args.ops.split(",")] if args.ops else None
    cases = [c for c in CASES if wanted is None or any(chosen(c.name, w) for w in wanted)]
    needed_copies = [COPY[name] for name in COPY if any(c.inputs[0] == name for c in cases)]
    print(machine())

    results, times, cluster_error = {}, {}, None
    cluster_sizes = [s for s in sizes if s <= args.max_cluster_chunks]
    if args.from_log:
        results, times = parse_log(args.from_log.read_text(), sizes, needed_copies + cases)
    else:
        results, times, cluster_error = measure_all(args, sizes, cases, needed_copies, cluster_sizes)
    report(args, sizes, cases, results, times, cluster_sizes, cluster_error)


def chosen(name: str, wanted: str) -> bool:
    """Whether ``--ops``'s entry ``wanted`` picks the case ``name``: '=name' that name exactly,
    else any name that contains it."""
    return name == wanted[1:] if wanted.startswith("=") else wanted in name


def measure_all(args, sizes, cases, needed_copies, cluster_sizes):
    """(build results, end-to-end times, the end-to-end phase's error or None)."""
    results, times, cluster_error = {}, {}, None
    with tempfile.TemporaryDirectory(prefix="graph-scale-") as tmp:
        work = Path(tmp)
        for size in sizes:
            for case in needed_copies + cases:
                got = measure(case, size, size <= args.max_count_chunks, args.time_limit, str(work / "scratch"),
                              args.graph_memory)
                results[case.name, size] = got
                print(f"  build {case.name} @ {input_chunks(case, size):,}: {got}", flush=True)
        if not args.no_cluster and cluster_sizes:
            # Only what built within the limit: the client builds the graph on the cluster too.
            runnable = [c for c in cases if c.cluster and all("build" in results[c.name, s] for s in cluster_sizes)]
            try:
                times = run_cluster(cluster_sizes, runnable, args.time_limit, work, args.repeat,
                                    args.store == "memory")
            except Exception as error:  # the build table is still worth recording
                cluster_error = f"{type(error).__name__}: {error}"
                print(f"end to end failed: {cluster_error}", flush=True)
    return results, times, cluster_error


def parse_log(text: str, sizes, cases) -> tuple[dict, dict]:
    """The results and times of a run from the lines it printed (``--from-log``: the tables,
    plot and record made again without measuring again)."""
    import ast

    results, times = {}, {}
    for line in text.splitlines():
        build = re.match(r"  build (.+) @ ([\d,]+): (\{.*\})$", line)
        if build:
            case = next(c for c in cases if c.name == build.group(1))
            chunks = int(build.group(2).replace(",", ""))
            size = next(s for s in sizes if input_chunks(case, s) == chunks)
            results[case.name, size] = ast.literal_eval(build.group(3))
        run = re.match(r"  cluster (.+) @ (\d+): (over [^;]*|([\d.]+) (ms|s))(?:; scheduler (\d+) -> (\d+) MiB)?$",
                       line)
        if run:
            key = (run.group(1), int(run.group(2)))
            if run.group(6) is not None:
                _add_scheduler_memory(times, key, int(run.group(6)) * 2**20, int(run.group(7)) * 2**20)
            took = run.group(3) if run.group(4) is None else float(run.group(4)) / (1e3 if run.group(5) == "ms" else 1)
            best = times.get(key)
            if best is None or (not isinstance(took, str) and (isinstance(best, str) or took < best)):
                times[key] = took
    return results, times


#: How the end-to-end runs store their arrays, as the record says it (``--store``).
STORES = {"local": "Zarr v3 on local disk to Zarr",
          "memory": "Zarr v3 in memory to Zarr in memory (each worker its own copy of the stores)"}


def report(args, sizes, cases, results, times, cluster_sizes, cluster_error) -> None:
    table = build_table(results, sizes, cases)
    print("\n" + table)
    body = (f"Machine: {machine().strip().removeprefix('machine: ')}. Inputs of tiny chunks (64-byte "
            f"float32 [1, 2, 2, 4] blocks of [4, H, W, 4]; int32 [4, 16] rows for AscendDequant; GatherNd: "
            f"params as x, {INDEX_CHUNKS:,} lazy index chunks of {TUPLES_PER_CHUNK} tuples). Build: the time to "
            f"call the operator on `da.from_zarr` of a metadata-only Zarr array (time limit "
            f"{args.time_limit:.0f} s per operator and size). Tasks per input chunk: raw, the operator's "
            f"high-level graph; scheduler, the graph that stores the result into Zarr after Dask's "
            f"optimisation, counted up to {int(args.max_count_chunks):,} chunks (`*`: the largest counted "
            f"size's count per chunk; it is flat in the size; `(r)`: the result's chunks are not regular, and "
            f"the count includes the rechunk to regular chunks that a Zarr output needs). GatherNd's input "
            f"chunks are params + index chunks.\n\n{table}\n")
    if times:
        ctable = cluster_table(times, cluster_sizes, cases)
        print("\n" + ctable)
        body += (f"\nEnd to end (build + run) on `dask scheduler` + 2 x `dask worker --nthreads 1` on 127.0.0.1, "
                 f"{STORES[args.store]}, against a plain Zarr copy of the same input on the same "
                 f"cluster, in input chunks per second (best of {args.repeat} rounds), and the scheduler process's "
                 f"memory (RSS before the first run -> peak over the runs; memory it freed is not always "
                 f"given back to the system, so a case can start where the one before ended):\n\n{ctable}\n")
    elif cluster_error:
        body += f"\nEnd to end: failed ({cluster_error}).\n"
    elif not args.no_cluster:
        body += "\nEnd to end: no size within --max-cluster-chunks.\n"
    else:
        body += "\nEnd to end: not run (--no-cluster).\n"
    if not args.no_record and plot(results, sizes, cases, PLOT):  # --no-record: printed only, the plot kept
        body += "\nBuild times plotted (log-log) in [graph_scale.png](graph_scale.png).\n"
    if args.previous:
        previous = previous_section(args.previous)
        if previous:
            body += "\n" + previous
    if not args.no_record:
        record_section("bench.graph_scale", body)
        print(f"\nrecorded in {RESULTS}")


def _stop_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # the ``finally`` blocks stop the cluster's processes


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    with contextlib.suppress(KeyboardInterrupt):
        main(sys.argv[1:])
