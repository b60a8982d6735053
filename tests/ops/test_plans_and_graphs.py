"""The chunk plans as pure functions, and the shape of the Dask graphs they produce:
which input blocks each output block reads, and that graphs grow linearly with blocks."""

from __future__ import annotations

import collections
import itertools
import math
import operator
from unittest import mock

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from dask.core import get_dependencies

import ops
from ops import _chunks
from ops.depth_space import depth_to_space_chunks, space_to_depth_chunks
from ops.space_batch import batch_to_space_nd_chunks, space_to_batch_nd_chunks
from ops.space_batch import graph as space_batch_graph
from ops.space_batch import plan as space_batch_plan
from tests.helpers import assert_same, compute
from tests.ops import reference

# --- pure plan functions --------------------------------------------------------------------


def test_align_keeps_aligned_chunks():
    assert _chunks.align((4, 4, 2), 2) == (4, 4, 2)
    assert _chunks.align((3, 3, 3), 1) == (3, 3, 3)


def test_align_moves_boundaries_to_the_nearest_multiple():
    assert _chunks.align((3, 3, 4, 2), 2) == (4, 2, 4, 2)  # 3->4, 6 stays, 10 stays
    assert _chunks.align((5, 6), 4) == (4, 7)  # 5 is nearer 4 than 8
    # regular chunks stay regular (a Zarr store takes no other): their size moves
    assert _chunks.align((3, 3, 3, 3), 2) == (4, 4, 4)
    assert _chunks.align((3, 3, 3, 1), 2) == (4, 4, 2)
    assert _chunks.align((5, 5), 4) == (4, 4, 2)  # 5 is nearer 4 than 8
    assert _chunks.align((6, 6, 6), 4) == (8, 8, 2)  # ties go up
    assert _chunks.align((1, 1, 1, 1, 1), 4) == (4, 1)
    assert _chunks.align((1, 1, 1, 1, 1, 1), 3) == (3, 3)  # boundaries that collide merge
    assert _chunks.align((1, 7), 4) == (8,)  # 1 rounds down to 0: one chunk
    # With an offset the allowed boundaries are q with (q + offset) % multiple == 0.
    assert _chunks.align((4, 4, 4), 4, offset=1) == (3, 4, 5)
    assert _chunks.align((0,), 3) == (0,)


def test_groups_cut_each_group_alike():
    assert _chunks.groups((2, 2, 2, 2), 4, 2) == (2, 2, 2, 2)  # already aligned
    assert _chunks.groups((8,), 2, 4) == (2, 2, 2, 2)
    assert _chunks.groups((3, 3, 3, 3), 6, 2) == (3, 3, 3, 3)
    assert _chunks.groups((5, 7), 6, 2) == (6, 6)
    assert _chunks.groups((4, 8), 6, 2) == (6, 6)
    assert _chunks.groups((2, 4, 6), 4, 3) == (4, 4, 4)


@pytest.mark.smoke
def test_depth_to_space_plan():
    chunks = ((1, 1), (2, 3), (4,), (4, 4))
    assert depth_to_space_chunks(chunks, 2, "NHWC", "DCR") == (
        ((1, 1), (2, 3), (4,), (8,)),
        ((1, 1), (4, 6), (8,), (2,)),
    )
    # CRD only needs channel groups of bs*bs together: (4, 4) is already aligned.
    assert depth_to_space_chunks(chunks, 2, "NHWC", "CRD")[1] == ((1, 1), (4, 6), (8,), (1, 1))
    nchw = ((2,), (3, 6), (5,), (1, 2))
    assert depth_to_space_chunks(nchw, 3, "NCHW", "CRD") == (
        ((2,), (9,), (5,), (1, 2)),
        ((2,), (1,), (15,), (3, 6)),
    )
    vect = ((1,), (2, 2), (3,), (3,), (4,))
    assert depth_to_space_chunks(vect, 2, "NCHW_VECT_C", "DCR")[1] == ((1,), (1,), (6,), (6,), (4,))


def test_space_to_depth_plan():
    chunks = ((1,), (3, 3), (5, 3), (2, 2))
    # H: 3 -> 4; W: 5 is as near 4 as 6, and ties go up.
    assert space_to_depth_chunks(chunks, 2, "NHWC", "DCR") == (
        ((1,), (4, 2), (6, 2), (4,)),
        ((1,), (2, 1), (3, 1), (16,)),
    )
    # CRD keeps the channel chunks: input channel c becomes output channels c*4 .. c*4+3.
    assert space_to_depth_chunks(chunks, 2, "NHWC", "CRD")[1] == ((1,), (2, 1), (3, 1), (8, 8))


def test_space_to_batch_nd_plan():
    # s = 10 rows in chunks of 5, block 4, paddings (1, 1): 12 padded rows = 3 batch-side
    # rows in regular output chunks of 5 // 4 = 1 (a Zarr store needs regular chunks). The
    # input keeps its chunks: output chunk 1 (padded rows 4..7 = space rows 3..6) reads rows
    # 3..4 of input chunk 0 and rows 0..1 of chunk 1.
    out, reads = space_to_batch_nd_chunks(((2,), (5, 5), (3,)), [4], [[1, 1]])
    assert out == ((8,), (1, 1, 1), (3,))  # batch in one chunk: all 4 offsets in one block
    assert reads == ((((0, 0, 3, 1),), ((0, 3, 5, 0), (1, 0, 2, 2)), ((1, 2, 5, 0),)),)
    # Several batch chunks: the input's batch chunks once per group.
    assert space_to_batch_nd_chunks(((1, 1), (5, 5), (3,)), [4], [[1, 1]])[0][0] == (1, 1) * 4
    # A block of padding only reads nothing (9 before = 2 whole blocks + 1 row, 7 after);
    # the windows do not follow the input chunks: one output chunk reads rows of two.
    out, reads = space_to_batch_nd_chunks(((1,), (8, 8)), [4], [[9, 7]])
    assert out == ((4,), (2, 2, 2, 2))
    assert reads == (((), ((0, 0, 7, 1),), ((0, 7, 8, 0), (1, 0, 7, 1)), ((1, 7, 8, 0),)),)
    # Paddings on the block grid: whole input blocks, zero blocks around them.
    out, reads = space_to_batch_nd_chunks(((1,), (8, 8)), [4], [[8, 8]])
    assert reads == (((), ((0, 0, 8, 0),), ((1, 0, 8, 0),), ()),)
    # An axis in one chunk stays one chunk, its padding included (no 1-row sliver chunk).
    out, reads = space_to_batch_nd_chunks(((1,), (8,)), [2], [[1, 1]])
    assert out == ((2,), (5,))
    assert reads == ((((0, 0, 8, 1),),),)
    # Input chunks shorter than the block: one output chunk reads several of them.
    out, reads = space_to_batch_nd_chunks(((1,), (1, 1, 1, 1)), [4], [[0, 0]])
    assert out == ((4,), (1,))
    assert reads == ((((0, 0, 1, 0), (1, 0, 1, 1), (2, 0, 1, 2), (3, 0, 1, 3)),),)


