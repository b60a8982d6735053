"""Multi-output tasks that store their own blocks (ops.fusing_stores): the rewritten store
graphs write the same bytes as Dask's own, hold no block as a result, and leave every other
graph as Dask optimizes it."""

from __future__ import annotations

import operator

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr
from dask._task_spec import Alias, Task, convert_legacy_graph
from dask.array.core import load_store_chunk
from dask.core import flatten
from dask.highlevelgraph import HighLevelGraph

import ops
from ops import _fused_stores
from tests.helpers import assert_same, stores_as_made

B2S = ([2, 2], [[0, 0], [0, 0]])


def _zarr_input(shape=(4, 16, 8, 2), chunks=(1, 4, 8, 2), seed=0):
    """A Zarr array of random floats and the Dask array reading it (BatchToSpaceND bundles)."""
    data = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=shape, chunks=chunks, dtype=data.dtype)
    z[...] = data
    return data, da.from_zarr(z)


def _target(y, chunks=None):
    chunks = chunks or tuple(c[0] for c in y.chunks)
    return zarr.create_array(zarr.storage.MemoryStore(), shape=y.shape, chunks=chunks, dtype=y.dtype, fill_value=0)


def _optimized_tasks(collection) -> dict:
    """The optimized graph of one collection or a tuple of them, as task objects."""
    tasks = {}
    for optimized in dask.optimize(*(collection if isinstance(collection, tuple) else (collection,))):
        tasks.update(dict(optimized.__dask_graph__()))
    return convert_legacy_graph(tasks)


@pytest.mark.smoke
def test_bundles_store_their_own_blocks():
    data, x = _zarr_input()
    y = ops.batch_to_space_nd(x, *B2S)
    z = _target(y)
    stored = da.store(y, z, lock=False, compute=False)

    plain = _optimized_tasks(stored)
    assert not stores_as_made(plain)  # Dask alone: a store task per block, after the bundle
    with ops.fusing_stores():
        tasks = _optimized_tasks(stored)
    bundles = stores_as_made(tasks)
    assert len(bundles) == 4  # one per row of chunks, each making and storing 4 blocks
    assert len(tasks) < len(plain)
    # The bundles' results: no block kept for other tasks, and the store tasks' Nones.
    assert dask.get(tasks, bundles) == tuple(((), (None,) * 4) for _ in bundles)
    assert_same(z[...], ops.batch_to_space_nd(data, *B2S))


@pytest.mark.parametrize("paddings", [[[0, 0], [0, 0]], [[1, 1], [1, 1]], [[2, 0], [0, 2]]])
def test_space_to_batch_windows_store_their_own_group_blocks(paddings):
    # A window (one batch chunk's rows of every group, with halos read by their owners when
    # padded) makes the P = 4 output blocks of its groups and writes them itself.
    data, x = _zarr_input(shape=(4, 16, 8, 2), chunks=(2, 4, 8, 2), seed=4)
    y = ops.space_to_batch_nd(x, [2, 2], paddings)
    z = _target(y)
    stored = da.store(y, z, lock=False, compute=False)
    plain = _optimized_tasks(stored)
    assert not stores_as_made(plain)
    with ops.fusing_stores():
        tasks = _optimized_tasks(stored)
        dask.compute(stored, scheduler="threads")
    windows = stores_as_made(tasks)
    assert len(windows) == x.numblocks[0] * y.numblocks[1]  # one per batch chunk and output row of blocks
    assert all(len(result[1]) == 4 for result in dask.get(tasks, windows))
    assert len(tasks) < len(plain)
    assert_same(z[...], ops.space_to_batch_nd(data, [2, 2], paddings))


