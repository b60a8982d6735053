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
from dask._task_spec import Task, TaskRef
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


def _realign_tasks(name, x_name, x_chunks, pieces) -> dict:
    """The task of each new block: the input block itself where it is unchanged, a piece sliced
    off one input block, or its pieces joined (``_joined``), each input block a ``TaskRef``
    argument of its own and the layout plain data (a nested task per piece would be an object
    each on a distributed scheduler, for the whole run)."""
    tasks = {}
    for index in np.ndindex(*map(len, pieces)):
        key = (name, *index)
        per_axis = [pieces[a][i] for a, i in enumerate(index)]
        if all(len(p) == 1 for p in per_axis):
            old = tuple(p[0][0] for p in per_axis)
            local = _local(x_chunks, old, tuple(p[0][1] for p in per_axis))
            block = (x_name, *old)
            tasks[key] = block if local is None else Task(key, operator.getitem, TaskRef(block), local)
            continue
        blocks = {}
        layout = _layout(x_chunks, per_axis, blocks)
        tasks[key] = Task(key, _joined, layout, *(TaskRef((x_name, *old)) for old in blocks))
    return tasks


def _local(x_chunks, old, local):
    """``local`` (a piece's slices of input block ``old``), or None when it is the whole block."""
    if all(s.start == 0 and s.stop == x_chunks[a][k] for a, (k, s) in enumerate(zip(old, local))):
        return None
    return local


def _layout(x_chunks, per_axis, blocks: dict, prefix=()):
    """np.block's nested lists for one new block (``per_axis``: its pieces per axis), each piece
    ``(block number, slices or None)``; ``blocks`` numbers the input blocks (filled here)."""
    if len(prefix) == len(per_axis):
        old = tuple(k for k, _ in prefix)
        return blocks.setdefault(old, len(blocks)), _local(x_chunks, old, tuple(s for _, s in prefix))
    return [_layout(x_chunks, per_axis, blocks, (*prefix, piece)) for piece in per_axis[len(prefix)]]


def _joined(layout, *blocks):
    """The new block that ``layout`` (``_layout``'s nested lists) makes of ``blocks``."""

    def pieces(item):
        if isinstance(item, list):
            return [pieces(inner) for inner in item]
        number, local = item
        return blocks[number] if local is None else blocks[number][local]

    return np.block(pieces(layout))
