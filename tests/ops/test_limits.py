"""ops.limits: a per-call limit on an operator's output blocks, its graph's tasks and its
output's bytes, counted from chunk metadata before any graph is built; held in a context
variable, so that concurrent builds in threads keep their own limits."""

from __future__ import annotations

import threading
import time

import dask
import dask.array as da
import numpy as np
import pytest

import ops
from ops._limits import MAX_BLOCKS, LimitExceeded, Limits, current

# 1 x 4 x 1 in chunks of 1, padded by 500,000 rows: 500,004 output blocks (the service's
# 167-byte request); without a limit, seconds and hundreds of MiB to build the graph of
# 1,000,012 tasks, and far more to schedule it.
PADDED = (lambda: da.zeros((1, 4, 1), dtype=np.float32, chunks=1), [1], [[500_000, 0]])


def refused(call, *needles, within: float = 1.0) -> LimitExceeded:
    """``call`` raises LimitExceeded (an InvalidArgument) within ``within`` seconds, its
    message holding every needle."""
    started = time.perf_counter()
    with pytest.raises(ops.InvalidArgument) as caught:
        call()
    elapsed = time.perf_counter() - started
    assert isinstance(caught.value, LimitExceeded), caught.value
    assert elapsed < within, f"refused after {elapsed:.2f} s"
    for needle in needles:
        assert needle in str(caught.value), str(caught.value)
    return caught.value


@pytest.mark.smoke
def test_a_padding_past_max_blocks_is_refused_at_once():
    make, block_shape, paddings = PADDED
    with ops.limits(max_blocks=100_000):
        error = refused(lambda: ops.space_to_batch_nd(make(), block_shape, paddings),
                        "space_to_batch_nd:", "500004 blocks", "100000 allowed (max_blocks)", "less padding")
    assert (error.limit, error.count, error.allowed) == ("max_blocks", 500_004, 100_000)


def _gather_exchange():
    """Lazy indices into params too large to broadcast (with a 64 KiB chunk size): the grouped
    exchange over 1000 indices blocks and 1000 params blocks."""
    params = da.zeros((1000, 4), chunks=(1, 4))
    indices = da.zeros((1000, 1), dtype=np.int64, chunks=1)
    with dask.config.set({"array.chunk-size": "64KiB"}):
        return ops.gather_nd(params, indices)


@pytest.mark.parametrize("make, call, needles", [
    pytest.param(lambda: da.zeros((1, 4, 4, 1), chunks=1), lambda x: ops.space_to_batch(x, 1, [0, 5_000, 0, 0]),
                 ["space_to_batch_nd:", "20016 blocks"], id="space_to_batch"),
    pytest.param(lambda: da.zeros((2, 20_000, 1), chunks=1), lambda x: ops.batch_to_space_nd(x, [2], [[0, 0]]),
                 ["batch_to_space_nd:", "20000 blocks"], id="batch_to_space_nd"),
    pytest.param(lambda: da.zeros((1, 150, 150, 4), chunks=(1, 1, 1, 4)), lambda x: ops.depth_to_space(x, 2),
                 ["depth_to_space:", "22500 blocks"], id="depth_to_space"),
    pytest.param(lambda: da.zeros((1, 300, 300, 1), chunks=2), lambda x: ops.space_to_depth(x, 2),
                 ["space_to_depth:", "22500 blocks"], id="space_to_depth"),
    pytest.param(lambda: da.zeros((20_000, 8), dtype=np.int32, chunks=(1, 8)),
                 lambda x: ops.ascend_dequant(x, np.float32(1), dst_dtype="float32"),
                 ["ascend_dequant:", "20000 blocks", "larger row chunks"], id="ascend_dequant"),
    pytest.param(lambda: da.zeros((2, 20_000), chunks=1), lambda x: ops.gather_nd(x, np.zeros((3, 1), np.int64)),
                 ["gather_nd:", "20000 blocks"], id="gather_nd"),
])
def test_every_looping_operator_counts_its_blocks_first(make, call, needles):
    x = make()
    with ops.limits(max_blocks=10_000):
        refused(lambda: call(x), *needles, "10000 allowed (max_blocks)")


def test_gather_nd_counts_the_exchange_tasks_first():
    # Counted before anything is built: linear in the blocks (at most 4 x (1000 + 1000) + 4,
    # where a task per pair of blocks made a million), and exactly the tasks then built.
    with ops.limits(max_tasks=1_000):
        error = refused(_gather_exchange, "gather_nd:", "1000 allowed (max_tasks)", "larger chunks")
    assert 1_000 < error.count <= 4 * (1000 + 1000) + 4
    with ops.limits(max_tasks=error.count):
        y = _gather_exchange()
    assert len(y.__dask_graph__().layers[y.name]) == error.count


def test_max_bytes_refuses_a_gather_before_planning():
    params, indices = da.zeros((10, 1000), chunks=(1, 1000)), np.zeros((10_000, 1), np.int64)
    with ops.limits(max_bytes=2**20):
        refused(lambda: ops.gather_nd(params, indices), "gather_nd:", "80000000 bytes", "1048576 allowed (max_bytes)")


def test_the_default_allows_what_it_allowed():
    assert current() == Limits(max_blocks=10_000_000, max_tasks=None, max_bytes=None) and MAX_BLOCKS == 10_000_000
    with ops.limits() as inside:  # naming no limit changes none
        assert inside == current() == Limits()
        x = da.zeros((1, 4, 1), dtype=np.float32, chunks=1)
        assert ops.space_to_batch_nd(x, [1], [[20_000, 0]]).numblocks == (1, 20_004, 1)
        assert ops.batch_to_space_nd(da.zeros((2, 20_000, 1), chunks=1), [2], [[0, 0]]).numblocks == (1, 20_000, 1)
        with pytest.raises(ops.InvalidArgument, match=r"the output would have \d+ blocks, more than the 10000000"):
            ops.space_to_batch_nd(x, [1], [[2**40, 0]])


def test_limits_do_not_leak_between_threads():
    """Two threads build at once, each inside its own limits: each sees its own."""
    make, block_shape, _ = PADDED
    both_inside = threading.Barrier(2, timeout=30)
    outcome = {}

    def build(name: str, max_blocks: int) -> None:
        with ops.limits(max_blocks=max_blocks):
            both_inside.wait()  # the other thread has set its limits too
            try:
                outcome[name] = ops.space_to_batch_nd(make(), block_shape, [[2_000, 0]]).numblocks
            except LimitExceeded as error:
                outcome[name] = error.allowed
            both_inside.wait()  # neither leaves its block before the other has built

    threads = [threading.Thread(target=build, args=("small", 1_000)),
               threading.Thread(target=build, args=("large", 10_000))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert outcome == {"small": 1_000, "large": (1, 2_004, 1)}
    assert current() == Limits()  # nor into this thread


def test_nested_limits_restore_the_enclosing_ones():
    with ops.limits(max_blocks=100, max_tasks=1_000):
        with ops.limits(max_tasks=50):
            assert current() == Limits(max_blocks=100, max_tasks=50)
        assert current() == Limits(max_blocks=100, max_tasks=1_000)
        with pytest.raises(LimitExceeded), ops.limits(max_blocks=5):
            ops.space_to_batch_nd(da.zeros((1, 4, 1), chunks=1), [1], [[10, 0]])
        assert current().max_blocks == 100  # restored after an error too
    assert current() == Limits()


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "10"])
def test_a_limit_must_be_a_positive_integer(value):
    with pytest.raises(ValueError, match="max_blocks must be a positive integer"):
        with ops.limits(max_blocks=value):
            pass
