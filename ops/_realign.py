"""Moving chunk boundaries lazily: the rechunk SpaceToDepth/DepthToSpace need when the given
chunks are not multiples of the block size, and AscendDequant when row blocks must hold whole
groups.

Dask's ``rechunk`` makes every task of its graph when it is called (about 0.5 ms per chunk:
minutes at a million chunks). Here the call computes only, per axis, which pieces of which
input chunks make each new chunk (O(chunks along that axis)); the tasks are made by a
``LazyLayer`` when the graph is materialised. Each new block is its pieces joined with
``np.block``, or the input block itself where it is unchanged.
"""

from __future__ import annotations

import operator

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from ops import _chunks
from ops._lazy_layer import LazyLayer


def axis_pieces(old: tuple[int, ...], new: tuple[int, ...]) -> list[list[tuple[int, slice]]]:
    """Per new chunk of one axis: its pieces, each (old chunk index, slice of that chunk)."""
    if tuple(old) == tuple(new):
        return [[(k, slice(0, size))] for k, size in enumerate(old)]
    old_bounds, new_bounds = _chunks.boundaries(old), _chunks.boundaries(new)
    pieces, k = [], 0
    for start, stop in zip(new_bounds, new_bounds[1:]):
        while k < len(old) - 1 and old_bounds[k + 1] <= start:
            k += 1
        here, j = [], k
        while j < len(old) and old_bounds[j] < stop:
            lo, hi = max(start, old_bounds[j]), min(stop, old_bounds[j + 1])
            if hi > lo:
                here.append((j, slice(lo - old_bounds[j], hi - old_bounds[j])))
            j += 1
        pieces.append(here)
    return pieces


def realigned(x: da.Array, chunks) -> da.Array:
    """``x.rechunk(chunks)`` with the tasks made lazily (same blocks, bit for bit)."""
    chunks = tuple(tuple(c) for c in chunks)
    pieces = tuple(axis_pieces(old, new) for old, new in zip(x.chunks, chunks))
    name = f"realign-{tokenize(x, chunks)}"
    layer = LazyLayer(name, tuple(map(len, chunks)), _realign_tasks, name, x.name, x.chunks, pieces)
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[x])
    return da.Array(graph, name, chunks=chunks, meta=x._meta)


def _piece(x_name, x_chunks, old, local):
    """The task (or key) of one piece: a whole input block is its key, a part is sliced off it."""
    key = (x_name, *old)
    if all(s.start == 0 and s.stop == x_chunks[a][k] for a, (k, s) in enumerate(zip(old, local))):
        return key
    return (operator.getitem, key, local)


def _nested(x_name, x_chunks, per_axis, prefix=()):
    """np.block's nested lists of pieces for one new block (``per_axis``: its pieces per axis)."""
    axis = len(prefix)
    if axis == len(per_axis):
        old = tuple(k for k, _ in prefix)
        return _piece(x_name, x_chunks, old, tuple(s for _, s in prefix))
    return [_nested(x_name, x_chunks, per_axis, (*prefix, piece)) for piece in per_axis[axis]]


def _realign_tasks(name, x_name, x_chunks, pieces) -> dict:
    tasks = {}
    for index in np.ndindex(*map(len, pieces)):
        per_axis = [pieces[a][i] for a, i in enumerate(index)]
        if all(len(p) == 1 for p in per_axis):
            tasks[(name, *index)] = _piece(x_name, x_chunks, tuple(p[0][0] for p in per_axis),
                                           tuple(p[0][1] for p in per_axis))
        else:
            tasks[(name, *index)] = (np.block, _nested(x_name, x_chunks, per_axis))
    return tasks