def test_batch_to_space_nd_plan():
    # 2 groups of batch 3; spatial chunks (2, 2, 2) * block 2 = rows [0,4) [4,8) [8,12);
    # crops (5, 4) keep rows [5, 8): the first chunk is dropped, the last one too.
    # Each output block reads a block of both groups, so the spatial chunks are split in 2
    # (an output block is one input block's size): rows [0,2) [2,4) ... [10,12).
    chunks, kept, out = batch_to_space_nd_chunks(((3, 3), (2, 2, 2), (1,)), [2], [[5, 4]])
    assert chunks == ((3, 3), (1,) * 6, (1,))
    assert kept == ((2, 4),)
    assert out == ((3,), (1, 2), (1,))
    # A batch axis in one chunk stays one chunk: each block holds all groups of its rows.
    assert batch_to_space_nd_chunks(((6,), (2, 2, 2), (1,)), [2], [[5, 4]])[0][0] == (6,)
    # Batch chunks that straddle groups are cut at the group boundaries.
    assert batch_to_space_nd_chunks(((4, 2), (2,), (1,)), [2], [[0, 0]])[0][0] == (3, 3)


# --- graph shape ----------------------------------------------------------------------------


def _source_blocks(y: da.Array, source_name: str) -> dict:
    """For each output block key, the keys of array ``source_name`` it (transitively) reads."""
    graph = dict(y.__dask_graph__())
    memo: dict = {}

    def walk(key):
        if key in memo:
            return memo[key]
        found = set()
        for dep in get_dependencies(graph, key):
            if isinstance(dep, tuple) and dep[0] == source_name:
                found.add(dep)
            else:
                found |= walk(dep)
        memo[key] = found
        return found

    return {key: walk(key) for key in _flat_keys(y)}


def _flat_keys(y):
    keys = y.__dask_keys__()
    while keys and isinstance(keys[0], list):
        keys = [k for sub in keys for k in sub]
    return keys


def _task_count(y: da.Array) -> int:
    return len(dict(y.__dask_graph__()))


@pytest.mark.parametrize("op", ["depth_to_space", "space_to_depth"])
@pytest.mark.parametrize("data_format,mode", [("NHWC", "DCR"), ("NCHW", "CRD"), ("NCHW_VECT_C", "DCR")])
def test_depth_ops_read_one_block_each(op, data_format, mode):
    shape = {"NHWC": (3, 8, 8, 16), "NCHW": (3, 16, 8, 8), "NCHW_VECT_C": (3, 4, 8, 8, 4)}[data_format]
    chunks = {"NHWC": (1, 4, 2, 16), "NCHW": (1, 8, 4, 2), "NCHW_VECT_C": (1, 4, 4, 2, 4)}[data_format]
    x = da.zeros(shape, chunks=chunks, dtype=np.float32)
    y = getattr(ops, op)(x, 2, data_format=data_format, mode=mode)
    reads = _source_blocks(y, x.name)
    assert len(reads) == x.npartitions  # the input was already aligned: one output per input
    assert all(len(blocks) == 1 for blocks in reads.values())
    # Tasks: the input's own plus one per block.
    assert _task_count(y) == 2 * x.npartitions


def test_depth_to_space_rechunks_only_the_channel_axis():
    x = da.zeros((2, 6, 6, 8), chunks=(1, 3, 2, 3), dtype=np.float32)
    y = ops.depth_to_space(x, 2)
    assert y.chunks == ((1, 1), (6, 6), (4, 4, 4), (2,))
    x = da.zeros((2, 6, 6, 8), chunks=(1, 3, 3, 8), dtype=np.float32)
    assert ops.space_to_depth(x, 2).chunks == ((1, 1), (2, 1), (2, 1), (32,))


def test_space_to_batch_windows_span_input_blocks_of_the_first_spatial_axis():
    # With the batch axis chunked each window makes P output blocks; a window of one input
    # block would make them 1/P of its size, and P + 2 tasks per input block. A window spans
    # as many blocks of the first spatial axis as fit in a quarter of array.chunk-size (here
    # both: the whole axis), so output blocks are input blocks' size.
    x = da.zeros((4, 8, 8, 3), chunks=(2, 4, 4, 3), dtype=np.int16)
    y = ops.space_to_batch(x, 2, [0, 0, 0, 0])
    reads = _source_blocks(y, x.name)
    assert len(reads) == 4 * x.npartitions // 2  # prod(block) output blocks per window of 2 input blocks
    assert all(len(blocks) == 2 for blocks in reads.values())
    assert y.chunks == ((2, 2) * 4, (4,), (2, 2), (3,))
    with dask.config.set({"array.chunk-size": "64B"}):  # a quarter holds one 48-byte input block
        assert ops.space_to_batch(x, 2, [0, 0, 0, 0]).chunks == ((2, 2) * 4, (2, 2), (2, 2), (3,))


def test_space_to_batch_padding_reads_nothing():
    x = da.zeros((1, 4, 4, 1), chunks=2, dtype=np.int16)
    y = ops.space_to_batch_nd(x, [2, 2], [[4, 2], [0, 0]])  # 2 whole zero rows before, 1 after
    # Zero rows are chunked like the data rows (1 row each): H chunks 1+1 | 1+1 | 1; the
    # batch axis is one chunk (all 4 offsets of the single image together).
    assert y.chunks == ((4,), (1, 1, 1, 1, 1), (1, 1), (1,))
    reads = _source_blocks(y, x.name)
    zero_blocks = [k for k, blocks in reads.items() if not blocks]
    assert len(zero_blocks) == 3 * 2  # (3 zero chunks on H) x (2 W chunks)
    assert all(len(blocks) <= 1 for blocks in reads.values())


