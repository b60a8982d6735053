"""SpaceToBatchND and BatchToSpaceND chunk plans: pure functions, chunk tuples in, chunk
tuples and read lists out.

- SpaceToBatchND: the input keeps its chunks; no rechunk, however the padding falls. The
  output's spatial chunks are regular (max input chunk // b rows, times the merged blocks
  on the first axis: a Zarr store needs regular chunks), so an output block reads the input
  rows under its window: its input block(s) and fewer than b boundary rows of a neighbour
  (a halo). Blocks of padding only read no input.
- BatchToSpaceND: a batch axis in one chunk stays so, and each input block (all P groups of
  its rows) is one output block. Otherwise batch chunks are aligned to the group size B so
  no chunk straddles two groups, and the first spatial axis is split P ways (so an output
  block is the size of an input block, not P times it). Input blocks cropped away entirely
  are not read. With a crop before the first row of a chunked axis the output blocks can be
  counted from the first kept row instead (``_shifted_rows``), so that they are regular.
- Which input chunks each window reads, and which window reads a chunk that several take
  (``_owners``, ``_owned_windows``): the halo plan both directions' region reads use; and
  whether SpaceToBatchND's windows can take their halos from their finished neighbours
  (``halos_chain``).
"""

from __future__ import annotations

import bisect
import itertools
import math

import numpy as np

from ops import _chunks, _limits

# ---------------------------------------------------------------------------------------------
# SpaceToBatchND


