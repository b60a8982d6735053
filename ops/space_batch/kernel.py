"""SpaceToBatchND and BatchToSpaceND in NumPy: the whole-array kernels and the per-block
functions the Dask tasks call. Pure NumPy, no Dask.

A space array ``[B, s_1..s_M, rest...]`` and a batch array ``[P*B, t_1..t_M, rest...]``
(``P = prod(block_shape)``) pair space row ``r`` with batch-side row ``t`` of block offset
``j`` when ``r + offset = t*b + j`` on every spatial axis, ``offset`` being the leading
padding (SpaceToBatch) or crop (BatchToSpace). ``_pairs`` gives that pairing as equal-shape
views of both arrays, so each kernel is a few ``copy_into`` calls: no padded copy of the
input is made (the whole-array kernel's batch side starts as zeros; a Dask task writes its
block's padding cells alone) and cropped rows are never read.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ops._copy import copy_into
from ops.space_batch.padding import PadCells, set_padding

# ---------------------------------------------------------------------------------------------
# The pairing of space and batch rows, and the kernels


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
    """The shape SpaceToBatchND makes of an array of ``shape``."""
    m = len(block_shape)
    spatial = [
        (shape[1 + i] + paddings[i][0] + paddings[i][1]) // block_shape[i] for i in range(m)
    ]
    return (shape[0] * math.prod(block_shape), *spatial, *shape[1 + m :])


def _space_shape(shape, block_shape, crops) -> tuple[int, ...]:
    """The shape BatchToSpaceND makes of an array of ``shape``."""
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


def place_batch_part(y: np.ndarray, part: np.ndarray, offsets, j, block_shape, crops_before) -> None:
    """Copy ``part`` of one group's batch rows into the BatchToSpaceND output ``y``.

    ``part`` holds the group's rows from ``offsets`` on (on every axis) of the rows ``y``
    takes of that group (``j``: the group's block offset on each spatial axis;
    ``crops_before``: ``y``'s crop before its first row on each). Rows that the crops drop
    are not copied; the part may lie in them entirely.
    """
    y_index = [slice(offsets[0], offsets[0] + part.shape[0])]
    part_index = [slice(None)]
    for axis, (b, crop, jj) in enumerate(zip(block_shape, crops_before, j), start=1):
        _, rows = _lattice(y.shape[axis], crop, b, jj)  # the group rows that y takes
        start = max(rows.start, offsets[axis])
        stop = min(rows.stop, offsets[axis] + part.shape[axis])
        if start >= stop:
            return
        first = start * b + jj - crop
        y_index.append(slice(first, first + (stop - start - 1) * b + 1, b))
        part_index.append(slice(start - offsets[axis], stop - offsets[axis]))
    y_index += [slice(o, o + n) for o, n in zip(offsets[1 + len(block_shape) :], part.shape[1 + len(block_shape) :])]
    copy_into(y[tuple(y_index)], part[tuple(part_index)])


# ---------------------------------------------------------------------------------------------
# SpaceToBatchND: what one task computes


def _space_to_batch_pieces(pieces, block_shape, shape, dtype, fill: PadCells | None):
    """One output block of SpaceToBatchND from its input pieces (its own block and halos).

    Each piece is ``[array, index, offsets]``: ``array[index]`` (the whole array for None)
    lands at padded rows ``offsets`` of this block; the rows no piece covers are padding:
    ``fill`` is None when there are none (the pieces cover the block), else the pad (zeros
    too) in ``PadCells``, written into those cells alone.
    """
    y = np.empty(shape, dtype)
    _fill(y, pieces, block_shape)
    # After the pieces: the pages are then in memory already, where writing the padding
    # first (a few cells of every row) would fault them in one by one.
    if fill is not None:
        set_padding(y, fill)
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


def _space_to_batch_placed(arrays, offsets, block_shape, shape, dtype, fill: PadCells | None):
    """One output block of SpaceToBatchND from its input pieces ``arrays`` (its own block or
    part of it, and halos), ``arrays[k]`` landing at padded rows ``offsets[k]`` of the block: a
    task's function through ``_block_reads.read_then`` or ``_lazy_layer.take_then``."""
    pieces = [[array, None, at] for array, at in zip(arrays, offsets)]
    return _space_to_batch_pieces(pieces, block_shape, shape, dtype, fill)


def _space_to_batch_window(chunks, pieces, exports, block_shape, shape, dtype, fill: PadCells | None):
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


def _with_halos(window, halos, block_shape, *sources):
    """A window's output block with the rows its neighbours' chunks give it written in (in
    place: only this task uses the block). ``halos`` are ``(source number, e, offsets)``: the
    rows are the ``e``-th a neighbour's window in ``sources`` copied out (``_export``), or with
    ``e`` None that source itself (an edge task's rows)."""
    y = window[0]
    _fill(y, [[_copied_out(sources, n, e), None, offsets] for n, e, offsets in halos], block_shape)
    return y


def _chained_blocks_of(source, regions, plan, *neighbours):
    """The output blocks of a window that takes its halos from its neighbours' finished
    tasks, one at a time, and then the rows it copied out for its own neighbours (a list).

    ``regions`` are its chunks' regions of ``source`` (``_block_reads.Regions``, read whole);
    ``plan`` is (its pieces and its exports, as ``_space_to_batch_window`` takes them; its
    halos, as ``(n, e, offsets)``: the ``e``-th rows ``neighbours[n]`` copied out; block_shape,
    shape, dtype, fill; ``split``: whether the block is cut into its P groups' blocks).
    """
    pieces, exports, halos, block_shape, shape, dtype, fill, split = plan
    y, copied = _space_to_batch_window(regions.read_all(source), pieces, exports, block_shape, shape, dtype, fill)
    _fill(y, [[neighbours[n][e], None, offsets] for n, e, offsets in halos], block_shape)
    yield from (_groups(y, block_shape) if split else (y,))
    yield copied


def _copied_out(sources, n: int, e):
    """The rows a neighbour copied out for a task: the ``e``-th export of the window or reader
    ``sources[n]``, or with ``e`` None ``sources[n]`` itself (an export task's result)."""
    return sources[n] if e is None else _export(sources[n], e)


def _groups(block, block_shape) -> tuple:
    """The P output blocks of an input batch chunk's all-groups block: views of its rows, group
    by group (output batch index g*B + n), no copy."""
    groups = math.prod(block_shape)
    rows = block.shape[0] // groups
    return tuple(block[g * rows : (g + 1) * rows] for g in range(groups))


def _group_blocks_of(make, block_shape, *args):
    """The output blocks, one per group, of the all-groups block ``make(*args)`` of one batch
    chunk, one at a time."""
    yield from _groups(make(*args), block_shape)


# ---------------------------------------------------------------------------------------------
# BatchToSpaceND: what one task computes


def _batch_to_space_block(blocks, block_shape, crops):
    """One output block from the same block of each of the P groups."""
    return batch_to_space_nd_kernel(list(blocks), block_shape, crops)


def _batch_to_space_one(blocks, block_shape, crops):
    """One output block from one input block holding all P groups of its rows (``blocks``: it alone)."""
    (block,) = blocks
    return batch_to_space_nd_kernel(block, block_shape, crops)


def _batch_to_space_local(block, block_shape, local_crops, block_id=None):
    """One output block of a blockwise map: the input block (all P groups of its rows),
    cropped as its place in the grid (``block_id``) says (``local_crops``: per axis, per block)."""
    crops = [axis_crops[block_id[1 + i]] for i, axis_crops in enumerate(local_crops)]
    return batch_to_space_nd_kernel(block, block_shape, crops)


def _batch_to_space_bundle_blocks(source, reads, outputs, block_shape, per_pass=None):
    """The output blocks fed by one bundle of source chunks, one at a time.

    ``reads`` are the chunks' regions of ``source`` (``_block_reads.Regions``, one chunk
    each); ``outputs`` are ``(crops, parts)`` with one ``(chunk position in reads, slices)``
    part per group. An output
    with crops None is its parts themselves, as a list (the rows of a block that also takes
    rows of other bundles' chunks: ``_batch_to_space_joined``). ``per_pass``: how many whole
    output blocks are made from one read of the chunks (None: all of them); the chunks are
    read again for the next ones.
    """
    for first, stop in _bundle_passes(outputs, per_pass):
        yield from _bundle_pass(source, reads, outputs[first:stop], block_shape)


def _bundle_passes(outputs, per_pass):
    """(first, stop) of each run of ``outputs`` made from one read of the chunks: at most
    ``per_pass`` whole blocks each; the parts of joined blocks (crops None, a few rows) join
    the run they fall in. Runs are contiguous, so the blocks come out in ``outputs``' order."""
    if per_pass is None:
        return [(0, len(outputs))]
    runs, first, whole = [], 0, 0
    for position, (crops, _) in enumerate(outputs):
        if crops is None:
            continue
        if whole == per_pass:
            runs.append((first, position))
            first, whole = position, 0
        whole += 1
    runs.append((first, len(outputs)))
    return runs


def _bundle_pass(source, reads, outputs, block_shape):
    """The blocks of ``outputs`` (as ``_batch_to_space_bundle_blocks``'), from one read of the
    chunks they take."""
    # Every chunk feeds every output block, so all their chunks' worth is held at once. Each
    # chunk, once read, is cut into the parts the output blocks take (copies) and dropped;
    # then each output block is made from its parts and they are dropped. At most that worth
    # plus one read's buffers, or plus one output block, are held. (Scattering each chunk
    # straight into the output blocks would touch every 2 MiB page of them with the first
    # group, every other row being that group's, so all outputs would be held beside all
    # chunks; with 4 KiB pages instead, the page faults cost more than these copies.)
    parts_of = [[None] * len(parts) for _, parts in outputs]
    taken = sorted({k for _, parts in outputs for k, _ in parts})
    for position in taken:
        chunk = reads.read(source, position)
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


def _batch_to_space_joined(parts, origins, rows, block_shape, crops, *sources):
    """An output block whose rows run across input chunks, from the parts of it the bundles of
    those chunks made (one part per group each; ``origins``: ``_batch_to_space_boxes``).
    ``parts`` are ``(source number, position)``: the part is the ``position``-th block of
    that bundle's result in ``sources``, or with ``position`` None that source itself."""
    pieces = [sources[n] if position is None else sources[n][position] for n, position in parts]
    return _batch_to_space_boxes(list(zip(pieces, origins)), rows, block_shape, crops)


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


def _batch_to_space_gathered(reader, imports, rows, block_shape, crops, *sources):
    """A block from its own boxes (``reader``'s) and the boxes other readers copied for it
    (``imports``: ``(source number, e, origin)``: the ``e``-th box that reader in ``sources``
    copied out (``_export``), or with ``e`` None that source itself, an export task's box)."""
    boxes = [(_copied_out(sources, n, e), origin) for n, e, origin in imports]
    return _batch_to_space_boxes([*reader[0], *boxes], rows, block_shape, crops)
