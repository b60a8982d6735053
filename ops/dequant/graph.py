"""The Dask graph of AscendDequant: one task per src row block, its scale rows riding along."""

from __future__ import annotations

import dask.array as da
import numpy as np
from dask.base import tokenize

from ops import _lazy
from ops.dequant.kernel import dequant_kernel
from ops.dequant.plan import dequant_chunks


def _dequant_block(src, scale, plan, dst_dtype, n_out, block_info=None):
    row0 = block_info[0]["array-location"][0][0]
    return dequant_kernel(src, scale, plan, dst_dtype, n_out, row0)


def _build(src: da.Array, scale, plan, dst_dtype, n_out):
    row_chunks, scale_rows = dequant_chunks(src.chunks[0], plan[0])
    if src.chunks != (row_chunks, (src.shape[1],)):
        src = src.rechunk((row_chunks, (src.shape[1],)))
    # Scales ride along as a second array, matched to src blocks by position (map_blocks):
    # whole (classic) or chunked with the rows.
    chunks = ((scale.shape[0],) if scale_rows is None else scale_rows, (scale.shape[1],))
    if isinstance(scale, da.Array):
        scale = scale.rechunk(chunks)
    else:
        scale = da.from_array(np.asarray(scale), chunks=chunks)
    token = tokenize(src, scale, plan, dst_dtype, n_out)
    return da.map_blocks(
        _dequant_block, src, scale, plan, dst_dtype, n_out,
        chunks=(row_chunks, (n_out,)), dtype=dst_dtype, meta=_lazy.meta(2, dst_dtype),
        name=f"ascend_dequant-{token}",
    )
