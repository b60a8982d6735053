"""SpaceToBatchND as a Dask graph: the strategies, one function each, and the rule that picks
one (``_choose_space_to_batch``).

The input keeps its chunks (``plan.space_to_batch_nd_chunks``). A batch axis in one chunk
(one image, the common case) gives one output block per input block holding all P block
offsets; several batch chunks give P output blocks per input block (one per group, views of
one task's result). Blocks of padding only read no input; the pad value (zero too) is
written by the task that makes a block, into its padding cells alone. The strategies:

- blockwise: every output block is one whole input block; a map that Dask fuses with the
  Zarr read and write.
- from blocks: each window's task takes the input blocks under it; the few boundary rows it
  needs of a neighbour (a halo) are sliced off that block in a small task, so the neighbour
  block never travels.
- region reads: the input is read straight from an array (``da.from_zarr``, ``da.from_array``
  of a Zarr array) and each window lies in one input block: its task reads that from the
  source itself.
- owned halos: the same source with halos: each chunk is read whole by the window that takes
  most of it, which copies out its neighbours' halo rows, so that no chunk is decoded twice.
- chained halos: the same for small windows (tiny blocks, where the scheduler's cost per task
  bounds a run), where the halos on each axis come from one side and there are windows
  enough: a window's one task reads its chunks, makes its blocks with the halos its
  neighbours' tasks copied out, and copies out the rows its own neighbours take. No window's
  block waits, held, for its halos; a window's second task is a pick of the rows it keeps.

With the batch axis chunked, a window spans as many blocks of the first spatial axis as fit
in a quarter of ``array.chunk-size``, so output blocks are not 1/P of an input block (with
region reads, when no chunk is then read by two windows). The strategies with halos spread a
last window of a padding row or two over the windows before it (``plan._absorbing_tail``).
"""

from __future__ import annotations

import itertools
import math
import operator

import dask.array as da
import numpy as np
from dask._task_spec import Task, TaskRef
from dask.base import tokenize

from ops import _block_reads, _chunks, _fused_stores, _lazy
from ops._block_reads import read_then
from ops._lazy_layer import take_then
from ops.space_batch import padding
from ops.space_batch.graph import _Input, _largest_block_bytes, _lazy_array, taken_whole
from ops.space_batch.kernel import (
    _chained_blocks_of,
    _edge,
    _export,
    _group_blocks_of,
    _space_to_batch_placed,
    _space_to_batch_window,
    _with_halos,
    space_to_batch_nd_kernel,
)
from ops.space_batch.plan import (
    HaloOrder,
    _each_chunk_read_once,
    _owned_windows,
    _whole_blocks,
    halos_chain,
    space_to_batch_nd_chunks,
)


def _build_space_to_batch_nd(x: da.Array, block_shape, paddings, fill: np.ndarray) -> da.Array:
    """SpaceToBatchND of a Dask array, padded with ``fill`` (a 0-d array of x's dtype): the
    graph of the strategy ``_choose_space_to_batch`` picks."""
    build, out_chunks, reads, stored = _choose_space_to_batch(x, block_shape, paddings)
    # The pad is written by the tasks that make the blocks (no task of its own). None for a
    # zero pad: blocks of padding only are then zeros, and the windows write zeros themselves.
    pad = fill if padding.writes_pad(fill, paddings) else None
    return build(x, block_shape, paddings, out_chunks, reads, stored, pad)