def test_space_to_batch_single_image_makes_one_output_block_per_input_block():
    # Issue 9: a 4x4 block on a 4,320-block tile gives 4,320 output blocks, not 69,120.
    x = da.zeros((1, 60 * 64, 72 * 64, 1), chunks=(1, 64, 64, 1), dtype=np.float32)
    y = ops.space_to_batch_nd(x, [4, 4], [[0, 0], [0, 0]])
    assert x.npartitions == 4320
    assert y.npartitions == 4320
    assert y.chunks[0] == (16,) and y.chunks[1] == (16,) * 60
    assert _task_count(y) == 2 * 4320  # the input's tasks plus one per output block


def test_padded_space_to_batch_reads_halos_not_a_rechunked_input():
    # Paddings that are not multiples of the block: each output block reads one input block
    # and fewer than b boundary rows of its neighbours, through small edge tasks; output
    # chunks are regular (what to_zarr needs without a rechunk of its own).
    x = da.zeros((1, 32, 32, 3), chunks=(1, 8, 8, 3), dtype=np.float32)
    y = ops.space_to_batch_nd(x, [4, 4], [[1, 3], [3, 1]])
    assert y.chunks[1:3] == ((2, 2, 2, 2, 1),) * 2
    graph = dict(y.__dask_graph__())
    assert not [k for k in graph if "rechunk" in str(k[0] if isinstance(k, tuple) else k)]
    reads = _source_blocks(y, x.name)
    assert len(reads) == y.npartitions
    assert max(len(blocks) for blocks in reads.values()) == 4  # own block + 3 neighbours (2-D)
    edges = [k for k in graph if "edge" in k[0]]
    assert edges
    edge_values = dask.get(graph, edges)
    assert max(a.nbytes for a in edge_values) <= 3 * 8 * 3 * 4  # a few rows, never a block
    # No output block is more than an input block.
    assert max(a.nbytes for a in dask.get(graph, _flat_keys(y))) <= 8 * 8 * 3 * 4


def test_batch_to_space_reads_one_block_from_each_group():
    x = da.zeros((8, 4, 4, 2), chunks=(1, 2, 2, 2), dtype=np.float32)
    y = ops.batch_to_space_nd(x, [2, 2], [[0, 0], [0, 0]])
    reads = _source_blocks(y, x.name)
    # H chunks of 2 are split in 2 (4 groups, 2 rows): an output block is an input block's size.
    assert len(reads) == y.npartitions == 2 * 4 * 2
    assert y.chunks[1] == (2,) * 4
    for blocks in reads.values():
        assert len(blocks) == 4
        assert sorted(key[1] // 2 for key in blocks) == [0, 1, 2, 3]  # one per group


def test_batch_to_space_does_not_read_cropped_blocks():
    x = da.zeros((4, 6, 6, 1), chunks=(1, 2, 2, 1), dtype=np.float32)
    y = ops.batch_to_space_nd(x, [2, 2], [[4, 4], [0, 0]])  # rows 0..3 and 8..11 cropped away
    read = set().union(*_source_blocks(y, x.name).values())
    assert {key[2] for key in read} == {1}  # only the middle H chunk
    assert y.shape == (1, 4, 12, 1)


def _rearrangements():
    """(name, build) for every rearranging operator, on x of shape [B, 8*n, 8, 4]."""
    return [
        ("depth_to_space", lambda x: ops.depth_to_space(x, 2)),
        ("space_to_depth", lambda x: ops.space_to_depth(x, 2)),
        ("space_to_batch", lambda x: ops.space_to_batch(x, 2, [0, 0, 2, 2])),
        ("space_to_batch_halo", lambda x: ops.space_to_batch_nd(x, [2, 2], [[1, 1], [1, 1]])),
        ("space_to_batch_halo_4", lambda x: ops.space_to_batch_nd(x, [4, 4], [[3, 1], [1, 3]])),
        ("batch_to_space", lambda x: ops.batch_to_space_nd(x, [2, 2], [[1, 1], [0, 2]])),
    ]


def _check_graph(y: da.Array, x_block_bytes: int, max_reads: int | None = 4) -> int:
    """Task count of y's graph; asserts that no task reads many blocks and that no task's
    result (any intermediate layer included) is larger than a few (4) input blocks, i.e. no
    rechunk or concatenation gathers the input."""
    graph = dict(y.__dask_graph__())
    if max_reads is not None:
        assert max(len(get_dependencies(graph, k)) for k in graph) <= max_reads
    values = dask.get(graph, list(graph))
    assert max(v.nbytes for v in values if isinstance(v, np.ndarray)) <= 4 * x_block_bytes
    return len(graph)


def _linear(tasks, sizes=(4, 8, 12)) -> bool:
    """Task counts for ``sizes`` (evenly spaced) input blocks grow by the same step (a straight
    line: edge blocks may add a constant, but nothing grows faster than the blocks)."""
    counts = [tasks(n) for n in sizes]
    return abs((counts[2] - counts[1]) - (counts[1] - counts[0])) <= 2 and counts[2] < 4 * counts[0]


@pytest.mark.parametrize("batch_chunk", [1, 4], ids=["batch-chunked", "batch-one-chunk"])
@pytest.mark.parametrize("name,build", _rearrangements(), ids=[n for n, _ in _rearrangements()])
def test_graphs_grow_linearly_with_blocks(name, build, batch_chunk):
    # With the batch axis chunked a SpaceToBatchND window spans up to P input blocks of the
    # first spatial axis (fewer when they pass a quarter of array.chunk-size; these are tiny)
    # and pieces of a neighbour at each end, on each of the 2 blocks of the second axis.
    groups = 16 if name.endswith("_4") else 4
    max_reads = (groups + 2) * 2 if batch_chunk == 1 and name.startswith("space_to_batch") else 4

    def tasks(n_chunks):
        x = da.random.random((4, 8 * n_chunks, 8, 4), chunks=(batch_chunk, 8, 4, 4)).astype(np.float32)
        return _check_graph(build(x), batch_chunk * 8 * 4 * 4 * 4, max_reads)

    # From 20 blocks on: with fewer, SpaceToBatchND's windows (up to P blocks each) are one or
    # two, and a one-row last window is spread over them (steps that differ with the window
    # count, not growth).
    assert _linear(tasks, (20, 24, 28))


@pytest.mark.parametrize("lazy_indices", [False, True], ids=["concrete-indices", "lazy-indices"])
def test_gather_nd_graph_grows_linearly(lazy_indices):
    # Params past the chunk budget (lazy indices then take the shuffle plan, never a
    # rechunk of params into one block). Graphs grow linearly with the params blocks and
    # with the indices blocks; with lazy indices requests are per (indices block, params
    # block) pair, so doubling both would quadruple that part.
    rng = np.random.default_rng(0)

    def tasks(params_chunks, index_chunks):
        params = da.random.random((8 * params_chunks, 8, 4), chunks=(8, 8, 4)).astype(np.float32)
        indices = rng.integers(0, [8 * params_chunks, 8], size=(16 * index_chunks, 2))
        indices = da.from_array(indices, chunks=(16, 2)) if lazy_indices else indices
        with dask.config.set({"array.chunk-size": "1KiB"}):
            y = ops.gather_nd(params, indices)
        # An output block gathers from every params block it hits: many reads, small pieces.
        return _check_graph(y, 8 * 8 * 4 * 4, max_reads=None)

    base = tasks(4, 4)
    assert tasks(8, 8) <= 4.2 * base  # at most quadratic in blocks, however the indices fall
    for more_params, more_indices in ((8, 4), (4, 8)):
        grown = tasks(more_params, more_indices)
        assert grown <= 2.1 * base, (base, grown)


def test_ascend_dequant_graph_grows_linearly():
    def tasks(n_chunks):
        src = da.random.randint(-100, 100, (64 * n_chunks, 32), chunks=(64, 32)).astype(np.int32)
        return _check_graph(ops.ascend_dequant(src, 0.5, dst_dtype="float32"), 64 * 32 * 4)

    assert _linear(tasks)


def test_building_is_lazy_and_quick_on_huge_arrays():
    # A 4 TiB lazy input: the graph is built from chunk tuples only.
    x = da.zeros((64, 4096, 4096, 256), chunks=(1, 1024, 1024, 256), dtype=np.float16)
    with dask.config.set(scheduler="sync"):
        y = ops.depth_to_space(x, 4)
        assert y.shape == (64, 16384, 16384, 16)
        assert y.npartitions == x.npartitions


# --- Zarr inputs: regions read inside the tasks that need them ------------------------------------


def _zarr_zeros(shape, chunks, dtype=np.float32) -> da.Array:
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=shape, chunks=chunks, dtype=dtype, fill_value=0)
    return da.from_zarr(z)


