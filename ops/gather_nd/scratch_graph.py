"""GatherNd's all-to-all through a scratch store (``ops.scratch``, ops/_scratch.py): the plan
for lazy indices and Dask params too large to send to every indices block.

Runs of indices blocks write their requests grouped by params block, each group of params
blocks is read once, a block at a time, and serves all its requests to files, and each batch
of indices blocks reads its rows back, one range per group, and hands each output block a
view; two barrier tasks separate the stages, so tasks and graph edges are linear in the
blocks and a task holds about one block, one group of blocks it was given, or one batch.
The stages are a ``layer.StagedLayer``: building the graph lists no block (a call costs the
chunks along each axis), and the tasks are made when the graph is materialised.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from ops import _block_reads, _chunks, _lazy
from ops.gather_nd.kernel import (
    _as_bytes,
    _coordinates,
    _rows_view,
    _runs,
    _scatter_rows,
    check_index_values,
)
from ops.gather_nd.layer import Stage, StagedLayer, unravel
from ops.gather_nd.plan import BlockGrid, output_rows


#: Bytes a split task holds per index tuple (the indices, their coordinates, block numbers,
#: rows, sort keys and order, as int64): what sizes its run of indices blocks.
_SPLIT_BYTES_PER_TUPLE = 128


def _scratch_split(index_blocks, offsets, params_shape, grid, b, negative, run, name,
                   first_batch: int, batch_sizes, group_size: int):
    """A run of consecutive indices blocks, cut into batches of ``batch_sizes`` tuples.

    Writes the row each tuple takes from its params block to ``run/requests/<name>``, ordered
    by group of ``group_size`` params blocks, then batch, then params block (a serve task
    reads one range: its group's section), and for each batch the positions of its tuples in
    the same order to ``run/positions/<batch>`` (an assemble task's one read). Returns the
    requests per (batch, params block): the plan's only in-graph data. Positions count
    through a batch's blocks in order, each block's tuples in C order.
    """
    coords = []
    for indices, offset in zip(index_blocks, offsets):
        check_index_values(indices, params_shape[b : b + indices.shape[-1]], negative, b, offset)
        coords.append([np.ascontiguousarray(x).reshape(-1) for x in _coordinates(indices, params_shape, b, offset)])
    coords = [np.concatenate(axis) for axis in zip(*coords)]
    n_params, n_batches = grid.blocks, len(batch_sizes)
    hit, rows = grid.locate(coords)  # the block, and the row in it (merged dims flattened)
    del coords
    batch = np.repeat(np.arange(n_batches, dtype=np.int64), batch_sizes)
    key = ((hit // group_size) * n_batches + batch) * group_size + hit % group_size
    order = np.argsort(key, kind="stable")
    del key
    run.write(f"requests/{name}", _as_bytes(rows[order]))
    del rows
    batch_starts = np.cumsum(batch_sizes) - batch_sizes
    ordered_batch = batch[order]
    for k, start in enumerate(batch_starts):
        run.write(f"positions/{first_batch + k}", _as_bytes(order[ordered_batch == k] - start))
    return np.bincount(batch * n_params + hit, minlength=n_batches * n_params).reshape(n_batches, n_params)


def _scratch_plan(run, group_size: int, *counts):
    """Barrier after every split: where each request and each gathered row lives.

    Params blocks are served in groups of ``group_size`` consecutive blocks. A group's
    requests are one section of each request file, and it serves them in batch (of indices
    blocks) order, then params block, then request: a batch's rows from a group are one range
    of the group's rows (``_piece``). An object store sees one GET per (request file, group)
    and one per (batch, group), not one per pair of blocks. Written as one record per group
    (``plan/by-group``: where its section of each request file starts and how long it is,
    then its requests per params block and batch) and one per batch (``plan/by-batch``: its
    rows from each group and where they start among the group's rows); returns (batches,
    request files, groups).
    """
    files = [len(c) for c in counts]
    count = np.concatenate(counts)  # [batch, params block]
    n_batches, n_params = count.shape
    groups = -(-n_params // group_size)
    padded = np.zeros((n_batches, groups * group_size), np.int64)
    padded[:, :n_params] = count
    by_group = padded.reshape(n_batches, groups, group_size)
    group_count = by_group.sum(axis=2)  # [batch, group]
    file_starts = np.cumsum(files) - files
    section = np.add.reduceat(group_count, file_starts, axis=0)  # [request file, group]: rows
    section_start = np.cumsum(section, axis=1) - section  # within its request file
    piece_start = np.cumsum(group_count, axis=0) - group_count  # among the group's rows
    records = np.concatenate(
        [section_start.T, section.T, by_group.transpose(1, 2, 0).reshape(groups, -1)], axis=1
    )
    run.write("plan/by-group", _as_bytes(records))
    run.write("plan/by-batch", _as_bytes(np.concatenate([group_count, piece_start], axis=1)))
    return n_batches, len(files), groups


def _plan_record(run, which: str, k: int, length: int) -> np.ndarray:
    """The ``k``-th record (``length`` int64) of ``plan/<which>``."""
    size = length * 8
    (data,) = run.read_ranges([f"plan/{which}"], [k * size], [(k + 1) * size])
    return np.frombuffer(data, np.int64)


def _piece(run, g: int, batch: int, slice_name: str, start: int) -> tuple[str, int]:
    """The file holding the rows a batch takes from a group, and the row where they start.

    On a local disk, one file per group (reading a range of it costs its bytes). On an object
    store, one object per (group, batch), read whole: some servers (moto) read the whole
    object for each ranged GET, and an object per batch costs the writer as many PUTs as a
    group's file would take multipart upload requests."""
    if run.local:
        return f"pieces/{g}-{slice_name}", start
    return f"pieces/{g}-{batch}-{slice_name}", 0


def _scratch_serve(blocks, plan_shape, run, g: int, group_size: int, merged: int, slice_name: str,
                   row_bytes: int, read_rows: int, request_budget: int, batches_per_file: int):
    """One group of params blocks (one slice block of each) serves every request for it.

    ``blocks`` holds the blocks, or functions that read them: a block is read (and used) one
    at a time, once per run of request files, so a group of functions can be larger than
    memory. The group's sections of the request files are read a run of files at a time (up
    to ``request_budget`` requests), and each block's rows, taken ``read_rows`` at a time, are
    written in place in (batch, params block, request) order to the piece files
    (``_piece``), all published at the end. A block no request hits is not read.
    """
    n_batches, n_files, _ = plan_shape
    record = _plan_record(run, "by-group", g, 2 * n_files + group_size * n_batches)
    starts, sizes = record[:n_files], record[n_files : 2 * n_files]
    counts = record[2 * n_files :].reshape(group_size, n_batches)[: len(blocks)]  # the last group may be short
    # The group's rows in (batch, block) order: the request files' sections one after the other.
    flat = counts.T.reshape(-1)
    segment_start = (np.cumsum(flat) - flat).reshape(n_batches, len(blocks))
    file_start = np.cumsum(sizes) - sizes
    wanted = np.flatnonzero(sizes)
    batch_rows = counts.sum(axis=0)
    layout = {}
    for batch in np.flatnonzero(batch_rows):
        name, _ = _piece(run, g, batch, slice_name, 0)
        start, size = layout.get(name, (int(segment_start[batch, 0]), 0))
        layout[name] = start, size + int(batch_rows[batch])
    layout = [(name, start * row_bytes, size * row_bytes) for name, (start, size) in layout.items()]
    with run.open_write_at(layout) as out:
        for reading in _runs(wanted, sizes[wanted], request_budget):
            data = run.read_ranges(
                [f"requests/{f}" for f in reading],
                [int(starts[f]) * 8 for f in reading],
                [int(starts[f] + sizes[f]) * 8 for f in reading],
            )
            requests = np.concatenate([np.frombuffer(d, np.int64) for d in data])
            del data
            first_row = int(file_start[reading[0]])
            batches = np.arange(reading[0] * batches_per_file, min((reading[-1] + 1) * batches_per_file, n_batches))
            for k, item in enumerate(blocks):
                n = counts[k, batches]
                if not n.any():
                    continue
                view = _rows_view(item() if callable(item) else item, merged)
                # This block's requests: one run of rows per batch, in the run's requests.
                offsets = segment_start[batches, k] - first_row - (np.cumsum(n) - n)
                rows = np.arange(int(n.sum())) + np.repeat(offsets, n)
                for a in range(0, len(rows), read_rows):
                    part = rows[a : a + read_rows]
                    served = np.take(view, requests[part], axis=0)
                    breaks = [0, *(np.flatnonzero(np.diff(part) != 1) + 1), len(part)]
                    for lo, hi in zip(breaks, breaks[1:]):
                        out.write_at((first_row + int(part[lo])) * row_bytes, _as_bytes(served[lo:hi]))
                del view


def _scratch_assemble(_served, plan_shape, run, batch: int, row_shape, dtype, slice_name: str, read_rows: int,
                      outputs: int):
    """One batch of output blocks (one slice block of each): the rows of its blocks one after
    the other, from its positions file and its rows from every group (``_piece``), a few
    groups (about ``read_rows`` rows) at a time. The last batch to finish removes the run's
    files."""
    _, _, groups = plan_shape
    count, piece_start = _plan_record(run, "by-batch", batch, 2 * groups).reshape(2, groups)
    positions = np.frombuffer(run.read(f"positions/{batch}"), np.int64)
    rows = np.empty((len(positions), *row_shape), dtype)
    row_bytes = math.prod(row_shape) * np.dtype(dtype).itemsize
    hit = np.flatnonzero(count)
    position = 0  # the positions and the pieces are both in params-block order
    for reading in _runs(hit, count[hit], read_rows):
        pieces = [_piece(run, g, batch, slice_name, int(piece_start[g])) for g in reading]
        data = run.read_ranges(
            [name for name, _ in pieces],
            [start * row_bytes for _, start in pieces],
            [(start + int(count[g])) * row_bytes for (_, start), g in zip(pieces, reading)],
        )
        for g, piece in zip(reading, data):
            n = int(count[g])
            values = np.frombuffer(piece, dtype).reshape(n, *row_shape)
            _scatter_rows(rows, positions[position : position + n], values)
            position += n
        del data
    if run.mark_and_count(f"{batch}-{slice_name}", "done") >= outputs:
        run.remove()
    return rows


def _batch_block(rows: np.ndarray, start: int, stop: int, shape) -> np.ndarray:
    """One output block of a batch: its rows, in its shape (a view)."""
    return rows[start:stop].reshape(shape)


def _after_all(*_):
    return None


def _build_scratch(params: da.Array, indices: da.Array, b: int, negative: bool, out_shape, scratch):
    """Lazy indices, large params: the all-to-all through a scratch store (ops/_scratch.py).

    split (per run of consecutive indices blocks: requests grouped by params block, to
    scratch) -> one barrier (the counts) -> serve (per group of params blocks: gathers their
    rows once, to scratch) -> one barrier -> assemble (per batch of consecutive indices
    blocks: reads its rows from every group's piece file) -> one view per output block.

    Each stage reads one range of each of the other stage's files, and on an object store a
    range is a request: a serve task reads one per request file, a batch one per group. So
    every side is as large as memory allows. Params read straight from a Zarr array are read
    inside the serve task, one block at a time (no block keys held for it), so a group is
    four times the chunk size (its requests then about fill one read of them, at 1e7 tuples
    into 3 GiB); blocks that come as the task's arguments are all in its memory at once, so a
    group is half. A batch's output rows fill a quarter (the rows read back take as
    much again, in reads of an eighth), and a split task's run of batches half at
    ``_SPLIT_BYTES_PER_TUPLE``. Tasks and edges are linear in the blocks.
    """
    c = indices.shape[-1]
    merged = b + c
    run = scratch.new_run(f"gather_nd-{tokenize(params, indices, b, negative)[:16]}")
    # Keys of their own: two builds of one gather write to two run directories, and a
    # scheduler that merged their keys would have one build's tasks read the other's files.
    token = tokenize(params, indices, b, negative, run.url)
    split, plan, serve, served, assemble = (
        f"gather_nd-{part}-{token}" for part in ("split", "plan", "serve", "served", "assemble")
    )
    name = f"gather_nd-{token}"
    target = _chunks.target_bytes()
    lead_numblocks, params_numblocks = indices.numblocks[:-1], params.numblocks[:merged]
    n_lead, n_params = math.prod(lead_numblocks), math.prod(params_numblocks)
    row_bytes = math.prod(params.chunksize[merged:]) * params.dtype.itemsize
    read_rows = max(1, target // 8 // max(row_bytes, 1))
    block_bytes = math.prod(params.chunksize) * params.dtype.itemsize
    source = _block_reads.BlockReads.of(params)
    # Blocks a serve task reads itself, one at a time: a group of four times the chunk size.
    # Larger groups mean fewer requests to an object store, until a group's requests outgrow
    # one read of them and each block is read once per read of requests; blocks that come as
    # the task's arguments are all in its memory: half.
    group_size = max(1, (4 * target if source is not None else target // 2) // max(block_bytes, 1))
    block_tuples = math.prod(indices.chunksize[:-1])
    batch_size = max(1, target // 4 // max(block_tuples * row_bytes, 1))
    batches_per_file = max(1, target // 2 // _SPLIT_BYTES_PER_TUPLE // max(batch_size * block_tuples, 1))
    n_batches = -(-n_lead // batch_size)
    n_files, n_groups = -(-n_batches // batches_per_file), -(-n_params // group_size)
    lead_chunks = indices.chunks[:-1]
    # Tuples per indices block, flat (C order): an outer product of the chunks along each axis.
    tuples = functools.reduce(np.multiply.outer, [np.asarray(c, np.int64) for c in lead_chunks], np.int64(1))
    plan_ = _ScratchPlan(
        names={"split": split, "plan": plan, "serve": serve, "served": served, "assemble": assemble,
               "grid": f"gather_nd-grid-{token}"},
        run=run, indices_name=indices.name, params_name=params.name, params_shape=params.shape,
        merged_chunks=params.chunks[:merged], slice_chunks=params.chunks[merged:], dtype=params.dtype, b=b,
        negative=negative, source=source, lead_numblocks=lead_numblocks, lead_chunks=lead_chunks,
        lead_starts=tuple(np.concatenate([[0], np.cumsum(c)]).astype(np.int64) for c in lead_chunks),
        tuple_starts=np.concatenate([[0], np.cumsum(np.ravel(tuples))]).astype(np.int64),
        params_numblocks=params_numblocks, group_size=group_size, batch_size=batch_size,
        batches_per_file=batches_per_file, n_batches=n_batches, n_files=n_files, n_groups=n_groups,
        read_rows=read_rows, request_budget=max(1, target // 8 // 8),
    )
    slices = params.numblocks[merged:]

    def stage(stage_name, shape, make):
        return Stage(stage_name, tuple(shape), functools.partial(make, plan_))

    layer = StagedLayer([
        stage(split, (n_files,), _make_split),
        stage(plan, (1,), _make_plan),
        stage(serve, (n_groups, *slices), _make_serve),
        stage(served, (1,), _make_served),
        stage(assemble, (n_batches, *slices), _make_assemble),
        stage(name, (*lead_numblocks, *slices), _make_view),
    ], literals={plan_.names["grid"]: BlockGrid.of(params.chunks[:merged])})
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[params, indices])
    chunks = (*lead_chunks, *params.chunks[merged:])
    return da.Array(graph, name, chunks=chunks, meta=_lazy.meta(len(out_shape), params.dtype))


@dataclass(frozen=True, eq=False)
class _ScratchPlan:
    """What the stages' tasks are made from (all small: names, the scratch run, counts, the
    chunks along each axis and the tuples per indices block). Batch ``j`` is the flat indices
    blocks ``j * batch_size ...``, split task ``f`` the batches ``f * batches_per_file ...``,
    serve group ``g`` the flat params blocks ``g * group_size ...``."""

    names: dict
    run: object
    indices_name: str
    params_name: str
    params_shape: tuple[int, ...]
    merged_chunks: tuple[tuple[int, ...], ...]
    slice_chunks: tuple[tuple[int, ...], ...]
    dtype: np.dtype
    b: int
    negative: bool
    source: object
    lead_numblocks: tuple[int, ...]
    lead_chunks: tuple[tuple[int, ...], ...]
    lead_starts: tuple[np.ndarray, ...]
    tuple_starts: np.ndarray
    params_numblocks: tuple[int, ...]
    group_size: int
    batch_size: int
    batches_per_file: int
    n_batches: int
    n_files: int
    n_groups: int
    read_rows: int
    request_budget: int

    @property
    def n_lead(self) -> int:
        return math.prod(self.lead_numblocks)

    def batch(self, j: int) -> range:
        return range(j * self.batch_size, min((j + 1) * self.batch_size, self.n_lead))

    def lead_index(self, f: int) -> tuple[int, ...]:
        return unravel(f, self.lead_numblocks)

    def row_shape(self, s) -> tuple[int, ...]:
        return tuple(self.slice_chunks[k][i] for k, i in enumerate(s))


def _slice_name(s) -> str:
    return ".".join(map(str, s)) or "0"


def _make_split(p: _ScratchPlan, index):
    (f,) = index
    first = f * p.batches_per_file
    batches = range(first, min(first + p.batches_per_file, p.n_batches))
    blocks = [p.lead_index(k) for j in batches for k in p.batch(j)]
    sizes = [int(p.tuple_starts[p.batch(j).stop] - p.tuple_starts[p.batch(j).start]) for j in batches]
    return (
        _scratch_split, [(p.indices_name, *index, 0) for index in blocks],
        [[int(p.lead_starts[k][i]) for k, i in enumerate(index)] for index in blocks], p.params_shape,
        p.names["grid"], p.b, p.negative, p.run, f, first, sizes, p.group_size,
    )


def _make_plan(p: _ScratchPlan, index):
    return (_scratch_plan, p.run, p.group_size, *[(p.names["split"], f) for f in range(p.n_files)])


def _make_serve(p: _ScratchPlan, index):
    g, *s = index
    first = g * p.group_size
    blocks = []
    for h in range(first, min(first + p.group_size, math.prod(p.params_numblocks))):
        block = (*unravel(h, p.params_numblocks), *s)
        blocks.append((p.params_name, *block) if p.source is None else p.source.reader(block))
    row_shape = p.row_shape(s)
    return (
        _scratch_serve, blocks, (p.names["plan"], 0), p.run, g, p.group_size, len(p.merged_chunks),
        _slice_name(s), math.prod(row_shape) * p.dtype.itemsize, p.read_rows, p.request_budget,
        p.batches_per_file,
    )


def _make_served(p: _ScratchPlan, index):
    slices = tuple(map(len, p.slice_chunks))
    return (_after_all, *[(p.names["serve"], g, *s) for g in range(p.n_groups) for s in np.ndindex(*slices)])


def _make_assemble(p: _ScratchPlan, index):
    j, *s = index
    outputs = p.n_batches * math.prod(map(len, p.slice_chunks))
    return (
        _scratch_assemble, (p.names["served"], 0), (p.names["plan"], 0), p.run, j, p.row_shape(s), p.dtype,
        _slice_name(s), p.read_rows, outputs,
    )


def _make_view(p: _ScratchPlan, index):
    j, s, start, stop, shape = output_rows(p, index, p.batch_size)
    return (_batch_block, (p.names["assemble"], j, *s), start, stop, shape)
