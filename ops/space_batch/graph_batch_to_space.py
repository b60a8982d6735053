"""BatchToSpaceND as a Dask graph: the plan every strategy builds from
(``_BatchToSpacePlan``), the strategies, one function each, and the rule that picks one
(``_choose_batch_to_space``).

A batch axis in one chunk stays so, and each input block (all P groups of its rows) is one
output block, in one pass. Otherwise each output block interleaves the same block of each of
the P groups (``plan.batch_to_space_nd_chunks``). Crops only trim edge blocks; input blocks
that are cropped away entirely are not read. A crop before the first row of a chunked axis
would make the first block short (not a Zarr chunk): the output blocks are then counted from
the first kept row on every spatial axis (``plan._shifted_rows``), and a block takes the few
rows it needs of the next chunks from the task that reads them.

Inputs read straight from an array (``da.from_zarr``, ``da.from_array`` of a Zarr array) are
read by the tasks themselves (``_block_reads``) instead of through the input's block tasks.
A task reads the P chunks that feed P output blocks and makes those (a bundle, while P
chunks' worth and a read's and a write's buffers fit in ``array.chunk-size``; while only k of
2..P-1 do, it reads its chunks ceil(P/k) times, making k blocks each time); otherwise each output
block reads its 1/P of one chunk of each group (P decodes or downloads of a chunk, nothing
held).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
import uuid

import dask.array as da
import numpy as np
from dask._task_spec import Task, TaskRef
from dask.base import tokenize

from ops import _block_reads, _chunks, _fused_stores, _lazy, _lazy_layer, _scratch
from ops.space_batch.graph import _Input, _largest_block_bytes, _lazy_array, taken_whole
from ops.space_batch.kernel import (
    _batch_to_space_block,
    _batch_to_space_bundle_blocks,
    _batch_to_space_gathered,
    _batch_to_space_joined,
    _batch_to_space_local,
    _batch_to_space_one,
    _batch_to_space_reader,
    _export,
)
from ops.space_batch.plan import (
    _local_crops,
    _owned_windows,
    _shifted_block,
    _shifted_chunks,
    _shifted_reads,
    _shifted_rows,
    batch_to_space_nd_chunks,
)
from ops.space_batch.graph_batch_to_space_scratch import scratch_tasks


def _build_batch_to_space_nd(x: da.Array, block_shape, crops, out_shape) -> da.Array:
    """BatchToSpaceND of a Dask array: the graph of the strategy ``_choose_batch_to_space`` picks."""
    plan = _BatchToSpacePlan.of(x, block_shape, crops, out_shape)
    strategy = _choose_batch_to_space(plan)
    if strategy is _build_batch_to_space_blockwise:
        return strategy(plan)
    if strategy is _batch_to_space_scratch_tasks:
        # Files of their own for this graph: two graphs of the same call never share them.
        prefix = f"batch_to_space_nd-{plan.token[:16]}-{uuid.uuid4().hex[:12]}"
        plan = dataclasses.replace(plan, token=tokenize(plan.token, plan.scratch.url, prefix), scratch_prefix=prefix)
    # The other strategies' tasks are made when the graph is materialised (``LazyLayer``),
    # from the plan with the input as its name, chunks and dtype (not the array and its graph).
    shifted = strategy in (_batch_to_space_single_shifted_tasks, _batch_to_space_shifted_tasks) or (
        strategy is _batch_to_space_scratch_tasks and plan.shifted is not None)
    chunks = plan.shifted_chunks if shifted else plan.out_chunks
    lite = dataclasses.replace(plan, x=_Input.of(plan.x))
    return _lazy_array(plan.name, chunks, plan.x, plan.source, strategy, lite)


@dataclasses.dataclass(frozen=True, eq=False)
class _BatchToSpacePlan:
    """What every BatchToSpaceND strategy builds from."""

    x: da.Array | _Input  #: the input: rechunked or split to ``in_chunks``, unless ``pieces`` map them to x's
    block_shape: tuple
    source: _block_reads.BlockReads | None  #: x's source, when the tasks read it themselves
    pieces: list | None  #: per axis, each chunk of in_chunks as (x's or its source's chunk, local slice)
    in_chunks: tuple  #: ``batch_to_space_nd_chunks``' plan: input chunks, kept chunks, output chunks
    kept: tuple
    out_chunks: tuple
    local_crops: list  #: per spatial axis, the crops of each kept input chunk
    token: str
    shifted: list | None  #: ``_shifted_rows`` of each spatial axis, if the output is counted from the first kept row
    shifted_chunks: tuple | None  #: the output chunks of ``shifted``
    #: how many output blocks a bundle makes from one read of its P chunks (``_bundle_blocks``)
    bundle_blocks: int
    crops: tuple  #: the call's, per spatial axis (before, after)
    scratch: _scratch.Scratch | None  #: the scratch store set for the call (``ops.scratch``)
    scratch_prefix: str | None = None  #: the names of this graph's files in ``scratch``

    @classmethod
    def of(cls, x: da.Array, block_shape, crops, out_shape) -> _BatchToSpacePlan:
        in_chunks, kept, out_chunks = batch_to_space_nd_chunks(x.chunks, block_shape, crops)
        # The plan's blocks read from the source inside the task that needs them, when x is a
        # plain from_array/from_zarr and the plan only splits its chunks: no rechunk tasks, no
        # input block held for its P readers (nor sent to another worker).
        # From an object store too: a split block is then downloaded P times, but the rechunk
        # plan holds P pieces of every block in worker memory, which with s3fs's buffers on top
        # is more than small (384 MiB) workers survive.
        # Otherwise, when the plan only splits x's blocks and the P blocks an output block
        # takes fit in half of Dask's chunk size, its task slices them itself (a split would
        # be P tasks per block more); else x is split (lazily) or rechunked to the plan's chunks.
        source = _block_reads.BlockReads.of(x)
        pieces = _block_reads.refined(x.chunks, in_chunks)
        if source is None:
            sliced = (pieces is not None and in_chunks != x.chunks
                      and math.prod(block_shape) * _largest_block_bytes(x) <= _chunks.target_bytes() // 2)
            if in_chunks != x.chunks and not sliced:
                x = x.rechunk(in_chunks) if pieces is None else _lazy_layer.split(x, in_chunks, pieces)
            if not sliced:
                pieces = None
        elif pieces is None:
            source = None
            if in_chunks != x.chunks:
                x = x.rechunk(in_chunks)
        m = len(block_shape)
        local_crops = [
            _local_crops(in_chunks[1 + i], kept[i], b, lo, out_shape[1 + i])
            for i, (b, (lo, _)) in enumerate(zip(block_shape, crops))
        ]
        token = tokenize(x, block_shape, crops)
        # A crop before the first row makes the first block short, and a Zarr store needs
        # regular chunks: to_zarr would rechunk the whole output. Blocks counted from the first
        # kept row on every spatial axis instead, when each runs into at most the next chunk.
        shifted = shifted_chunks = None
        if all(out_shape[1 : 1 + m]) and not all(map(_chunks.zarr_regular, out_chunks[1 : 1 + m])):
            shifted = [_shifted_rows(x.chunks[1 + i], b, lo, out_shape[1 + i], max(out_chunks[1 + i]))
                       for i, (b, (lo, _)) in enumerate(zip(block_shape, crops))]
            shifted = None if None in shifted else shifted
        if shifted is not None:
            shifted_chunks = (out_chunks[0], *(_shifted_chunks(rows, b) for rows, b in zip(shifted, block_shape)),
                              *out_chunks[1 + m :])
        # Decided here, with the configuration of the call: the tasks are made later.
        bundle_blocks = _bundle_blocks(math.prod(block_shape), _largest_block_bytes(x))
        return cls(x, block_shape, source, pieces, in_chunks, kept, out_chunks, local_crops, token, shifted,
                   shifted_chunks, bundle_blocks, tuple(map(tuple, crops)), _scratch.configured())

    @property
    def name(self) -> str:
        return f"batch_to_space_nd-{self.token}"

    @property
    def groups(self) -> int:
        return math.prod(self.block_shape)

    @property
    def single(self) -> bool:
        """Whether the batch axis is one chunk: each input block holds all P groups of its rows."""
        return len(self.in_chunks[0]) == 1

    @property
    def unsplit(self) -> bool:
        """Whether the plan's input blocks are x's own."""
        return self.in_chunks == self.x.chunks

    @property
    def keeps_every_block(self) -> bool:
        """Whether the crops leave some of every input block on every spatial axis."""
        m = len(self.block_shape)
        return all(k == (0, n) for k, n in zip(self.kept, self.x.numblocks[1 : 1 + m]))

    def task(self, key, function, indices, *args):
        """The task ``function(blocks, *args)`` of the plan's input blocks at ``indices``, taken
        as flat arguments: read from x's source (its ``Regions``), or x's blocks as
        ``TaskRef`` arguments, each sliced in the task when the plan splits x's blocks without a
        split of its own."""
        if self.pieces is None:
            return Task(key, _lazy_layer.take_then, function, [(n, None) for n in range(len(indices))], args,
                        *(TaskRef((self.x.name, *index)) for index in indices))
        olds = [tuple(self.pieces[a][i][0] for a, i in enumerate(index)) for index in indices]
        locals_ = [tuple(self.pieces[a][i][1] for a, i in enumerate(index)) for index in indices]
        if self.source is not None:
            return Task(key, _block_reads.read_then, function, self.source.ref(), self.source.regions(olds, locals_),
                        args)
        refs = {}
        parts = [(refs.setdefault(old, len(refs)), local) for old, local in zip(olds, locals_)]
        return Task(key, _lazy_layer.take_then, function, parts, args, *(TaskRef((self.x.name, *o)) for o in refs))


#: Chunks' worth a bundle holds beside the parts of its output blocks, at its peak: a Zarr
#: read of a chunk holds about three (the compressed bytes, the decoded chunk, the copy it
#: returns) and the write of a block about one more.
_BUNDLE_OVERHEAD_CHUNKS = 4


def _bundle_blocks(groups: int, chunk_bytes: int) -> int:
    """How many of its P output blocks a bundle of P chunks of ``chunk_bytes`` makes from one
    read of them: as many as fit in Dask's chunk size, each block's parts a chunk's worth, with
    a read's and a write's buffers beside them; at most P (0: not even one). With P = 1, one:
    its one chunk is what a task per block would read anyway."""
    if groups == 1:
        return 1
    fits = _chunks.target_bytes() // max(1, chunk_bytes) - _BUNDLE_OVERHEAD_CHUNKS
    return max(0, min(groups, fits))


def _choose_batch_to_space(plan: _BatchToSpacePlan):
    """The strategy for BatchToSpaceND of ``plan``.

    With the batch axis in one chunk: shifted blocks when the output is counted from the
    first kept row, else a blockwise map when every input block is kept, else a task per
    block. With it chunked: bundles when x's source is read and a bundle makes at least two
    of its output blocks (P, if fewer) from one read of its chunks (``_bundle_blocks``)
    (shifted bundles when the output is counted from the first kept row); else, when x's
    source is read and a scratch store is set, each chunk read once and its parts exchanged
    through the store; else a task per block reading one block of each group.
    """
    if plan.single and plan.unsplit and plan.shifted is not None:
        return _batch_to_space_single_shifted_tasks
    if plan.single and plan.unsplit and plan.keeps_every_block:
        return _build_batch_to_space_blockwise
    if plan.single:
        return _batch_to_space_single_tasks
    # Each output block reads a part of P source chunks (one per group), and each of those
    # chunks feeds P output blocks. Reading the parts separately decodes every chunk P times;
    # one task per set of P chunks reads each once and makes its P output blocks, holding
    # P chunks' worth of parts. Where only k of them fit (2 <= k < P), the task reads its
    # chunks ceil(P/k) times, making k blocks from each read. Dask's chunk size is the measure:
    # with the default (128 MiB), four 16 MiB chunks make a bundle (a 384 MiB worker peaked
    # at 266 MiB), and 32 MiB chunks none: two blocks per read peaked at 339 MiB on larger
    # workers and got 384 MiB workers killed (the nanny's line: 365 MiB).
    # A worker holds up to two bundles when the scheduler queues a second root task on it
    # (``distributed.scheduler.worker-saturation`` above 1.0; with 1.0, one: deploy/README.md).
    bundled = plan.source is not None and plan.bundle_blocks >= min(2, plan.groups)
    if bundled and plan.shifted is not None:
        return _batch_to_space_shifted_tasks
    if bundled:
        return _batch_to_space_bundles_tasks
    # Reading each chunk P times costs P decodes (or downloads) of it; a scratch store costs
    # one, and a write and a read of its bytes, uncompressed (through_scratch.py).
    if plan.source is not None and plan.scratch is not None and all(n for n in plan.x.shape[1:]):
        return _batch_to_space_scratch_tasks
    return _batch_to_space_groups_tasks


# ---------------------------------------------------------------------------------------------
# The strategies: each takes the plan; all but the blockwise map return their tasks, which
# ``_build_batch_to_space_nd`` has made only when the graph is materialised


def _build_batch_to_space_blockwise(plan: _BatchToSpacePlan) -> da.Array:
    """Each input block is one output block: a blockwise map, which Dask fuses with the read
    of the block and the write of the result."""
    x = plan.x
    return x.map_blocks(
        _batch_to_space_local, list(plan.block_shape), plan.local_crops,
        chunks=plan.out_chunks, dtype=x.dtype, meta=_lazy.meta(x.ndim, x.dtype), name=plan.name,
    )


def _batch_to_space_single_tasks(plan: _BatchToSpacePlan) -> dict:
    """A task per kept input block, each holding all P groups of its rows: one pass, as the
    NumPy kernel does, cropped as the block's place says."""
    m = len(plan.block_shape)
    layer = {}
    for index, spatial, block_crops in _output_blocks(plan):
        key = (plan.name, *index)
        layer[key] = plan.task(key, _batch_to_space_one, [(0, *spatial, *index[1 + m :])], list(plan.block_shape),
                               block_crops)
    return layer