def _zarr_of(values: np.ndarray, chunks) -> zarr.Array:
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=values.shape, chunks=chunks, dtype=values.dtype)
    z[:] = values
    return z


def _region_reads(task) -> list:
    """The source reads in one task, each as ``(getter, source, region, ...)``: the
    ``Regions`` a task object takes as data (its source the task's ``TaskRef``), or the
    ``getter(source, region)`` calls nested in a legacy tuple task."""
    from dask._task_spec import Task, TaskRef
    from dask.array.core import getter

    from ops._block_reads import Regions

    if isinstance(task, Task):
        source = next((a.key for a in task.args if isinstance(a, TaskRef)), None)
        return [(r.func, source, region, *r.extra) for r in task.args if isinstance(r, Regions) for region in r.slices]
    found = []
    if isinstance(task, (tuple, list)) and task and task[0] is getter:
        return [task]
    if isinstance(task, (tuple, list)):
        for item in task:
            found += _region_reads(item)
    return found


def _layer_reads(y: da.Array, part: str) -> dict:
    """For each task of y's own layer whose key contains ``part``: its nested region reads."""
    return {k: _region_reads(v) for k, v in y.dask.layers[y.name].items() if part in k[0]}


def test_block_reads_only_for_plain_source_arrays():
    from ops._block_reads import BlockReads

    x = _zarr_zeros((4, 8), (2, 4))
    reads = BlockReads.of(x)
    assert reads is not None
    task = reads.read((1, 1), (slice(1, 2), slice(0, 3)))
    assert task[2] == (slice(3, 4), slice(4, 7))  # the region in the source's coordinates
    assert BlockReads.of(x + 1) is None  # a computed array: its blocks are not plain reads
    assert BlockReads.of(da.zeros((4, 8), chunks=2)) is None
    assert BlockReads.of(da.from_array(np.zeros((4, 8)), chunks=2)) is None  # data inlined per block


def test_refined_maps_split_chunks_to_regions():
    from ops._block_reads import refined

    assert refined(((4, 4),), ((2, 2, 4),)) == [[(0, slice(0, 2)), (0, slice(2, 4)), (1, slice(0, 4))]]
    assert refined(((4, 4),), ((3, 5),)) is None  # a new chunk across an old boundary
    assert refined(((2, 0, 2),), ((2, 2),)) == [[(0, slice(0, 2)), (2, slice(0, 2))]]


def test_batch_to_space_from_zarr_reads_each_chunk_once():
    # The benchmark's layout (issue 10): 4 groups of one image, chunks of 4 rows. Each output
    # block needs a quarter of one chunk of each group, and each chunk feeds 4 output blocks:
    # one bundle task per row of chunks reads its 4 chunks (each once, whole) from the source
    # and the 4 output blocks are cut from it. No rechunk tasks.
    x = _zarr_zeros((4, 16, 8, 2), (1, 4, 8, 2))
    y = ops.batch_to_space_nd(x, [2, 2], [[0, 0], [0, 0]])
    assert y.chunks[1] == (2,) * 16  # an output block is an input block's size
    graph = dict(y.__dask_graph__())
    assert not [k for k in graph if "rechunk" in str(k[0] if isinstance(k, tuple) else k)]
    bundles = _layer_reads(y, "-bundle-")
    assert len(bundles) == 4 and all(len(r) == 4 for r in bundles.values())
    read = [r[2] for rs in bundles.values() for r in rs]
    assert sorted(read) == sorted(tuple(slice(a, a + n) for a, n in zip(k, (1, 4, 8, 2)))
                                  for k in [(g, 4 * r, 0, 0) for g in range(4) for r in range(4)])
    assert len(graph) == y.npartitions + len(bundles) + 1  # + the Zarr array itself
    # Linear: twice the rows, twice the tasks.
    assert _task_count(ops.batch_to_space_nd(_zarr_zeros((4, 32, 8, 2), (1, 4, 8, 2)), [2, 2], [[0, 0], [0, 0]])) == (
        2 * (y.npartitions + len(bundles)) + 1
    )


