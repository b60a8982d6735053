"""How the graphs of DepthToSpace/SpaceToDepth and AscendDequant grow with the input's chunks,
stated as counts (never as times): the layers a call adds are lazy (no task is built per
chunk at call time), the memory the call allocates stays a few bytes per block, and after
Dask's optimisation the graph has at most 3 tasks per input chunk. The results of the
lazy paths against NumPy, bit for bit."""

from __future__ import annotations

import tracemalloc

import dask
import dask.array as da
import numpy as np
import pytest

import ops
from tests.helpers import assert_flat_layer, assert_same, compute
from tests.ops import reference


def materialised_tasks(y: da.Array, x: da.Array) -> int:
    """Tasks held in materialised layers that the call made ``y`` from ``x`` added (Dask's
    lazy layers hold none; ``x``'s own are left out: an optimisation may have expanded them)."""
    return sum(len(layer) for name, layer in y.dask.layers.items()
               if name not in x.dask.layers and layer.is_materialized())


def tasks_after_optimisation(y: da.Array) -> int:
    (optimised,) = dask.optimize(y)
    return len(dict(optimised.__dask_graph__()))


# --- DepthToSpace / SpaceToDepth ----------------------------------------------------------------


@pytest.mark.smoke
def test_channels_in_several_chunks_are_merged_by_a_lazy_layer_not_a_rechunk():
    # 10,000 blocks of channel pieces: DCR needs all channels of a pixel in one block. A
    # rechunk would materialise several tasks per chunk; the merge is done by the op's own
    # blockwise layer.
    x = da.zeros((4, 100, 100, 8), chunks=(1, 4, 4, 2), dtype="float32")
    for y in (ops.depth_to_space(x, 2), ops.space_to_depth(x, 2)):
        assert materialised_tasks(y, x) == 0
        assert tasks_after_optimisation(y) <= 3 * x.npartitions


def test_chunk_boundaries_off_the_block_size_are_moved_lazily():
    # H/W chunks of 3 with block size 2: the boundaries move to multiples of 2. Dask's
    # rechunk made every task at call time (~0.5 ms per chunk); the layer makes them when
    # the graph is materialised, then one per new block.
    x = da.zeros((4, 60, 60, 4), chunks=(1, 3, 3, 4), dtype="float32")  # 1,600 blocks
    y = ops.space_to_depth(x, 2)
    assert materialised_tasks(y, x) == 0
    assert tasks_after_optimisation(y) <= 3 * x.npartitions


def test_the_task_estimate_counts_no_rechunk_for_merged_channels():
    # 400 input blocks, 100 output blocks; the op adds one task per output block, so a limit
    # of 100 tasks lets the call through (the old estimate added a rechunk's 500 tasks).
    x = da.zeros((1, 20, 20, 8), chunks=(1, 2, 2, 2), dtype="float32")
    with ops.limits(max_tasks=100):
        y = ops.depth_to_space(x, 2)
    assert len(y.dask.layers[y.name]) == 100


@pytest.mark.parametrize("direction", ["depth_to_space", "space_to_depth"])
def test_aligned_input_adds_one_lazy_layer_and_one_task_per_chunk(direction):
    x = da.zeros((4, 64, 64, 16), chunks=(1, 2, 2, 16), dtype="float32")  # 4,096 blocks
    y = getattr(ops, direction)(x, 2)
    assert materialised_tasks(y, x) == 0
    assert len(y.dask.layers) == 2  # the input's layer and the op's: no rechunk
    assert tasks_after_optimisation(y) <= x.npartitions + 1


@pytest.mark.parametrize("data_format, mode, shape, chunks", [
    ("NHWC", "DCR", (2, 6, 4, 8), (1, 3, 2, 3)),
    ("NHWC", "CRD", (2, 6, 4, 8), (1, 3, 2, 4)),
    ("NCHW", "DCR", (2, 8, 6, 4), (1, 3, 3, 2)),
    ("NCHW", "CRD", (2, 8, 6, 4), (2, 4, 2, 4)),
    ("NCHW_VECT_C", "DCR", (2, 4, 6, 4, 4), (1, 1, 2, 2, 2)),
    ("NCHW_VECT_C", "CRD", (2, 4, 6, 4, 4), (1, 3, 3, 4, 1)),
])
def test_chunked_channels_give_numpy_results_bit_for_bit(data_format, mode, shape, chunks):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(np.float32)
    lazy = da.from_array(x, chunks=chunks)
    y = ops.depth_to_space(lazy, 2, data_format=data_format, mode=mode)
    assert_same(compute(y), reference.depth_to_space(x, 2, data_format, mode))
    z = ops.space_to_depth(y, 2, data_format=data_format, mode=mode)
    assert_same(compute(z), x)