def _batch_to_space_groups_tasks(plan: _BatchToSpacePlan) -> dict:
    """A task per output block, taking the same block of each of the P groups."""
    layer = {}
    for index, spatial, block_crops in _output_blocks(plan):
        key = (plan.name, *index)
        layer[key] = plan.task(key, _batch_to_space_block, _group_blocks(plan, index, spatial),
                               list(plan.block_shape), block_crops)
    return layer


def _batch_to_space_bundles_tasks(plan: _BatchToSpacePlan) -> dict:
    """A task per set of P source chunks (a bundle) reads each once and makes the output
    blocks they feed; an output block is its bundle's result at its position."""
    bundle_name = f"batch_to_space_nd-bundle-{plan.token}"
    per_pass = _per_pass(plan)
    bundles: dict[tuple, list] = {}  # source chunks -> (output index, crops, parts) of each output block
    for index, spatial, block_crops in _output_blocks(plan):
        in_blocks = _group_blocks(plan, index, spatial)
        sources = [tuple(plan.pieces[a][i][0] for a, i in enumerate(b)) for b in in_blocks]
        unique = tuple(dict.fromkeys(sources))
        parts = [(unique.index(src), tuple(plan.pieces[a][i][1] for a, i in enumerate(b)))
                 for src, b in zip(sources, in_blocks)]
        bundles.setdefault(unique, []).append((index, block_crops, parts))
    layer = {}
    for number, (unique, outputs) in enumerate(bundles.items()):
        key = (bundle_name, number)
        # The reads as data (``Regions``), made by the bundle one at a time.
        bundle = [(crops, parts) for _, crops, parts in outputs]
        layer[key] = Task(key, _batch_to_space_bundle, plan.source.ref(), plan.source.regions(unique), bundle,
                          list(plan.block_shape), per_pass)
        for position, (index, _, _) in enumerate(outputs):
            layer[(plan.name, *index)] = Task((plan.name, *index), operator.getitem, TaskRef(key), position)
    return layer