def _cropped_single_batch_chunk(values, chunks, crops, small: bool):
    """BatchToSpaceND [2, 2] of ``values`` read from Zarr in ``chunks``, its graph made with
    readers taken whole (``small``) or lending rows through export tasks: (y, graph, readers,
    exports), after checking the values and that nothing is rechunked."""
    y = ops.batch_to_space_nd(da.from_zarr(_zarr_of(values, chunks)), [2, 2], crops)
    with mock.patch.object(space_batch_graph, "SMALL_RESULT_BYTES", 1 << 20 if small else 0):
        graph = dict(y.__dask_graph__())
        readers = _layer_reads(y, "-reader-")
        result = compute(y)
    assert_same(result, ops.batch_to_space_nd(values, [2, 2], crops))
    assert not [k for k in graph if "rechunk" in str(k[0] if isinstance(k, tuple) else k)]
    exports = [k for k in graph if "-export-" in str(k[0])]
    assert len(graph) == y.npartitions + len(readers) + len(exports) + 1  # + the Zarr array itself
    return y, graph, readers, exports


def test_batch_to_space_single_batch_chunk_crop_reads_each_chunk_once():
    # The batch axis in one chunk (each chunk holds all 4 groups) and a crop of one row before
    # the first: output blocks of 8 rows counted from the first kept row, each from all 4 rows
    # of one chunk and the first of the next. Each chunk is read once, whole, by the block
    # that takes most of it; the next block's reader copies out the row it lends. No rechunk.
    # Readers over SMALL_RESULT_BYTES lend the row in an export task; a small reader's
    # result is taken whole by the block that needs the row (no export tasks).
    values = np.arange(4 * 16 * 8 * 2, dtype=np.float32).reshape(4, 16, 8, 2)
    for small in (False, True):
        y, graph, readers, exports = _cropped_single_batch_chunk(values, (4, 4, 8, 2), [[1, 1], [0, 0]], small)
        assert y.chunks[1] == (8, 8, 8, 6)  # Zarr chunks as they are (not 7, 8, 8, 7)
        read = sorted(r[2] for rs in readers.values() for r in rs)
        assert read == sorted(tuple(slice(a, a + n) for a, n in zip((0, k, 0, 0), (4, 4, 8, 2)))
                              for k in range(0, 16, 4))
        assert len(exports) == (0 if small else 3)  # the first row of chunks 1-3, for blocks 0-2
    # Linear: twice the rows, twice the tasks (and one more lent row).
    doubled = ops.batch_to_space_nd(_zarr_zeros((4, 32, 8, 2), (4, 4, 8, 2)), [2, 2], [[1, 1], [0, 0]])
    with mock.patch.object(space_batch_graph, "SMALL_RESULT_BYTES", 0):
        assert _task_count(doubled) == 2 * (y.npartitions + len(readers)) + (2 * 3 + 1) + 1


def test_batch_to_space_crop_on_two_chunked_axes_reads_each_chunk_once():
    # As above, with the second spatial axis chunked and cropped too: blocks counted from the
    # first kept row and column, each from one chunk and the row, column and corner the
    # next chunks' readers lend (row: 3 x 4 blocks, column: 4 x 3, corner: 3 x 3). No rechunk.
    values = np.arange(4 * 16 * 16 * 2, dtype=np.float32).reshape(4, 16, 16, 2)
    for small in (False, True):
        y, graph, readers, exports = _cropped_single_batch_chunk(values, (4, 4, 4, 2), [[1, 1], [1, 1]], small)
        assert y.chunks[1:3] == ((8, 8, 8, 6), (8, 8, 8, 6))
        read = sorted(r[2] for rs in readers.values() for r in rs)
        assert read == sorted(tuple(slice(a, a + n) for a, n in zip((0, i, j, 0), (4, 4, 4, 2)))
                              for i in range(0, 16, 4) for j in range(0, 16, 4))
        assert len(exports) == (0 if small else 12 + 12 + 9)


def test_batch_to_space_bundles_crop_on_two_chunked_axes():
    # The batch chunked (bundles of 4 chunks, one per group) and both spatial axes chunked and
    # cropped: every chunk is read once, by its bundle; a block in one bundle's chunks is
    # made there, one that runs into the next chunks (on either axis) is joined from the parts
    # their bundles make. Blocks are regular (Zarr chunks), and no rechunk.
    x = _zarr_zeros((4, 16, 16, 2), (1, 4, 4, 2))
    y = ops.batch_to_space_nd(x, [2, 2], [[1, 1], [1, 1]])
    assert y.chunks[1:3] == ((2,) * 15, (8, 8, 8, 6))  # an output block is an input block's size
    graph = dict(y.__dask_graph__())
    assert not [k for k in graph if "rechunk" in str(k[0] if isinstance(k, tuple) else k)]
    bundles = _layer_reads(y, "-bundle-")
    read = sorted(r[2] for rs in bundles.values() for r in rs)
    assert read == sorted(tuple(slice(a, a + n) for a, n in zip((g, i, j, 0), (1, 4, 4, 2)))
                          for g in range(4) for i in range(0, 16, 4) for j in range(0, 16, 4))
    layer = y.dask.layers[y.name]
    joined = [k for k, task in layer.items() if k[0] == y.name and task.func is not operator.getitem]
    # Blocks at the end of a row of chunks (3 of 4 on the first axis) or of a column of them.
    assert len(joined) == (3 * 4 + 15 * 3) - 3 * 3
    # Small bundles: a joined block cuts its parts out of the bundles' results itself; over
    # SMALL_RESULT_BYTES each part is a task of its own, so that only it travels.
    assert not [k for k in layer if "-part-" in str(k[0])]
    values = np.arange(4 * 16 * 16 * 2, dtype=np.float32).reshape(4, 16, 16, 2)
    x = da.from_zarr(_zarr_of(values, (1, 4, 4, 2)))
    expected = ops.batch_to_space_nd(values, [2, 2], [[1, 1], [1, 1]])
    assert_same(compute(ops.batch_to_space_nd(x, [2, 2], [[1, 1], [1, 1]])), expected)
    y = ops.batch_to_space_nd(x, [2, 2], [[1, 1], [1, 1]])
    with mock.patch.object(space_batch_graph, "SMALL_RESULT_BYTES", 0):
        parts = [k for k in dict(y.__dask_graph__()) if "-part-" in str(k[0])]
        assert_same(compute(y), expected)
    assert len(parts) > len(joined)


class _CountingStore(zarr.storage.MemoryStore):
    """A memory store counting the reads of each chunk (``reads``: key -> count)."""

    def __init__(self):
        super().__init__()
        self.reads = collections.Counter()

    async def get(self, key, prototype=None, byte_range=None):
        if key.startswith("c/"):
            self.reads[key] += 1
        return await super().get(key, prototype, byte_range)