def _choose_space_to_batch(x: da.Array, block_shape, paddings):
    """The strategy for SpaceToBatchND of x and the plan it builds: (builder, output chunks,
    reads, the source reads of x or None).

    Blockwise when the batch axis is one chunk and every output block is one whole input
    block; from x's blocks when x is not read straight from an array; from that array,
    region reads when each output window lies in one input block, else chained halos (small
    windows, ``plan.halos_chain``) or owned halos.
    """
    out_chunks, reads = space_to_batch_nd_chunks(x.chunks, block_shape, paddings)
    m = len(block_shape)
    if x.numblocks[0] == 1 and _whole_blocks(reads, out_chunks[1 : 1 + m], x.chunks[1 : 1 + m], block_shape):
        return _build_space_to_batch_blockwise, out_chunks, reads, None
    stored = _block_reads.BlockReads.of(x)
    if stored is None:
        # Windows of several input blocks too: P output blocks per input block would be P + 2
        # tasks per block (the window, its P picks, the block's own task). A window that
        # would hold the padding's last row or two alone is spread over the others, as with
        # owned halos below: one task fewer per batch chunk, and no tiny output block.
        out_chunks, reads = space_to_batch_nd_chunks(x.chunks, block_shape, paddings, absorb_tail=True)
        out_chunks, reads = _merged(x, block_shape, paddings, out_chunks, reads, region_reads=False, absorb_tail=True)
        return _build_space_to_batch_from_blocks, out_chunks, reads, None
    # A plain from_array/from_zarr input whose output windows each lie in one input block:
    # each task reads its block from the source itself (one task, no intermediate key). A
    # window that also needs a few boundary rows of a neighbour (a halo from the padding)
    # does not read them itself: a Zarr chunk is decoded whole, so that would decode every
    # chunk a second time for one row. The chunk's owner copies them out for it instead
    # (``_build_space_to_batch_owned_halos``).
    window_in_one_block = math.prod(max(map(len, axis)) for axis in reads) == 1
    if window_in_one_block:
        out_chunks, reads = _merged(x, block_shape, paddings, out_chunks, reads, region_reads=True)
        return _build_space_to_batch_region_reads, out_chunks, reads, stored
    # Halos are read anyway: a last output chunk of a row or two (the padding's) is spread
    # over the others, which Zarr then does not store as a chunk of its own, almost empty.
    out_chunks, reads = space_to_batch_nd_chunks(x.chunks, block_shape, paddings, absorb_tail=True)
    out_chunks, reads = _merged(x, block_shape, paddings, out_chunks, reads, region_reads=False, absorb_tail=True)
    if _small_windows(x, block_shape, out_chunks) and halos_chain(reads, x.numblocks[0], x.numblocks[1 + m :]):
        return _build_space_to_batch_chained_halos, out_chunks, reads, stored
    return _build_space_to_batch_owned_halos, out_chunks, reads, stored


def _merged(x: da.Array, block_shape, paddings, out_chunks, reads, *, region_reads: bool, absorb_tail: bool = False):
    """The plan (output chunks, reads) of windows: with the batch axis
    chunked, output blocks that span ``_merge`` input chunks on the first spatial axis (for
    region reads, when no input chunk is then read by two windows); else ``out_chunks``,
    ``reads`` as they are."""
    # With the batch axis chunked an input chunk makes P output blocks of 1/P of its size:
    # output blocks that span ``merge`` input chunks on the first spatial axis cut the
    # store tasks and their fixed costs (and the picks of a group's block) by ``merge``. The task
    # holds merge input blocks and as much output, kept within a quarter of Dask's chunk
    # size. Region reads need windows that read no chunk twice; with halos each chunk is
    # read once anyway (by its owner; the halo rows go through edge tasks).
    merge = _merge(x, math.prod(block_shape)) if x.numblocks[0] > 1 else 1
    if merge > 1:
        merged_chunks, merged_reads = space_to_batch_nd_chunks(x.chunks, block_shape, paddings, merge, absorb_tail)
        if not region_reads or _each_chunk_read_once(merged_reads):
            return merged_chunks, merged_reads
    return out_chunks, reads


