"""GatherNd's exchange (lazy indices into params too large to send whole) at scale: its graph
is linear in the blocks (tasks and edges), building it makes no task, and its results equal
the reference on many chunkings, batch dims and a real cluster."""

from __future__ import annotations

import math
import pickle

import dask
import dask.array as da
import numpy as np
import pytest
from dask.core import get_dependencies
from hypothesis import given, settings
from hypothesis import strategies as st

import ops
from ops.gather_nd import concrete, exchange, scratch_graph
from ops.gather_nd.plan import _exchange_groups, exchange_tasks
from tests.helpers import assert_same, chunkings, compute
from tests.ops import reference


def _exchange(params, indices, **kwargs):
    # A 1 KiB chunk size: params past a quarter of it take the exchange (no scratch store),
    # built as for a cluster (on threads, da.from_array's params are gathered from whole).
    with dask.config.set({"array.chunk-size": "1KiB", "chunked-tensor-ops.scratch": None, "scheduler": "processes"}):
        return ops.gather_nd(params, indices, **kwargs)


def _own_layer(y):
    return y.__dask_graph__().layers[y.name]


@pytest.mark.smoke
def test_tasks_and_edges_grow_with_the_sum_of_the_blocks():
    # 1,000 params blocks and 200 indices blocks: a task per pair of blocks made 400,000.
    P, I = 1_000, 200
    params = da.zeros((4 * P, 4), chunks=(4, 4), dtype=np.float32)
    indices = da.zeros((2 * I, 1), chunks=(2, 1), dtype=np.int64)
    y = _exchange(params, indices)
    layer = _own_layer(y)
    tasks = dict(layer)
    assert len(tasks) == len(layer) == exchange_tasks(I, P, 1) <= 4 * (P + I)
    graph = dict(y.__dask_graph__())
    fan_in = [len(get_dependencies(graph, key)) for key in tasks]
    assert sum(fan_in) <= 8 * (P + I)  # edges: linear too (4 a params block, 4 a pair of groups)
    assert max(fan_in) <= 2 * math.isqrt(P + I)  # no task waits on all the blocks of a side
    assert (y.compute() == 0).all()


@pytest.mark.parametrize("P,I", [(1, 1), (1, 500), (500, 1), (7, 3), (16_384, 250), (1_000_000, 1_000),
                                 (1_000_000, 1), (300, 300)])
