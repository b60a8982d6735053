"""Out of core on a real cluster, the small version of ``python -m bench.out_of_core`` (same harness).

``dask scheduler`` and two ``dask worker --nthreads 1 --memory-limit 384MiB`` run as processes on
127.0.0.1; every operator runs Zarr -> op -> Zarr on them and its output is checked element by
element against the NumPy kernels; no worker may restart and each worker's peak memory, from the
workers' own metrics (system monitor samples every 50 ms and the kernel's VmHWM), must stay
under its limit. The input here is small (32 MiB float32 and 32 MiB int32 in 2 MiB chunks,
GatherNd with 10,000 index tuples) to fit the suite's time: it checks the plans run and stay
correct on worker processes with a memory limit. Streaming is proven by the benchmark, which
runs the same at 3 GiB, four times the workers' total memory, and records it in
bench/RESULTS.md.
"""

from __future__ import annotations

import pytest
from dask.utils import parse_bytes

from bench import out_of_core as ooc

MEMORY_LIMIT = "384MiB"
SIZES = ooc.Sizes(gib=1 / 32, chunk_mib=2, tuples=10_000)
OPERATORS = [name for name, case in ooc.CASES.items() if name not in ooc.COPIES and not case.disk_scratch]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """One run of every operator on one cluster, by name."""
    work = tmp_path_factory.mktemp("out-of-core")
    (work / "data").mkdir()
    procs = ooc.Processes(work)
    cluster = None
    try:
        cluster = ooc.Cluster(procs, work, memory_limit=MEMORY_LIMIT)
        rows = ooc.run(cluster, ooc.LocalStorage(work / "data"), SIZES, OPERATORS, copies=False, counts=False,
                       log=lambda line: None)
    finally:
        if cluster:
            cluster.close()
        procs.stop()
    return {row["name"]: row for row in rows}


def test_sizes_are_what_the_docstring_says():
    assert SIZES.x_shape == (4, 32, 1024, 64) and SIZES.x_chunks == (1, 8, 1024, 64)
    assert SIZES.src_shape == (2048, 4096) and SIZES.src_chunks == (128, 4096)


@pytest.mark.parametrize("name", OPERATORS)
def test_operator_streams_within_the_workers_memory(results, name):
    row = results[name]
    assert row["error"] is None, row["error"]
    assert row["restarts"] == [], row["restarts"]
    assert row["scratch_left"] == 0  # GatherNd's scratch files are gone once its output is written
    # Every output element was compared with the NumPy kernel (the check raises on the first difference).
    assert row["checked"] == row["elements_out"] > 0
    assert len(row["peaks"]) == 2
    # The CPU the run took, from each process's own counters (a worker's under its nanny).
    assert set(row["cpu"]) >= {"scheduler", "worker-0", "worker-1"}, row["cpu"]
    assert all(row["cpu"][w] > 0 for w in ("worker-0", "worker-1")), row["cpu"]
    assert ooc.table([{**row, "seconds_all": [row["seconds"]], "ratio": None}], 0).count(" / -") == 1
    for worker, peak in row["peaks"].items():
        assert peak["limit"] == parse_bytes(MEMORY_LIMIT)
        assert peak["samples"] > 0, f"{worker}: the system monitor took no sample during the run"
        assert peak["monitor"] <= peak["hwm"] * 1.01 + 2**20  # samples cannot beat the high-water mark
        assert max(peak["monitor"], peak["hwm"]) < peak["limit"], (
            f"{name}: {worker} peaked at {max(peak['monitor'], peak['hwm']) / 2**20:.0f} MiB, "
            f"limit {peak['limit'] / 2**20:.0f} MiB")


@pytest.mark.smoke
def test_a_wrong_output_block_is_caught(tmp_path):
    """The check is not a formality: one changed element of a stored output fails it."""
    import numpy as np

    from concurrent.futures import ThreadPoolExecutor

    storage = ooc.LocalStorage(tmp_path)
    sizes = ooc.Sizes(gib=1 / 64, chunk_mib=1, tuples=100)
    x = ooc.create(storage, "x", sizes.x_shape, sizes.x_chunks, np.float32)
    x[:] = np.random.default_rng(0).random(sizes.x_shape, dtype=np.float32)
    y = ooc.create(storage, "y", (4, 2 * sizes.height, 2048, 16), (1, 32, 2048, 16), np.float32)
    import ops

    y[:] = ops.depth_to_space(x[:], 2)
    with ThreadPoolExecutor(2) as pool:
        assert ooc.check_depth_to_space({"x": x}, y, pool) == y.size
        y[3, 5, 7, 1] = np.nextafter(y[3, 5, 7, 1], np.float32(2))
        with pytest.raises(AssertionError, match=r"depth_to_space \[3, .*1 of .* elements differ"):
            ooc.check_depth_to_space({"x": x}, y, pool)
