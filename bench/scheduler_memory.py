"""What a job's graph costs the Dask scheduler's memory, per input chunk, against a plain Zarr
copy of the same chunks.

A distributed scheduler keeps every task of a job (its state and its task object, with the
task's arguments) until the job ends: at a million chunks that is gigabytes, and a job whose
graph holds more per chunk than a copy's is that much closer to the scheduler's limit. For
each operator (the tiny-chunk cases of ``bench.graph_scale``) and size, a new ``dask
scheduler`` process on 127.0.0.1 with no workers gets the store graph of the operator's result
as a job submits it (``ops._fused_stores.fusing``, one ``client.compute``); once it holds all
the tasks (none can run, so none is forgotten), its resident memory is read after a garbage
collection, against the same reading before the submission (after a small graph of the same
case was submitted and let go, so that what unpacking it imports is not counted). A fresh
scheduler per case, so that no case inherits what another left in its heap.

Printed only: the numbers go into ``bench.graph_scale``'s section of bench/RESULTS.md by hand,
beside the end-to-end runs they explain. Run an export of an
earlier commit the same way for a before/after comparison on the same machine.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

import dask.array as da
import zarr

from bench.common import Processes, free_port, machine, wait_until
from bench.graph_scale import CASES, COPY, input_chunks, inputs_of, metadata_array, stored_graph
from ops._fused_stores import fusing


#: Seconds the scheduler may take to unpack and optimise a submitted graph.
HOLD_TIMEOUT = 900


def _resident_bytes() -> int:
    """The scheduler process's resident memory after a garbage collection (run on the scheduler)."""
    import psutil

    gc.collect()
    return psutil.Process().memory_info().rss


def _held_tasks(dask_scheduler=None) -> int:
    return len(dask_scheduler.tasks)


def _store_graph(case, chunks: int, work: Path, name: str):
    """The store graph of ``case`` at ``chunks`` on metadata-only Zarr arrays under ``work``."""
    shapes = inputs_of(chunks)
    arrays = {n: da.from_zarr(metadata_array(zarr.storage.LocalStore(work / f"{name}-{n}"), *shapes[n]))
              for n in case.inputs}
    return fusing(stored_graph(case.build(arrays), zarr.storage.LocalStore(work / f"{name}-out")))


def _held(client, stored):
    """(future, tasks held) once the scheduler holds ``stored``'s tasks: it unpacks and
    optimises the graph after the submission returns, so held once the count stops growing."""
    future = client.compute(stored)
    held, steady = 0, 0
    deadline = time.monotonic() + HOLD_TIMEOUT
    while steady < 3:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the scheduler held {held} tasks and was still unpacking after {HOLD_TIMEOUT} s")
        if future.status == "error":
            future.result()  # raises the submission's error
        time.sleep(1)
        now = client.run_on_scheduler(_held_tasks)
        steady = steady + 1 if now == held and now > 0 else 0
        held = now
    return future, held


def measure(case, chunks: int, work: Path) -> dict:
    """{tasks, before, after} of the scheduler holding ``case``'s store graph at ``chunks``."""
    from distributed import Client

    procs = Processes(work)
    port = free_port()
    try:
        procs.start("scheduler", [str(Path(sys.executable).with_name("dask")), "scheduler", "--host", "127.0.0.1",
                                  "--port", str(port), "--no-dashboard"])
        client = wait_until("scheduler", lambda: Client(f"tcp://127.0.0.1:{port}", timeout=5), procs)
        # A small graph of the same case first, let go: what unpacking it imports on the
        # scheduler (Dask's array code, NumPy, Zarr, ours: tens of MiB) is not the graph's.
        future, _ = _held(client, _store_graph(case, 100, work, "warm"))
        future.cancel()
        del future
        wait_until("no tasks", lambda: client.run_on_scheduler(_held_tasks) == 0, procs)
        stored = _store_graph(case, chunks, work, "job")
        before = client.run_on_scheduler(_resident_bytes)
        future, held = _held(client, stored)
        after = client.run_on_scheduler(_resident_bytes)
        future.cancel()
        client.close()
        return {"tasks": held, "before": before, "after": after}
    finally:
        procs.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="5e4", help="input chunk counts, comma-separated")
    parser.add_argument("--ops", help="only the operators whose name contains one of these (comma-separated)")
    args = parser.parse_args(argv)
    sizes = sorted(int(float(s)) for s in args.sizes.split(","))
    wanted = [w.strip() for w in args.ops.split(",")] if args.ops else None
    cases = [c for c in CASES if c.cluster and (wanted is None or any(w in c.name for w in wanted))]
    copies = [COPY[name] for name in COPY if any(c.inputs[0] == name for c in cases)]
    print(machine(), flush=True)
    rows = ["| operator | input chunks | scheduler tasks | held MiB | bytes / input chunk | / copy |",
            "|---|---|---|---|---|---|"]
    for size in sizes:
        per_copy = {}
        for case in copies + cases:
            with tempfile.TemporaryDirectory(prefix="scheduler-memory-") as tmp:
                got = measure(case, size, Path(tmp))
            n = input_chunks(case, size)
            held = got["after"] - got["before"]
            per_chunk = held / n
            if case in copies:
                per_copy[case.inputs[0]] = per_chunk
            ratio = per_chunk / per_copy[case.inputs[0]]
            print(f"  {case.name} @ {n:,}: {got}", flush=True)
            rows.append(f"| {case.name} | {n:,} | {got['tasks']:,} | {held / 2**20:,.0f} | {per_chunk:,.0f} | "
                        f"{ratio:.2f}x |")
    print("\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