def test_groups_keep_the_pairs_within_the_blocks(P, I):
    groups, per_group, index_groups, per_index_group = _exchange_groups(P, I)
    assert (groups - 1) * per_group < P <= groups * per_group
    assert (index_groups - 1) * per_index_group < I <= index_groups * per_index_group
    assert exchange_tasks(I, P, 1) <= 4 * (P + I) + 4
    if P + I > 100:  # the larger cases: both sides in about sqrt(P + I) groups, or all their blocks
        assert groups >= min(P, math.isqrt(P + I) // 2) and index_groups >= min(I, math.isqrt(P + I) // 2)
    if P >= math.isqrt(P + I):  # no task waits on many more than sqrt(P + I) others
        # (collect: a params group's blocks; requests: an indices group's; gather: every
        # params group, and its requests; route: every indices group)
        assert max(per_group, per_index_group, groups + 1, index_groups) <= 2 * math.isqrt(P + I) + 2


def test_building_makes_no_task(monkeypatch):
    # 20,000 x 100 blocks: under a limit of 100,000 tasks (a task per pair of blocks was 4
    # million). The call makes no task and neither does counting them; they are made when
    # the graph is materialised, once per key.
    params = da.zeros((20_000, 8), chunks=(1, 8), dtype=np.float32)
    indices = da.zeros((100, 1), chunks=(1, 1), dtype=np.int64)
    with ops.limits(max_tasks=100_000):
        layer = _own_layer(_exchange(params, indices))
    assert len(pickle.dumps(layer)) < 64 * 1024  # sent as its recipe: no task, no list of blocks
    made = []
    for stage in [name for name in vars(exchange) if name.startswith("_make_")]:
        original = getattr(exchange, stage)
        monkeypatch.setattr(exchange, stage, lambda p, index, _f=original: made.append(1) or _f(p, index))
    y = _exchange(params, indices)
    layer = _own_layer(y)
    assert not layer.is_materialized() and made == []
    count = len(y.__dask_graph__())
    assert made == [] and count == len(layer) + params.npartitions + indices.npartitions
    assert len(dict(layer)) == len(made) + 1  # every task made once (the +1: the grid of blocks)
    assert layer.is_materialized()


def test_concrete_indices_build_no_task(monkeypatch):
    # NumPy indices are planned now, in NumPy (a sort by hit block and the cuts where a bucket
    # meets an output run); the tasks, one per hit block and one per output block, are made
    # when the graph is materialised.
    made = []
    for stage in ("_make_bucket", "_make_output"):
        original = getattr(concrete, stage)
        monkeypatch.setattr(concrete, stage, lambda p, index, _f=original: made.append(1) or _f(p, index))
    rng = np.random.default_rng(9)
    values = rng.standard_normal((4_000, 8)).astype(np.float32)
    index = rng.integers(-4_000, 4_000, size=(1_500, 1))
    # Output blocks of 128 rows; the bucketed plan (a scheduler outside this process's memory).
    with dask.config.set({"array.chunk-size": "4KiB", "scheduler": "processes"}):
        y = ops.gather_nd(da.from_array(values, chunks=(4, 8)), index)
    layer = _own_layer(y)
    hits = len(np.unique((index[:, 0] % 4_000) // 4))
    assert not layer.is_materialized() and made == []
    assert len(layer) == hits + y.npartitions and y.npartitions == -(-1_500 // 128)
    assert_same(y.compute(), values[index[:, 0]])
    assert len(made) == len(layer)


def test_scratch_plan_builds_no_task(monkeypatch, tmp_path):
    # Through a scratch store: 20,000 params blocks in groups, 100 indices blocks in batches;
    # the call lists no block (the serve tasks' lists of blocks are made with the tasks).
    made = []
    for stage in [name for name in vars(scratch_graph) if name.startswith("_make_")]:
        original = getattr(scratch_graph, stage)
        monkeypatch.setattr(scratch_graph, stage, lambda p, index, _f=original: made.append(1) or _f(p, index))
    params = da.zeros((20_000, 8), chunks=(1, 8), dtype=np.float32)
    indices = da.zeros((100, 1), chunks=(1, 1), dtype=np.int64)
    with dask.config.set({"array.chunk-size": "1KiB"}):
        y = ops.gather_nd(params, indices, scratch=str(tmp_path))
    layer = _own_layer(y)
    assert not layer.is_materialized() and made == []
    assert len(layer) < params.npartitions  # a serve task per group of params blocks
    assert len(dict(layer)) == len(made) + 1 == len(layer)  # the +1: the grid of blocks


@st.composite
def exchange_cases(draw):
    """Params of 2-4 dims and up to 48 rows, 0-2 batch dims, tuples of 1..r - b, indices of up
    to 60 tuples: chunked at random, so groups of several blocks on both sides."""
    r = draw(st.integers(2, 4))
    shape = (draw(st.integers(1, 48)), *draw(st.lists(st.integers(1, 5), min_size=r - 1, max_size=r - 1)))
    b = draw(st.integers(0, min(2, r - 1)))
    if b:
        shape = (draw(st.integers(1, 4)), *shape[1:])
    c = draw(st.integers(1, r - b))
    lead = shape[:b] + tuple(draw(st.lists(st.integers(0, 60 if not b else 12), min_size=1, max_size=2)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    negative = draw(st.booleans())
    dims = shape[b : b + c]
    indices = np.stack([rng.integers(-s if negative else 0, s, size=lead) for s in dims], axis=-1)
    params = rng.integers(-(2**31), 2**31, size=shape).astype(draw(st.sampled_from([np.int32, np.int64])))
    return params, indices.astype(np.int64), b, negative, draw(chunkings(shape)), draw(chunkings(indices.shape))


@settings(max_examples=60, deadline=None)
@given(case=exchange_cases())
def test_exchange_equals_the_reference(case):
    params, indices, b, negative, params_chunks, indices_chunks = case
    lazy = da.from_array(params, chunks=params_chunks)
    y = _exchange(lazy, da.from_array(indices, chunks=indices_chunks), batch_dims=b, negative_index_support=negative)
    if params.nbytes > 256:  # past a quarter of the chunk size: the exchange, not the broadcast
        assert isinstance(_own_layer(y), exchange.StagedLayer)
    assert y.chunks[: indices.ndim - 1] == da.from_array(indices, chunks=indices_chunks).chunks[:-1]
    assert_same(compute(y), reference.gather_nd(params, indices, b))


def test_exchange_with_irregular_chunks_and_a_split_slice():
    rng = np.random.default_rng(7)
    values = rng.standard_normal((50, 7, 6)).astype(np.float32)
    index = np.stack([rng.integers(-50, 50, (9, 13)), rng.integers(0, 7, (9, 13))], axis=-1)
    params = da.from_array(values, chunks=((1, 20, 3, 26), (2, 5), (1, 2, 3)))
    y = _exchange(params, da.from_array(index, chunks=((4, 5), (1, 3, 9), (1, 1))))
    assert isinstance(_own_layer(y), exchange.StagedLayer)
    assert y.chunks == ((4, 5), (1, 3, 9), (1, 2, 3))
    assert_same(y.compute(), values[index[..., 0], index[..., 1]])


def test_exchange_reads_stored_params_inside_its_serve_tasks():
    # Params read from Zarr: each serve task reads its block, so the graph's roots are the
    # store and the indices blocks, not every params block (ordering a graph costs about
    # roots x outputs).
    import zarr

    rng = np.random.default_rng(10)
    values = rng.standard_normal((240, 6)).astype(np.float32)
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=values.shape, chunks=(8, 6), dtype=np.float32)
    z[...] = values
    params = da.from_zarr(z)
    index = rng.integers(-240, 240, size=(500, 1))
    y = _exchange(params, da.from_array(index, chunks=(25, 1)))
    graph = dict(dask.optimize(y)[0].__dask_graph__())
    assert not any(isinstance(k, tuple) and k[0] == params.name for k in graph)
    roots = [k for k in graph if not get_dependencies(graph, k)]
    assert len(roots) <= 1 + 20 + 1  # the store, the indices blocks, the grid of blocks
    assert_same(y.compute(), values[index[:, 0]])


def _roots_upstream(graph: dict) -> dict:
    """For every task, the frozenset of the graph's roots it depends on, directly or not: what
    Dask keeps per task when it orders a graph (on the client, or on the distributed scheduler
    for every job). As Dask does there, a plain value taken by several tasks (a Zarr array)
    is no root; the tasks that take it are."""
    deps = {k: set(get_dependencies(graph, k)) for k in graph}
    takers: dict = {}
    for k, ds in deps.items():
        for d in ds:
            takers.setdefault(d, set()).add(k)
    for k in [k for k, ds in deps.items() if not ds and not dask.core.istask(graph[k])]:
        if len(takers.get(k, ())) > 1:
            for t in takers[k]:
                deps[t].discard(k)
            del deps[k]
    upstream: dict = {}
    for k in dask.core.toposort({k: list(ds) for k, ds in deps.items()}):
        ds = deps[k]
        upstream[k] = frozenset({k}) if not ds else frozenset().union(*(upstream[d] for d in ds))
    return upstream


@pytest.mark.parametrize("plan", ["broadcast", "exchange", "scratch"])
def test_ordering_the_graph_keeps_root_sets_linear_in_the_blocks(plan, tmp_path):
    # Many params blocks read from Zarr, lazy indices: no plan may make each indices block's
    # task depend on every params block's read (a rechunk of params into one block did: the
    # scheduler held 10.5 GiB ordering 200,000 x 1,000 blocks), so the distinct root sets
    # Dask keeps add up to a few entries per block, not params blocks x indices blocks.
    import zarr

    rng = np.random.default_rng(11)
    values = rng.standard_normal((400, 4)).astype(np.float32)
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=values.shape, chunks=(2, 4), dtype=np.float32)
    z[...] = values
    index = rng.integers(0, 400, size=(60, 1))
    zi = zarr.create_array(zarr.storage.MemoryStore(), shape=index.shape, chunks=(3, 1), dtype=np.int64)
    zi[...] = index
    params, indices = da.from_zarr(z), da.from_zarr(zi)
    config = {"array.chunk-size": "128MiB" if plan == "broadcast" else "1KiB",
              "chunked-tensor-ops.scratch": str(tmp_path) if plan == "scratch" else None}
    with dask.config.set(config):
        y = ops.gather_nd(params, indices)
        graph = dict(dask.optimize(y)[0].__dask_graph__())
    blocks = params.npartitions + indices.npartitions  # 200 + 20
    distinct = set(_roots_upstream(graph).values())
    assert sum(map(len, distinct)) <= 4 * blocks
    assert_same(compute(y), values[index[:, 0]])


def test_a_bad_index_is_named_from_its_group():
    values = np.arange(400, dtype=np.int32).reshape(100, 4)
    index = np.zeros((90, 1), np.int64)
    index[57, 0] = -101
    y = _exchange(da.from_array(values, chunks=(5, 4)), da.from_array(index, chunks=(3, 1)))
    with pytest.raises(IndexError, match=r"^indices\[57, 0\] = -101 is out of range for dimension 0 of size 100"):
        y.compute()


def test_exchange_on_a_cluster():
    """Worker processes: the layer is sent as its recipe, materialised away from the client."""
    from distributed import Client, LocalCluster

    rng = np.random.default_rng(8)
    values = rng.standard_normal((400, 16)).astype(np.float32)
    index = rng.integers(-400, 400, size=(300, 1))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None, silence_logs=40) as cluster, Client(cluster) as client:
        y = _exchange(da.from_array(values, chunks=(8, 16)), da.from_array(index, chunks=(10, 1)))
        assert isinstance(_own_layer(y), exchange.StagedLayer)
        assert_same(client.compute(y, sync=True), values[index[:, 0]])
        # With a client as the default scheduler, params of views of one in-memory array
        # still take the exchange (gathering from the whole array would send it to every worker).
        with dask.config.set({"array.chunk-size": "1KiB"}):
            y = ops.gather_nd(da.from_array(values, chunks=(8, 16)), da.from_array(index, chunks=(10, 1)))
            concrete_y = ops.gather_nd(da.from_array(values, chunks=(8, 16)), index)
        assert isinstance(_own_layer(y), exchange.StagedLayer)
        assert _own_layer(concrete_y).stages[0].name.startswith("gather_nd-bucket-")
        assert_same(client.compute(y, sync=True), values[index[:, 0]])
        assert_same(client.compute(concrete_y, sync=True), values[index[:, 0]])
