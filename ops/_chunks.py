"""Chunk plans as pure functions: chunk tuples in, chunk tuples out.

Dask's own ``coarsen`` aligns chunks the same way: move each interior chunk boundary to the
nearest allowed position, so a plan rechunks an axis only when it has to and keeps the
user's chunk sizes as far as the operator allows.
"""

from __future__ import annotations

import itertools

import dask
from dask.utils import parse_bytes


def target_bytes() -> int:
    """Dask's ``array.chunk-size`` in bytes: the block size the plans aim at and budget with."""
    return parse_bytes(dask.config.get("array.chunk-size"))


def boundaries(chunks: tuple[int, ...]) -> list[int]:
    """Chunk boundaries including 0 and the total: (2, 3) -> [0, 2, 5]."""
    return [0, *itertools.accumulate(chunks)]


def from_boundaries(points) -> tuple[int, ...]:
    """Inverse of ``boundaries``; a zero-length axis is one empty chunk."""
    points = sorted(set(points))
    chunks = tuple(b - a for a, b in zip(points, points[1:]))
    return chunks or (0,)


def align(chunks: tuple[int, ...], multiple: int, offset: int = 0) -> tuple[int, ...]:
    """Chunks of the same axis whose interior boundaries q all satisfy (q + offset) % multiple == 0.

    Each boundary moves to the nearest allowed position (ties go up); boundaries that collide
    merge. Regular chunks (all equal but a smaller last one) stay regular, with offset 0: their
    size moves to its nearest multiple (ties go up), so that a result stored in Zarr, which
    holds regular chunks only, needs no second rechunk. Already aligned chunks come back
    unchanged.
    """
    total = sum(chunks)
    if multiple == 1:
        return tuple(chunks) if total else (0,)
    size = chunks[0] if chunks else 0
    regular = len(chunks) > 1 and all(c == size for c in chunks[:-1]) and 0 < chunks[-1] <= size
    if offset == 0 and regular and size % multiple:
        size = max(multiple, (size + multiple // 2) // multiple * multiple)
        return (size,) * (total // size) + ((total % size,) if total % size else ())
    points = [0, total]
    for q in boundaries(chunks)[1:-1]:
        below = q - (q + offset) % multiple
        above = below + multiple
        nearest = below if q - below < above - q else above
        if 0 < nearest < total:
            points.append(nearest)
    return from_boundaries(points)


def single(chunks: tuple[int, ...]) -> tuple[int, ...]:
    """The whole axis in one chunk."""
    return (sum(chunks),)


def groups(chunks: tuple[int, ...], group: int, count: int) -> tuple[int, ...]:
    """Chunks of an axis of ``count`` equal groups of length ``group``, each group chunked alike.

    Kept as they are when already so; otherwise every group is cut into pieces of the largest
    existing chunk (at most ``group``), so no chunk crosses a group boundary.
    """
    chunks = tuple(chunks)
    if group == 0 or count == 0:
        return chunks
    first = from_boundaries(q for q in boundaries(chunks) if q <= group)
    if sum(first) == group and first * count == chunks:
        return chunks
    size = min(max(chunks), group)
    pieces = (size,) * (group // size) + ((group % size,) if group % size else ())
    return pieces * count


def scaled(chunks: tuple[int, ...], factor: int) -> tuple[int, ...]:
    return tuple(c * factor for c in chunks)


def divided(chunks: tuple[int, ...], divisor: int) -> tuple[int, ...]:
    return tuple(c // divisor for c in chunks)


def regular(total: int, size: int) -> tuple[int, ...]:
    """``total`` cut into pieces of ``size`` (the last one shorter); (0,) when empty."""
    if total == 0:
        return (0,)
    size = max(size, 1)
    return (size,) * (total // size) + ((total % size,) if total % size else ())


def zarr_regular(chunks: tuple[int, ...]) -> bool:
    """Whether blocks of these sizes along one axis can be a Zarr array's chunks as they are:
    all equal but a shorter last one."""
    return len(chunks) < 2 or (len(set(chunks[:-1])) == 1 and chunks[-1] <= chunks[0])


def zarr_chunks(chunks: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """One Zarr chunk length per axis such that no two Dask blocks share a Zarr chunk: the
    blocks' length when they are regular (but the last), else the largest (a rechunk)."""
    return tuple(max(max(axis, default=1), 1) for axis in chunks)