def _batch_to_space_scratch_tasks(plan: _BatchToSpacePlan) -> dict:
    """A task per input chunk reads it once and writes the part of it each output block takes
    to a file of its own in the scratch store; a task per output block reads its parts back
    and removes them (``graph_batch_to_space_scratch``). With a crop before the first row,
    the output blocks are counted from the first kept row (Zarr chunks as they are)."""
    chunks = plan.out_chunks if plan.shifted is None else plan.shifted_chunks
    return scratch_tasks(plan, chunks, plan.crops)


def _batch_to_space_single_shifted_tasks(plan: _BatchToSpacePlan) -> dict:
    """BatchToSpaceND with the batch axis in one chunk, its output blocks counted on each
    spatial axis from the first row the crop keeps (``plan.shifted``; their chunks:
    ``plan.shifted_chunks``), so that they are Zarr chunks as they are. A block takes the
    rows of one input chunk and a few of the next (the crop's) on each axis. Each input chunk
    is read once, whole, by the block that takes most of it; that block's reader copies out
    the rows the other blocks take, which make their own blocks from their rows and those (no
    rechunk, no chunk read twice)."""
    x, shifted, token = plan.x, plan.shifted, plan.token
    m = len(plan.block_shape)
    name, reader_name, export_name = (f"batch_to_space_nd{part}-{token}" for part in ("", "-reader", "-export"))
    # SpaceToBatchND's halo plan: for each block, the chunks it reads, its boxes of them, the
    # boxes it copies out for others and the boxes it takes from others' copies.
    windows = _owned_windows([_shifted_reads(rows) for rows in shifted], 1, x.numblocks[1 + m :])
    # Small readers: a block cuts the boxes it takes out of the reader's whole result itself.
    whole = taken_whole(_largest_block_bytes(x))
    layer = {}
    for key, (reads, own, exports, imports) in windows.items():
        chunks = [(0, *ks, *key[1 + m :]) for ks in reads]
        reader_key = (reader_name, *key[1:])
        layer[reader_key] = plan.task(reader_key, _batch_to_space_reader, chunks, own, exports)
        for e in range(0 if whole else len(exports)):
            export_key = (export_name, *key[1:], e)
            layer[export_key] = Task(export_key, _export, TaskRef(reader_key), e)
    for key, (_, _, _, imports) in windows.items():
        rows, crops = _shifted_block(shifted, key[1 : 1 + m])
        sources, boxes = {}, []
        for owner, e, origin in imports:
            box_source = (reader_name, *owner[1:]) if whole else (export_name, *owner[1:], e)
            boxes.append((sources.setdefault(box_source, len(sources)), e if whole else None, origin))
        layer[(name, *key)] = Task((name, *key), _batch_to_space_gathered, TaskRef((reader_name, *key[1:])), boxes,
                                   rows, list(plan.block_shape), crops, *map(TaskRef, sources))
    return layer


