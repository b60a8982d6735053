"""SpaceToBatch(ND) / BatchToSpaceND against the seed's 4-D formula, the literal documented
formulas, and as Dask graphs against the NumPy path."""

from __future__ import annotations

import math
from unittest import mock

import dask
import dask.array as da
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ops
from ops.space_batch import plan as space_batch_plan
from tests.helpers import ALL_DTYPES, assert_same, chunkings, compute, dtype_strategy, random_array
from tests.ops import reference


def test_seed_example_shape():
    # The seed's sample: int32 output of shape [4, 2, 2, 2].
    x = np.arange(1 * 4 * 4 * 2, dtype=np.int32).reshape(1, 4, 4, 2)
    y = ops.space_to_batch(x, 2, np.array([[0, 0], [0, 0]], np.int32))
    assert y.shape == (4, 2, 2, 2)
    # n_out = n + (bh*bs + bw)*N: group (bh, bw) = (0, 1) holds x[0, 0::2, 1::2].
    assert_same(y[1], x[0, 0::2, 1::2])


@pytest.mark.smoke
def test_tensorflow_doc_examples():
    # tf.space_to_batch_nd documentation, examples (1) and (4).
    x = np.array([[[[1], [2]], [[3], [4]]]])
    assert ops.space_to_batch_nd(x, [2, 2], [[0, 0], [0, 0]]).reshape(-1).tolist() == [1, 2, 3, 4]
    x = np.arange(1, 17).reshape(2, 2, 4, 1)
    y = ops.space_to_batch_nd(x, [2, 2], [[0, 0], [2, 0]])
    expected = [[0, 1, 3], [0, 9, 11], [0, 2, 4], [0, 10, 12],
                [0, 5, 7], [0, 13, 15], [0, 6, 8], [0, 14, 16]]
    assert y.shape == (8, 1, 3, 1)
    assert y[:, 0, :, 0].tolist() == expected
    # tf.batch_to_space documentation, example (4): the inverse.
    assert_same(ops.batch_to_space_nd(y, [2, 2], [[0, 0], [2, 0]]), x)


@pytest.mark.parametrize("paddings", [[[0, 0], [1, 0]], [[1, 1], [0, 1]], [0, 2, 1, 0], [[3, 1, 0, 1]]])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_space_to_batch_seed_formula_every_dtype(dtype, paddings):
    x = random_array(np.random.default_rng(5), (2, 4, 3, 3), dtype)
    expected = reference.space_to_batch(x, 2, paddings)
    assert_same(ops.space_to_batch(x, 2, paddings), expected)
    assert_same(ops.space_to_batch(x, 2, np.array(paddings, np.int64)), expected)
    assert_same(compute(ops.space_to_batch(da.from_array(x, chunks=(1, 3, 2, 2)), 2, paddings)), expected)


@pytest.mark.smoke
def test_space_to_batch_equals_nd_form():
    x = random_array(np.random.default_rng(2), (3, 5, 7, 2), np.float32)
    p = np.array([1, 0, 3, 2])
    assert_same(ops.space_to_batch(x, 3, p), ops.space_to_batch_nd(x, [3, 3], p.reshape(2, 2)))


def test_block_size_one_is_identity_plus_padding():
    x = random_array(np.random.default_rng(2), (2, 2, 2, 1), np.int8)
    assert_same(ops.space_to_batch(x, 1, [0, 0, 0, 0]), x)
    assert ops.space_to_batch(x, 1, [1, 0, 0, 1]).shape == (2, 3, 3, 1)