def test_fused_tasks_of_a_layer_share_one_task_group():
    # The distributed scheduler keeps a task group per name (key_split_group): one per fused
    # task would be 50,000 groups for a 200,000-chunk BatchToSpaceND job.
    from distributed.utils import key_split_group

    _, x = _zarr_input(shape=(4, 32, 8, 2), chunks=(1, 4, 8, 2))
    y = ops.batch_to_space_nd(x, *B2S)
    first, second = _target(y), _target(y, chunks=(1, 4, 16, 2))
    with ops.fusing_stores():
        one = _optimized_tasks(da.store(y, first, lock=False, compute=False))
        two = _optimized_tasks(da.store(y, second, lock=False, compute=False))
    fused_one, fused_two = stores_as_made(one), stores_as_made(two)
    assert len(fused_one) == len(fused_two) == 8
    assert len({key_split_group(k) for k in fused_one}) == 1
    # Another target: other names and other keys (each is a different task).
    assert not {key_split_group(k) for k in fused_one} & {key_split_group(k) for k in fused_two}
    assert not set(fused_one) & set(fused_two)


def test_fused_store_graph_computes_what_dask_stores():
    data, x = _zarr_input(shape=(8, 12, 6, 3), chunks=(1, 4, 6, 3), seed=1)
    y = ops.batch_to_space_nd(x, [2, 2], [[1, 0], [0, 1]])
    plain, fused = _target(y), _target(y)
    da.store(y, plain, lock=False, scheduler="sync")
    with ops.fusing_stores():
        da.store(y, fused, lock=False, scheduler="threads")
    assert_same(fused[...], plain[...])
    assert_same(fused[...], ops.batch_to_space_nd(data, [2, 2], [[1, 0], [0, 1]]))


def test_a_block_needed_elsewhere_keeps_its_bundle_whole():
    _, x = _zarr_input(seed=2)
    y = ops.batch_to_space_nd(x, *B2S)
    # (Two targets Dask tokenizes differently: two equal empty arrays would be one store.)
    first, second = _target(y), _target(y, chunks=(1, 4, 16, 2))
    one, two = da.store([y, y], [first, second], lock=False, compute=False)
    graph = HighLevelGraph.merge(one.dask, two.dask)  # each block has two store tasks
    assert _fused_stores._rewritten(graph, set(flatten([one.__dask_keys__(), two.__dask_keys__()]))) is None
    assert _fused_stores._rewritten(one.dask, set(flatten(y.__dask_keys__()))) is None  # y's blocks asked for
    assert _fused_stores._rewritten(one.dask, set(flatten(one.__dask_keys__()))) is not None  # the control


def test_collections_sharing_bundles_are_all_stored():
    # However Dask groups the collections it optimizes (one graph, or each apart and merged),
    # every target gets its bytes and every other result is right.
    data, x = _zarr_input(seed=2)
    y = ops.batch_to_space_nd(x, *B2S)
    expected = ops.batch_to_space_nd(data, *B2S)
    first, second, third = _target(y), _target(y, chunks=(1, 4, 16, 2)), _target(y, chunks=(1, 8, 16, 2))
    with ops.fusing_stores():
        dask.compute(da.store([y, y], [first, second], lock=False, compute=False), scheduler="sync")
        _, total = dask.compute(da.store(y, third, lock=False, compute=False), y.sum(dtype=np.float64),
                                scheduler="sync")
        optimized = dask.optimize(da.store(y, first, lock=False, compute=False), y)
    assert_same(first[...], expected)
    assert_same(second[...], expected)
    assert_same(third[...], expected)
    assert np.isclose(total, expected.sum(dtype=np.float64))
    assert_same(optimized[1].compute(scheduler="sync"), expected)


def test_to_zarr_builds_the_fused_graph(tmp_path):
    data, x = _zarr_input(seed=3)
    y = ops.batch_to_space_nd(x, *B2S)
    ds = xr.DataArray(y, dims=["n", "h", "w", "c"]).to_dataset(name="v")
    encoding = {"v": {"chunks": tuple(c[0] for c in y.chunks)}}
    with ops.fusing_stores():  # xarray optimizes the graph as it builds it
        delayed = ds.to_zarr(tmp_path / "out.zarr", zarr_format=3, compute=False, mode="w", encoding=encoding)
    tasks = convert_legacy_graph(dict(delayed.__dask_graph__()))
    assert len(stores_as_made(tasks)) == 4
    delayed.compute(scheduler="sync")
    assert_same(xr.open_zarr(tmp_path / "out.zarr")["v"].values, ops.batch_to_space_nd(data, *B2S))