def _batch_to_space_shifted_tasks(plan: _BatchToSpacePlan) -> dict:
    """BatchToSpaceND in bundles, its output blocks counted on each spatial axis from the
    first row the crop keeps (``plan.shifted``; their chunks: ``plan.shifted_chunks``). A
    block within one input chunk is made by that chunk's bundle; a block that runs into the
    next chunk on some axis is joined in a task of its own from its parts, each made by the
    bundle of the chunk it lies in (a few rows: the crop's)."""
    x, source, pieces, shifted, token = plan.x, plan.source, plan.pieces, plan.shifted, plan.token
    m = len(plan.block_shape)
    groups = plan.groups
    batch_blocks = len(plan.in_chunks[0]) // groups
    name, bundle_name, part_name = (f"batch_to_space_nd{part}-{token}" for part in ("", "-bundle", "-part"))
    reads = [_shifted_reads(rows) for rows in shifted]
    bundles: dict[tuple, list] = {}  # source chunks -> [(crops or None, parts)] of each output
    outputs: dict[tuple, tuple] = {}  # output block -> ([(bundle's source chunks, position)], origins, rows, crops)
    layer = {}
    # Bundles share most of their parts' slices (the same rows of a chunk): one object each,
    # not one per part. The tasks hold them for the whole run.
    shared_slices: dict = {}

    def parts_of(n, box, rest):
        """The source chunks of one bundle and the part each group takes of its own chunk."""
        sources, parts = [], []
        for g in range(groups):
            first, local = pieces[0][g * batch_blocks + n]
            chunk = (first, *(k for k, *_ in box), *rest)
            sources.append(chunk)
            bounds = (local.start, local.stop, *((a, z) for _, a, z, _ in box))
            slices = shared_slices.get(bounds)
            if slices is None:
                slices = (local, *(slice(a, z) for _, a, z, _ in box), *(slice(None),) * len(rest))
                shared_slices[bounds] = slices
            parts.append((chunk, slices))
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
    # Small bundles: a joined block cuts its parts out of the bundles' whole results itself.
    whole = taken_whole(groups * _largest_block_bytes(x))
    per_pass = _per_pass(plan)
    for unique, bundle in bundles.items():
        key = (bundle_name, numbers[unique])
        layer[key] = Task(key, _batch_to_space_bundle, source.ref(), source.regions(unique), bundle,
                          list(plan.block_shape), per_pass)
    for index, (made, origins, rows, crops) in outputs.items():
        if len(made) == 1:
            ((unique, position),) = made
            layer[(name, *index)] = Task((name, *index), operator.getitem, TaskRef((bundle_name, numbers[unique])),
                                         position)
            continue
        # Small bundles: the joined block takes the bundles' whole results and picks its parts
        # itself; else each part is a pick of its own, so that only it travels.
        sources, parts = {}, []
        for j, (unique, position) in enumerate(made):
            bundle_key = (bundle_name, numbers[unique])
            if whole:
                parts.append((sources.setdefault(bundle_key, len(sources)), position))
                continue
            part_key = (part_name, *index, j)
            layer[part_key] = Task(part_key, operator.getitem, TaskRef(bundle_key), position)
            parts.append((sources.setdefault(part_key, len(sources)), None))
        layer[(name, *index)] = Task((name, *index), _batch_to_space_joined, parts, origins, rows,
                                     list(plan.block_shape), crops, *map(TaskRef, sources))
    return layer