def test_batch_to_space_tensorflow_doc_example():
    # tf.batch_to_space docs: [4, 1, 1, 3] -> [1, 2, 2, 3]
    x = np.array([[[[1, 2, 3]]], [[[4, 5, 6]]], [[[7, 8, 9]]], [[[10, 11, 12]]]])
    y = ops.batch_to_space_nd(x, [2, 2], [[0, 0], [0, 0]])
    assert y.tolist() == [[[[1, 2, 3], [4, 5, 6]], [[7, 8, 9], [10, 11, 12]]]]
    # [8, 1, 3, 1] with crops [[0, 0], [2, 0]] -> [2, 2, 4, 1]
    x = np.arange(1, 25).reshape(8, 1, 3, 1)
    y = ops.batch_to_space_nd(x, [2, 2], [[0, 0], [2, 0]])
    assert y.shape == (2, 2, 4, 1)
    assert_same(y, reference.batch_to_space_nd(x, [2, 2], [[0, 0], [2, 0]]))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_nd_formulas_every_dtype(dtype):
    rng = np.random.default_rng(11)
    x = random_array(rng, (2, 3, 4, 5, 2), dtype)
    block, pads = [2, 3, 1], [[1, 0], [0, 2], [0, 0]]
    y = ops.space_to_batch_nd(x, block, pads)
    assert_same(y, reference.space_to_batch_nd(x, block, pads))
    assert_same(ops.batch_to_space_nd(y, block, pads), x)
    crops = [[1, 2], [0, 4], [0, 0]]
    z = random_array(rng, (12, 3, 2, 5, 2), dtype)
    assert_same(ops.batch_to_space_nd(z, block, crops), reference.batch_to_space_nd(z, block, crops))


def test_rank_eight_and_one_spatial_dim():
    rng = np.random.default_rng(4)
    x = random_array(rng, (2, 4, 1, 2, 1, 2, 1, 3), np.uint16)
    block, pads = [2, 1, 2, 1, 1, 1, 3], [[0, 0]] * 7
    y = ops.space_to_batch_nd(x, block, pads)
    assert_same(y, reference.space_to_batch_nd(x, block, pads))
    assert_same(ops.batch_to_space_nd(y, block, pads), x)
    x = random_array(rng, (3, 5), np.complex128)
    assert_same(ops.space_to_batch_nd(x, [5], [[0, 0]]), reference.space_to_batch_nd(x, [5], [[0, 0]]))


def test_large_paddings_and_crops():
    rng = np.random.default_rng(8)
    x = random_array(rng, (1, 2, 3, 1), np.float32)
    pads = [[7, 5], [10, 3]]  # whole blocks of padding on both sides
    y = ops.space_to_batch_nd(x, [2, 4], pads)
    assert_same(y, reference.space_to_batch_nd(x, [2, 4], pads))
    lazy = ops.space_to_batch_nd(da.from_array(x, chunks=1), [2, 4], pads)
    assert_same(compute(lazy), y)
    crops = [[5, 4], [2, 9]]  # crops reaching past whole input blocks
    z = random_array(rng, (8, 6, 5, 1), np.float32)
    expected = reference.batch_to_space_nd(z, [2, 4], crops)
    assert_same(ops.batch_to_space_nd(z, [2, 4], crops), expected)
    assert_same(compute(ops.batch_to_space_nd(da.from_array(z, chunks=(3, 1, 1, 1)), [2, 4], crops)), expected)


def test_empty_tensors():
    x = np.zeros((0, 4, 4, 3), np.float32)
    assert ops.space_to_batch(x, 2, [0, 0, 0, 0]).shape == (0, 2, 2, 3)
    assert ops.batch_to_space_nd(np.zeros((8, 0, 2, 1)), [2, 4], [[0, 0], [1, 1]]).shape == (1, 0, 6, 1)
    x = np.zeros((2, 0, 3), np.int8)
    y = ops.space_to_batch_nd(x, [2], [[1, 1]])
    assert_same(y, np.zeros((4, 1, 3), np.int8))
    assert_same(compute(ops.space_to_batch_nd(da.from_array(x), [2], [[1, 1]])), y)
    # A huge number of block offsets with nothing to move must not loop over them.
    huge = ops.space_to_batch_nd(np.zeros((0, 1, 1), np.uint8), [2**40], [[0, 2**40 - 1]])
    assert huge.shape == (0, 1, 1)
    lazy = ops.batch_to_space_nd(da.zeros((0, 1, 5), dtype=np.uint8), [2**40], [[0, 0]])
    assert lazy.shape == (0, 2**40, 5) and lazy.npartitions == 1


# --- Dask == NumPy byte for byte, and round trips, over random shapes/dtypes/chunkings --------


@st.composite
def space_cases(draw):
    m = draw(st.integers(1, 3))
    rest = draw(st.lists(st.integers(0, 2), max_size=6 - m))
    block = draw(st.lists(st.integers(1, 3), min_size=m, max_size=m))
    spatial, pads = [], []
    for b in block:
        s = draw(st.integers(0, 5))
        lo = draw(st.integers(0, 4))
        hi = draw(st.integers(0, 3))
        hi += (-(s + lo + hi)) % b
        spatial.append(s)
        pads.append([lo, hi])
    shape = (draw(st.integers(0, 3)), *spatial, *rest)
    dtype = draw(dtype_strategy)
    x = random_array(np.random.default_rng(draw(st.integers(0, 2**32 - 1))), shape, dtype)
    return x, block, pads, draw(chunkings(shape))


