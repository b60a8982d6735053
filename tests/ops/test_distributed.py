"""Every operator on a real Dask cluster: a scheduler and two worker processes on 127.0.0.1
(graphs must pickle, kernels must compile in fresh processes)."""

from __future__ import annotations

from unittest import mock

import dask.array as da
import numpy as np
import pytest
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import SchedulerPlugin

import ops
from tests.helpers import assert_same


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None, silence_logs=40) as cluster, Client(cluster) as client:
        yield client


@pytest.mark.smoke
def test_operators_on_a_cluster(client):
    rng = np.random.default_rng(0)
    image = rng.standard_normal((4, 8, 8, 16)).astype(np.float32)
    lazy = da.from_array(image, chunks=(1, 4, 4, 16))
    cases = [
        (ops.depth_to_space(lazy, 2), ops.depth_to_space(image, 2)),
        (ops.space_to_depth(lazy, 2, mode="CRD"), ops.space_to_depth(image, 2, mode="CRD")),
        (ops.space_to_batch(lazy, 2, [1, 1, 0, 2]), ops.space_to_batch(image, 2, [1, 1, 0, 2])),
        (ops.batch_to_space_nd(lazy, [2, 2], [[1, 0], [0, 1]]), ops.batch_to_space_nd(image, [2, 2], [[1, 0], [0, 1]])),
    ]
    points = rng.integers(0, 8, size=(50, 2))
    cases.append((ops.gather_nd(lazy[0], points),
                  ops.gather_nd(image[0], points)))
    lazy_points = da.from_array(points, chunks=(10, 2))
    cases.append((ops.gather_nd(lazy[0], lazy_points), ops.gather_nd(image[0], points)))
    acc = rng.integers(-1000, 1000, size=(64, 32), dtype=np.int32)
    scale = rng.random(64).astype(np.float32)
    cases.append((ops.ascend_dequant(da.from_array(acc, chunks=(16, 32)), scale, dst_dtype="float16", policy="per_token"),
                  ops.ascend_dequant(acc, scale, dst_dtype="float16", policy="per_token")))
    results = client.compute([lazy_result for lazy_result, _ in cases], sync=True)
    for result, (_, expected) in zip(results, cases):
        assert_same(result, expected)


def test_index_errors_reach_the_client(client):
    params = da.from_array(np.arange(10), chunks=5)
    indices = da.from_array(np.array([[1], [12]]), chunks=1)
    with pytest.raises(IndexError, match=r"indices\[1, 0\] = 12 is out of range for dimension 0 of size 10"):
        client.compute(ops.gather_nd(params, indices), sync=True)


@pytest.mark.parametrize("op, params", [
    ("space_to_batch_nd", {"block_shape": [2, 2], "paddings": [[1, 1], [1, 3]], "pad_value": -1.0}),
    ("batch_to_space_nd", {"block_shape": [2, 2], "crops": [[1, 1], [1, 1]]}),
])
def test_halo_plans_stored_from_zarr_on_a_cluster(client, tmp_path, op, params):
    # Small windows (SpaceToBatchND) and bundles (BatchToSpaceND, cropped) are taken whole by
    # the tasks that need a part of them, which may run on the other worker; blocks are stored
    # by the tasks that make them where they can (ops.fusing_stores).
    import zarr

    rng = np.random.default_rng(1)
    image = rng.standard_normal((4, 10, 12, 3)).astype(np.float32)
    source = zarr.create_array(str(tmp_path / "x.zarr"), shape=image.shape, chunks=(1, 2, 4, 3), dtype=image.dtype)
    source[:] = image
    y = getattr(ops, op)(da.from_zarr(source), **params)
    target = zarr.create_array(str(tmp_path / "y.zarr"), shape=y.shape, chunks=tuple(c[0] for c in y.chunks),
                               dtype=y.dtype)
    with ops.fusing_stores():
        client.compute(da.store(y, target, lock=False, compute=False), sync=True)
    assert_same(target[...], getattr(ops, op)(image, **params))


class _PeakInMemory(SchedulerPlugin):
    """The most tasks held in memory on the scheduler at once since it was registered."""

    name = "peak-in-memory"

    def __init__(self):
        self.now = self.peak = 0

    def transition(self, key, start, finish, *args, **kwargs):
        self.now += (finish == "memory") - (start == "memory")
        self.peak = max(self.peak, self.now)


def _peak_in_memory(client, collection) -> int:
    """The most tasks the cluster held in memory at once while computing ``collection``."""
    client.register_plugin(_PeakInMemory())
    try:
        client.compute(collection, sync=True)
        return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins[_PeakInMemory.name].peak)
    finally:
        client.unregister_scheduler_plugin(_PeakInMemory.name)