# ---------------------------------------------------------------------------------------------
# What the strategies share


def _output_blocks(plan: _BatchToSpacePlan):
    """Each output block of ``plan.out_chunks``: (its index, the spatial index of the input
    blocks it reads, its crops on each spatial axis)."""
    m = len(plan.block_shape)
    for index in np.ndindex(*map(len, plan.out_chunks)):
        # Spatial block k of the output is input chunk kept[i][0] + k (of every group).
        spatial = [index[1 + i] + plan.kept[i][0] for i in range(m)]
        yield index, spatial, [plan.local_crops[i][index[1 + i]] for i in range(m)]


def _per_pass(plan: _BatchToSpacePlan) -> int | None:
    """The whole output blocks a bundle makes from one read of its chunks (None: all)."""
    return None if plan.bundle_blocks >= plan.groups else plan.bundle_blocks


def _group_blocks(plan: _BatchToSpacePlan, index, spatial) -> list[tuple]:
    """The input blocks output block ``index`` reads with the batch axis chunked: the same
    block of each of the P groups."""
    m = len(plan.block_shape)
    batch_blocks = len(plan.in_chunks[0]) // plan.groups
    return [(g * batch_blocks + index[0], *spatial, *index[1 + m :]) for g in range(plan.groups)]


@_fused_stores.streams(_batch_to_space_bundle_blocks)
def _batch_to_space_bundle(source, reads, outputs, block_shape, per_pass=None):
    """The output blocks fed by one bundle of source chunks (``reads`` of ``source``), as a
    tuple. In a store graph (``ops.fusing_stores``) the bundle writes each block as it makes it
    instead."""
    return tuple(_batch_to_space_bundle_blocks(source, reads, outputs, block_shape, per_pass))
