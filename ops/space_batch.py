"""SpaceToBatch(ND) and BatchToSpaceND: the NumPy kernels and the Dask builders, side by side.

Both operators pair a *space* array ``[B, s_1..s_M, rest...]`` with a *batch* array
``[P*B, t_1..t_M, rest...]`` (``P = prod(block_shape)``): batch group ``g`` (block offsets
``j``, ``g = ravel(j)``) holds the space rows ``r`` with ``r + offset = t*b + j`` on every
spatial axis, where ``offset`` is the leading padding (SpaceToBatch) or leading crop
(BatchToSpace). Away from a partial first and last block that pairing is a plain reshape and
transpose of both arrays, so each kernel is a few ``copy_into`` calls over views
(``_pairs``); padding is never materialised (the batch side starts as zeros) and cropped rows
are never read.

Chunk plans:
- SpaceToBatchND: the input keeps its chunks; no rechunk, however the padding falls. The
  output's spatial chunks are regular (max input chunk // b rows, times the merged blocks
  below on the first axis: a Zarr store needs regular chunks), so an output block reads the
  input rows under its window: its input block(s) and fewer than b boundary rows of a
  neighbour (a halo: copied out by the task that reads the neighbour, or sliced off its
  block in a small task, so the neighbour block never travels). A batch axis in one chunk
  (one image, the common case) gives one output block per input block holding all P block
  offsets; several batch chunks give P output blocks per input block (one per group, views
  of one task's result). Blocks of padding only are zeros that read no input. When every
  output block is one whole input block, the plan is a blockwise map that Dask fuses with
  the Zarr read and write.
- BatchToSpaceND: a batch axis in one chunk stays so, and each input block (all P groups
  of its rows) is one output block, in one pass. Otherwise batch chunks are aligned to the
  group size B so no chunk straddles two groups, the first spatial axis is split P ways (so
  an output block is the size of an input block, not P times it) and each output block
  interleaves the same block from each of the P groups. Crops only trim edge blocks; input
  blocks that are cropped away entirely are not read. A crop before the first row of a
  chunked axis would make the first block short (not a Zarr chunk): the output blocks are
  then counted from the first kept row on every spatial axis, and a block takes the few rows
  it needs of the next chunks from the task that reads them.
- Inputs read straight from an array (``da.from_zarr``, ``da.from_array`` of a Zarr array):
  the tasks read what they need from the source themselves (``_block_reads``) instead of
  depending on the input's block tasks, and each chunk is read once where memory allows. A
  SpaceToBatchND window spans as many blocks of the first spatial axis as fit in a quarter
  of ``array.chunk-size``, so output blocks are not 1/P of an input block; without a halo
  its task reads them; with one, each chunk is read whole by the window that takes most of
  it, which copies out its neighbours' halo rows, so that no chunk is decoded twice. A
  BatchToSpaceND task reads the P chunks that feed P output blocks and makes those (a
  bundle, while P chunks fit in half of ``array.chunk-size``); otherwise each output block
  reads its 1/P of one chunk of each group (P decodes or downloads of a chunk, nothing
  held).
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from ops import _block_reads, _chunks, _fused_stores, _lazy, _validate
from ops._copy import copy_into
from ops.errors import InvalidArgument
from schemas import BatchToSpaceNDParams, SpaceToBatchNDParams, SpaceToBatchParams

# ---------------------------------------------------------------------------------------------
# NumPy kernels


def _axis_pieces(length: int, offset: int, b: int):
    """Split space rows [0, length) into runs (start, K, L, t0, j0): row start + k*L + l pairs
    with batch-side row t0 + k at block offset j0 + l. A partial first block, the whole
    blocks (L == b) and a partial last block: at most three runs."""
    pieces = []
    head = min(length, (-offset) % b)
    if head:
        pieces.append((0, 1, head, offset // b, offset % b))
    whole = (length - head) // b
    if whole:
        pieces.append((head, whole, b, (head + offset) // b, 0))
    tail_start = head + whole * b
    if tail_start < length:
        pieces.append((tail_start, 1, length - tail_start, (tail_start + offset) // b, 0))
    return pieces


def _boxes(space: np.ndarray, batch: np.ndarray, block_shape, offsets):
    """Equal-shape (space view, batch view) pairs that together pair every element once.

    ``batch`` is split into ``[b_1..b_M, B, t_1..t_M, rest]`` (its batch index is the group
    index times B plus b); each combination of per-axis runs is then one view on each side,
    so a whole operator is at most 3**M copies, each streamed in one pass.
    """
    m = len(block_shape)
    rows = space.shape[0]
    rest = space.shape[1 + m :]
    split = batch.reshape(*block_shape, rows, *batch.shape[1:])
    # From [L_1..L_M, B, K_1..K_M, rest] to the space view's [B, K_1, L_1, ..., rest].
    order = [m, *(a for i in range(m) for a in (m + 1 + i, i)), *range(2 * m + 1, split.ndim)]
    axes = [_axis_pieces(space.shape[1 + i], offsets[i], b) for i, b in enumerate(block_shape)]
    for runs in itertools.product(*axes):
        space_index = (slice(None), *(slice(r, r + k * n) for r, k, n, _, _ in runs))
        space_view = space[space_index].reshape(rows, *(v for _, k, n, _, _ in runs for v in (k, n)), *rest)
        batch_index = (
            *(slice(j, j + n) for _, _, n, _, j in runs),
            slice(None),
            *(slice(t, t + k) for _, k, _, t, _ in runs),
        )
        yield space_view, split[batch_index].transpose(order)


def _lattice(space_len: int, offset: int, b: int, j: int) -> tuple[slice, slice]:
    """Slices pairing space rows r with batch-side rows t where r + offset == t*b + j."""
    first = (j - offset) % b
    count = max(0, -(-(space_len - first) // b))
    t0 = (first + offset - j) // b
    return slice(first, first + (count - 1) * b + 1 if count else first, b), slice(t0, t0 + count)


def _pairs(space: np.ndarray, batch, block_shape, offsets):
    """Equal-shape (space view, batch view) pairs covering every element.

    ``batch`` is one array (a whole input or block: ``_boxes``), or the list of its P groups
    held in separate arrays (the blocks a Dask BatchToSpaceND task receives): one strided
    view per group.
    """
    if not isinstance(batch, list):
        yield from _boxes(space, batch, block_shape, offsets)
        return
    for group, j in zip(batch, np.ndindex(*block_shape)):
        space_index, group_index = [slice(None)], [slice(None)]
        for axis, (b, offset, jj) in enumerate(zip(block_shape, offsets, j), start=1):
            s, t = _lattice(space.shape[axis], offset, b, jj)
            space_index.append(s)
            group_index.append(t)
        yield space[tuple(space_index)], group[tuple(group_index)]


def _batch_shape(shape, block_shape, paddings) -> tuple[int, ...]:
    m = len(block_shape)
    spatial = [
        (shape[1 + i] + paddings[i][0] + paddings[i][1]) // block_shape[i] for i in range(m)
    ]
    return (shape[0] * math.prod(block_shape), *spatial, *shape[1 + m :])


def _space_shape(shape, block_shape, crops) -> tuple[int, ...]:
    m = len(block_shape)
    spatial = [shape[1 + i] * block_shape[i] - crops[i][0] - crops[i][1] for i in range(m)]
    return (shape[0] // math.prod(block_shape), *spatial, *shape[1 + m :])


def space_to_batch_nd_kernel(x: np.ndarray, block_shape, paddings) -> np.ndarray:
    """SpaceToBatchND of one NumPy array (a whole input or one Dask block)."""
    shape = _batch_shape(x.shape, block_shape, paddings)
    padded = any(lo or hi for lo, hi in paddings)
    # Fresh zeroed pages cost nothing extra, and only padding relies on them.
    y = np.zeros(shape, x.dtype) if padded else np.empty(shape, x.dtype)
    for space_view, batch_view in _pairs(x, y, block_shape, [lo for lo, _ in paddings]):
        copy_into(batch_view, space_view)
    return y


def batch_to_space_nd_kernel(batch, block_shape, crops) -> np.ndarray:
    """BatchToSpaceND of one NumPy array, or of its P groups given as separate arrays."""
    groups = batch if isinstance(batch, list) else [batch]
    rows = sum(group.shape[0] for group in groups)
    y = np.empty(_space_shape((rows, *groups[0].shape[1:]), block_shape, crops), groups[0].dtype)
    for space_view, batch_view in _pairs(y, batch, block_shape, [lo for lo, _ in crops]):
        copy_into(space_view, batch_view)
    return y


# ---------------------------------------------------------------------------------------------
# Validation


def _validate_block_and_pairs(x, block_shape, pairs, pairs_name: str, model):
    x = _validate.array("x", x)
    shape, flat = _validate.integers("block_shape", block_shape)
    if len(shape) != 1:
        raise InvalidArgument(f"block_shape must be 1-D [M], got shape {list(shape)}")
    m = len(flat)
    rows = _validate.pairs(pairs_name, pairs, m) if m else []
    p = _validate.params(model, block_shape=flat, **{pairs_name: rows})
    if not 1 <= m < x.ndim or x.ndim > 8:
        raise InvalidArgument(
            f"x must have rank M+1..8 for block_shape of length M = {m}, "
            f"got rank {x.ndim} (shape {list(x.shape)})"
        )
    return x, p


def _validate_space_to_batch_nd(x, block_shape, paddings):
    x, p = _validate_block_and_pairs(x, block_shape, paddings, "paddings", SpaceToBatchNDParams)
    for i, (b, (lo, hi)) in enumerate(zip(p.block_shape, p.paddings)):
        padded = x.shape[1 + i] + lo + hi
        if padded % b:
            raise InvalidArgument(
                f"padded size of spatial dim {i} (x.shape[{1 + i}] + paddings[{i}] = "
                f"{x.shape[1 + i]} + {lo} + {hi} = {padded}) must be divisible by "
                f"block_shape[{i}] = {b}"
            )
    _validate.output_shape(_batch_shape(x.shape, p.block_shape, p.paddings), x.dtype.itemsize)
    return x, p


def _validate_batch_to_space_nd(x, block_shape, crops):
    x, p = _validate_block_and_pairs(x, block_shape, crops, "crops", BatchToSpaceNDParams)
    groups = math.prod(p.block_shape)
    if x.shape[0] % groups:
        raise InvalidArgument(
            f"batch size x.shape[0] = {x.shape[0]} must be divisible by prod(block_shape) = {groups}"
        )
    for i, (b, (lo, hi)) in enumerate(zip(p.block_shape, p.crops)):
        full = x.shape[1 + i] * b
        if lo + hi > full:
            raise InvalidArgument(
                f"crops[{i}] = [{lo}, {hi}] removes more than spatial dim {i} holds "
                f"(x.shape[{1 + i}] * block_shape[{i}] = {full})"
            )
    _validate.output_shape(_space_shape(x.shape, p.block_shape, p.crops), x.dtype.itemsize)
    return x, p


# ---------------------------------------------------------------------------------------------
# Chunk plans (pure functions)


def _axis_cuts(chunks: tuple[int, ...], b: int, before: int, after: int, merge: int = 1) -> list[int]:
    """Output chunk boundaries on one spatial axis of SpaceToBatchND: regular chunks of
    max(input chunk) // b batch-side rows (Zarr stores need regular chunks; anything else
    makes ``to_zarr`` rechunk the whole output), or one chunk for an axis in one chunk.

    Batch-side row t holds padded rows [t*b, (t+1)*b), i.e. space rows [t*b - before, ...),
    so an output chunk reads the input rows under it: with input chunks that are multiples
    of b, its own input block and a few rows of the neighbouring one (a halo), wherever the
    padding puts the window, and nothing for a chunk of padding only.
    """
    total = (sum(chunks) + before + after) // b
    size = _output_chunk(chunks, b, total, merge)
    return [*range(0, total, size), total]


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


def space_to_batch_nd_chunks(chunks, block_shape, paddings, merge: int = 1):
    """Plan: (output chunks, reads): ``reads[i][k]`` lists the input pieces of output chunk k
    of spatial axis i (see ``_axis_reads``); an empty list is a block of padding only, a
    zero block that reads nothing.

    The input keeps its chunks; the output's spatial chunks are regular (``_axis_cuts``), on
    the first spatial axis the rows of ``merge`` input chunks.
    The batch axis: one chunk of P*B when the input's batch axis is one chunk (one output
    block per input block, all P offsets in it), else the input's batch chunks repeated for
    each of the P groups.
    """
    chunks = [tuple(c) for c in chunks]
    m = len(block_shape)
    groups = math.prod(block_shape)
    # Counted before any tuple of output chunks is built: padding can ask for more blocks
    # than any graph can hold, and the tuples alone would exhaust memory.
    blocks = (1 if len(chunks[0]) == 1 else len(chunks[0]) * groups) * math.prod(
        len(c) for c in chunks[1 + m :]
    )
    for i, (b, (before, after)) in enumerate(zip(block_shape, paddings)):
        total = (sum(chunks[1 + i]) + before + after) // b
        blocks *= max(1, -(-total // _output_chunk(chunks[1 + i], b, total, merge if i == 0 else 1)))
    _chunks.check_block_count("space_to_batch_nd", blocks)
    out, reads = list(chunks), []
    out[0] = (sum(chunks[0]) * groups,) if len(chunks[0]) == 1 else chunks[0] * groups
    for i, (b, (before, after)) in enumerate(zip(block_shape, paddings)):
        cuts = _axis_cuts(chunks[1 + i], b, before, after, merge if i == 0 else 1)
        out[1 + i] = tuple(t1 - t0 for t0, t1 in zip(cuts, cuts[1:])) or (0,)
        reads.append(tuple(_axis_reads(chunks[1 + i], b, before, cuts)) or ((),))
    return tuple(out), tuple(reads)


def batch_to_space_nd_chunks(chunks, block_shape, crops):
    """Plan: (aligned input chunks, kept input chunk range per spatial axis, output chunks).

    A batch axis in one chunk stays so: each input block holds all P groups of its rows and
    is one output block. Otherwise the batch axis is cut into equal groups and an output
    block reads the same block of each group. On each spatial axis the input chunks whose
    rows are cropped away entirely are dropped (``kept[i] = (first, stop)`` chunk indices).
    """
    chunks = [tuple(c) for c in chunks]
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
    return tuple(chunks), tuple(kept), tuple(out)


# ---------------------------------------------------------------------------------------------
# Dask builders


def _space_to_batch_pieces(pieces, block_shape, shape, dtype, fill: bool):
    """One output block of SpaceToBatchND from its input pieces (its own block and halos).

    Each piece is ``[array, index, offsets]``: ``array[index]`` (the whole array for None)
    lands at padded rows ``offsets`` of this block; the rows no piece covers are padding.
    """
    y = np.zeros(shape, dtype) if fill else np.empty(shape, dtype)
    _fill(y, pieces, block_shape)
    return y


def _fill(y, pieces, block_shape) -> None:
    """Copy each ``[array, index, offsets]`` piece into the output block ``y``."""
    for array, index, offsets in pieces:
        space = array if index is None else array[index]
        rows = space.shape[1 : 1 + len(block_shape)]
        view = y[(slice(None), *(slice(o // b, -(-(o + n) // b)) for o, n, b in zip(offsets, rows, block_shape)))]
        for space_view, batch_view in _boxes(space, view, block_shape, [o % b for o, b in zip(offsets, block_shape)]):
            copy_into(batch_view, space_view)


def _edge(block, index):
    """A few boundary rows of a neighbouring block, copied so that only they are kept and sent."""
    return block[index].copy()


def _space_to_batch_window(chunks, pieces, exports, block_shape, shape, dtype, fill: bool):
    """A window that reads its own input chunks (``chunks``, read whole): its output block
    from the pieces it owns, ``[chunk number, index, offsets]``, and copies of the rows its
    neighbours take from those chunks, ``[chunk number, index]`` (their halos)."""
    y = _space_to_batch_pieces(
        [[chunks[c], index, offsets] for c, index, offsets in pieces], block_shape, shape, dtype, fill
    )
    return y, [chunks[c][index].copy() for c, index in exports]


def _export(window, e: int):
    """The ``e``-th rows a window (SpaceToBatchND's, or a BatchToSpaceND reader) copied for a
    neighbour: its halo."""
    return window[1][e]


def _with_halos(window, halos, block_shape):
    """A window's output block with the rows its neighbours' chunks give it (``halos``:
    ``[rows, None, offsets]``) written in (in place: only this task uses the block)."""
    y = window[0]
    _fill(y, halos, block_shape)
    return y


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
                    index = (slice(None), *(slice(a, z) for _, a, z, _ in combo))
                    offsets = [o for *_, o in combo]
                    if owner == key:
                        pieces.append([owner_chunks.index(ks), index, offsets])
                    else:
                        exports.append([owner_chunks.index(ks), index])
                        halos.append((owner, len(exports) - 1, offsets))
    return windows


def _groups(block, block_shape) -> tuple:
    """The P output blocks of an input batch chunk's all-groups block: views of its rows, group
    by group (output batch index g*B + n), no copy."""
    groups = math.prod(block_shape)
    rows = block.shape[0] // groups
    return tuple(block[g * rows : (g + 1) * rows] for g in range(groups))


def _space_to_batch_group_blocks(pieces, block_shape, shape, dtype, fill: bool):
    """The output blocks, one per group, of one batch chunk's pieces, one at a time."""
    yield from _groups(_space_to_batch_pieces(pieces, block_shape, shape, dtype, fill), block_shape)


@_fused_stores.streams(_space_to_batch_group_blocks)
def _space_to_batch_groups(pieces, block_shape, shape, dtype, fill: bool):
    """The output blocks, one per group, of one batch chunk's pieces, as a tuple. In a store
    graph (``ops.fusing_stores``) the task writes each block itself instead."""
    return _groups(_space_to_batch_pieces(pieces, block_shape, shape, dtype, fill), block_shape)


def _with_halos_group_blocks(window, halos, block_shape):
    """A window's output blocks, one per group, with its halos written in, one at a time."""
    yield from _groups(_with_halos(window, halos, block_shape), block_shape)


@_fused_stores.streams(_with_halos_group_blocks)
def _with_halos_groups(window, halos, block_shape):
    """A window's output blocks, one per group, with its halos written in, as a tuple. In a
    store graph (``ops.fusing_stores``) the task writes each block itself instead."""
    return _groups(_with_halos(window, halos, block_shape), block_shape)


def _piece_args(x: da.Array, key, combo, layer, edge_key):
    """The ``[array, index, offsets]`` argument for one piece; small pieces of a neighbouring
    block get their own task (``_edge``) so the whole neighbour never travels."""
    index = (slice(None), *(slice(start, stop) for _, start, stop, _ in combo))
    offsets = [offset for *_, offset in combo]
    lengths = [x.chunks[1 + i][k] for i, (k, *_) in enumerate(combo)]
    taken = [stop - start for _, start, stop, _ in combo]
    if taken == lengths:
        return [key, None, offsets]
    if any(2 * n < length for n, length in zip(taken, lengths)):
        layer[edge_key] = (_edge, key, index)
        return [edge_key, None, offsets]
    return [key, index, offsets]


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


def _build_space_to_batch_blockwise(x: da.Array, block_shape, out_chunks, reads) -> da.Array:
    """Each input block is one output block: a blockwise map (Dask fuses it with the read of
    the block and the write of the result, one task per block), zero blocks around it."""
    m = len(block_shape)
    data_chunks = [tuple(n for r, n in zip(reads[i], out_chunks[1 + i]) if r) for i in range(m)]
    y = x.map_blocks(
        space_to_batch_nd_kernel, list(block_shape), [[0, 0]] * m,
        chunks=(out_chunks[0], *data_chunks, *x.chunks[1 + m :]),
        dtype=x.dtype, meta=_lazy.meta(x.ndim, x.dtype),
        name=f"space_to_batch_nd-{tokenize(x, block_shape, out_chunks)}",
    )
    for i in range(m):
        before = out_chunks[1 + i][: next(k for k, r in enumerate(reads[i]) if r)]
        after = out_chunks[1 + i][len(before) + len(data_chunks[i]) :]
        pieces = [y]
        for zero_chunks, at in ((before, 0), (after, 1)):
            if zero_chunks:
                chunks = list(y.chunks)
                chunks[1 + i] = zero_chunks
                zeros = da.zeros(tuple(map(sum, chunks)), dtype=y.dtype, chunks=tuple(chunks))
                pieces.insert(0 if at == 0 else len(pieces), zeros)
        if len(pieces) > 1:
            y = da.concatenate(pieces, axis=1 + i)
    return y


def _merge(x: da.Array, groups: int) -> int:
    """Input chunks per SpaceToBatchND output block on the first spatial axis: as many as fit
    in a quarter of Dask's chunk size, at most P (an output block then has an input block's
    size)."""
    block_bytes = max(1, _largest_block_bytes(x))
    return max(1, min(groups, _chunks.target_bytes() // 4 // block_bytes))


def _each_chunk_read_once(reads) -> bool:
    """Whether no input chunk is read by two output windows on any spatial axis."""
    for axis_reads in reads:
        chunks = [k for window in axis_reads for k, *_ in window]
        if len(chunks) != len(set(chunks)):
            return False
    return True


def _graph(name: str, layer: dict, x: da.Array, reads) -> HighLevelGraph:
    """The graph of ``layer`` on top of x's; with region reads, on top of x's sources only
    (x's own block tasks are not used, and would only be culled)."""
    if reads is None:
        return HighLevelGraph.from_collections(name, layer, dependencies=[x])
    used = any(x.name in deps for deps in x.dask.dependencies.values())
    layers = {k: v for k, v in x.dask.layers.items() if k != x.name or used}
    dependencies = {k: set(v) for k, v in x.dask.dependencies.items() if k in layers}
    layers[name] = layer
    dependencies[name] = set(reads.layers)
    return HighLevelGraph(layers, dependencies)


def _build_space_to_batch_nd(x: da.Array, block_shape, paddings) -> da.Array:
    out_chunks, reads = space_to_batch_nd_chunks(x.chunks, block_shape, paddings)
    m = len(block_shape)
    if x.numblocks[0] == 1 and _whole_blocks(reads, out_chunks[1 : 1 + m], x.chunks[1 : 1 + m], block_shape):
        return _build_space_to_batch_blockwise(x, block_shape, out_chunks, reads)
    groups = math.prod(block_shape)
    token = tokenize(x, block_shape, paddings)
    name, all_name, edge_name, window_name = (
        f"space_to_batch_nd{part}-{token}" for part in ("", "-all", "-edge", "-window")
    )
    # A plain from_array/from_zarr input whose output windows each lie in one input block:
    # each task reads its block from the source itself (one task, no intermediate key). A
    # window that also needs a few boundary rows of a neighbour (a halo from the padding)
    # does not read them itself: a Zarr chunk is decoded whole, so that would decode every
    # chunk a second time for one row. The chunk's owner copies them out for it instead
    # (below); other inputs give block keys and edge tasks.
    reads_per_block = math.prod(max(map(len, axis)) for axis in reads)
    stored = _block_reads.BlockReads.of(x)
    source = stored if reads_per_block == 1 else None
    # With the batch axis chunked an input chunk makes P output blocks of 1/P of its size:
    # for an input read from a store, output blocks that span ``merge`` input chunks on the
    # first spatial axis cut the store tasks and their fixed costs by ``merge``. The task
    # holds merge input blocks and as much output, kept within a quarter of Dask's chunk
    # size. Region reads need windows that read no chunk twice; with halos each chunk is
    # read once anyway (by its owner; the halo rows go through edge tasks).
    merge = _merge(x, groups) if stored is not None and x.numblocks[0] > 1 else 1
    if merge > 1:
        merged_chunks, merged_reads = space_to_batch_nd_chunks(x.chunks, block_shape, paddings, merge)
        if source is None or _each_chunk_read_once(merged_reads):
            out_chunks, reads = merged_chunks, merged_reads
    # One batch chunk: each output block holds all P offsets (output batch index g*B + n).
    # Several: one task per input batch chunk computes all P groups in one pass, and output
    # block (g, k) is group g's rows of it (a view, no copy).
    single = x.numblocks[0] == 1
    block_shape, dtype = list(block_shape), x.dtype
    # Halos from a plain source: each input chunk is read once, whole, by the window that
    # reads most of its rows (its owner), which also copies out the few rows its neighbours
    # take (their halos); a neighbour writes them into its block in a small task after its
    # own window. No window waits for another and no block key of x is held or sent: with
    # block keys, two blocks of one window can be read on two workers and one sent across;
    # a window that waits for its neighbour's reads leaves its worker idle, and the
    # scheduler then sends that worker more reads to hold.
    owned = stored if source is None and stored is not None else None
    windows = _owned_windows(reads, x.numblocks[0], x.numblocks[1 + m :]) if owned is not None else {}
    layer = {}
    for n, rows in enumerate(x.chunks[0]):
        for spatial in np.ndindex(*map(len, out_chunks[1 : 1 + m])):
            axis_reads = [reads[i][k] for i, k in enumerate(spatial)]
            spatial_shape = tuple(out_chunks[1 + i][k] for i, k in enumerate(spatial))
            for rest in np.ndindex(*x.numblocks[1 + m :]):
                rest_shape = tuple(x.chunks[1 + m + i][k] for i, k in enumerate(rest))
                out_keys = (
                    [(name, 0, *spatial, *rest)] if single
                    else [(name, g * len(x.chunks[0]) + n, *spatial, *rest) for g in range(groups)]
                )
                if not all(axis_reads):  # padding only: zeros, no input read
                    zero_shape = (rows * groups if single else rows, *spatial_shape, *rest_shape)
                    layer.update({key: (np.zeros, zero_shape, dtype) for key in out_keys})
                    continue
                covered = all(
                    sum(stop - start for _, start, stop, _ in r) == size * b
                    for r, size, b in zip(axis_reads, spatial_shape, block_shape)
                )
                shape = (rows * groups, *spatial_shape, *rest_shape)
                if owned is not None:
                    own_chunks, pieces, exports, halos = windows[(n, *spatial, *rest)]
                    window_key = (window_name, n, *spatial, *rest)
                    layer[window_key] = (
                        _space_to_batch_window, [owned.read((n, *ks, *rest)) for ks in own_chunks],
                        pieces, exports, block_shape, shape, dtype, not covered,
                    )
                    for e in range(len(exports)):
                        layer[(edge_name, n, *spatial, *rest, e)] = (_export, window_key, e)
                    halo_pieces = [[(edge_name, *owner, e), None, offsets] for owner, e, offsets in halos]
                    task = (_with_halos, window_key, halo_pieces, block_shape)
                    groups_task = (_with_halos_groups, *task[1:])
                else:
                    pieces = []
                    for p, combo in enumerate(itertools.product(*axis_reads)):
                        block = (n, *(k for k, *_ in combo), *rest)
                        if source is None:
                            edge_key = (edge_name, n, *spatial, *rest, p)
                            pieces.append(_piece_args(x, (x.name, *block), combo, layer, edge_key))
                            continue
                        local = (slice(None), *(slice(a, z) for _, a, z, _ in combo), *(slice(None),) * len(rest))
                        pieces.append([source.read(block, local), None, [o for *_, o in combo]])
                    task = (_space_to_batch_pieces, pieces, block_shape, shape, dtype, not covered)
                    groups_task = (_space_to_batch_groups, *task[1:])
                if single:
                    layer[out_keys[0]] = task
                    continue
                # The P blocks as one multi-output task: in a store graph it writes them itself.
                all_key = (all_name, n, *spatial, *rest)
                layer[all_key] = groups_task
                for g, key in enumerate(out_keys):
                    layer[key] = (operator.getitem, all_key, g)
    graph = _graph(name, layer, x, source or owned)
    return da.Array(graph, name, chunks=out_chunks, meta=_lazy.meta(x.ndim, x.dtype))


def _batch_to_space_block(blocks, block_shape, crops):
    return batch_to_space_nd_kernel(list(blocks), block_shape, crops)


def _batch_to_space_bundle_blocks(reads, outputs, block_shape):
    """The output blocks fed by one bundle of source chunks, one at a time.

    ``reads`` are ``[getter, source, slices, *extra]`` (one chunk each); ``outputs`` are
    ``(crops, parts)`` with one ``(chunk position in reads, slices)`` part per group. An output
    with crops None is its parts themselves, as a list (the rows of a block that also takes
    rows of other bundles' chunks: ``_batch_to_space_joined``).
    """
    # Every chunk feeds every output block, so all P chunks' worth is held at once. Each
    # chunk, once read, is cut into the parts the output blocks take (copies) and dropped;
    # then each output block is made from its parts and they are dropped. At most P chunks'
    # worth plus one read's buffers, or plus one output block, are held. (Scattering each
    # chunk straight into the output blocks would touch every 2 MiB page of them with the
    # first group, every other row being that group's, so all P outputs would be held beside
    # all P chunks; with 4 KiB pages instead, the page faults cost more than these copies.)
    parts_of = [[None] * len(parts) for _, parts in outputs]
    for position, (func, source, slices, *extra) in enumerate(reads):
        chunk = func(source, slices, *extra)
        for held, (_, parts) in zip(parts_of, outputs):
            for j, (k, piece) in enumerate(parts):
                if k == position:
                    held[j] = np.array(chunk[piece])
        del chunk
    for o, (crops, _) in enumerate(outputs):
        block = parts_of[o] if crops is None else batch_to_space_nd_kernel(parts_of[o], block_shape, crops)
        parts_of[o] = None
        yield block
        del block  # before the next one is made: the caller has stored it


def _batch_to_space_joined(pieces, origins, rows, block_shape, crops):
    """An output block whose rows run across input chunks, from the parts of it the bundles of
    those chunks made (``pieces``, one part per group each; ``origins``: ``_batch_to_space_boxes``)."""
    return _batch_to_space_boxes(list(zip(pieces, origins)), rows, block_shape, crops)


@_fused_stores.streams(_batch_to_space_bundle_blocks)
def _batch_to_space_bundle(reads, outputs, block_shape):
    """The output blocks fed by one bundle of source chunks, as a tuple. In a store graph
    (``ops.fusing_stores``) the bundle writes each block as it makes it instead."""
    return tuple(_batch_to_space_bundle_blocks(reads, outputs, block_shape))


def _batch_to_space_boxes(pieces, rows, block_shape, crops):
    """One output block of BatchToSpaceND from boxes of the batch's rows, as if they were one
    array of ``rows`` rows per spatial axis cropped by ``crops``: ``pieces`` are ``(piece,
    origin)``, a piece being an array holding all P groups or the list of its P groups'
    arrays, and its origin its first row on each spatial axis. Each piece is scattered into
    its part of the block, with no joined copy of them."""
    m = len(block_shape)
    head = pieces[0][0]
    parts = head if isinstance(head, list) else [head]
    first, batch = parts[0], sum(part.shape[0] for part in parts)
    y = np.empty(_space_shape((batch, *rows, *first.shape[1 + m :]), block_shape, crops), first.dtype)
    for piece, origin in pieces:
        shape = (piece[0] if isinstance(piece, list) else piece).shape[1 : 1 + m]
        view, offsets = [slice(None)], []
        for b, (lo, _), o, n, length in zip(block_shape, crops, origin, shape, y.shape[1:]):
            start, stop = max(0, o * b - lo), min(length, (o + n) * b - lo)
            view.append(slice(start, stop))
            offsets.append(start + lo - o * b)
        if all(s.stop > s.start for s in view[1:]):
            for space_view, batch_view in _pairs(y[tuple(view)], piece, block_shape, offsets):
                copy_into(space_view, batch_view)
    return y


def _batch_to_space_reader(chunks, own, exports):
    """A block's reads (``chunks``, whole): the boxes its block takes of them, ``[chunk number,
    index, origin]`` (views, with their origins in the block), and copies of the boxes other
    blocks take, ``[chunk number, index]``, for them."""
    return [(chunks[c][index], origin) for c, index, origin in own], [chunks[c][index].copy() for c, index in exports]


def _batch_to_space_gathered(reader, imports, rows, block_shape, crops):
    """A block from its own boxes (``reader``'s) and the boxes other readers copied for it
    (``imports``: ``(box, origin)``)."""
    return _batch_to_space_boxes([*reader[0], *imports], rows, block_shape, crops)


def _build_batch_to_space_single_shifted(x, source, out_chunks, block_shape, shifted, token) -> da.Array:
    """BatchToSpaceND with the batch axis in one chunk, its output blocks counted on each
    spatial axis from the first row the crop keeps (``shifted``: ``_shifted_rows`` of each
    axis; ``out_chunks``: those blocks), so that they are Zarr chunks as they are. A block
    takes the rows of one input chunk and a few of the next (the crop's) on each axis. Each
    input chunk is read once, whole, by the block that takes most of it; that block's reader
    copies out the rows the other blocks take, which make their own blocks from their rows
    and those (no rechunk, no chunk read twice)."""
    m = len(block_shape)
    name, reader_name, export_name = (f"batch_to_space_nd{part}-{token}" for part in ("", "-reader", "-export"))
    # SpaceToBatchND's halo plan: for each block, the chunks it reads, its boxes of them, the
    # boxes it copies out for others and the boxes it takes from others' copies.
    windows = _owned_windows([_shifted_reads(rows) for rows in shifted], 1, x.numblocks[1 + m :])
    layer = {}
    for key, (reads, own, exports, imports) in windows.items():
        chunks = [(0, *ks, *key[1 + m :]) for ks in reads]
        reader_key = (reader_name, *key[1:])
        layer[reader_key] = (_batch_to_space_reader,
                             [source.read(i) if source is not None else (x.name, *i) for i in chunks], own, exports)
        for e in range(len(exports)):
            layer[(export_name, *key[1:], e)] = (_export, reader_key, e)
    for key, (_, _, _, imports) in windows.items():
        rows, crops = _shifted_block(shifted, key[1 : 1 + m])
        boxes = [[(export_name, *owner[1:], e), origin] for owner, e, origin in imports]
        layer[(name, *key)] = (_batch_to_space_gathered, (reader_name, *key[1:]), boxes, rows, list(block_shape),
                               crops)
    graph = _graph(name, layer, x, source)
    return da.Array(graph, name, chunks=out_chunks, meta=_lazy.meta(x.ndim, x.dtype))


def _largest_block_bytes(x: da.Array) -> int:
    return math.prod(max(c) if c else 0 for c in x.chunks) * x.dtype.itemsize


def _batch_to_space_local(block, block_shape, local_crops, block_id=None):
    crops = [axis_crops[block_id[1 + i]] for i, axis_crops in enumerate(local_crops)]
    return batch_to_space_nd_kernel(block, block_shape, crops)


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


def _build_batch_to_space_nd(x: da.Array, block_shape, crops, out_shape) -> da.Array:
    in_chunks, kept, out_chunks = batch_to_space_nd_chunks(x.chunks, block_shape, crops)
    # The plan's blocks read from the source inside the task that needs them, when x is a
    # plain from_array/from_zarr and the plan only splits its chunks: no rechunk tasks, no
    # input block held for its P readers (nor sent to another worker).
    # From an object store too: a split block is then downloaded P times, but the rechunk
    # plan holds P pieces of every block in worker memory, which with s3fs's buffers on top
    # is more than small (384 MiB) workers survive.
    source = _block_reads.BlockReads.of(x)
    pieces = source and _block_reads.refined(x.chunks, in_chunks)
    if pieces is None:
        source = None
        if in_chunks != x.chunks:
            x = x.rechunk(in_chunks)

    def block(index):
        if source is None:
            return (x.name, *index)
        return source.read(
            tuple(pieces[a][i][0] for a, i in enumerate(index)),
            tuple(pieces[a][i][1] for a, i in enumerate(index)),
        )

    m = len(block_shape)
    groups = math.prod(block_shape)
    single = len(in_chunks[0]) == 1
    batch_blocks = len(in_chunks[0]) // groups
    local_crops = [
        _local_crops(in_chunks[1 + i], kept[i], b, lo, out_shape[1 + i])
        for i, (b, (lo, _)) in enumerate(zip(block_shape, crops))
    ]
    token = tokenize(x, block_shape, crops)
    name = f"batch_to_space_nd-{token}"
    # A crop before the first row makes the first block short, and a Zarr store needs regular
    # chunks: to_zarr would rechunk the whole output. Blocks counted from the first kept row
    # on every spatial axis instead, when each runs into at most the next chunk.
    shifted = None
    if all(out_shape[1 : 1 + m]) and not all(map(_chunks.zarr_regular, out_chunks[1 : 1 + m])):
        shifted = [_shifted_rows(x.chunks[1 + i], b, lo, out_shape[1 + i], max(out_chunks[1 + i]))
                   for i, (b, (lo, _)) in enumerate(zip(block_shape, crops))]
        shifted = None if None in shifted else shifted
    if shifted is not None:  # the output chunks of the shifted plans (the others keep out_chunks)
        shifted_chunks = (out_chunks[0], *(_shifted_chunks(rows, b) for rows, b in zip(shifted, block_shape)),
                          *out_chunks[1 + m :])
    if shifted is not None and single and in_chunks == x.chunks:
        return _build_batch_to_space_single_shifted(x, source, shifted_chunks, block_shape, shifted, token)
    if single and in_chunks == x.chunks and all(k == (0, n) for k, n in zip(kept, x.numblocks[1 : 1 + m])):
        # Each input block is one output block: a blockwise map, which Dask fuses with the
        # read of the block and the write of the result.
        return x.map_blocks(
            _batch_to_space_local, list(block_shape), local_crops,
            chunks=out_chunks, dtype=x.dtype, meta=_lazy.meta(x.ndim, x.dtype), name=name,
        )
    # Each output block reads a part of P source chunks (one per group), and each of those
    # chunks feeds P output blocks. Reading the parts separately decodes every chunk P times;
    # when P chunks fit in half of Dask's chunk size, one task per set of P chunks reads each
    # once and makes its P output blocks.
    # A worker holds up to two bundles when the scheduler queues a second root task on it
    # (``distributed.scheduler.worker-saturation`` above 1.0; with 1.0, one: deploy/README.md).
    bundled = (
        source is not None and not single
        and groups * _largest_block_bytes(x) <= _chunks.target_bytes() // 2
    )
    if shifted is not None and bundled:
        return _build_batch_to_space_shifted(x, source, pieces, in_chunks, shifted_chunks, block_shape, shifted,
                                             token)
    bundle_name = f"batch_to_space_nd-bundle-{token}"
    bundles: dict[tuple, list] = {}  # source chunks -> (output index, crops, parts) of each output block
    layer = {}
    for index in np.ndindex(*map(len, out_chunks)):
        # Spatial block k of the output is input chunk kept[i][0] + k (of every group).
        spatial = [index[1 + i] + kept[i][0] for i in range(m)]
        block_crops = [local_crops[i][index[1 + i]] for i in range(m)]
        if single:
            # The block holds all P groups of its rows: one pass, as the NumPy kernel does.
            task = block((0, *spatial, *index[1 + m :]))
            layer[(name, *index)] = (batch_to_space_nd_kernel, task, list(block_shape), block_crops)
            continue
        in_blocks = [(g * batch_blocks + index[0], *spatial, *index[1 + m :]) for g in range(groups)]
        if not bundled:
            blocks = [block(b) for b in in_blocks]
            layer[(name, *index)] = (_batch_to_space_block, blocks, list(block_shape), block_crops)
            continue
        sources = [tuple(pieces[a][i][0] for a, i in enumerate(b)) for b in in_blocks]
        unique = tuple(dict.fromkeys(sources))
        parts = [(unique.index(src), tuple(pieces[a][i][1] for a, i in enumerate(b)))
                 for src, b in zip(sources, in_blocks)]
        bundles.setdefault(unique, []).append((index, block_crops, parts))
    for number, (unique, outputs) in enumerate(bundles.items()):
        key = (bundle_name, number)
        # The reads as data ([getter, source, slices, ...]: a list is not a task), made by
        # the bundle one at a time.
        reads = [list(source.read(b)) for b in unique]
        plan = [(crops, parts) for _, crops, parts in outputs]
        layer[key] = (_batch_to_space_bundle, reads, plan, list(block_shape))
        for position, (index, _, _) in enumerate(outputs):
            layer[(name, *index)] = (operator.getitem, key, position)
    graph = _graph(name, layer, x, source)
    return da.Array(graph, name, chunks=out_chunks, meta=_lazy.meta(x.ndim, x.dtype))


def _build_batch_to_space_shifted(x, source, pieces, in_chunks, out_chunks, block_shape, shifted, token) -> da.Array:
    """BatchToSpaceND in bundles, its output blocks counted on each spatial axis from the
    first row the crop keeps (``shifted``: ``_shifted_rows`` of each axis; ``out_chunks``:
    those blocks). A block within one input chunk is made by that chunk's bundle; a block that
    runs into the next chunk on some axis is joined in a task of its own from its parts, each
    made by the bundle of the chunk it lies in (a few rows: the crop's)."""
    m = len(block_shape)
    groups = math.prod(block_shape)
    batch_blocks = len(in_chunks[0]) // groups
    name, bundle_name, part_name = (f"batch_to_space_nd{part}-{token}" for part in ("", "-bundle", "-part"))
    reads = [_shifted_reads(rows) for rows in shifted]
    bundles: dict[tuple, list] = {}  # source chunks -> [(crops or None, parts)] of each output
    outputs: dict[tuple, tuple] = {}  # output block -> ([(bundle's source chunks, position)], origins, rows, crops)
    layer = {}

    def parts_of(n, box, rest):
        """The source chunks of one bundle and the part each group takes of its own chunk."""
        sources, parts = [], []
        for g in range(groups):
            first, local = pieces[0][g * batch_blocks + n]
            chunk = (first, *(k for k, *_ in box), *rest)
            sources.append(chunk)
            parts.append((chunk, (local, *(slice(a, z) for _, a, z, _ in box), *(slice(None),) * len(rest))))
        unique = tuple(dict.fromkeys(sources))
        return unique, [(unique.index(chunk), slices) for chunk, slices in parts]

    for n in range(batch_blocks):
        for spatial in np.ndindex(*map(len, shifted)):
            boxes = list(itertools.product(*(reads[i][k] for i, k in enumerate(spatial))))
            rows, crops = _shifted_block(shifted, spatial)
            for rest in np.ndindex(*x.numblocks[1 + m :]):
                made = []
                for box in boxes:
                    unique, parts = parts_of(n, box, rest)
                    made.append((unique, len(bundles.setdefault(unique, []))))
                    bundles[unique].append((crops if len(boxes) == 1 else None, parts))
                origins = [[origin for *_, origin in box] for box in boxes]
                outputs[(n, *spatial, *rest)] = (made, origins, rows, crops)
    numbers = {unique: number for number, unique in enumerate(bundles)}
    for unique, plan in bundles.items():
        key = (bundle_name, numbers[unique])
        layer[key] = (_batch_to_space_bundle, [list(source.read(b)) for b in unique], plan, list(block_shape))
    for index, (made, origins, rows, crops) in outputs.items():
        picks = [(operator.getitem, (bundle_name, numbers[unique]), position) for unique, position in made]
        if len(picks) == 1:
            layer[(name, *index)] = picks[0]
            continue
        parts = []
        for j, pick in enumerate(picks):
            layer[(part_name, *index, j)] = pick
            parts.append((part_name, *index, j))
        layer[(name, *index)] = (_batch_to_space_joined, parts, origins, rows, list(block_shape), crops)
    graph = _graph(name, layer, x, source)
    return da.Array(graph, name, chunks=out_chunks, meta=_lazy.meta(x.ndim, x.dtype))


# ---------------------------------------------------------------------------------------------
# Public functions


def space_to_batch_nd(x, block_shape, paddings):
    """Zero-pad the spatial dims and move each offset inside a block into the batch (SpaceToBatchND).

    TensorFlow's N-D form. ``x`` is ``[B, s_1, ..., s_M, rest...]``; each spatial dim is
    padded with ``paddings[i]`` zeros before and after and cut into blocks of
    ``block_shape[i]``; the in-block offsets ``j_0..j_{M-1}`` of batch entry ``b`` go to
    output batch index ``((j_0*b_1 + j_1)*b_2 + ... + j_{M-1})*B + b`` (the input batch
    index varies fastest). Padding is the dtype's zero. The full reference is
    docs/operators.md.

    Parameters
    ----------
    x : numpy.ndarray or dask.array.Array
        ``[B, s_1, ..., s_M, rest...]``, rank <= 8, any supported dtype.
    block_shape : sequence of int or array of int
        ``M`` block sizes >= 1, ``1 <= M < x.ndim``.
    paddings : sequence of (int, int) or array of int
        ``[M, 2]``: zeros ``[before, after]`` each spatial dim, >= 0, with
        ``(s_i + before_i + after_i) % block_shape[i] == 0``.

    Returns
    -------
    numpy.ndarray or dask.array.Array
        ``[B*prod(block_shape), (s_i + before_i + after_i) / block_shape[i]..., rest...]``,
        same dtype. Dask in: lazy; the padding costs no input reads.

    Raises
    ------
    ops.InvalidArgument
        Block sizes < 1 or whose product overflows int64, ``paddings`` of the wrong shape or
        negative, a padded size not divisible by its block size, floats or booleans where
        integers are required, an unsupported dtype.

    See Also
    --------
    batch_to_space_nd : the inverse.
    space_to_batch : the 4-D NHWC form with a square block.

    Examples
    --------
    >>> import numpy as np, ops
    >>> x = np.array([[1, 2, 3], [4, 5, 6]])   # B = 2 rows, one spatial dim of 3
    >>> y = ops.space_to_batch_nd(x, [2], [[1, 0]])   # pad one zero in front: [0 1 2 3], [0 4 5 6]
    >>> y   # rows: offset 0 of batch 0, of batch 1, then offset 1 of batch 0, of batch 1
    array([[0, 2],
           [0, 5],
           [1, 3],
           [4, 6]])
    """
    x, p = _validate_space_to_batch_nd(x, block_shape, paddings)
    out_shape = _batch_shape(x.shape, p.block_shape, p.paddings)
    if 0 in out_shape:  # nothing to move, however many block offsets there are
        return _lazy.empty(out_shape, x.dtype) if isinstance(x, da.Array) else np.zeros(out_shape, x.dtype)
    if isinstance(x, da.Array):
        return _build_space_to_batch_nd(x, p.block_shape, p.paddings)
    return space_to_batch_nd_kernel(x, p.block_shape, p.paddings)


def space_to_batch(x, block_size, paddings):
    """Zero-pad an NHWC image batch and move square spatial blocks into the batch (SpaceToBatch).

    The 4-D operator: with ``Hp = H + pad_top + pad_bottom`` and
    ``Wp = W + pad_left + pad_right``, both divisible by ``bs = block_size``, the result is
    ``[N*bs*bs, Hp/bs, Wp/bs, C]`` and ::

        n = n_out % N ; rem = n_out // N ; bh = rem // bs ; bw = rem % bs
        h_in = h_out*bs + bh - pad_top ; w_in = w_out*bs + bw - pad_left
        y[n_out, h_out, w_out, c] = x[n, h_in, w_in, c]  (0 outside x)

    It equals ``space_to_batch_nd(x, [bs, bs], np.reshape(paddings, (2, 2)))``. The full
    reference is docs/operators.md.

    Parameters
    ----------
    x : numpy.ndarray or dask.array.Array
        ``[N, H, W, C]``, any supported dtype.
    block_size : int
        Integer >= 1 (1 is allowed, as in the Ascend description: only the padding applies).
    paddings : array_like of int
        4 integers >= 0, ``[pad_top, pad_bottom, pad_left, pad_right]``, given as shape
        ``[2, 2]``, ``[4]`` or ``[1, 4]``.

    Returns
    -------
    numpy.ndarray or dask.array.Array
        ``[N*bs*bs, Hp/bs, Wp/bs, C]``, same dtype; lazy for Dask input.

    Raises
    ------
    ops.InvalidArgument
        ``x`` not 4-D, ``block_size`` < 1 or not an integer, ``paddings`` not 4 integers >= 0,
        ``Hp`` or ``Wp`` not divisible by ``block_size``, an unsupported dtype.

    See Also
    --------
    space_to_batch_nd : the N-D form.
    batch_to_space_nd : the inverse.

    Examples
    --------
    >>> import numpy as np, ops
    >>> x = np.arange(1, 7).reshape(1, 2, 3, 1)   # one 2 x 3 image: rows [1 2 3] and [4 5 6]
    >>> y = ops.space_to_batch(x, 2, [[0, 0], [0, 1]])   # one zero column on the right
    >>> y.shape
    (4, 1, 2, 1)
    >>> y[:, 0, :, 0]   # batch entries = offsets (0, 0), (0, 1), (1, 0), (1, 1) in each 2 x 2 block
    array([[1, 3],
           [2, 0],
           [4, 6],
           [5, 0]])
    """
    x = _validate.array("x", x)
    _validate.rank("x", x, "4 (NHWC)", x.ndim == 4)
    shape, flat = _validate.integers("paddings", paddings)
    if shape not in ((2, 2), (4,), (1, 4)):
        raise InvalidArgument(
            f"paddings must have 4 elements as shape [2, 2], [4] or [1, 4], got shape {list(shape)}"
        )
    pairs = ((flat[0], flat[1]), (flat[2], flat[3]))
    p = _validate.params(
        SpaceToBatchParams, block_size=_validate.integer("block_size", block_size), paddings=pairs
    )
    return space_to_batch_nd(x, [p.block_size] * 2, [list(pair) for pair in p.paddings])


def batch_to_space_nd(x, block_shape, crops):
    """Move batch groups back into spatial blocks, then crop (BatchToSpaceND).

    The inverse of :func:`space_to_batch_nd` (TensorFlow). With
    ``B = x.shape[0] / prod(block_shape)``::

        y[b, s_1*b_0 + j_0 - c_00, ..., s_M*b_{M-1} + j_{M-1} - c_{M-1,0}, rest...]
            = x[((j_0*b_1 + j_1)*... + j_{M-1})*B + b, s_1, ..., s_M, rest...]

    The full reference is docs/operators.md.

    Parameters
    ----------
    x : numpy.ndarray or dask.array.Array
        ``[B*prod(block_shape), s_1, ..., s_M, rest...]``, rank 2..8, any supported dtype.
    block_shape : sequence of int or array of int
        ``M`` block sizes >= 1, ``1 <= M < x.ndim``.
    crops : sequence of (int, int) or array of int
        ``[M, 2]``: elements removed ``[before, after]`` each spatial dim, >= 0, never more
        than ``x.shape[i+1] * block_shape[i]``.

    Returns
    -------
    numpy.ndarray or dask.array.Array
        ``[B, x.shape[i+1]*block_shape[i] - before_i - after_i..., rest...]``, same dtype.
        Dask in: lazy; each output block interleaves one block of every group.

    Raises
    ------
    ops.InvalidArgument
        ``x.shape[0]`` not divisible by ``prod(block_shape)``, crops larger than the dim,
        wrong shapes, negative or non-integer block sizes or crops, a rank outside 2..8.

    See Also
    --------
    space_to_batch_nd : the inverse.

    Examples
    --------
    >>> import numpy as np, ops
    >>> y = np.array([[0, 2], [0, 5], [1, 3], [4, 6]])   # space_to_batch_nd([[1, 2, 3], [4, 5, 6]], [2], [[1, 0]])
    >>> ops.batch_to_space_nd(y, [2], [[1, 0]])   # interleave the 2 groups, crop the leading 0
    array([[1, 2, 3],
           [4, 5, 6]])
    """
    x, p = _validate_batch_to_space_nd(x, block_shape, crops)
    out_shape = _space_shape(x.shape, p.block_shape, p.crops)
    if 0 in out_shape:  # nothing to move, however many block offsets there are
        return _lazy.empty(out_shape, x.dtype) if isinstance(x, da.Array) else np.zeros(out_shape, x.dtype)
    if isinstance(x, da.Array):
        return _build_batch_to_space_nd(x, p.block_shape, p.crops, out_shape)
    return batch_to_space_nd_kernel(x, p.block_shape, p.crops)