@given(space_cases())
def test_space_to_batch_nd_dask_equals_numpy(case):
    x, block, pads, chunks = case
    expected = ops.space_to_batch_nd(x, block, pads)
    assert_same(expected, reference.space_to_batch_nd(x, block, pads))
    lazy = ops.space_to_batch_nd(da.from_array(x, chunks=chunks), block, pads)
    assert_same(compute(lazy), expected)
    # batch_to_space_nd(space_to_batch_nd(x, b, p), b, p) == x, eagerly and lazily.
    assert_same(ops.batch_to_space_nd(expected, block, pads), x)
    assert_same(compute(ops.batch_to_space_nd(lazy, block, pads)), x)


@st.composite
def batch_cases(draw):
    m = draw(st.integers(1, 3))
    rest = draw(st.lists(st.integers(0, 2), max_size=6 - m))
    block = draw(st.lists(st.integers(1, 3), min_size=m, max_size=m))
    spatial = [draw(st.integers(0, 4)) for _ in block]
    crops = []
    for b, s in zip(block, spatial):
        lo = draw(st.integers(0, s * b))
        crops.append([lo, draw(st.integers(0, s * b - lo))])
    shape = (math.prod(block) * draw(st.integers(0, 3)), *spatial, *rest)
    dtype = draw(dtype_strategy)
    x = random_array(np.random.default_rng(draw(st.integers(0, 2**32 - 1))), shape, dtype)
    return x, block, crops, draw(chunkings(shape))


@given(batch_cases())
def test_batch_to_space_nd_dask_equals_numpy(case):
    x, block, crops, chunks = case
    expected = ops.batch_to_space_nd(x, block, crops)
    assert_same(expected, reference.batch_to_space_nd(x, block, crops))
    assert_same(compute(ops.batch_to_space_nd(da.from_array(x, chunks=chunks), block, crops)), expected)


# --- Zarr-backed inputs: blocks read as regions of the source inside the tasks ----------------


def _zarr_input(x: np.ndarray, chunks) -> da.Array:
    import zarr

    z = zarr.create_array(zarr.storage.MemoryStore(), shape=x.shape, chunks=chunks, dtype=x.dtype, fill_value=0)
    z[...] = x
    return da.from_zarr(z)


@pytest.mark.parametrize(
    "chunks,block,pads",
    [
        ((1, 4, 6, 2), [2, 2], [[0, 0], [0, 0]]),  # the benchmark's layout: batch chunked, W one chunk
        ((1, 4, 6, 2), [2, 2], [[1, 1], [1, 1]]),  # a one-row halo on H
        ((2, 3, 6, 2), [2, 3], [[1, 1], [2, 1]]),  # irregular H chunks
        ((4, 4, 4, 2), [2, 2], [[1, 1], [1, 1]]),  # halos on both axes, corners included
        ((3, 5, 6, 1), [4, 1], [[9, 7], [0, 0]]),  # whole blocks of padding
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.bool_], ids=str)
def test_zarr_input_dask_equals_numpy(chunks, block, pads, dtype):
    x = random_array(np.random.default_rng(3), (4, 12, 6, 2), dtype)
    expected = ops.space_to_batch_nd(x, block, pads)
    assert_same(compute(ops.space_to_batch_nd(_zarr_input(x, chunks), block, pads)), expected)
    # The inverse from a Zarr input of the batch-side array (its own chunking).
    batch_chunks = (1, 2, 3, 2)
    assert_same(compute(ops.batch_to_space_nd(_zarr_input(expected, batch_chunks), block, pads)), x)


