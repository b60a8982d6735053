"""The Dask graph of DepthToSpace and SpaceToDepth: one task per output block, each reading one input block."""

from __future__ import annotations

import dask.array as da
from dask.base import tokenize

from ops import _lazy
from ops.depth_space.kernel import depth_to_space_kernel, space_to_depth_kernel
from ops.depth_space.plan import depth_to_space_chunks, space_to_depth_chunks


def _blockwise(name, kernel, x: da.Array, plan, *args) -> da.Array:
    """One output block per input block: rechunk as planned, then map the kernel."""
    in_chunks, out_chunks = plan
    if in_chunks != x.chunks:
        x = x.rechunk(in_chunks)
    token = tokenize(x, *args)
    return x.map_blocks(
        kernel, *args,
        chunks=out_chunks,
        dtype=x.dtype,
        meta=_lazy.meta(x.ndim, x.dtype),
        name=f"{name}-{token}",
    )


def depth_to_space_graph(x: da.Array, bs: int, data_format: str, mode: str) -> da.Array:
    """DepthToSpace of a Dask array, lazily: rechunked by ``depth_to_space_chunks``, then blockwise."""
    args = (bs, data_format, mode)
    plan = depth_to_space_chunks(x.chunks, *args)
    return _blockwise("depth_to_space", depth_to_space_kernel, x, plan, *args)


def space_to_depth_graph(x: da.Array, bs: int, data_format: str, mode: str) -> da.Array:
    """SpaceToDepth of a Dask array, lazily: rechunked by ``space_to_depth_chunks``, then blockwise."""
    args = (bs, data_format, mode)
    plan = space_to_depth_chunks(x.chunks, *args)
    return _blockwise("space_to_depth", space_to_depth_kernel, x, plan, *args)