def _axis_cuts(chunks: tuple[int, ...], b: int, before: int, after: int, merge: int = 1,
               absorb_tail: bool = False) -> list[int]:
    """Output chunk boundaries on one spatial axis of SpaceToBatchND: regular chunks of
    max(input chunk) // b batch-side rows (Zarr stores need regular chunks; anything else
    makes ``to_zarr`` rechunk the whole output), or one chunk for an axis in one chunk.

    Batch-side row t holds padded rows [t*b, (t+1)*b), i.e. space rows [t*b - before, ...),
    so an output chunk reads the input rows under it: with input chunks that are multiples
    of b, its own input block and a few rows of the neighbouring one (a halo), wherever the
    padding puts the window, and nothing for a chunk of padding only. ``absorb_tail``: chunks
    a few rows larger where the last one would otherwise be a sliver (``_absorbing_tail``).
    """
    total = (sum(chunks) + before + after) // b
    size = _output_chunk(chunks, b, total, merge)
    if absorb_tail and len(chunks) > 1:
        size = _absorbing_tail(size, total, max(chunks) // b)
    return [*range(0, total, size), total]


def _absorbing_tail(size: int, total: int, chunk_rows: int) -> int:
    """The output chunk ``size`` (batch-side rows) grown by the fewest rows that spread a
    sliver of a last chunk (under a quarter of ``size``) over the chunks before it.

    Zarr stores every chunk whole, a last chunk of one row too: writing it costs about half
    of writing a full chunk, and padding by one block makes such a row on every padded axis.
    Grown chunks drift off the input chunks by the added rows, one window more each, and the
    halos grow with the drift: only while it stays within a quarter of an input chunk
    (``chunk_rows``, in batch-side rows).
    """
    windows, tail = divmod(total, size)
    if windows == 0 or tail == 0 or 4 * tail >= size:
        return size
    grow = -(-tail // windows)
    if 4 * (windows - 1) * grow > chunk_rows:
        return size
    return size + grow


def _output_chunk(chunks, b: int, total: int, merge: int = 1) -> int:
    """The regular output chunk of one spatial axis, in batch-side rows: the rows of ``merge``
    input chunks; an axis in one input chunk stays one chunk (its padding too: no sliver of a
    chunk for the last rows)."""
    if len(chunks) == 1 or not sum(chunks):
        return max(total, 1)
    return max(1, merge * max(chunks) // b)


def _axis_reads(chunks, b: int, before: int, cuts):
    """For each data chunk [cuts[k], cuts[k+1]) of batch-side rows: the input pieces it reads,
    as (input chunk, local start, local stop, offset of the piece's first row in the output
    chunk's padded rows)."""
    bounds = _chunks.boundaries(chunks)
    length = bounds[-1]
    reads = []
    for t0, t1 in zip(cuts, cuts[1:]):
        r0, r1 = max(0, t0 * b - before), min(length, t1 * b - before)
        pieces = []
        k = bisect.bisect_right(bounds, r0) - 1
        while k < len(chunks) and bounds[k] < r1:
            start, stop = max(r0, bounds[k]), min(r1, bounds[k + 1])
            if stop > start:
                pieces.append((k, start - bounds[k], stop - bounds[k], start + before - t0 * b))
            k += 1
        reads.append(tuple(pieces))
    return reads


def _check_space_to_batch_size(chunks, block_shape, paddings, merge: int) -> None:
    """Refuse (``_limits.check``) a plan past the call's limits, counted from the chunks
    alone: padding can ask for more blocks than any graph can hold, and the tuples of output
    chunks alone would exhaust memory.

    Tasks: two per output block (the blockwise plan makes the blocks of padding and
    concatenates them with its own), plus per batch chunk and window with data a window
    task and one per input piece it takes (an edge or export task). On one axis the windows with
    data and the input chunks are intervals of one line, so they make fewer pieces than
    their two counts together; a window's pieces are the product of its axes' pieces, so all
    windows' together are the product of each axis's total.
    """
    m = len(block_shape)
    batch, rest = len(chunks[0]), math.prod(len(c) for c in chunks[1 + m :])
    windows = data_windows = pieces = 1
    for i, (b, (before, after)) in enumerate(zip(block_shape, paddings)):
        length = sum(chunks[1 + i])
        total = (length + before + after) // b
        size = _output_chunk(chunks[1 + i], b, total, merge if i == 0 else 1)
        windows *= max(1, -(-total // size))
        # The windows over padded rows [before, before + length): those that read input.
        with_data = (before + length - 1) // (size * b) - before // (size * b) + 1 if length else 0
        data_windows *= with_data
        pieces *= with_data + len(chunks[1 + i]) - 1 if length else 0
    blocks = (1 if batch == 1 else batch * math.prod(block_shape)) * windows * rest
    tasks = 2 * blocks + batch * rest * (2 * data_windows + pieces)
    _limits.check("space_to_batch_nd", blocks, tasks, "give the input larger chunks, or less padding")


def space_to_batch_nd_chunks(chunks, block_shape, paddings, merge: int = 1, absorb_tail: bool = False):
    """Plan: (output chunks, reads): ``reads[i][k]`` lists the input pieces of output chunk k
    of spatial axis i (see ``_axis_reads``); an empty list is a block of padding only, a
    zero block that reads nothing.

    The input keeps its chunks; the output's spatial chunks are regular (``_axis_cuts``), on
    the first spatial axis the rows of ``merge`` input chunks; with ``absorb_tail``, a few
    rows larger where the last chunk would be a sliver (for plans that read halos anyway).
    The batch axis: one chunk of P*B when the input's batch axis is one chunk (one output
    block per input block, all P offsets in it), else the input's batch chunks repeated for
    each of the P groups.
    """
    chunks = [tuple(c) for c in chunks]
    groups = math.prod(block_shape)
    _check_space_to_batch_size(chunks, block_shape, paddings, merge)
    out, reads = list(chunks), []
    out[0] = (sum(chunks[0]) * groups,) if len(chunks[0]) == 1 else chunks[0] * groups
    for i, (b, (before, after)) in enumerate(zip(block_shape, paddings)):
        cuts = _axis_cuts(chunks[1 + i], b, before, after, merge if i == 0 else 1, absorb_tail)
        out[1 + i] = tuple(t1 - t0 for t0, t1 in zip(cuts, cuts[1:])) or (0,)
        reads.append(tuple(_axis_reads(chunks[1 + i], b, before, cuts)) or ((),))
    return tuple(out), tuple(reads)


def _whole_blocks(reads, out_chunks, in_chunks, block_shape) -> bool:
    """Whether every data block of the output is exactly one whole input block, in order."""
    for axis_reads, out, chunks, b in zip(reads, out_chunks, in_chunks, block_shape):
        data = [(r, n) for r, n in zip(axis_reads, out) if r]
        if len(data) != len(chunks):
            return False
        for k, (r, n) in enumerate(data):
            if r != ((k, 0, chunks[k], 0),) or n * b != chunks[k]:
                return False
    return True


def _each_chunk_read_once(reads) -> bool:
    """Whether no input chunk is read by two output windows on any spatial axis."""
    for axis_reads in reads:
        chunks = [k for window in axis_reads for k, *_ in window]
        if len(chunks) != len(set(chunks)):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# Chunks several windows read: each read once, by its owner


def _owners(axis_reads) -> dict[int, int]:
    """For one spatial axis: input chunk -> the window that reads most of its rows (the first
    of equals); that window reads the chunk, and its neighbours get their rows from it."""
    best: dict[int, tuple[int, int]] = {}
    for window, pieces in enumerate(axis_reads):
        for k, start, stop, _ in pieces:
            if stop - start > best.get(k, (0, -1))[0]:
                best[k] = (stop - start, window)
    return {k: window for k, (_, window) in best.items()}


def _owned_windows(reads, batch_blocks: int, rest_blocks) -> dict:
    """Plan for halos read by their owners: for each window with reads, ``(n, *spatial,
    *rest)`` -> (the chunks it reads, as spatial chunk indices; its pieces of them, as
    ``[chunk number, index, offsets]``; the rows it copies out for neighbours, as ``[chunk
    number, index]``; its halos, as (owner window, export number, offsets))."""
    owners = [_owners(axis) for axis in reads]
    windows: dict[tuple, tuple[list, list, list, list]] = {}
    # Windows share most of their boxes and offsets (the same rows of a chunk, the same place
    # in a block): one object each, not one per window. The tasks hold them for the whole run.
    shared_boxes: dict = {}
    shared_offsets: dict = {}
    for n in range(batch_blocks):
        for spatial in np.ndindex(*map(len, reads)):
            axis_reads = [reads[i][k] for i, k in enumerate(spatial)]
            if not all(axis_reads):
                continue
            for rest in np.ndindex(*rest_blocks):
                key = (n, *spatial, *rest)
                _, pieces, _, halos = windows.setdefault(key, ([], [], [], []))
                for combo in itertools.product(*axis_reads):
                    ks = tuple(k for k, *_ in combo)
                    owner = (n, *(owners[i][k] for i, k in enumerate(ks)), *rest)
                    owner_chunks, _, exports, _ = windows.setdefault(owner, ([], [], [], []))
                    if ks not in owner_chunks:
                        owner_chunks.append(ks)
                    bounds = tuple((a, z) for _, a, z, _ in combo)
                    index = shared_boxes.setdefault(bounds, (slice(None), *(slice(a, z) for a, z in bounds)))
                    offsets = tuple(o for *_, o in combo)
                    offsets = shared_offsets.setdefault(offsets, offsets)
                    if owner == key:
                        pieces.append([owner_chunks.index(ks), index, offsets])
                    else:
                        exports.append([owner_chunks.index(ks), index])
                        halos.append((owner, len(exports) - 1, offsets))
    return windows


#: How many times the windows of a halo plan must outnumber its longest chain of windows for
#: each window to take its halos from its neighbours' finished tasks (``halos_chain``): about
#: that many windows can then run at once, on average.
CHAIN_PARALLELISM = 4


def _halo_way(axis_reads) -> int | None:
    """On one spatial axis, where the windows' halos come from: +1 from later windows (each
    chunk's owner comes after every other window that reads it), -1 from earlier ones, 0 when
    no window takes a halo; None when some come from each side."""
    owners = _owners(axis_reads)
    ways = {(owners[k] > w) - (owners[k] < w) for w, pieces in enumerate(axis_reads) for k, *_ in pieces} - {0}
    if len(ways) > 1:
        return None
    return ways.pop() if ways else 0


def halos_chain(reads, batch_blocks: int, rest_blocks) -> bool:
    """Whether each window of a halo plan can take its halos from its neighbours' finished
    tasks (a chain from window to window) and still leave enough windows free to run at once.

    On every axis the halos must come from one side only, so that no two windows wait on each
    other; a chain then runs at most once through the windows of each axis, and the windows
    must outnumber that longest chain ``CHAIN_PARALLELISM`` times. O(chunks along the axes).
    """
    longest, windows = 1, batch_blocks * math.prod(rest_blocks)
    for axis_reads in reads:
        way = _halo_way(axis_reads)
        if way is None:
            return False
        reading = sum(1 for pieces in axis_reads if pieces)
        windows *= reading
        if way:
            longest += reading - 1
    return longest > 1 and windows >= CHAIN_PARALLELISM * longest


class HaloOrder:
    """The order in which a halo plan's windows are best read, as the priority annotation
    of their tasks (key -> priority; None for any other key).

    A window's block waits, held in its worker's memory, until the neighbours whose chunks
    give its halos have read them. Dask's own order visits the windows of a store graph far
    apart, so on a cluster several blocks wait at once, are spilled or sent to another
    worker. Here the windows come axis by axis from the side their halos come from (last
    first where they come from later windows), so a window's halo sources are read before
    it, and windows that share no halo (other batch chunks, other blocks of the trailing
    axes) are next to each other, for the workers to read at the same time.

    The priorities lie between -1 and 0, first window highest: the tasks that finish a block
    (0) run before another window is read, and the reads yield to other graphs' tasks on a
    shared cluster rather than overtake them.
    """

    def __init__(self, name: str, reads, batch_blocks: int, rest_blocks):
        self.name = name
        self.spatial = tuple(map(len, reads))
        # Last first on an axis whose halos come from later windows; else first first.
        self.reversed = tuple(_halo_way(axis_reads) == 1 for axis_reads in reads)
        self.batch_blocks, self.rest_blocks = batch_blocks, tuple(rest_blocks)
        self.count = batch_blocks * math.prod(self.spatial) * math.prod(self.rest_blocks)

    def __call__(self, key):
        if not (isinstance(key, tuple) and key and key[0] == self.name):
            return None
        m = len(self.spatial)
        n, spatial, rest = key[1], key[2 : 2 + m], key[2 + m :]
        rank = 0
        for k, size, last_first in zip(spatial, self.spatial, self.reversed):
            rank = rank * size + (size - 1 - k if last_first else k)
        rank = rank * self.batch_blocks + n
        for k, size in zip(rest, self.rest_blocks):
            rank = rank * size + k
        return -(rank + 1) / (self.count + 1)


# ---------------------------------------------------------------------------------------------
# BatchToSpaceND


def batch_to_space_nd_chunks(chunks, block_shape, crops):
    """Plan: (aligned input chunks, kept input chunk range per spatial axis, output chunks).

    A batch axis in one chunk stays so: each input block holds all P groups of its rows and
    is one output block. Otherwise the batch axis is cut into equal groups and an output
    block reads the same block of each group. On each spatial axis the input chunks whose
    rows are cropped away entirely are dropped (``kept[i] = (first, stop)`` chunk indices).
    """
    given = tuple(tuple(c) for c in chunks)
    chunks = list(given)
    groups = math.prod(block_shape)
    batch = sum(chunks[0]) // groups
    out = list(chunks)
    if len(chunks[0]) == 1:
        out[0] = (batch,)
    else:
        chunks[0] = _chunks.groups(chunks[0], batch, groups)
        out[0] = chunks[0][: len(chunks[0]) // groups] if groups and batch else (0,)
        if len(chunks) > 1 and sum(chunks[1]):
            # An output block reads the same block of each of the P groups: split the first
            # spatial axis P ways (a split-only rechunk) so it is one input block's size.
            chunks[1] = tuple(
                n for c in chunks[1] for n in _chunks.regular(c, -(-c // groups))
            )
    kept = []
    for i, (b, (lo, hi)) in enumerate(zip(block_shape, crops)):
        axis = 1 + i
        bounds = _chunks.boundaries(chunks[axis])
        length = bounds[-1] * b - lo - hi
        sizes = [
            max(0, min(stop * b, lo + length) - max(start * b, lo))
            for start, stop in zip(bounds, bounds[1:])
        ]
        live = [k for k, n in enumerate(sizes) if n > 0]
        if not live:
            kept.append((0, 0))
            out[axis] = (0,)
            continue
        kept.append((live[0], live[-1] + 1))
        out[axis] = tuple(sizes[live[0] : live[-1] + 1])
    _check_batch_to_space_size(given, chunks, out, block_shape)
    return tuple(chunks), tuple(kept), tuple(out)


def _check_batch_to_space_size(given, chunks, out, block_shape) -> None:
    """Refuse (``_limits.check``) a plan past the call's limits, before the graph builders
    loop over its blocks. Tasks: each output block and the input blocks it reads (the same
    block of each of the P groups with the batch axis chunked, else one, or up to two per
    spatial axis when the blocks are counted from the first kept row: ``_shifted_rows``),
    and a rechunk from the ``given`` chunks to ``chunks``."""
    m = len(block_shape)
    blocks = math.prod(len(c) for c in out)
    if len(chunks[0]) > 1:
        reads = math.prod(block_shape)
    else:
        reads = 1 if all(map(_chunks.zarr_regular, out[1 : 1 + m])) else 2**m
    tasks = blocks * (1 + reads)
    if tuple(chunks) != tuple(given):
        tasks += math.prod(len(c) for c in given) + math.prod(len(c) for c in chunks)
    _limits.check("batch_to_space_nd", blocks, tasks, "give the input larger chunks")


def _local_crops(chunks, kept, b: int, lo: int, length: int) -> list[tuple[int, int]]:
    """(crop before, crop after) of each kept input chunk of one spatial axis."""
    bounds = _chunks.boundaries(chunks)
    result = []
    for k in range(*kept):
        start, stop = bounds[k] * b, bounds[k + 1] * b
        result.append((max(0, lo - start), max(0, stop - (lo + length))))
    return result


def _shifted_rows(chunks, b: int, lo: int, length: int, size: int):
    """Output blocks of ``size`` rows on one spatial axis, counted from the first row the
    crop keeps (so that they are a Zarr array's chunks whatever the crop): for each block, its
    input rows as ``(input chunk, local start, local stop)`` pieces (two when it runs into the
    next chunk) and the crop of those rows' ``b``-fold rows; None if a block spans more than
    two input chunks."""
    bounds = _chunks.boundaries(chunks)
    blocks = []
    for first in range(0, length, size):
        u0, u1 = lo + first, lo + min(first + size, length)  # in the uncropped rows
        s0, s1 = u0 // b, -(-u1 // b)  # the input rows they come from
        pieces = []
        k = bisect.bisect_right(bounds, s0) - 1
        row = s0
        while row < s1:
            stop = min(s1, bounds[k + 1])
            pieces.append((k, row - bounds[k], stop - bounds[k]))
            row, k = stop, k + 1
        if len(pieces) > 2:
            return None
        blocks.append((pieces, (u0 - s0 * b, s1 * b - u1)))
    return blocks


def _shifted_chunks(rows, b: int) -> tuple[int, ...]:
    """The output chunks on one spatial axis of ``_shifted_rows``' blocks."""
    return tuple(sum(stop - start for _, start, stop in pieces) * b - before - after
                 for pieces, (before, after) in rows)


def _shifted_block(shifted, spatial) -> tuple[list[int], list[tuple[int, int]]]:
    """For the block at ``spatial`` of ``shifted`` (``_shifted_rows`` of each axis): its input
    rows and its crops, per spatial axis."""
    blocks = [axis[k] for axis, k in zip(shifted, spatial)]
    return [sum(stop - start for _, start, stop in pieces) for pieces, _ in blocks], [crops for _, crops in blocks]


def _shifted_reads(rows):
    """``_shifted_rows``' blocks of one axis as SpaceToBatchND's reads: for each block, its
    pieces as ``(input chunk, local start, local stop, first row in the block)``."""
    reads = []
    for pieces, _ in rows:
        origin, block = 0, []
        for k, start, stop in pieces:
            block.append((k, start, stop, origin))
            origin += stop - start
        reads.append(tuple(block))
    return reads