@settings(max_examples=30, deadline=None)
@given(batch_cases())
def test_batch_to_space_nd_zarr_input_equals_numpy(case):
    x, block, crops, chunks = case
    if x.dtype.kind == "V" or x.dtype.name not in np.sctypeDict or 0 in x.shape:
        return  # Zarr holds the standard dtypes; empty arrays never read anything
    expected = ops.batch_to_space_nd(x, block, crops)
    lazy = ops.batch_to_space_nd(_zarr_input(x, tuple(max(c) for c in chunks)), block, crops)
    assert_same(compute(lazy), expected)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_space_to_batch_nd_zarr_input_with_merged_windows_equals_numpy(data):
    # Batch chunked: output blocks span 1..4 input chunks of the first spatial axis, as Dask's
    # chunk size allows; without a halo (paddings multiples of the block) read from the store
    # by the windows, with one each chunk by the window owning it, halos through edge tasks,
    # or, with windows enough (or always, as drawn here), from the neighbours' finished tasks.
    block = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2))
    rows = [data.draw(st.integers(1, 3)) * b for b in block]  # rows per chunk
    spatial = [r * data.draw(st.integers(1, 5)) for r in rows]
    halo = data.draw(st.booleans())
    before = [data.draw(st.integers(0, 2 * b - 1)) if halo else b * data.draw(st.integers(0, 1)) for b in block]
    pads = [[lo, (-(n + lo)) % b + b * data.draw(st.integers(0, 1))] for lo, n, b in zip(before, spatial, block)]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = random_array(rng, (data.draw(st.integers(2, 3)), *spatial, 2), np.float32)
    chunks = (1, *rows, 2)
    windows = data.draw(st.integers(1, 4))
    chain = data.draw(st.sampled_from([1, space_batch_plan.CHAIN_PARALLELISM, 10**6]))
    with dask.config.set({"array.chunk-size": f"{4 * windows * math.prod(chunks) * 4}B"}), \
            mock.patch.object(space_batch_plan, "CHAIN_PARALLELISM", chain):
        lazy = ops.space_to_batch_nd(_zarr_input(x, chunks), block, pads)
    assert_same(compute(lazy), ops.space_to_batch_nd(x, block, pads))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_batch_to_space_nd_cropped_blocks_are_zarr_chunks(data):
    # A crop before the first row of the first spatial axis (and of the second, chunked or
    # not): the output blocks are counted from the first kept row on each axis, so they are
    # regular (a Zarr array's chunks, no rechunk to store them). With the batch chunked
    # (bundles) blocks that run into the next input chunk are joined from parts made by the
    # bundles of the chunks they lie in; with the batch in one chunk, from one chunk's rows
    # and the few the next chunks' readers lend (from a Zarr source or from another
    # computation's blocks). Stored inside ops.fusing_stores too.
    import zarr

    block = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2))
    groups = math.prod(block)
    rows = [data.draw(st.integers(1, 4)) for _ in block]  # input rows per chunk on each spatial axis
    spatial = [rows[0] * data.draw(st.integers(2, 5)), *(n * data.draw(st.integers(1, 3)) for n in rows[1:])]
    lo = data.draw(st.integers(1, spatial[0] * block[0] - 1))
    hi = data.draw(st.integers(0, spatial[0] * block[0] - lo - 1))
    crops = [[lo, hi]]
    for n, b in zip(spatial[1:], block[1:]):  # any crop before on the other axes, chunked or not
        other_lo = data.draw(st.integers(0, n * b - 1))
        crops.append([other_lo, data.draw(st.integers(0, n * b - other_lo - 1))])
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    single = data.draw(st.booleans())  # the batch in one chunk, or one row per chunk
    count = data.draw(st.integers(1 if groups > 1 or single else 2, 2))
    x = random_array(rng, (groups * count, *spatial, 2), np.float32)
    chunks = (x.shape[0] if single else 1, *rows, 2)
    # A computed input (block keys, not region reads) only with the batch in one chunk: with it
    # chunked only bundles, which read a source, count blocks so. An exact copy of x, not
    # ``x * 1``, which would quiet signalling NaNs.
    computed = single and data.draw(st.booleans())
    source = da.from_array(x, chunks=chunks).map_blocks(np.copy) if computed else _zarr_input(x, chunks)
    lazy = ops.batch_to_space_nd(source, block, crops)
    expected = ops.batch_to_space_nd(x, block, crops)
    assert all(len(set(c[:-1])) <= 1 and c[-1] <= c[0] for c in lazy.chunks), lazy.chunks
    assert_same(compute(lazy), expected)
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=lazy.shape, chunks=[c[0] for c in lazy.chunks],
                          dtype=lazy.dtype, fill_value=0)
    with ops.fusing_stores():
        da.store(lazy, z, lock=False, scheduler="threads")
    assert_same(z[...], expected)
