"""SpaceToBatchND and BatchToSpaceND build their graphs without a loop over every block: the
call makes no task (its layers are made when the graph is materialised), whatever the
number of chunks, and the tasks made later compute what NumPy computes."""

from __future__ import annotations

import pickle
from unittest import mock

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from dask.blockwise import Blockwise
from dask.highlevelgraph import MaterializedLayer

import ops
from ops._block_reads import BlockReads
from ops._lazy_layer import LazyLayer
from tests.helpers import assert_flat_layer, assert_same

S2B, S2B_PADDED = ([2, 2], [[0, 0], [0, 0]]), ([2, 2], [[1, 1], [3, 1]])
B2S, B2S_CROPPED = ([2, 2], [[0, 0], [0, 0]]), ([2, 2], [[1, 1], [1, 3]])
CALLS = {
    "space_to_batch_nd": (ops.space_to_batch_nd, S2B),
    "space_to_batch_nd padded": (ops.space_to_batch_nd, S2B_PADDED),
    "batch_to_space_nd": (ops.batch_to_space_nd, B2S),
    "batch_to_space_nd cropped": (ops.batch_to_space_nd, B2S_CROPPED),
}


def _zarr_source(shape, chunks, values=None) -> da.Array:
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=shape, chunks=chunks, dtype=np.float32, fill_value=0)
    if values is not None:
        z[...] = values
    return da.from_zarr(z)


def _inputs(blocks_per_side: int):
    """The same shape as a lazy computed array and as a Zarr source, in 4 x side x side
    blocks of (1, 2, 2, 3)."""
    shape, chunks = (4, 2 * blocks_per_side, 2 * blocks_per_side, 3), (1, 2, 2, 3)
    return {"computed": da.zeros(shape, chunks=chunks, dtype=np.float32), "zarr": _zarr_source(shape, chunks)}


def _tasks_made(y: da.Array) -> int:
    """How many tasks the graph of y holds already made: the tasks of its materialised
    layers (a Blockwise or lazy layer not yet made holds none)."""
    made = 0
    for layer in y.dask.layers.values():
        if isinstance(layer, (Blockwise, LazyLayer)) and not layer.is_materialized():
            continue
        assert isinstance(layer, MaterializedLayer), type(layer)
        made += len(layer)
    return made


@pytest.mark.smoke
@pytest.mark.parametrize("source", ["computed", "zarr"])
@pytest.mark.parametrize("call", CALLS)
def test_the_call_makes_no_task_per_block(call, source):
    # 4 x 256 x 256 = 262,144 input blocks: the graphs used to be built by the call, one or
    # more tasks per block (and a rechunk's for a computed input), in 1 to 80 s.
    function, args = CALLS[call]
    x = _inputs(256)[source]
    y = function(x, *args)
    assert y.npartitions >= 65_536
    assert _tasks_made(y) <= 2  # the Zarr array object itself, as from_zarr makes it
    assert not x.dask.layers[x.name].is_materialized()  # the source's reads were not listed either


@pytest.mark.parametrize("source", ["computed", "zarr"])
@pytest.mark.parametrize("call", CALLS)
def test_lazily_made_tasks_compute_what_numpy_does(call, source):
    function, args = CALLS[call]
    values = np.arange(4 * 12 * 12 * 3, dtype=np.float32).reshape(4, 12, 12, 3)
    x = da.from_array(values, chunks=(1, 2, 2, 3)) if source == "computed" else _zarr_source(
        values.shape, (1, 2, 2, 3), values)
    y = function(x, *args)
    layer = y.dask.layers[y.name]
    assert isinstance(layer, LazyLayer) and not layer.is_materialized()
    assert_same(y.compute(scheduler="synchronous"), function(values, *args))


@pytest.mark.parametrize("call", CALLS)
def test_a_lazy_layer_travels_as_its_recipe(call):
    # What the client sends a scheduler: the layer unmade, and made there into the same tasks.
    function, args = CALLS[call]
    y = function(_inputs(8)["zarr"], *args)
    layer = y.dask.layers[y.name]
    sent = pickle.loads(pickle.dumps(layer))
    assert not sent.is_materialized() and len(pickle.dumps(layer)) < 20_000
    assert dict(sent) == dict(layer)
    assert layer.get_output_keys() == set(map(tuple, np.array(y.__dask_keys__(), dtype=object).reshape(-1, 5)))


