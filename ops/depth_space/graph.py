"""The Dask graph of DepthToSpace and SpaceToDepth: one task per output block, each reading one input block."""

from __future__ import annotations

import dask.array as da
from dask.base import tokenize

from ops import _lazy
from ops.depth_space.kernel import depth_to_space_kernel, space_to_depth_kernel
from ops.depth_space.plan import depth_to_space_chunks, space_to_depth_chunks
from ops._realign import realigned


def _blockwise(name, kernel, x: da.Array, plan, *args) -> da.Array:
    """One output block per block of the planned input chunks.

    An axis the plan wants in one chunk (the channels of DCR, NCHW_VECT_C's axes) is not
    rechunked: the output's index drops that axis's input index, so Dask's blockwise hands
    each task the concatenation of the blocks along it. That is one lazy layer whatever the
    number of chunks, where ``rechunk`` builds a materialised layer of several tasks per
    chunk (about 36 s at 524,288 chunks). Boundaries moved to multiples of the block size are
    moved by ``realigned``, whose tasks are made when the graph is materialised.
    """
    in_chunks, out_chunks = plan
    merged = [axis for axis in range(x.ndim) if len(in_chunks[axis]) == 1 < len(x.chunks[axis])]
    others = tuple(x.chunks[axis] if axis in merged else in_chunks[axis] for axis in range(x.ndim))
    if others != x.chunks:
        x = realigned(x, others)
    in_index = "abcdefgh"[: x.ndim]
    out_index = "".join(letter.upper() if axis in merged else letter for axis, letter in enumerate(in_index))
    token = tokenize(x, *args)
    return da.blockwise(
        kernel, out_index, x, in_index, *(part for arg in args for part in (arg, None)),
        new_axes={out_index[axis]: out_chunks[axis] for axis in merged},
        adjust_chunks={out_index[axis]: out_chunks[axis] for axis in range(x.ndim) if axis not in merged},
        concatenate=True,
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
