"""The Dask graph of AscendDequant: one task per src row block, its scale rows riding along."""

from __future__ import annotations

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.layers import ArraySliceDep

from ops import _chunks, _lazy
from ops.dequant.kernel import dequant_kernel
from ops._realign import realigned
from ops.dequant.plan import dequant_chunks


def _dequant_block(src, scale, where: tuple[slice], plan, dst_dtype, n_out, whole_scale: bool):
    """One row block; ``where[0]``: its rows in the whole src (row limits are global)."""
    (rows,), row_div = where, plan[0]
    if whole_scale and row_div:  # the kernel reads scale rows from the block's first one
        scale = scale[rows.start // row_div: -(-rows.stop // row_div)]
    return dequant_kernel(src, scale, plan, dst_dtype, n_out, rows.start)


def _build(src: da.Array, scale, plan, dst_dtype, n_out):
    row_chunks, scale_rows = dequant_chunks(src.chunks[0], plan[0])
    if src.chunks[0] != row_chunks:  # rows aligned to whole scale groups, lazily
        src = realigned(src, (row_chunks, src.chunks[1]))
    # The scale rides along as a second array matched to src blocks by position. A scale of
    # at most one block's budget is one block that every task shares and slices its rows
    # from: no graph work per row block (a NumPy scale cut into a block per row block is a
    # materialised layer, ~5 s at 1e6 blocks). A larger one is chunked with the rows.
    whole = scale_rows is None or scale.nbytes <= _chunks.target_bytes()
    chunks = ((scale.shape[0],) if whole else scale_rows, (scale.shape[1],))
    if isinstance(scale, da.Array):
        scale = scale.rechunk(chunks)
    else:
        scale = da.from_array(np.asarray(scale), chunks=chunks)
    token = tokenize(src, scale, plan, dst_dtype, n_out)
    # Each block's first row comes from a lazy per-block dependency (Dask's ArraySliceDep),
    # not from map_blocks' block_info, which builds and tokenizes a dict per block at call
    # time (12 s at 262,144 blocks). Columns in several chunks: the output's column index J
    # is not src's j, so each task gets the concatenation of its rows' column blocks (a
    # rechunk to whole rows is a materialised layer of tasks per chunk). In one chunk they
    # keep the index, so Dask's optimisation fuses the task with src's read.
    merge = src.numblocks[1] > 1
    columns = "J" if merge else "j"
    return da.blockwise(
        _dequant_block, "i" + columns,
        src, "ij", scale, "i" + columns, ArraySliceDep((row_chunks,)), "i",
        plan, None, dst_dtype, None, n_out, None, whole, None,
        new_axes={"J": (n_out,)} if merge else {}, adjust_chunks=None if merge else {"j": (n_out,)},
        align_arrays=False, concatenate=True,
        dtype=dst_dtype, meta=_lazy.meta(2, dst_dtype), name=f"ascend_dequant-{token}",
    )