def test_intermediate_tasks_survive_culling():
    # A bundle (or a window's halo piece) is no output block: culling keeps it for its blocks.
    values = np.arange(8 * 8 * 8 * 2, dtype=np.float32).reshape(8, 8, 8, 2)
    x = _zarr_source(values.shape, (1, 4, 8, 2), values)
    y = ops.batch_to_space_nd(x, *B2S_CROPPED)
    (optimized,) = dask.optimize(y[:, :3])
    assert_same(optimized.compute(scheduler="synchronous"), ops.batch_to_space_nd(values, *B2S_CROPPED)[:, :3])


def test_block_reads_of_a_large_source_look_at_two_blocks():
    x = _zarr_source((4, 1024, 1024, 3), (1, 4, 4, 3))
    reads = BlockReads.of(x)
    assert reads is not None and not x.dask.layers[x.name].is_materialized()
    task = reads.read((3, 255, 2, 0), (slice(None), slice(1, 3), slice(0, 2), slice(None)))
    assert task[2] == (slice(3, 4), slice(1021, 1023), slice(8, 10), slice(0, 3))


@pytest.mark.parametrize("source", ["computed", "zarr"])
@pytest.mark.parametrize("call", ["space_to_batch_nd", "batch_to_space_nd"])
def test_a_stored_result_costs_at_most_three_tasks_per_input_block(call, source):
    # As the scheduler gets it (optimized, in ops.fusing_stores): a plain Zarr copy is one
    # task per block (read and write fused). With the batch axis chunked an input block
    # feeds P = 4 output blocks; they used to cost P + 2 tasks (SpaceToBatchND, computed input)
    # and P split pieces more (BatchToSpaceND).
    function, args = CALLS[call]
    x = _inputs(8)[source]
    y = function(x, *args)
    target = zarr.create_array(zarr.storage.MemoryStore(), shape=y.shape, chunks=tuple(c[0] for c in y.chunks),
                               dtype=y.dtype, fill_value=0)
    with ops.fusing_stores():
        (optimized,) = dask.optimize(da.store(y, target, lock=False, compute=False))
    assert len(dict(optimized.__dask_graph__())) <= 3 * x.npartitions


@pytest.mark.parametrize("small_results", [True, False])
@pytest.mark.parametrize("batch_chunks", [1, 4])
@pytest.mark.parametrize("source", ["computed", "zarr"])
@pytest.mark.parametrize("call", CALLS)
def test_made_tasks_nest_no_task(call, source, batch_chunks, small_results):
    # A distributed scheduler holds every task object of a graph for the whole run: a read,
    # halo or part nested in a task as a task of its own (with its own set of dependencies and
    # a reference to the source) cost about a KiB each, several per chunk. The tasks take
    # their inputs as TaskRef arguments and the rest as plain data; results stay NumPy's.
    from ops.space_batch import graph as space_batch_graph

    function, args = CALLS[call]
    values = np.arange(4 * 16 * 16 * 3, dtype=np.float32).reshape(4, 16, 16, 3)
    chunks = (4 // batch_chunks, 4, 4, 3)
    x = da.from_array(values, chunks=chunks) + 0 if source == "computed" else _zarr_source(values.shape, chunks,
                                                                                             values)
    with mock.patch.object(space_batch_graph, "SMALL_RESULT_BYTES", 1 << 20 if small_results else 0):
        y = function(x, *args)
        # With the batch axis in one chunk and no padding or crop, the operator is a blockwise
        # map (Dask's own layer, whose tasks Dask makes): only its values are checked.
        if isinstance(y.dask.layers[y.name], LazyLayer):
            assert assert_flat_layer(y.dask, y.name) > 0
        assert_same(y.compute(scheduler="synchronous"), function(values, *args))


@pytest.mark.parametrize("call", CALLS)
def test_a_stored_graph_holds_few_bytes_per_input_chunk_more_than_a_copy(call):
    # The made store graph of each operator from a Zarr source of 1,600 tiny chunks, as
    # bench.graph_scale --graph-memory traces it, against a plain Zarr copy of the same
    # chunks (whose graph has about twice as many tasks, each with a scheduler's fixed cost
    # besides). With a nested task per chunk read, halo and part, and a box of slices per
    # window, padded SpaceToBatchND held 6.0 times the copy's bytes per input chunk, cropped
    # BatchToSpaceND 5.5 times and SpaceToBatchND 3.05 times; now 2.6, 2.3 and 1.6 times.
    from bench.graph_scale import metadata_array, scheduler_tasks_and_bytes

    function, args = CALLS[call]

    def held(build) -> float:
        x = da.from_zarr(metadata_array(zarr.storage.MemoryStore(), (4, 40, 40, 4), (1, 2, 2, 4), "float32"))
        return scheduler_tasks_and_bytes([build(x)])[1] / x.npartitions

    assert held(lambda x: function(x, *args)) < 3 * held(lambda x: x)