def _merge(x: da.Array, groups: int) -> int:
    """Input chunks per SpaceToBatchND output block on the first spatial axis: as many as fit
    in a quarter of Dask's chunk size, at most P (an output block then has an input block's
    size)."""
    block_bytes = max(1, _largest_block_bytes(x))
    return max(1, min(groups, _chunks.target_bytes() // 4 // block_bytes))


# ---------------------------------------------------------------------------------------------
# The strategies: each takes (x, block_shape, paddings, output chunks, reads, source reads,
# pad: None for zeros, else the pad value as a 0-d array)


def _build_space_to_batch_blockwise(x: da.Array, block_shape, paddings, out_chunks, reads, stored, pad) -> da.Array:
    """Each input block is one output block: a blockwise map (Dask fuses it with the read of
    the block and the write of the result, one task per block), blocks of padding around it."""
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
                shape = tuple(map(sum, chunks))
                pad_blocks = (da.zeros(shape, dtype=y.dtype, chunks=tuple(chunks)) if pad is None
                              else da.full(shape, pad, dtype=y.dtype, chunks=tuple(chunks)))
                pieces.insert(0 if at == 0 else len(pieces), pad_blocks)
        if len(pieces) > 1:
            y = da.concatenate(pieces, axis=1 + i)
    return y


def _build_space_to_batch_from_blocks(x: da.Array, block_shape, paddings, out_chunks, reads, stored, pad) -> da.Array:
    """Each output window's task takes the input blocks under it (x's block keys); a small
    piece of a neighbouring block gets a task of its own (``_piece_args``)."""
    return _space_to_batch_windows("from_blocks", x, block_shape, paddings, out_chunks, reads, None, pad)


def _build_space_to_batch_region_reads(x: da.Array, block_shape, paddings, out_chunks, reads, stored, pad) -> da.Array:
    """Each output window's task reads its input pieces from x's source (``stored``) itself."""
    return _space_to_batch_windows("region_reads", x, block_shape, paddings, out_chunks, reads, stored, pad)


def _build_space_to_batch_owned_halos(x: da.Array, block_shape, paddings, out_chunks, reads, stored, pad) -> da.Array:
    """Each input chunk is read from x's source (``stored``) once, whole, by the window that
    reads most of its rows (its owner), which also copies out the rows its neighbours take
    (their halos); a neighbour writes them into its block in a small task after its own
    window (``plan._owned_windows``)."""
    # No window waits for another and no block key of x is held or sent: with block keys, two
    # blocks of one window can be read on two workers and one sent across; a window that
    # waits for its neighbour's reads leaves its worker idle, and the scheduler then sends
    # that worker more reads to hold.
    return _space_to_batch_windows("owned_halos", x, block_shape, paddings, out_chunks, reads, stored, pad)


def _build_space_to_batch_chained_halos(x: da.Array, block_shape, paddings, out_chunks, reads, stored, pad) -> da.Array:
    """As ``_build_space_to_batch_owned_halos``, with one task per window: it reads its chunks,
    makes its blocks with the halos its neighbours' tasks copied out, and copies out the rows
    its own neighbours take (``plan.halos_chain``). For small windows only."""
    # Owned halos make each block in two tasks, the second after the halos are ready. Here
    # the halos come first instead: a window waits for its neighbours on one side, which the
    # chain allows when no two windows wait on each other and enough windows are free at any
    # time. With tiny blocks, where the scheduler's cost per task bounds the run, no task then
    # waits holding a block, and the second task is a pick of the rows it keeps: 1.47-1.64x a
    # plain copy's chunks per second at 1e4 chunks, against 0.95x with two tasks. With large
    # ones it did not pay: through the command line at 3 GiB (32 MiB chunks, 2 x 384 MiB
    # workers) both took the same time, and the workers' peak rose by 20-30 MiB, at the
    # nanny's limit: its tasks are placed by the scheduler as they become ready, not handed
    # out as workers free up as a window's first tasks (Dask's root tasks) are, and a worker
    # can run ahead of the other and wait at the end.
    return _space_to_batch_windows("chained_halos", x, block_shape, paddings, out_chunks, reads, stored, pad)


# ---------------------------------------------------------------------------------------------
# The window strategies' common graph: built lazily (``LazyLayer``), when the graph is run


def _space_to_batch_windows(strategy: str, x: da.Array, block_shape, paddings, out_chunks, reads, stored, pad):
    """The output array of one task per output window of the plan (``out_chunks``,
    ``reads``) by ``strategy``, padded with ``pad`` (None: zeros); its tasks are made by
    ``_windows_tasks`` when the graph is materialised."""
    token = tokenize(x, block_shape, paddings, strategy, out_chunks, pad)  # the plan depends on array.chunk-size too
    name = f"space_to_batch_nd-{token}"
    args = (strategy, _Input.of(x), list(block_shape), out_chunks, reads, token, stored, paddings, pad)
    annotations = None
    if strategy == "owned_halos" and not _small_windows(x, block_shape, out_chunks):
        # Large windows wait, held, for their halos: read them in an order that keeps the
        # wait short (``HaloOrder``). Small ones are cheap to hold, and many: no annotation.
        m = len(block_shape)
        order = HaloOrder(f"space_to_batch_nd-window-{token}", reads, x.numblocks[0], x.numblocks[1 + m :])
        annotations = {"priority": order}
    return _lazy_array(name, out_chunks, x, stored, _windows_tasks, *args, annotations=annotations)


def _window_bytes(x: _Input, block_shape, out_chunks) -> int:
    """The bytes of the largest window of the plan (all P groups of a batch chunk)."""
    m = len(block_shape)
    cells = max(x.chunks[0]) * math.prod(block_shape)
    cells *= math.prod(max(axis, default=0) for axis in out_chunks[1 : 1 + m])
    cells *= math.prod(max(axis, default=0) for axis in x.chunks[1 + m :])
    return cells * x.dtype.itemsize


def _small_windows(x: _Input, block_shape, out_chunks) -> bool:
    """Whether the plan's windows are small enough for a task to take one's result whole
    (``graph.taken_whole``): then the scheduler's cost per task, not the bytes, bounds a run."""
    return taken_whole(_window_bytes(x, block_shape, out_chunks))


def _window_maker(strategy: str, x: _Input, block_shape, out_chunks, reads, token, stored):
    """The function ``window(layer, key, axis_reads, shape, fill)`` of ``strategy`` that
    returns the ``(function, arguments)`` of the all-groups block of the window at ``key`` =
    ``(n, *spatial, *rest)``, after putting in ``layer`` any task they take.

    The arguments are flat: the keys a window takes are ``TaskRef`` arguments of its own
    (each once), and what it does with them is plain data (slices, offsets, regions to read),
    not a nested task per block read or halo, which a distributed scheduler would hold as an
    object each for the whole run.
    """
    m = len(block_shape)
    edge_name, window_name, exports_name, all_name = (
        f"space_to_batch_nd{part}-{token}" for part in ("-edge", "-window", "-exports", "-all")
    )

    def from_blocks(layer, key, axis_reads, shape, fill):
        n, rest = key[0], key[1 + m :]
        arrays, parts, offsets = {}, [], []
        for p, combo in enumerate(itertools.product(*axis_reads)):
            block = (n, *(k for k, *_ in combo), *rest)
            array, index = _piece(x, (x.name, *block), combo, layer, (edge_name, *key, p))
            parts.append((arrays.setdefault(array, len(arrays)), index))
            offsets.append([o for *_, o in combo])
        return take_then, (_space_to_batch_placed, parts, (offsets, block_shape, shape, x.dtype, fill),
                           *map(TaskRef, arrays))

    def region_reads(layer, key, axis_reads, shape, fill):
        n, rest = key[0], key[1 + m :]
        combos = list(itertools.product(*axis_reads))
        blocks = [(n, *(k for k, *_ in combo), *rest) for combo in combos]
        locals_ = [(slice(None), *(slice(a, z) for _, a, z, _ in combo), *(slice(None),) * len(rest))
                   for combo in combos]
        offsets = [[o for *_, o in combo] for combo in combos]
        return read_then, (_space_to_batch_placed, stored.ref(), stored.regions(blocks, locals_),
                           (offsets, block_shape, shape, x.dtype, fill))

    halo_plans = ("owned_halos", "chained_halos")
    windows = _owned_windows(reads, x.numblocks[0], x.numblocks[1 + m :]) if strategy in halo_plans else None
    # Small windows: the neighbour cuts its halo out of the owner's whole result itself, so
    # there is no edge task per halo; tiny blocks are bound by task counts.
    inline_halos = strategy == "owned_halos" and _small_windows(x, block_shape, out_chunks)

    def owned_halos(layer, key, axis_reads, shape, fill):
        n, rest = key[0], key[1 + m :]
        own_chunks, pieces, exports, halos = windows[key]
        window_key = (window_name, *key)
        regions = stored.regions([(n, *ks, *rest) for ks in own_chunks])
        layer[window_key] = Task(window_key, read_then, _space_to_batch_window, stored.ref(), regions,
                                 (pieces, exports, block_shape, shape, x.dtype, fill))
        if not inline_halos:
            for e in range(len(exports)):
                layer[(edge_name, *key, e)] = Task((edge_name, *key, e), _export, TaskRef(window_key), e)
        sources, spec = {}, []
        for owner, e, offsets in halos:
            source = (window_name, *owner) if inline_halos else (edge_name, *owner, e)
            spec.append((sources.setdefault(source, len(sources)), e if inline_halos else None, offsets))
        return _with_halos, (TaskRef(window_key), spec, block_shape, *map(TaskRef, sources))

    def chained_halos(layer, key, axis_reads, shape, fill):
        n, rest = key[0], key[1 + m :]
        own_chunks, pieces, exports, halos = windows[key]
        regions = stored.regions([(n, *ks, *rest) for ks in own_chunks])
        sources, spec = {}, []
        for owner, e, offsets in halos:
            spec.append((sources.setdefault((exports_name, *owner), len(sources)), e, offsets))
        split = x.numblocks[0] > 1  # one task per batch chunk makes its P groups' blocks
        if exports:  # what its neighbours take: the pick after its blocks
            exports_key = (exports_name, *key)
            layer[exports_key] = Task(exports_key, operator.getitem, TaskRef((all_name, *key)),
                                      math.prod(block_shape) if split else 1)
        return _space_to_batch_chained, (stored.ref(), regions, (pieces, exports, spec, block_shape, shape, x.dtype,
                                                                 fill, split), *map(TaskRef, sources))

    return {"from_blocks": from_blocks, "region_reads": region_reads, "owned_halos": owned_halos,
            "chained_halos": chained_halos}[strategy]


def _windows_tasks(strategy: str, x: _Input, block_shape, out_chunks, reads, token, stored, paddings, pad) -> dict:
    """The tasks of one task per output window of the plan (``out_chunks``, ``reads``):
    padding blocks for a window of padding only; for a window with reads, the task of
    ``_window_maker(strategy, ...)``'s function and arguments (with several batch chunks, a
    task making the P blocks of a batch chunk at once), which write the pad (zeros too) into
    their padding cells."""
    m = len(block_shape)
    groups = math.prod(block_shape)
    window = _window_maker(strategy, x, block_shape, out_chunks, reads, token, stored)
    name, all_name = (f"space_to_batch_nd{part}-{token}" for part in ("", "-all"))
    # One batch chunk: each output block holds all P offsets (output batch index g*B + n).
    # Several: one task per input batch chunk computes all P groups in one pass, and output
    # block (g, k) is group g's rows of it (a view, no copy).
    single = x.numblocks[0] == 1
    dtype = x.dtype
    in_shape = tuple(map(sum, x.chunks))
    batch = in_shape[0]
    starts = [np.cumsum((0, *axis[:-1])).tolist() for axis in (x.chunks[0], *out_chunks[1 : 1 + m])]
    zero = padding.pad_fill(0, dtype)
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
                if not all(axis_reads):  # padding only: no input read
                    pad_shape = (rows * groups if single else rows, *spatial_shape, *rest_shape)
                    for key in out_keys:
                        layer[key] = (Task(key, np.zeros, pad_shape, dtype) if pad is None
                                      else Task(key, padding.padding_block, pad_shape, pad))
                    continue
                covered = all(
                    sum(stop - start for _, start, stop, _ in r) == size * b
                    for r, size, b in zip(axis_reads, spatial_shape, block_shape)
                )
                fill = None
                if not covered:
                    # The pad (zeros too) is written into the padding cells alone: zeroing the
                    # whole block first would be one more pass over it. The window's rows: all
                    # P*B output rows (one batch chunk), else each group's rows of this batch
                    # chunk, group by group.
                    at = tuple(starts[1 + i][k] for i, k in enumerate(spatial))
                    firsts = [0] if single else [g * batch + starts[0][n] for g in range(groups)]
                    fill = padding.cells_at(zero if pad is None else pad, in_shape, block_shape, paddings,
                                            [(f, *at) for f in firsts])
                shape = (rows * groups, *spatial_shape, *rest_shape)
                function, args = window(layer, (n, *spatial, *rest), axis_reads, shape, fill)
                if strategy == "chained_halos":
                    # Its blocks, then the rows its neighbours take: picks of one task's result,
                    # which in a store graph writes the blocks itself and keeps the rows alone.
                    chain_key = (all_name, n, *spatial, *rest)
                    layer[chain_key] = Task(chain_key, function, *args)
                    for g, key in enumerate(out_keys):
                        layer[key] = Task(key, operator.getitem, TaskRef(chain_key), g)
                    continue
                if single:
                    layer[out_keys[0]] = Task(out_keys[0], function, *args)
                    continue
                # The P blocks as one multi-output task: in a store graph it writes them itself.
                all_key = (all_name, n, *spatial, *rest)
                layer[all_key] = Task(all_key, _space_to_batch_groups, function, block_shape, *args)
                for g, key in enumerate(out_keys):
                    layer[key] = Task(key, operator.getitem, TaskRef(all_key), g)
    return layer


def _piece(x: _Input, key, combo, layer, edge_key):
    """(the key of the array, index into it) that one piece of a window is taken from: a whole
    block of x, or a large part of one, is its block; a small part of a neighbouring block (a
    halo) gets a task of its own (``_edge``) so that the whole neighbour never travels."""
    index = (slice(None), *(slice(start, stop) for _, start, stop, _ in combo))
    lengths = [x.chunks[1 + i][k] for i, (k, *_) in enumerate(combo)]
    taken = [stop - start for _, start, stop, _ in combo]
    if taken == lengths:
        return key, None
    if any(2 * n < length for n, length in zip(taken, lengths)):
        layer[edge_key] = Task(edge_key, _edge, TaskRef(key), index)
        return edge_key, None
    return key, index


@_fused_stores.streams(_chained_blocks_of, small_extras=True)
def _space_to_batch_chained(source, regions, plan, *neighbours):
    """A window's output blocks, then the rows it copied out for its neighbours, as a tuple
    (``_chained_blocks_of``). In a store graph (``ops.fusing_stores``) the task writes the
    blocks itself and keeps the rows alone; the window is small, so those rows are small
    enough for the task that waits on its stores to take its result whole."""
    return tuple(_chained_blocks_of(source, regions, plan, *neighbours))


@_fused_stores.streams(_group_blocks_of)
def _space_to_batch_groups(make, block_shape, *args):
    """The output blocks, one per group, of the all-groups block ``make(*args)`` of one batch
    chunk, as a tuple. In a store graph (``ops.fusing_stores``) the task writes each block
    itself instead."""
    return tuple(_group_blocks_of(make, block_shape, *args))