def test_a_submitted_store_graph_releases_each_written_block(client, tmp_path):
    # Dask's own store graph ends in one task taking every store task's result, so all of
    # them are held until the last block is written; the service's collection (fusing) waits
    # on them through a tree of small tasks and lets each go once its group is done.
    import zarr

    from ops import _fused_stores

    image = np.arange(16 * 16, dtype=np.float32).reshape(16, 16)
    source = zarr.create_array(str(tmp_path / "x.zarr"), shape=image.shape, chunks=(1, 1), dtype=image.dtype)
    source[:] = image
    blocks = image.size
    peaks = {}
    for way in ("dask", "fusing"):
        target = zarr.create_array(str(tmp_path / f"{way}.zarr"), shape=image.shape, chunks=(1, 1), dtype=image.dtype)
        stored = da.store(da.from_zarr(source), target, lock=False, compute=False)
        with mock.patch.object(_fused_stores, "DONE_FAN_IN", 8):  # groups small beside the blocks
            collection = _fused_stores.fusing(stored) if way == "fusing" else stored
        peaks[way] = _peak_in_memory(client, collection)
        assert_same(target[...], image)
    assert peaks["dask"] >= blocks  # the measure sees every held result
    assert peaks["fusing"] <= blocks // 4, peaks  # a few groups of 8 at a time


class _WindowsStarted(SchedulerPlugin):
    """The windows of a SpaceToBatchND halo plan (their ``-window-`` tasks) in the order the
    scheduler sent them to a worker, and the priority each was given."""

    name = "windows-started"

    def __init__(self):
        self.started = []
        self.priorities = {}

    async def start(self, scheduler):
        self.scheduler = scheduler

    def transition(self, key, start, finish, *args, **kwargs):
        if isinstance(key, tuple) and "-window-" in key[0] and finish == "processing" and key not in self.priorities:
            self.started.append(key)  # (first sent only: a stolen task is sent again)
            self.priorities[key] = self.scheduler.tasks[key].priority


@pytest.mark.parametrize("door", ["job", "library"])
def test_large_halo_windows_are_read_after_the_windows_giving_their_halos(client, tmp_path, door):
    # A window whose block waits for its neighbours' halo rows holds it in memory meanwhile;
    # in Dask's own order of such a graph, windows far apart are read one after the other,
    # and many blocks wait at once (spilled, or sent to another worker, on a cluster near
    # its memory limit). The windows' priorities have a window's halo sources read before
    # it. They must reach the scheduler through the optimization of a job (the service's
    # and the command line's) and of ``ops.fusing_stores``, which fuse the layers carrying them.
    import dask
    import zarr

    from ops import _fused_stores
    from ops.space_batch import graph
    from tests.ops import reference

    rng = np.random.default_rng(2)
    image = rng.standard_normal((4, 32, 16, 8)).astype(np.float32)
    source = zarr.create_array(str(tmp_path / "x.zarr"), shape=image.shape, chunks=(1, 4, 8, 8), dtype=image.dtype)
    source[:] = image
    plugin = _WindowsStarted()
    client.register_plugin(plugin)
    try:
        # Windows of 1-2 KiB taken as large ones (their results not taken whole), one input
        # chunk each (array.chunk-size), as 32 MiB windows of 32 MiB chunks are.
        with mock.patch.object(graph, "SMALL_RESULT_BYTES", 256), dask.config.set({"array.chunk-size": "4KiB"}):
            y = ops.space_to_batch_nd(da.from_zarr(source), [2, 2], [[1, 1], [1, 1]])
            target = zarr.create_array(str(tmp_path / "y.zarr"), shape=y.shape, chunks=tuple(c[0] for c in y.chunks),
                                       dtype=y.dtype)
            stored = da.store(y, target, lock=False, compute=False)
            tasks = {key: task.dependencies for key, task in dict(stored.__dask_graph__()).items()
                     if hasattr(task, "dependencies")}  # key -> the keys it takes
            if door == "job":
                client.compute(_fused_stores.fusing(stored), sync=True)
            else:
                with ops.fusing_stores():
                    client.compute(stored, sync=True)
        started, priorities = client.run_on_scheduler(
            lambda dask_scheduler: (dask_scheduler.plugins[_WindowsStarted.name].started,
                                    dask_scheduler.plugins[_WindowsStarted.name].priorities))
    finally:
        client.unregister_scheduler_plugin(_WindowsStarted.name)
    assert_same(target[...], reference.space_to_batch_nd(image, [2, 2], [[1, 1], [1, 1]]))
    windows = {key for key in tasks if "-window-" in key[0]}
    assert len(windows) == 4 * 9 * 3 and set(started) == windows  # batch x rows x columns of windows
    # The scheduler sends them to the workers in the order of their priorities ...
    assert [tuple(k) for k in started] == sorted(map(tuple, started), key=lambda k: priorities[k])
    # ... in which each window's halo sources (the windows of the edge tasks its block takes)
    # come before it.
    edges = {key: next(iter(tasks[key])) for key in tasks if "-edge-" in key[0]}
    checked = 0
    for key, taken in tasks.items():
        own = [d for d in taken if d in windows]
        if "-all-" not in key[0] or len(own) != 1:
            continue
        for source in {edges[d] for d in taken if d in edges}:
            assert priorities[source] < priorities[own[0]], (source, own[0])
            checked += 1
    assert checked >= 4 * 8 * 2  # the halos of every window but the last row and column's
