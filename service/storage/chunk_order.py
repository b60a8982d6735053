"""Chunks and C order: the chunks a C-order byte stream fills one after another (an NPY
upload) and the regions that, read in turn, give a stored array in C order (an NPY download).
"""

from __future__ import annotations

import itertools


def stream_chunks(shape: tuple[int, ...], itemsize: int, target: int) -> tuple[int, ...]:
    """Chunks that a C-order byte stream fills one after another, each about ``target`` bytes.

    Axes before the split axis get chunk 1, the split axis as many rows as fit, the axes after
    it stay whole; so every chunk is one contiguous run of the stream.
    """
    tail = itemsize
    for axis in reversed(range(len(shape))):
        if tail * shape[axis] > target:
            rows = max(1, target // tail)
            return (1,) * axis + (rows,) + tuple(max(1, n) for n in shape[axis + 1:])
        tail *= shape[axis]
    return tuple(max(1, n) for n in shape)


def c_order_regions(shape, chunks, itemsize: int, target: int):
    """Regions of ``shape`` that, read one after another, give the array in C order.

    Rows of the split axis are taken a whole chunk at a time when that slab is small enough,
    so each stored chunk is read once.
    """
    if not shape:
        yield ()
        return
    if 0 in shape:
        return
    tail, axis = itemsize, -1
    for a in reversed(range(len(shape))):
        if tail * shape[a] > target:
            axis = a
            break
        tail *= shape[a]
    if axis < 0:
        yield tuple(slice(0, n) for n in shape)
        return
    rows = chunks[axis] if chunks[axis] * tail <= 4 * target else max(1, target // tail)
    for lead in itertools.product(*(range(n) for n in shape[:axis])):
        for start in range(0, shape[axis], rows):
            yield (*lead, slice(start, min(start + rows, shape[axis])))
