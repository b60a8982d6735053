"""GatherNd's planning on chunk tuples and index arrays: which params block each tuple hits
and where in it, tuples bucketed by the block they hit, output chunks along the tuples, and
the size up to which params goes whole to every indices block."""

from __future__ import annotations

import math

import numpy as np

from ops import _chunks
from ops.gather_nd.kernel import _coordinates, check_index_values


def _broadcast_limit() -> int:
    """Params up to this size go to every indices block as one block: a quarter of Dask's
    chunk size (32 MiB by default), so that a small worker holds params, an indices block and
    its output at once."""
    return _chunks.target_bytes() // 4


def _lead_chunks(lead, row_bytes: int, target: int) -> tuple[tuple[int, ...], ...]:
    """Chunks of the tuples' dims such that every block is one contiguous (C order) run of
    tuples of about ``target`` bytes of output: split one axis, 1 on the axes before it."""
    for split in range(len(lead)):
        inner = math.prod(lead[split + 1 :]) * row_bytes
        if inner <= target:
            break
    else:
        return tuple((n,) for n in lead)
    rows = max(1, target // max(inner, 1))
    return (
        *(((1,) * n) for n in lead[:split]),
        _chunks.regular(lead[split], rows),
        *((n,) for n in lead[split + 1 :]),
    )


def _locate(coords: list[np.ndarray], chunks) -> tuple[np.ndarray, list[np.ndarray]]:
    """For flat coordinate arrays: the flat block number each tuple hits among the merged
    dims' blocks, and the coordinates local to that block."""
    blocks, local = [], []
    for coord, axis_chunks in zip(coords, chunks):
        size = axis_chunks[0]
        if size and all(c == size for c in axis_chunks[:-1]) and axis_chunks[-1] <= size:
            block = coord // size  # regular chunks: no search needed
            local.append(coord - block * size)
        else:
            starts = np.asarray(_chunks.boundaries(axis_chunks), dtype=np.int64)
            block = np.searchsorted(starts, coord, side="right") - 1
            local.append(coord - starts[block])
        blocks.append(block)
    numblocks = tuple(len(c) for c in chunks)
    return np.ravel_multi_index(blocks, numblocks) if blocks else np.zeros(0, np.int64), local


def _buckets(hit: np.ndarray, count: int):
    """Tuple ids grouped by hit block (ascending ids within a group), the hit blocks, and
    each group's [start, stop) in that order."""
    # A stable sort of small integer keys is a radix sort in NumPy: linear time.
    keys = hit.astype(np.uint16) if count <= 2**16 else hit
    order = np.argsort(keys, kind="stable")
    sizes = np.bincount(hit, minlength=count) if count <= 2**20 else None
    if sizes is None:
        hits, starts = np.unique(hit[order], return_index=True)
        return order, hits, starts, [*starts[1:], len(order)]
    hits = np.flatnonzero(sizes)
    stops = np.cumsum(sizes)[hits]
    return order, hits, stops - sizes[hits], stops


def _block_offsets(chunks, index) -> list[int]:
    return [sum(chunks[k][:i]) for k, i in enumerate(index)]


def _split_requests(indices, params_shape, params_chunks, b, negative, offset):
    """One indices block's tuples as requests per params block: {hit: (positions, local)}."""
    c = indices.shape[-1]
    check_index_values(indices, params_shape[b : b + c], negative, b, offset)
    coords = [np.ascontiguousarray(x).reshape(-1) for x in _coordinates(indices, params_shape, b, offset)]
    hit, local = _locate(coords, params_chunks)
    order, hits, starts, stops = _buckets(hit, math.prod(len(c) for c in params_chunks))
    local = [coord[order] for coord in local]
    return {
        int(h): (order[start:stop], [coord[start:stop] for coord in local])
        for h, start, stop in zip(hits, starts, stops)
    }


def _graph_size(plan: str, lead: int, params: int, slices: int, hits: int = 0) -> tuple[int, int]:
    """(output blocks, tasks) of the graph of ``plan`` (see ``graph``), from block counts alone:
    ``lead`` blocks of the tuples' dims, ``params`` blocks of params (of its indexed dims,
    ``hits`` of them hit; all of them for ``broadcast``), ``slices`` blocks of the slice a
    tuple takes (1 for ``broadcast``: params is one block)."""
    blocks = lead * slices
    tasks = {
        # a gather per hit block and slice block, an assembly per output block
        "concrete": (lead + hits) * slices,
        # params merged into one block, a gather per indices block
        "broadcast": params + lead,
        # a split per indices block, a request and a piece per (indices block, params block)
        # pair and slice block, a serve per params block, an assembly per output block
        "shuffle": lead * (1 + params) + params * slices * (1 + lead) + blocks,
        # splits and assemblies per run of indices blocks, a serve per group of params blocks
        # (holding each block's key), a view per output block
        "scratch": lead + params * slices + 2 * blocks,
    }[plan]
    return blocks, tasks