def test_graphs_without_multi_output_tasks_are_optimized_as_dask_does():
    _, x = _zarr_input(shape=(2, 8, 8, 8), chunks=(1, 4, 4, 8))
    # (SpaceToBatchND with one batch chunk: one task per output block.)
    single = _zarr_input(shape=(1, 8, 8, 8), chunks=(1, 4, 4, 8))[1]
    for y in (ops.depth_to_space(x, 2), ops.space_to_batch_nd(single, [2, 2], [[1, 1], [0, 0]]), x + 1):
        stored = da.store(y, _target(y), lock=False, compute=False)
        plain = _optimized_tasks(stored)
        with ops.fusing_stores():
            fused = _optimized_tasks(stored)
        assert set(fused) == set(plain)
        assert [type(fused[k]) for k in plain] == [type(plain[k]) for k in plain]


def _made_and_stored(log, count):
    for i in range(count):
        log.append(("made", i))
        yield np.full((1, 2), i, dtype=np.int16)


@_fused_stores.streams(_made_and_stored)
def _all_made(log, count):
    return tuple(_made_and_stored(log, count))


class _Log:
    """The events, in order (not a list: Dask copies a list argument of a task)."""

    def __init__(self):
        self.events = []

    def append(self, event):
        self.events.append(event)

    def __dask_tokenize__(self):
        return id(self)


class _LoggedTarget:
    """A store target that records each write."""

    def __init__(self, log, shape):
        self.log, self.data = log, np.zeros(shape, dtype=np.int16)
        self.shape, self.dtype, self.ndim = shape, self.data.dtype, len(shape)

    def __setitem__(self, index, value):
        self.log.append(("stored", int(value[0, 0])))
        self.data[index] = value


def _three_blocks(log) -> da.Array:
    """A [3, 2] array whose blocks (rows) one registered multi-output task makes."""
    layer = {("multi", 0): (_all_made, log, 3)}
    layer.update({("y", i, 0): (operator.getitem, ("multi", 0), i) for i in range(3)})
    graph = HighLevelGraph.from_collections("y", layer, dependencies=())
    return da.Array(graph, "y", chunks=((1, 1, 1), (2,)), dtype=np.int16)


def test_each_block_is_stored_before_the_next_is_made():
    # A registered multi-output task of 3 blocks: with the rewrite, block i is written as soon
    # as it is made, before block i + 1 exists; the task's result holds no block.
    log = _Log()
    y = _three_blocks(log)
    target = _LoggedTarget(log, (3, 2))
    with ops.fusing_stores():
        da.store(y, target, lock=False, scheduler="sync")
    assert log.events == [("made", 0), ("stored", 0), ("made", 1), ("stored", 1), ("made", 2), ("stored", 2)]
    assert_same(target.data, np.repeat(np.arange(3, dtype=np.int16), 2).reshape(3, 2))
    log.events.clear()
    da.store(y, _LoggedTarget(log, (3, 2)), lock=False, scheduler="sync")  # Dask's own graph
    assert log.events[:3] == [("made", 0), ("made", 1), ("made", 2)]


def test_store_tasks_are_load_store_chunk():
    # The rewrite looks for Dask's store function by identity; if Dask renames it, the
    # fusion silently stops: this test says so first.
    _, x = _zarr_input()
    y = ops.batch_to_space_nd(x, *B2S)
    stored = da.store(y, _target(y), lock=False, compute=False)
    funcs = {t.func for t in convert_legacy_graph(dict(stored.__dask_graph__())).values() if isinstance(t, Task)}
    assert load_store_chunk in funcs