# --- AscendDequant --------------------------------------------------------------------------------

ROWS, COLUMNS = 4, 16  # one row block per 4 rows


def _src(blocks: int) -> da.Array:
    return da.zeros((ROWS * blocks, COLUMNS), chunks=(ROWS, COLUMNS), dtype="int32")


@pytest.mark.smoke
def test_dequant_call_allocates_a_few_bytes_per_row_block():
    # map_blocks' block_info built (and hashed) a dict per block at call time: ~1 KiB each.
    # The block's rows now come from a lazy dependency, built from the row chunks only.
    src, scale = _src(10_000), np.linspace(0.5, 2, COLUMNS, dtype=np.float32)
    ops.ascend_dequant(_src(10), scale, dst_dtype="float32")  # imports and caches warmed
    tracemalloc.start()
    try:
        y = ops.ascend_dequant(src, scale, dst_dtype="float32")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 200 * src.npartitions, peak
    assert tasks_after_optimisation(y) <= src.npartitions + 2


@pytest.mark.parametrize("policy, scale_shape, extra", [
    ("per_token", (ROWS * 5000,), {}),
    ("per_group", (ROWS * 5000, 1), {"group_size": 32, "k_dim": 1}),
])
def test_a_numpy_scale_per_row_is_one_block_not_one_per_row_block(policy, scale_shape, extra):
    src = _src(5000)
    scale = np.ones(scale_shape, np.float32)
    y = ops.ascend_dequant(src, scale, dst_dtype="float32", policy=policy, **extra)
    assert materialised_tasks(y, src) <= 1  # the scale's one block (was one per row block)
    assert tasks_after_optimisation(y) <= src.npartitions + 2


@pytest.mark.parametrize("scale_budget", [None, "64B"], ids=["whole scale", "scale chunked with rows"])
@pytest.mark.parametrize("policy, group_size, k_dim", [
    ("per_token", None, 1), ("per_group", 32, 0), ("per_group", 32, 1),
])
def test_dequant_row_blocks_give_the_plain_expression_bit_for_bit(scale_budget, policy, group_size, k_dim):
    rng = np.random.default_rng(3)
    m, n = 200, 64
    src = rng.integers(-(2**20), 2**20, (m, n), dtype=np.int32)
    shape = {"per_token": (m,), 0: (-(-m // 32), n), 1: (m, n // 32)}[policy if policy == "per_token" else k_dim]
    scale = rng.uniform(-2, 2, shape).astype(np.float32)
    kwargs = {"policy": policy, "calc_count": 150 * n}  # rows from 150 on pass through
    if group_size:
        kwargs.update(group_size=group_size, k_dim=k_dim)
    expected = reference.dequant(src, scale, np.float32, **kwargs)
    config = {} if scale_budget is None else {"array.chunk-size": scale_budget}
    with dask.config.set(config):
        for rows, columns in ((7, n), (32, 16), ((64, 40, 96), 24)):  # columns merged in the task
            y = ops.ascend_dequant(da.from_array(src, chunks=(rows, columns)), scale, dst_dtype="float32", **kwargs)
            assert_same(compute(y), expected)


def test_column_chunks_and_unaligned_group_rows_need_no_materialised_layer():
    # 2,500 blocks: 625 row blocks of 8 rows (groups of 32 rows: boundaries move) x 4 column
    # blocks (merged into whole rows). Dask's rechunk made several tasks per chunk at call time.
    src = da.zeros((5000, 64), chunks=(8, 16), dtype="int32")
    scale = np.ones((-(-5000 // 32), 64), np.float32)
    y = ops.ascend_dequant(src, scale, dst_dtype="float32", policy="per_group", group_size=32, k_dim=0)
    assert materialised_tasks(y, src) <= 1  # the scale's one block
    assert tasks_after_optimisation(y) <= 3 * src.npartitions


def test_realigned_blocks_take_their_pieces_as_flat_arguments():
    # A new block joined from pieces of several input blocks takes each block as a TaskRef
    # argument and the layout as data: no nested getitem task per piece, which a distributed
    # scheduler would hold as an object of its own for the whole run.
    values = np.arange(2 * 12 * 12 * 4, dtype=np.float32).reshape(2, 12, 12, 4)
    x = da.from_array(values, chunks=(1, 3, 3, 4)) + 0
    y = ops.space_to_depth(x, 2)
    (realign,) = [name for name in y.dask.layers if name.startswith("realign-")]
    assert assert_flat_layer(y.dask, realign) > 0
    assert_same(compute(y), ops.space_to_depth(values, 2))