def _counted_zarr_of(values: np.ndarray, chunks) -> tuple[da.Array, _CountingStore]:
    """``values`` in a Zarr array of ``chunks`` in a counting store, read by Dask; the reads
    of its chunks are counted from here on."""
    store = _CountingStore()
    z = zarr.create_array(store, shape=values.shape, chunks=chunks, dtype=values.dtype)
    z[:] = values
    x = da.from_zarr(z)
    store.reads.clear()
    return x, store


def test_batch_to_space_bundles_what_fits_the_chunk_size():
    # Four 256-byte chunks (float32 [1, 4, 8, 2]), one per group, feed four 256-byte output
    # blocks. A bundle's peak is the parts of the blocks it makes from one read (a chunk's
    # worth each) and about four chunks' worth of buffers. With a 1 KiB chunk size (room for
    # the buffers alone) each output block reads its quarter of the 4 chunks in its own
    # task: every chunk is decoded 4 times. At 1.5 KiB (two blocks) a bundle reads its 4
    # chunks twice, making two blocks from each read; at 2 KiB (four) once.
    values = np.arange(4 * 16 * 8 * 2, dtype=np.float32).reshape(4, 16, 8, 2)
    expected = ops.batch_to_space_nd(values, [2, 2], [[0, 0], [0, 0]])
    for size, reads_per_chunk in (("1KiB", 4), ("1536B", 2), ("2KiB", 1)):
        x, store = _counted_zarr_of(values, (1, 4, 8, 2))
        with dask.config.set({"array.chunk-size": size}):
            y = ops.batch_to_space_nd(x, [2, 2], [[0, 0], [0, 0]])
        bundles = _layer_reads(y, "-bundle-")
        if reads_per_chunk == 4:
            assert not bundles
            reads = _layer_reads(y, "batch_to_space")
            assert len(reads) == y.npartitions and all(len(r) == 4 for r in reads.values())
            assert all(r[2][1].stop - r[2][1].start == 1 for rs in reads.values() for r in rs)  # a quarter
        else:
            assert len(bundles) == 4 and all(len(r) == 4 for r in bundles.values())
        assert_same(compute(y), expected)
        assert len(store.reads) == x.npartitions == 16
        assert set(store.reads.values()) == {reads_per_chunk}, (size, store.reads)


def test_batch_to_space_cropped_bundles_read_twice_what_fits_twice():
    # Cropped, both spatial axes chunked (blocks counted from the first kept row, some joined
    # from parts of two bundles): with room for two of a bundle's output blocks, no chunk is
    # read more than twice, some are read twice, and the result is the kernel's. With room
    # for all four, every chunk is read once.
    values = np.arange(4 * 16 * 16 * 2, dtype=np.float32).reshape(4, 16, 16, 2)
    crops = [[1, 1], [1, 1]]
    expected = ops.batch_to_space_nd(values, [2, 2], crops)
    for size, most in (("768B", 2), ("1KiB", 1)):
        x, store = _counted_zarr_of(values, (1, 4, 4, 2))  # 128-byte chunks
        with dask.config.set({"array.chunk-size": size}):
            y = ops.batch_to_space_nd(x, [2, 2], crops)
        assert y.chunks[1:3] == ((2,) * 15, (8, 8, 8, 6))
        assert _layer_reads(y, "-bundle-")
        assert_same(compute(y), expected)
        assert len(store.reads) == x.npartitions
        assert max(store.reads.values()) == most, (size, store.reads)


def test_space_to_batch_from_zarr_reads_each_block_once():
    # Batch axis chunked (the benchmark's layout), no halo: one task per input block reads it
    # from the source and rearranges all 4 groups; the output blocks are views of it. Blocks
    # of 256 bytes and a 1 KiB chunk size: a quarter of it holds one block.
    x = _zarr_zeros((4, 16, 8, 2), (1, 4, 8, 2))
    with dask.config.set({"array.chunk-size": "1KiB"}):
        y = ops.space_to_batch_nd(x, [2, 2], [[0, 0], [0, 0]])
    reads = _layer_reads(y, "-all-")
    assert len(reads) == x.npartitions and all(len(r) == 1 for r in reads.values())
    graph = dict(y.__dask_graph__())
    assert not [k for k in graph if "edge" in str(k[0] if isinstance(k, tuple) else k)]
    assert len(graph) == len(reads) + y.npartitions + 1
    # With room for two blocks (2 KiB), a task reads two consecutive blocks of H, each once,
    # and its output blocks span both: half as many output blocks, twice their size.
    with dask.config.set({"array.chunk-size": "2KiB"}):
        merged = ops.space_to_batch_nd(x, [2, 2], [[0, 0], [0, 0]])
    reads = _layer_reads(merged, "-all-")
    assert len(reads) == x.npartitions // 2 and all(len(r) == 2 for r in reads.values())
    assert sorted(r[2][1].start for rs in reads.values() for r in rs) == sorted([0, 4, 8, 12] * 4)
    assert merged.chunks[1] == (4, 4) and merged.npartitions == y.npartitions // 2
    assert_same(compute(merged), compute(y))
    # A halo (padding 1) with too few windows to chain them (owned halos): each block is read
    # once, whole, by the window that takes most of its rows, which copies out the rows its
    # neighbours take (edge tasks on it, for windows above SMALL_RESULT_BYTES; a small window's
    # neighbours cut them out of its result themselves); a window never waits for another
    # window, and no block key of x is in the graph. With W in two chunks the halos are 2-D (a
    # corner comes from a diagonal neighbour).
    # (32 rows: with 16, one window of 9 rows would take every chunk, and there is no halo.)
    tall = np.arange(4 * 32 * 8 * 2, dtype=np.float32).reshape(4, 32, 8, 2)
    for chunks, small in itertools.product([(1, 4, 8, 2), (1, 4, 4, 2)], [True, False]):
        x = da.from_zarr(_zarr_of(tall, chunks))
        with mock.patch.object(space_batch_plan, "CHAIN_PARALLELISM", 10**6):
            y = ops.space_to_batch_nd(x, [2, 2], [[1, 1], [1, 1]])
        with mock.patch.object(space_batch_graph, "SMALL_RESULT_BYTES", 1 << 20 if small else 0):
            windows = _layer_reads(y, "-window-")
            graph = dict(y.__dask_graph__())
            result = compute(y)
        regions = [tuple((s.start, s.stop) for s in r[2]) for rs in windows.values() for r in rs]
        assert len(regions) == len(set(regions)) == x.npartitions  # every chunk once, whole
        assert all(r[2][1].stop - r[2][1].start == chunks[1] for rs in windows.values() for r in rs)
        assert not [k for k in graph if isinstance(k, tuple) and k[0] == x.name]
        edges = [k for k in graph if "edge" in str(k[0])]
        assert not edges if small else edges
        halo_takers = [k for k in graph if "-all-" in str(k[0]) and len(get_dependencies(graph, k)) > 1]
        assert halo_takers  # some windows take halos: from edge tasks, or from windows whole
        for key in windows:  # a window depends on the source only
            assert not [d for d in get_dependencies(graph, key) if isinstance(d, tuple)], key
        assert_same(result, ops.space_to_batch_nd(tall, [2, 2], [[1, 1], [1, 1]]))
    # Merged windows with a halo too: a window takes two whole blocks and an edge of a third.
    values = np.arange(4 * 16 * 8 * 2, dtype=np.float32).reshape(4, 16, 8, 2)
    expected = ops.space_to_batch_nd(values, [2, 2], [[1, 1], [1, 1]])
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=values.shape, chunks=(1, 4, 8, 2), dtype=values.dtype)
    z[:] = values
    x = da.from_zarr(z)
    with dask.config.set({"array.chunk-size": "2KiB"}), mock.patch.object(space_batch_plan, "CHAIN_PARALLELISM", 10**6):
        merged = ops.space_to_batch_nd(x, [2, 2], [[1, 1], [1, 1]])
    assert merged.chunks[1] == (4, 4, 1)  # 18 padded rows: two windows of 8 and the last one
    with mock.patch.object(space_batch_graph, "SMALL_RESULT_BYTES", 0):  # edge tasks
        graph = dict(merged.__dask_graph__())
        windows = _layer_reads(merged, "-window-")
        result = compute(merged)
    assert sorted(len(r) for r in windows.values()) == [0] * 4 + [2] * 8  # the last windows own none
    assert len([k for k in graph if "edge" in str(k[0])]) == 4 * 2  # per image, into windows 2 and 3
    assert_same(result, expected)