def test_a_block_another_task_takes_is_kept_and_the_others_stored():
    # Block 1 of the multi-output task is also summed by another task: the fused task stores
    # blocks 0 and 2 as it makes them and keeps block 1 for the sum (stored by its own task).
    log = _Log()
    y = _three_blocks(log)
    total = y.blocks[1].sum()  # an array too: Dask optimizes it with the store, in one graph
    target = _LoggedTarget(log, (3, 2))
    stored = da.store(y, target, lock=False, compute=False)
    with ops.fusing_stores():
        _, summed = dask.compute(stored, total, scheduler="sync")
    assert summed == 2  # block 1 is [[1, 1]]
    assert_same(target.data, np.repeat(np.arange(3, dtype=np.int16), 2).reshape(3, 2))
    # Blocks 0 and 2 written as made; block 1 kept, and written by its own store task after.
    assert log.events == [("made", 0), ("stored", 0), ("made", 1), ("made", 2), ("stored", 2), ("stored", 1)]


def test_concurrent_contexts_leave_dask_as_it_was_and_rewrite_only_for_their_thread():
    """Two threads enter and leave in crossed order (two jobs of the service): Dask's
    configuration ends as it began, and a third thread building a graph meanwhile gets Dask's
    own optimization."""
    import threading

    _, x = _zarr_input()
    stored = da.store(ops.batch_to_space_nd(x, *B2S), _target(ops.batch_to_space_nd(x, *B2S)), lock=False,
                      compute=False)
    before = dask.config.get("array_optimize", "absent")
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with ops.fusing_stores():
            first_in.set()
            second_in.wait(10)
            seen["first"] = len(stores_as_made(_optimized_tasks(stored)))
        first_out.set()

    def second():
        first_in.wait(10)
        with ops.fusing_stores():
            second_in.set()
            first_out.wait(10)  # the first thread left while this one is inside
            seen["second"] = len(stores_as_made(_optimized_tasks(stored)))

    def outsider():
        second_in.wait(10)
        seen["outsider"] = len(stores_as_made(_optimized_tasks(stored)))

    threads = [threading.Thread(target=f) for f in (first, second, outsider)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert seen == {"first": 4, "second": 4, "outsider": 0}
    assert dask.config.get("array_optimize", "absent") == before
    assert not stores_as_made(_optimized_tasks(stored))


@pytest.mark.parametrize("blocks", [1, 32, 33, 1100])
def test_fusing_waits_on_every_store_task_through_a_tree(blocks):
    # One key to wait on; each task of the tree waits on at most DONE_FAN_IN others, and
    # between them they wait on every store task (computing the key writes every block).
    data = np.random.default_rng(blocks).standard_normal((blocks, 2)).astype(np.float32)
    z = _target(da.from_array(data, chunks=(1, 2)))
    stored = da.store(da.from_array(data, chunks=(1, 2)), z, lock=False, compute=False)
    collection = _fused_stores.fusing(stored)
    assert collection.__dask_keys__() == [(collection.name,)]
    tasks = convert_legacy_graph(dict(collection.__dask_graph__()))
    tree = {key: node for key, node in tasks.items() if str(key[0]).startswith(collection.name)}
    assert all(len(node.dependencies) <= _fused_stores.DONE_FAN_IN for node in tree.values())
    reached, frontier = set(), [(collection.name,)]
    while frontier:
        key = frontier.pop()
        reached.add(key)
        frontier.extend(tree[key].dependencies if key in tree else ())
    assert reached - set(tree) == set(flatten(stored.__dask_keys__()))
    levels, count = [], blocks
    while count > 1 or not levels:
        count = -(-count // _fused_stores.DONE_FAN_IN)
        levels.append(count)
    assert len(tree) == sum(levels)
    dask.compute(collection, scheduler="sync")
    assert_same(z[...], data)


def _waited_on(tasks: dict, root) -> set:
    """The keys that ``fusing``'s tree (rooted at ``root``) waits on, other than its own."""
    frontier, leaves = [root], set()
    while frontier:
        key = frontier.pop()
        if getattr(tasks[key], "func", None) is _fused_stores._done:
            frontier.extend(tasks[key].dependencies)
        else:
            leaves.add(key)
    return leaves


@pytest.mark.parametrize("build, paddings", [
    (ops.space_to_batch_nd, [[0, 0], [0, 0]]),  # windows making P group blocks each
    (ops.space_to_batch_nd, [[1, 1], [1, 1]]),  # the same, with halos from neighbours
    (ops.batch_to_space_nd, [[0, 0], [0, 0]]),  # bundles
    (ops.batch_to_space_nd, [[1, 1], [1, 1]]),  # cropped: Dask fuses each store into its block's task
])
def test_fusing_waits_on_the_tasks_that_write_the_blocks(build, paddings):
    # No task per block only to pass a store result on: the tree waits on the writers
    # themselves, and the graph still writes what NumPy computes.
    data, x = _zarr_input(shape=(4, 8, 8, 2), chunks=(1, 2, 2, 2))
    y = build(x, [2, 2], paddings)
    z = _target(y)
    stored = da.store(y, z, lock=False, compute=False)
    collection = _fused_stores.fusing(stored)
    tasks = _optimized_tasks(collection)
    with ops.fusing_stores():
        without_tree = _optimized_tasks(stored)  # the same rewrite, the picks and aliases left in
    writers = _waited_on(tasks, (collection.name,))
    assert not any(isinstance(tasks[key], Alias) for key in tasks)
    assert not any(getattr(tasks[key], "func", None) is _fused_stores._stored for key in tasks)
    made_and_stored = stores_as_made(tasks)
    if made_and_stored:  # multi-output writers: the tree waits on them alone
        assert writers == set(made_and_stored)
    assert all(isinstance(tasks[key], Task) and key in without_tree or key in made_and_stored for key in writers)
    tree = [key for key in tasks if getattr(tasks[key], "func", None) is _fused_stores._done]
    assert len(tasks) - len(tree) <= len(without_tree) - y.npartitions
    dask.get(tasks, (collection.name,))
    assert_same(z[...], build(data, [2, 2], paddings))


def test_a_writer_that_keeps_a_block_is_waited_on_through_its_picks():
    # Block 1 is also summed by another task in the same graph, so the writer's result holds
    # it: the tree must not take that result (it would send the block to the tree's worker).
    log = _Log()
    y = _three_blocks(log)
    total = y.blocks[1].sum()
    target = _LoggedTarget(log, (3, 2))
    collection = _fused_stores.fusing(da.store(y, target, lock=False, compute=False))
    root, (summed,) = (collection.name,), total.__dask_keys__()
    graph = HighLevelGraph.merge(collection.__dask_graph__(), total.__dask_graph__())
    tasks = _fused_stores._fusing_optimize(graph, [root, summed])
    (writer,) = stores_as_made(tasks)
    assert writer not in _waited_on(tasks, root)
    # One pick, whichever block's: when it can run, the writer has run every store.
    picks = [k for k in _waited_on(tasks, root) if getattr(tasks[k], "func", None) is _fused_stores._stored]
    assert len(picks) == 1 and tasks[picks[0]].dependencies == {writer}
    results = dask.get(tasks, [root, summed])
    assert results[1] == 2
    assert_same(target.data, np.repeat(np.arange(3, dtype=np.int16), 2).reshape(3, 2))


@_fused_stores.streams(_made_and_stored, small_extras=True)
def _all_made_with_a_small_extra(log, count):
    return tuple(_made_and_stored(log, count))


def test_a_writer_that_keeps_only_small_extras_is_waited_on_itself():
    # Registered with small extras: the blocks it makes after those it stores are small, so
    # the tree takes its result whole (no pick task); here the third block, which another
    # task sums and nothing stores.
    log = _Log()
    layer = {("multi", 0): (_all_made_with_a_small_extra, log, 3)}
    layer.update({("y", i, 0): (operator.getitem, ("multi", 0), i) for i in range(2)})
    layer[("extra", 0)] = (operator.getitem, ("multi", 0), 2)
    y = da.Array(HighLevelGraph.from_collections("y", layer, dependencies=()), "y", chunks=((1, 1), (2,)),
                 dtype=np.int16)
    target = _LoggedTarget(log, (2, 2))
    collection = _fused_stores.fusing(da.store(y, target, lock=False, compute=False))
    summed = ("sum", 0)
    graph = HighLevelGraph.merge(collection.__dask_graph__(), {summed: (np.sum, ("extra", 0))})
    tasks = _fused_stores._fusing_optimize(graph, [(collection.name,), summed])
    (writer,) = stores_as_made(tasks)
    assert writer in _waited_on(tasks, (collection.name,))
    assert not [k for k, v in tasks.items() if getattr(v, "func", None) is _fused_stores._stored]
    results = dask.get(tasks, [(collection.name,), summed])
    assert results[1] == 4  # block 2: [[2, 2]]
    assert_same(target.data, np.repeat(np.arange(2, dtype=np.int16), 2).reshape(2, 2))


def _annotated_store_graph(add=1):
    """A store graph with a layer annotated (``retries``: x + ``add``), and that layer's keys."""
    _, x = _zarr_input()
    with dask.annotate(retries=3):
        y = x + add
    z = ops.batch_to_space_nd(y, *B2S)
    stored = da.store(z, _target(z), lock=False, compute=False)
    return stored, {key for key in dict(stored.__dask_graph__()) if key[0] == y.name}


@pytest.mark.parametrize("door", ["job", "fusing_stores"])
def test_layer_annotations_survive_the_optimization(door):
    # Dask's array optimization fuses the layers into one graph and drops their annotations;
    # the optimizations of a job and of ``fusing_stores`` keep them on the keys still there.
    stored, annotated = _annotated_store_graph()
    keys = stored.__dask_keys__()
    if door == "job":
        optimized = _fused_stores.fusing(stored).__dask_optimize__(stored.__dask_graph__(), keys)
    else:
        with ops.fusing_stores():
            optimized = da.Array.__dask_optimize__(stored.__dask_graph__(), keys)
    assert isinstance(optimized, HighLevelGraph)
    (layer,) = optimized.layers.values()
    retries = layer.annotations["retries"]
    carried = {key for key in layer if retries(key) is not None}
    # The annotated additions are fused with their reads, under the additions' keys.
    assert carried and carried <= annotated and all(retries(key) == 3 for key in carried)


def test_a_graph_without_annotations_comes_back_as_a_plain_graph():
    # Nothing to carry: the optimized tasks as they are, no layer around them.
    _, x = _zarr_input()
    y = ops.batch_to_space_nd(x, *B2S)
    stored = da.store(y, _target(y), lock=False, compute=False)
    optimized = _fused_stores.fusing(stored).__dask_optimize__(stored.__dask_graph__(), stored.__dask_keys__())
    assert isinstance(optimized, dict)


def test_annotated_graphs_optimized_one_by_one_merge_whole():
    # Collections computed together are optimized one by one and their graphs merged by
    # layer name: each keeps its tasks and its annotations.
    from ops import _annotations

    graphs, expected = [], {}
    for k in range(2):
        stored, annotated = _annotated_store_graph(add=1 + k)
        graphs.append(_fused_stores.fusing(stored).__dask_optimize__(stored.__dask_graph__(), stored.__dask_keys__()))
        expected.update({key: 3 for key in annotated})
    merged = HighLevelGraph.merge(*graphs)
    assert set(dict(merged)) == set(dict(graphs[0])) | set(dict(graphs[1]))
    found = _annotations.given(merged)["retries"]
    assert found and set(found) <= set(expected) and all(found[key] == 3 for key in found)
    assert len({key[0] for key in found}) == 2  # the annotated layer of each graph
