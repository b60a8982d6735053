"""The documented bad inputs: each refused with InvalidArgument naming parameter, rule and
value, before any work, quickly and without a large allocation."""

from __future__ import annotations

import time
import tracemalloc

import dask
import dask.array as da
import numpy as np
import pytest

import ops
from ops.errors import InvalidArgument

X4 = np.zeros((1, 4, 4, 4), np.float32)
B2 = np.zeros((4, 2, 2, 1), np.float32)

HUGE_BLOCK_SIZES = [0, -1, -1879048192, 2**62, 2**63, 2**64]


def _call(op, *args, **kwargs):
    return {
        "depth_to_space": lambda: ops.depth_to_space(*args, **kwargs),
        "space_to_depth": lambda: ops.space_to_depth(*args, **kwargs),
        "space_to_batch": lambda: ops.space_to_batch(*args, **kwargs),
        "space_to_batch_nd": lambda: ops.space_to_batch_nd(*args, **kwargs),
        "batch_to_space_nd": lambda: ops.batch_to_space_nd(*args, **kwargs),
    }[op]()


def refused(call, match: str, error=InvalidArgument):
    """The call raises ``error`` matching ``match`` in well under a second with < 1 MiB allocated."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(error, match=match):
            call()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert time.perf_counter() - started < 2.0
    assert peak < 2**20, f"refusing allocated {peak} bytes"


@pytest.mark.parametrize("block_size", HUGE_BLOCK_SIZES)
def test_depth_block_sizes(block_size):
    rule = r">= 2" if block_size < 2 else r"<= 3037000499"
    refused(lambda: ops.depth_to_space(X4, block_size), rf"block_size must be {rule}, got {block_size}")
    refused(lambda: ops.space_to_depth(X4, block_size), rf"block_size must be {rule}, got {block_size}")


@pytest.mark.smoke
def test_depth_block_size_one():
    refused(lambda: ops.depth_to_space(X4, 1), r"block_size must be >= 2, got 1")


@pytest.mark.parametrize("block_size", HUGE_BLOCK_SIZES)
def test_space_to_batch_block_sizes(block_size):
    # block_size**2 is the batch multiplier, so it must fit in int64 too.
    rule = r">= 1" if block_size < 1 else r"<= 3037000499"
    refused(lambda: ops.space_to_batch(X4, block_size, [0, 0, 0, 0]), rf"block_size must be {rule}, got {block_size}")


@pytest.mark.parametrize("op", ["space_to_batch_nd", "batch_to_space_nd"])
@pytest.mark.parametrize("entry", [0, -1, -1879048192])
def test_block_shape_entries(op, entry):
    refused(lambda: _call(op, B2, [2, entry], [[0, 0], [0, 0]]), rf"block_shape\[1\] must be >= 1, got {entry}")


@pytest.mark.parametrize("op", ["space_to_batch_nd", "batch_to_space_nd"])
def test_block_shape_product_overflows_int64(op):
    refused(lambda: _call(op, B2, [2**32, 2**32], [[0, 0], [0, 0]]), r"block_shape product must fit in int64")
    refused(lambda: _call(op, B2, [2**62, 2**62], [[0, 0], [0, 0]]), r"block_shape product must fit in int64")


def test_output_shape_overflows_int64():
    # Lazy inputs can be astronomically large; the output size is checked before any graph.
    x = da.zeros((1, 2**40, 2**20, 4), chunks=(1, 2**40, 2**20, 4), dtype=np.float64)
    refused(lambda: ops.depth_to_space(x, 2), r"output shape \[1, 2199023255552, 2097152, 1\] overflows int64")
    y = da.zeros((2**40, 2**30, 1), chunks=(2**40, 2**30, 1), dtype=np.float64)
    refused(lambda: ops.space_to_batch_nd(y, [2**20], [[0, 0]]), r"output shape .* overflows int64")
    refused(lambda: ops.space_to_batch_nd(X4, [1, 1], [[0, 2**62], [0, 2**62]]), r"output shape .* overflows int64")


@pytest.mark.parametrize("op,name", [("space_to_batch_nd", "paddings"), ("batch_to_space_nd", "crops")])
def test_negative_paddings_and_crops(op, name):
    refused(lambda: _call(op, B2, [2, 2], [[0, -1], [0, 0]]), rf"{name}\[0\]\[1\] must be >= 0, got -1")
    refused(lambda: _call(op, B2, [2, 2], [[0, 0], [-2**40, 0]]), rf"{name}\[1\]\[0\] must be >= 0")


def test_negative_space_to_batch_paddings():
    refused(lambda: ops.space_to_batch(X4, 2, [0, 0, -2, 2]), r"paddings\[1\]\[0\] must be >= 0, got -2")


def test_crops_larger_than_the_dimension():
    refused(lambda: ops.batch_to_space_nd(B2, [2, 2], [[3, 2], [0, 0]]), r"crops\[0\] = \[3, 2\] removes more than spatial dim 0 holds \(x.shape\[1\] \* block_shape\[0\] = 4\)")
    refused(lambda: ops.batch_to_space_nd(B2, [2, 2], [[0, 0], [2**62, 0]]), r"crops\[1\] = \[4611686018427387904, 0\] removes more")


@pytest.mark.parametrize(
    "block_shape,pairs,match",
    [
        ([], [], r"block_shape must have at least 1 entries, got 0"),
        ([1] * 8, [[0, 0]] * 8, r"block_shape must have at most 7 entries, got 8"),
        ([[2, 2]], [[0, 0]], r"block_shape must be 1-D \[M\], got shape \[1, 2\]"),
        (2, [[0, 0]], r"block_shape must be 1-D \[M\], got shape \[\]"),
        ([2, 2], [[0, 0]], r"must have shape \[2, 2\], got shape \[1, 2\]"),
        ([2, 2], [0, 0, 0, 0], r"must have shape \[2, 2\], got shape \[4\]"),
        ([2, 2], [[0, 0, 0], [0, 0, 0]], r"must have shape \[2, 2\], got shape \[2, 3\]"),
        ([2, 2], [[0, 0], [0]], r"must be a rectangular array of integers"),
        ([2, 2, 2, 2], [[0, 0]] * 4, r"x must have rank M\+1..8 for block_shape of length M = 4, got rank 4"),
    ],
)
@pytest.mark.parametrize("op", ["space_to_batch_nd", "batch_to_space_nd"])
def test_wrong_ranks_and_shapes(op, block_shape, pairs, match):
    refused(lambda: _call(op, B2, block_shape, pairs), match)


def test_wrong_space_to_batch_paddings_shapes():
    refused(lambda: ops.space_to_batch(X4, 2, [0, 0, 0]), r"paddings must have 4 elements as shape \[2, 2\], \[4\] or \[1, 4\], got shape \[3\]")
    refused(lambda: ops.space_to_batch(X4, 2, np.zeros((4, 1), np.int32)), r"got shape \[4, 1\]")
    refused(lambda: ops.space_to_batch(np.zeros((4, 4, 4)), 2, [0, 0, 0, 0]), r"x must have rank 4 \(NHWC\), got rank 3")


def test_wrong_depth_layouts():
    refused(lambda: ops.depth_to_space(np.zeros((4, 4, 4)), 2), r"x must have rank 4 for NHWC, got rank 3")
    refused(lambda: ops.depth_to_space(np.zeros((1, 1, 1, 4, 2)), 2, data_format="NCHW_VECT_C"), r"x.shape\[4\] must be 4 for NCHW_VECT_C")
    refused(lambda: ops.depth_to_space(X4, 2, data_format="NCWH"), r"data_format must be one of 'NHWC', 'NCHW' or 'NCHW_VECT_C', got 'NCWH'")
    refused(lambda: ops.depth_to_space(X4, 2, mode="DRC"), r"mode must be one of 'DCR' or 'CRD', got 'DRC'")
    refused(lambda: ops.depth_to_space(np.zeros((1, 2, 2, 6)), 2), r"input depth \(channels\) must be divisible by block_size\*\*2 = 4, got 6 channels")
    refused(lambda: ops.depth_to_space(np.zeros((1, 2, 2, 2, 4)), 2, data_format="NCHW_VECT_C"), r"output depth .* must be divisible by 4 for NCHW_VECT_C")
    refused(lambda: ops.space_to_depth(np.zeros((1, 3, 4, 1)), 2), r"input height \(x.shape\[1\] = 3\) must be divisible by block_size 2")
    refused(lambda: ops.space_to_depth(np.zeros((1, 1, 4, 3)), 2, data_format="NCHW"), r"input width \(x.shape\[3\] = 3\) must be divisible")


def test_batch_not_divisible_and_padded_size():
    refused(lambda: ops.batch_to_space_nd(np.zeros((6, 1)), [2, 2], [[0, 0], [0, 0]]), r"x must have rank M\+1..8 for block_shape of length M = 2, got rank 2")
    refused(lambda: ops.batch_to_space_nd(np.zeros((6, 1, 1, 1)), [2, 2], [[0, 0], [0, 0]]), r"batch size x.shape\[0\] = 6 must be divisible by prod\(block_shape\) = 4")
    refused(lambda: ops.space_to_batch_nd(np.zeros((1, 3, 1)), [2], [[0, 0]]), r"padded size of spatial dim 0 .* = 3\) must be divisible by block_shape\[0\] = 2")
    refused(lambda: ops.batch_to_space_nd(np.zeros((2,) * 9), [2], [[0, 0]]), r"rank M\+1..8 .* got rank 9")


@pytest.mark.parametrize("value", [2.0, np.float32(2), True, np.bool_(True), "2", None, np.array(2.0), 2 + 0j])
def test_non_integer_block_size(value):
    refused(lambda: ops.depth_to_space(X4, value), r"block_size must be an integer")
    refused(lambda: ops.space_to_batch(X4, value, [0, 0, 0, 0]), r"block_size must be an integer")


@pytest.mark.parametrize("op,name", [("space_to_batch_nd", "paddings"), ("batch_to_space_nd", "crops")])
def test_non_integer_arrays(op, name):
    refused(lambda: _call(op, B2, [2.0, 2], [[0, 0], [0, 0]]), r"block_shape\[0\] must be an integer, got float 2.0")
    refused(lambda: _call(op, B2, [2, True], [[0, 0], [0, 0]]), r"block_shape\[1\] must be an integer, got bool True")
    refused(lambda: _call(op, B2, np.array([2, 2], np.float32), [[0, 0], [0, 0]]), r"block_shape must be an integer array, got dtype float32")
    refused(lambda: _call(op, B2, [2, 2], np.zeros((2, 2), bool)), rf"{name} must be an integer array, got dtype bool")
    refused(lambda: _call(op, B2, [2, 2], [[0, 0], [0, 0.5]]), rf"{name}\[1, 1\] must be an integer, got float 0.5")
    refused(lambda: _call(op, B2, da.from_array(np.array([2, 2])), [[0, 0], [0, 0]]), r"block_shape must be concrete integers")


def test_integer_forms_accepted():
    x = np.arange(16, dtype=np.int32).reshape(4, 2, 2, 1)
    expected = ops.batch_to_space_nd(x, [2, 2], [[0, 0], [0, 0]])
    for block, crops in [
        (np.array([2, 2], np.int32), np.zeros((2, 2), np.int64)),
        ((np.int64(2), np.int32(2)), ((0, 0), (0, 0))),
        (np.array([2, 2], np.uint8), np.zeros((2, 2), np.uint16)),
    ]:
        np.testing.assert_array_equal(ops.batch_to_space_nd(x, block, crops), expected)
    np.testing.assert_array_equal(ops.depth_to_space(X4, np.int32(2)), ops.depth_to_space(X4, np.array(2)))


@pytest.mark.parametrize("dtype", [object, "U3", "S2", "M8[s]", "V4", [("a", "<i4")], np.longdouble])
def test_unsupported_dtypes(dtype):
    x = np.zeros((1, 2, 2, 4), dtype=dtype)
    for op, args in [
        ("depth_to_space", (2,)),
        ("space_to_depth", (2,)),
        ("space_to_batch", (2, [0, 0, 0, 0])),
        ("space_to_batch_nd", ([2], [[0, 0]])),
        ("batch_to_space_nd", ([1], [[0, 0]])),
    ]:
        refused(lambda: _call(op, x, *args), r"x dtype must be one of bool, int8, .*complex32; got")


def test_unknown_chunk_sizes():
    x = da.from_array(np.zeros((4, 2, 2, 4)), chunks=2)
    x = x[x[:, 0, 0, 0] >= 0]
    refused(lambda: ops.depth_to_space(x, 2), r"x has unknown chunk sizes .*compute_chunk_sizes")


def _explode(*args, **kwargs):
    raise AssertionError("something was computed")


def test_refusal_and_building_compute_nothing():
    x = da.zeros((4, 4, 4, 4), chunks=2).map_blocks(lambda b: _explode(), dtype=float)
    with dask.config.set(scheduler=_explode):
        refused(lambda: ops.depth_to_space(x, 3), r"divisible by block_size\*\*2 = 9")
        refused(lambda: ops.batch_to_space_nd(x, [3], [[0, 0]]), r"divisible by prod\(block_shape\) = 3")
        # Building valid graphs computes nothing either.
        ops.depth_to_space(x, 2)
        ops.space_to_depth(x, 2, data_format="NCHW", mode="CRD")
        ops.space_to_batch(x, 2, [1, 1, 0, 2])
        ops.batch_to_space_nd(x, [2, 2], [[1, 0], [0, 1]])


def test_padding_that_would_make_an_unschedulable_graph_is_refused_before_planning():
    """Huge paddings on a Dask input: refused by counting blocks, before any chunk tuple is built."""
    x = da.zeros((1, 2, 2, 1), chunks=(1, 1, 1, 1), dtype="int8")
    tracemalloc.start()
    with pytest.raises(InvalidArgument, match=r"the output would have \d+ blocks, more than the 10000000"):
        ops.space_to_batch_nd(x, [2, 2], [[0, 2**40], [0, 0]])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2**20
    # A padding that stays schedulable still works.
    assert ops.space_to_batch_nd(x, [2, 2], [[0, 6], [0, 0]]).shape == (4, 4, 1, 1)
