"""GatherNd's planning on chunk tuples and index arrays: which params block each tuple hits
and where in it, tuples bucketed by the block they hit, output chunks along the tuples, the
size up to which params goes whole to every indices block, and the groups of the exchange."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ops import _chunks
from ops.gather_nd.layer import ravel


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


def _run_bounds(lead_chunks) -> np.ndarray:
    """Where each output block along the tuples starts and ends among the tuple ids (C order):
    block o is the run ``[bounds[o], bounds[o + 1])``, its size an outer product of the chunks
    along each axis (``_lead_chunks`` makes every block one contiguous run)."""
    per_block = functools.reduce(np.multiply.outer, [np.asarray(c, np.int64) for c in lead_chunks], np.int64(1))
    return np.concatenate([[0], np.cumsum(np.ravel(per_block))]).astype(np.int64)


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


@dataclass(frozen=True, eq=False)
class BlockGrid:
    """The blocks of params' merged dims, to locate tuples in when a task runs: per axis the
    chunk size when the chunks are regular (the last may be short), else the boundaries.
    Built once per graph in O(chunks along each axis), with NumPy."""

    numblocks: tuple[int, ...]
    lengths: tuple[int, ...]
    sizes: tuple[int | None, ...]
    bounds: tuple[np.ndarray | None, ...]

    @classmethod
    def of(cls, chunks) -> BlockGrid:
        sizes, bounds = [], []
        for axis_chunks in chunks:
            lengths = np.asarray(axis_chunks, dtype=np.int64)
            size = int(lengths[0])
            if size and (lengths[:-1] == size).all() and lengths[-1] <= size:
                sizes.append(size)
                bounds.append(None)
            else:
                sizes.append(None)
                bounds.append(np.concatenate([[0], np.cumsum(lengths)]))
        return cls(tuple(len(c) for c in chunks), tuple(sum(c) for c in chunks), tuple(sizes), tuple(bounds))

    @property
    def blocks(self) -> int:
        return math.prod(self.numblocks)

    def locate(self, coords: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """For flat coordinate arrays (values in range): the flat block each tuple hits and its
        row in that block, the block's merged dims flattened in C order."""
        block = np.zeros(len(coords[0]) if coords else 0, np.int64)
        row = np.zeros_like(block)
        for coord, n, total, size, bounds in zip(coords, self.numblocks, self.lengths, self.sizes, self.bounds):
            if size is not None:
                k = coord // size
                start = k * size
                length = np.minimum(size, total - start)
            else:
                k = np.searchsorted(bounds, coord, side="right") - 1
                start, length = bounds[k], bounds[k + 1] - bounds[k]
            block = block * n + k
            row = row * length + (coord - start)
        return block, row


def _exchange_groups(params_blocks: int, index_blocks: int) -> tuple[int, int, int, int]:
    """(params groups, params blocks per group, indices groups, indices blocks per group) for
    the exchange (``exchange``).

    Requests and rows cross between the two kinds of groups through one small task per pair
    of groups, so the pairs, (G + 1)(J + 1), are kept within P + I (the two block counts):
    the graph is then linear in P + I: at most 4 (P + I) tasks and 8 (P + I) edges. Within
    that, G is about sqrt(P + I) (or P) and J takes the rest (I at most), so the largest group
    task holds about 1/sqrt(P + I) of the requests or the output rows, and no task waits on
    more than about sqrt(P + I) others (a params group's blocks, or the groups of a side)
    unless params has fewer than sqrt(P + I) blocks (J is then about I / P).
    """
    total = params_blocks + index_blocks
    groups = min(params_blocks, max(1, math.isqrt(total) - 1))
    # The rest of the pairs to the indices side: an indices group's task holds its blocks'
    # output rows, so fewer blocks a group is what bounds memory there (a params group's
    # task holds its share of the rows: 1/G, already no more than an output block's share
    # when the indices side has fewer than G blocks).
    index_groups = min(index_blocks, max(1, total // (groups + 1) - 1))
    per_group, per_index_group = -(-params_blocks // groups), -(-index_blocks // index_groups)
    return -(-params_blocks // per_group), per_group, -(-index_blocks // per_index_group), per_index_group


def _graph_size(plan: str, lead: int, params: int, slices: int, hits: int = 0) -> tuple[int, int]:
    """(output blocks, tasks) of the graph of ``plan`` (see ``graph``), from block counts alone:
    ``lead`` blocks of the tuples' dims, ``params`` blocks of params (of its indexed dims,
    ``hits`` of them hit; all of them for ``broadcast``), ``slices`` blocks of the slice a
    tuple takes (1 for ``broadcast``: params is one block)."""
    blocks = lead * slices
    if plan == "exchange":
        return blocks, exchange_tasks(lead, params, slices)
    tasks = {
        # a gather per hit block and slice block, an assembly per output block
        "concrete": (lead + hits) * slices,
        # the array params' blocks are views of, a gather per output block
        "in_memory": 1 + blocks,
        # params merged into one block, a gather per indices block
        "broadcast": params + lead,
        # splits and assemblies per run of indices blocks, a serve per group of params blocks
        # (holding each block's key), a view per output block
        "scratch": lead + params * slices + 2 * blocks,
    }[plan]
    return blocks, tasks


def exchange_tasks(lead: int, params: int, slices: int) -> int:
    """Tasks of the exchange (``exchange``) for ``lead`` indices blocks, ``params`` blocks of
    params' merged dims and ``slices`` blocks of the slice: the grid of params' blocks; per
    indices group its requests, and a piece per params group; per params group its routed
    requests, and per params block its share of them; then per slice block a serve per
    params block, a collection per params group, a piece per pair of groups, a gather per
    indices group and a view per output block."""
    groups, _, index_groups, _ = _exchange_groups(params, lead)
    requests = index_groups * (1 + groups) + groups + params
    return 1 + requests + slices * (params + groups + groups * index_groups + index_groups + lead)


def output_rows(p, index, group: int):
    """Where output block ``index`` of a grouped plan ``p`` lies in its group's rows: (its
    group, its slice-axis index, first row, stop row, block shape). ``p`` has the output's
    leading blocks (``lead_numblocks``, ``lead_chunks``), each leading block's first tuple
    (``tuple_starts``) and ``row_shape``; ``group`` leading blocks make one group."""
    lead, s = index[: len(p.lead_numblocks)], index[len(p.lead_numblocks) :]
    f = ravel(lead, p.lead_numblocks)
    j = f // group
    first = int(p.tuple_starts[j * group])
    start, stop = int(p.tuple_starts[f]) - first, int(p.tuple_starts[f + 1]) - first
    shape = tuple(p.lead_chunks[k][i] for k, i in enumerate(lead)) + p.row_shape(s)
    return j, s, start, stop, shape