def test_padded_space_to_batch_from_zarr_chains_halos_from_finished_windows():
    # Windows enough (here 4 images of 9 windows, or of 9 x 2): each window is one task that
    # reads its chunk once, whole, makes its blocks with the rows its neighbours' tasks copied
    # out and copies out the rows its own neighbours take, a pick of its result after its
    # blocks. The halos come from one side on each axis, so no two windows wait on each other;
    # no window's block is held for a second task, and there are no edge tasks.
    tall = np.arange(4 * 32 * 8 * 2, dtype=np.float32).reshape(4, 32, 8, 2)
    expected = ops.space_to_batch_nd(tall, [2, 2], [[1, 1], [1, 1]])
    for chunks in [(1, 4, 8, 2), (1, 4, 4, 2)]:
        x = da.from_zarr(_zarr_of(tall, chunks))
        y = ops.space_to_batch_nd(x, [2, 2], [[1, 1], [1, 1]])
        graph = dict(y.__dask_graph__())
        names = collections.Counter(k[0].split("-")[1] for k in graph if isinstance(k, tuple) and k[0] != x.name)
        assert not names.get("window") and not names.get("edge")
        chained = _layer_reads(y, "-all-")
        regions = [tuple((s.start, s.stop) for s in r[2]) for rs in chained.values() for r in rs]
        assert len(regions) == len(set(regions)) == x.npartitions  # every chunk once, whole, by its owner
        exports = [k for k in graph if "-exports-" in str(k[0])]
        assert exports and len(exports) < len(chained)  # the first windows copy out nothing
        sides = collections.defaultdict(set)  # spatial axis -> which way its halos come from
        for key in chained:
            taken = [d for d in get_dependencies(graph, key) if isinstance(d, tuple)]
            assert all("-exports-" in d[0] and d[1] == key[1] for d in taken), taken  # one image's
            for d in taken:
                for axis in (2, 3):
                    sides[axis] |= {np.sign(d[axis] - key[axis])} - {0}
        assert sides[2] and all(len(way) <= 1 for way in sides.values()), sides
        assert_same(compute(y), expected)
        stored = zarr.create_array(zarr.storage.MemoryStore(), shape=y.shape, chunks=[c[0] for c in y.chunks],
                                   dtype=np.float32)
        with ops.fusing_stores():
            da.store(y, stored, lock=False)
        assert_same(stored[:], expected)
        # As the service and the command line submit it: each window one task that writes its
        # blocks and keeps the rows it copied out, one pick of those, and the tree of done
        # tasks waiting on the windows themselves (their kept rows are small).
        done = ops._fused_stores.fusing(da.store(y, stored, lock=False, compute=False))
        (optimized,) = dask.optimize(done)
        tasks = dict(optimized.__dask_graph__())
        assert not [k for k, v in tasks.items() if getattr(v, "func", None) is ops._fused_stores._stored]
        # (and the source array: one key its readers share)
        assert len(tasks) == len(chained) + len(exports) + math.ceil(y.npartitions / 32) + 1 + 1
        assert [k for k in tasks if not isinstance(k, tuple) and k.startswith("original-from-zarr")]
        stored[:] = np.nan
        dask.compute(done)
        assert_same(stored[:], expected)
        # Windows over SMALL_RESULT_BYTES are not chained: the scheduler places a chained
        # task where its neighbours' rows are as it becomes ready, and with large blocks a
        # worker then ran ahead of the other, for no time saved and a higher memory peak.
        with mock.patch.object(space_batch_graph, "SMALL_RESULT_BYTES", 0):
            large = ops.space_to_batch_nd(x, [2, 2], [[1, 1], [1, 1]])
        assert _layer_reads(large, "-window-") and not _layer_reads(large, "-exports-")


def test_halos_chain_only_one_way_and_with_windows_to_spare():
    from ops.space_batch.plan import halos_chain

    # One axis, three windows: window 1 owns chunk 1 and takes a row of chunk 2 (owned by
    # window 2): halos from later windows. Plus a row of chunk 0: from both sides, a cycle.
    one_way = (((0, 0, 4, 0),), ((1, 0, 4, 0), (2, 0, 1, 8)), ((2, 1, 4, 0),))
    both_ways = (((0, 0, 3, 0),), ((0, 3, 4, 0), (1, 0, 4, 1), (2, 0, 1, 5)), ((2, 1, 4, 0),))
    assert halos_chain([one_way], 4, ()) is True  # 12 windows, chains of 3
    assert halos_chain([one_way], 3, ()) is False  # 9 windows: under 4 times the chain
    assert halos_chain([one_way], 3, (2,)) is True
    assert halos_chain([both_ways], 100, ()) is False
    no_halo = (((0, 0, 4, 0),), ((1, 0, 4, 0),))
    assert halos_chain([no_halo], 100, ()) is False  # nothing to chain: owned windows read their own
    # A single image with W in one chunk has no windows to spare: owned halos, no chain.
    x = da.from_zarr(_zarr_of(np.zeros((1, 64, 8, 2), np.float32), (1, 4, 8, 2)))
    graph = dict(ops.space_to_batch_nd(x, [2, 2], [[1, 1], [1, 1]]).__dask_graph__())
    assert [k for k in graph if "-window-" in str(k[0])] and not [k for k in graph if "-exports-" in str(k[0])]


def test_object_store_sources():
    # From an object store (here fsspec's in-memory filesystem behind zarr's FsspecStore) the
    # plans are those from a local disk: SpaceToBatchND's halos from their chunks' owners,
    # BatchToSpaceND's bundles (each chunk downloaded once).
    from zarr.storage import FsspecStore

    from ops._block_reads import BlockReads

    store = FsspecStore.from_url(f"memory://h8-{id(object())}/x.zarr", read_only=False)
    z = zarr.create_array(store, shape=(4, 16, 8, 2), chunks=(1, 4, 8, 2), dtype=np.float32, fill_value=0)
    x = da.from_zarr(z)
    assert BlockReads.of(x) is not None
    y = ops.batch_to_space_nd(x, [2, 2], [[0, 0], [0, 0]])
    assert not [k for k in dict(y.__dask_graph__()) if "rechunk" in str(k[0] if isinstance(k, tuple) else k)]
    bundles = _layer_reads(y, "-bundle-")
    regions = [tuple((s.start, s.stop) for s in r[2]) for rs in bundles.values() for r in rs]
    assert len(bundles) == 4 and len(regions) == len(set(regions)) == x.npartitions
    values = np.arange(4 * 16 * 8 * 2, dtype=np.float32).reshape(4, 16, 8, 2)
    z[:] = values
    assert_same(y.compute(), ops.batch_to_space_nd(values, [2, 2], [[0, 0], [0, 0]]))
    y = ops.space_to_batch_nd(x, [2, 2], [[1, 1], [1, 1]])
    owned = [tuple((s.start, s.stop) for s in r[2]) for rs in _layer_reads(y, "-window-").values() for r in rs]
    assert len(owned) == len(set(owned)) == x.npartitions  # each chunk read once; halos via edge tasks
    y = ops.space_to_batch_nd(x, [2, 2], [[0, 0], [0, 0]])  # each chunk read once, from the store
    regions = [tuple((s.start, s.stop) for s in r[2]) for rs in _layer_reads(y, "-all-").values() for r in rs]
    assert len(regions) == len(set(regions)) == x.npartitions


def test_padded_space_to_batch_spreads_a_sliver_of_a_last_chunk_over_the_others():
    # Padding by one block adds one batch-side row per padded axis: with windows aligned to the
    # chunks the last output chunk would be that row alone, which Zarr stores as a whole chunk.
    # A halo plan grows its chunks by a row instead while the drift off the input chunks stays
    # within a quarter of a chunk; each chunk is still read once, and the values are the kernel's.
    values = np.random.default_rng(3).standard_normal((1, 48, 32, 3)).astype(np.float32)
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=values.shape, chunks=(1, 16, 16, 3), dtype=np.float32)
    z[:] = values
    x = da.from_zarr(z)
    for pad_value in (0, 2.5):
        y = ops.space_to_batch_nd(x, [2, 2], [[1, 1], [1, 1]], pad_value)
        assert y.chunks[1:3] == ((9, 9, 7), (9, 8))  # not (8, 8, 8, 1) and (8, 8, 1)
        owned = [tuple((s.start, s.stop) for s in r[2]) for rs in _layer_reads(y, "-window-").values() for r in rs]
        assert len(owned) == len(set(owned)) == x.npartitions
        assert_same(y.compute(), ops.space_to_batch_nd(values, [2, 2], [[1, 1], [1, 1]], pad_value))
        stored = zarr.create_array(zarr.storage.MemoryStore(), shape=y.shape, chunks=[c[0] for c in y.chunks],
                                   dtype=np.float32)
        with ops.fusing_stores():
            da.store(y, stored, lock=False)
        assert_same(stored[:], ops.space_to_batch_nd(values, [2, 2], [[1, 1], [1, 1]], pad_value))
    # Many chunks: spreading the row over 16 windows of 8 would drift the last ones 15 rows,
    # past a quarter of a chunk (2 of its 8 batch-side rows), so the sliver stays.
    many = da.from_zarr(zarr.create_array(zarr.storage.MemoryStore(), shape=(1, 256, 8, 1), chunks=(1, 16, 4, 1),
                                          dtype=np.float32, fill_value=0))
    assert ops.space_to_batch_nd(many, [2, 2], [[1, 1], [1, 1]]).chunks[1] == (8,) * 16 + (1,)
    # Without a halo the windows stay on the chunks (region reads), the padding row its own chunk.
    assert ops.space_to_batch_nd(x, [2, 2], [[0, 2], [0, 0]]).chunks[1] == (8, 8, 8, 1)


def test_padded_space_to_batch_of_computed_blocks_spreads_a_sliver_too():
    # Windows over x's own blocks (an array in memory, a computed one): a one-row last window
    # would be one more task per batch chunk and its own tiny output block.
    values = np.random.default_rng(4).standard_normal((2, 32, 32, 3)).astype(np.float32)
    for x in (da.from_array(values, chunks=(1, 16, 32, 3)), da.from_array(values, chunks=(1, 16, 32, 3)) * 1):
        for pad_value in (0, np.nan):
            with dask.config.set({"array.chunk-size": "8KiB"}):  # windows of one block each, not merged
                y = ops.space_to_batch_nd(x, [2, 2], [[1, 1], [1, 1]], pad_value)
            assert y.chunks[1:3] == ((9, 8), (17,))  # not (8, 8, 1)
            assert_same(compute(y), reference.space_to_batch_nd(values, [2, 2], [[1, 1], [1, 1]],
                                                                np.full((), pad_value, np.float32)))
