"""GatherNd: the NumPy kernel and the Dask builders, side by side.

An index tuple of length ``c`` selects an element (``c == r - batch_dims``) or a slice of
``params`` within its batch. The kernel turns every tuple into coordinates along the first
``batch_dims + c`` dims of params (the *merged* dims) and takes those rows.

Plans, by what is lazy:
- NumPy params and indices: eager.
- Dask params, concrete indices (``_build_concrete``): the indices are checked now; tuples are
  bucketed by the params block they hit, one task per hit block gathers its bucket, and one
  task per output block puts the pieces back in the original order. Params blocks that no
  tuple hits are never read: a gather of a few points from a huge array touches a few blocks.
- Lazy (Dask) indices, output chunked like the indices' leading dims; index values are checked
  when computed, with the same IndexError:
  * params up to a quarter of ``dask.config["array.chunk-size"]``, or NumPy params
    (``_build_broadcast``): params as one block, read by every indices block (a cluster sends
    it once to each worker);
  * larger Dask params with a scratch store set (``ops.scratch``; ``_build_scratch``): the
    exchange goes through files. Runs of indices blocks write their requests grouped by
    params block, each group of params blocks is read once, a block at a time, and serves all
    its requests to files, and each batch of indices blocks reads its rows back, one range per
    group, and hands each output block a view; two barrier tasks separate the stages, so
    tasks and graph edges are linear in the blocks and a task holds about one block, one
    group of blocks it was given, or one batch;
  * larger Dask params without one (``_build_shuffle``): the same exchange inside the graph,
    a request and a piece task per (indices block, params block) pair, all pieces in worker
    memory at once.
"""

from __future__ import annotations

import math
import operator

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from ops import _block_reads, _chunks, _lazy, _scratch, _validate
from ops.errors import InvalidArgument
from schemas import GatherNdParams

# ---------------------------------------------------------------------------------------------
# NumPy kernel


def check_index_values(indices, dims, negative_index_support: bool, first_dim: int = 0, offset=()):
    """Raise IndexError for the first (C order) index value outside its dimension's range.

    ``dims`` are the sizes of params dims ``first_dim, first_dim + 1, ...`` that the tuple
    components index; ``offset`` places ``indices`` (a Dask block) in the whole indices array.
    """
    if indices.size == 0:
        return
    sizes = np.asarray(dims, dtype=np.int64)
    flat = indices.reshape(-1, len(dims))
    low = -sizes if negative_index_support else np.zeros_like(sizes)
    # Column by column: a min/max over one strided column is far faster than over axis 0.
    if all(low[k] <= flat[:, k].min() and flat[:, k].max() < sizes[k] for k in range(len(dims))):
        return
    first = int(np.flatnonzero((flat < low) | (flat >= sizes))[0])
    position = np.unravel_index(first, indices.shape)
    position = [int(p) + (offset[k] if k < len(offset) else 0) for k, p in enumerate(position)]
    component = first % len(dims)
    value, size = int(flat.reshape(-1)[first]), int(sizes[component])
    if size == 0:
        allowed = "none: the dimension is empty"
    else:
        allowed = f"{-size}..{size - 1}" if negative_index_support else f"0..{size - 1}"
    note = ", negative_index_support=False" if value < 0 and not negative_index_support else ""
    raise IndexError(
        f"indices[{', '.join(map(str, position))}] = {value} is out of range for dimension "
        f"{first_dim + component} of size {size} (allowed {allowed}{note})"
    )


def _coordinates(indices, params_shape, batch_dims: int, offset=()) -> list[np.ndarray]:
    """Coordinates of every tuple along the merged dims of params, each an int64 array of the
    tuples' shape (``indices.shape[:-1]``); values are already checked, negatives resolved."""
    lead = indices.shape[:-1]
    coords = []
    for d in range(batch_dims):  # the batch coordinate is the tuple's own position
        start = offset[d] if d < len(offset) else 0
        axis = np.arange(start, start + lead[d], dtype=np.int64)
        coords.append(np.broadcast_to(axis.reshape((-1,) + (1,) * (len(lead) - d - 1)), lead))
    for k in range(indices.shape[-1]):
        component = indices[..., k].astype(np.int64, copy=False)
        size = params_shape[batch_dims + k]
        if component.size and component.min() < 0:
            component = np.where(component < 0, component + size, component)
        coords.append(component)
    return coords


def _merged_view(params: np.ndarray, merged: int):
    """params with its first ``merged`` dims as one axis if that is a view, else None."""
    shape, strides = params.shape, params.strides
    for k in range(merged - 1):
        if shape[k + 1] != 1 and strides[k] != strides[k + 1] * shape[k + 1]:
            return None
    return params.reshape(math.prod(shape[:merged]), *shape[merged:])


def _take(params: np.ndarray, coords: list[np.ndarray]) -> np.ndarray:
    """params[coords] (one slice per tuple), through np.take on merged rows where possible."""
    merged = _merged_view(params, len(coords))
    if merged is None or len(coords) == 0:
        return params[tuple(coords)]
    rows = coords[0]
    for k in range(1, len(coords)):
        rows = rows * params.shape[k] + coords[k]
    return np.take(merged, rows, axis=0)


def gather_nd_kernel(params, indices, batch_dims: int, negative_index_support: bool, offset=()):
    """GatherNd of NumPy arrays; ``offset`` places ``indices`` in a larger array for errors."""
    c = indices.shape[-1]
    check_index_values(
        indices, params.shape[batch_dims : batch_dims + c], negative_index_support, batch_dims, offset
    )
    return _take(params, _coordinates(indices, params.shape, batch_dims, offset))


# ---------------------------------------------------------------------------------------------
# Validation


def _validate_gather_nd(params, indices, batch_dims, negative_index_support):
    p = _validate.params(
        GatherNdParams,
        batch_dims=_validate.integer("batch_dims", batch_dims),
        negative_index_support=negative_index_support,
    )
    params = _validate.array("params", params)
    if not isinstance(indices, (np.ndarray, da.Array)):
        indices = np.asarray(indices)
    if indices.dtype.newbyteorder("=") not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise InvalidArgument(f"indices dtype must be int32 or int64, got {indices.dtype}")
    if any(math.isnan(n) for n in indices.shape):
        raise InvalidArgument(
            f"indices has unknown chunk sizes {indices.shape}; call indices.compute_chunk_sizes() first"
        )
    r, q, b = params.ndim, indices.ndim, p.batch_dims
    if r < 1:
        raise InvalidArgument("params must have rank >= 1, got rank 0")
    if q < 1:
        raise InvalidArgument("indices must have rank >= 1, got rank 0")
    if b >= min(q, r):
        raise InvalidArgument(
            f"batch_dims must be < min(rank(indices), rank(params)) = {min(q, r)}, got {b}"
        )
    if params.shape[:b] != indices.shape[:b]:
        raise InvalidArgument(
            f"the first batch_dims = {b} dims of params and indices must be equal, got "
            f"{list(params.shape[:b])} and {list(indices.shape[:b])}"
        )
    c = indices.shape[-1]
    if not 1 <= c <= r - b:
        raise InvalidArgument(
            f"indices.shape[-1] (the index tuple length) must be in 1..rank(params) - batch_dims "
            f"= {r - b}, got {c}"
        )
    out_shape = (*indices.shape[:-1], *params.shape[b + c :])
    _validate.output_shape(out_shape, params.dtype.itemsize)
    return params, indices, p, out_shape


# ---------------------------------------------------------------------------------------------
# Dask builders


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


def _gather_bucket(block, local):
    return _take(block, list(local))


def _scatter_rows(rows: np.ndarray, positions: np.ndarray, piece: np.ndarray) -> None:
    """rows[positions] = piece, moving each row as one opaque item (faster than row fancy)."""
    if rows.ndim > 1 and len(rows) and rows[0].nbytes and rows.flags.c_contiguous and piece.flags.c_contiguous:
        item = np.dtype((np.void, rows[0].nbytes))
        rows.reshape(len(rows), -1).view(item)[positions, 0] = piece.reshape(len(piece), -1).view(item)[:, 0]
    else:
        rows[positions] = piece


def _assemble(shape, dtype, lead_ndim: int, parts):
    """One output block: ``rows[positions] = piece[start:stop]`` for each part."""
    out = np.empty(shape, dtype)
    rows = out.reshape(math.prod(shape[:lead_ndim]), *shape[lead_ndim:])
    for piece, start, stop, positions in parts:
        _scatter_rows(rows, positions, piece[start:stop])
    return out


def _build_concrete(params: da.Array, indices: np.ndarray, b: int, negative: bool, out_shape):
    """Dask params, NumPy indices: bucket tuples by hit block; read only the hit blocks."""
    c = indices.shape[-1]
    merged = b + c
    check_index_values(indices, params.shape[b:merged], negative, b)
    lead = indices.shape[:-1]
    coords = [np.ascontiguousarray(x).reshape(-1) for x in _coordinates(indices, params.shape, b)]
    hit, local = _locate(coords, params.chunks[:merged])
    order, hits, starts, stops = _buckets(hit, math.prod(params.numblocks[:merged]))

    slice_chunks = params.chunks[merged:]
    row_bytes = math.prod(params.shape[merged:]) * params.dtype.itemsize
    lead_chunks = _lead_chunks(lead, row_bytes, _chunks.target_bytes())
    # Output blocks along the tuples are contiguous runs of tuple ids: [bounds[o], bounds[o+1]).
    run_bounds = np.cumsum([0] + [
        math.prod(lead_chunks[k][i] for k, i in enumerate(index))
        for index in np.ndindex(*map(len, lead_chunks))
    ])

    token = tokenize(params, indices, b, negative)
    gather_name, name = f"gather_nd-bucket-{token}", f"gather_nd-{token}"
    layer, parts = {}, {}
    params_blocks = np.unravel_index(hits, params.numblocks[:merged])
    local = [coord[order] for coord in local]  # bucket by bucket: each bucket is a slice
    for h, (start, stop) in enumerate(zip(starts, stops)):
        ids = order[start:stop]
        local_h = [coord[start:stop] for coord in local]
        block = tuple(int(axis[h]) for axis in params_blocks)
        for s in np.ndindex(*map(len, slice_chunks)):
            layer[(gather_name, h, *s)] = (_gather_bucket, (params.name, *block, *s), local_h)
        # Which output runs this bucket feeds, and where.
        cuts = np.searchsorted(ids, run_bounds)
        for o in np.flatnonzero(np.diff(cuts)):
            lo, hi = int(cuts[o]), int(cuts[o + 1])
            parts.setdefault(int(o), []).append((h, lo, hi, ids[lo:hi] - run_bounds[o]))
    lead_blocks = list(np.ndindex(*map(len, lead_chunks)))
    for o, lead_index in enumerate(lead_blocks):
        shape_lead = tuple(lead_chunks[k][i] for k, i in enumerate(lead_index))
        for s in np.ndindex(*map(len, slice_chunks)):
            shape = shape_lead + tuple(slice_chunks[k][i] for k, i in enumerate(s))
            # Lists, not tuples: Dask replaces keys inside lists with their values.
            pieces = [[(gather_name, h, *s), lo, hi, pos] for h, lo, hi, pos in parts.get(o, [])]
            layer[(name, *lead_index, *s)] = (_assemble, shape, params.dtype, len(lead), pieces)
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[params])
    return da.Array(graph, name, chunks=(*lead_chunks, *slice_chunks), meta=_lazy.meta(len(out_shape), params.dtype))


def _gather_block(params, indices, b: int, negative: bool, offset):
    return gather_nd_kernel(params, indices, b, negative, offset)


def _block_offsets(chunks, index) -> list[int]:
    return [sum(chunks[k][:i]) for k, i in enumerate(index)]


def _build_broadcast(params, indices: da.Array, b: int, negative: bool, out_shape):
    """Lazy indices, small params: params in one block, gathered from by each indices block."""
    if isinstance(params, np.ndarray):
        params = da.from_array(params, chunks=params.shape)
    elif params.npartitions > 1:
        params = params.rechunk(params.shape)
    c = indices.shape[-1]
    lead_chunks = indices.chunks[:-1]
    token = tokenize(params, indices, b, negative)
    name = f"gather_nd-{token}"
    params_key = (params.name,) + (0,) * params.ndim
    slice_zeros = (0,) * (params.ndim - b - c)
    layer = {
        (name, *index, *slice_zeros): (
            _gather_block, params_key, (indices.name, *index, 0), b, negative,
            _block_offsets(indices.chunks, index),
        )
        for index in np.ndindex(*indices.numblocks[:-1])
    }
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[params, indices])
    chunks = (*lead_chunks, *((n,) for n in params.shape[b + c :]))
    return da.Array(graph, name, chunks=chunks, meta=_lazy.meta(len(out_shape), params.dtype))


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


def _serve(block, *requests):
    """Rows of one params block for each indices block's request (None where none)."""
    return [None if r is None else _take(block, r[1]) for r in requests]


def _assemble_requests(shape, dtype, lead_ndim: int, pieces, requests):
    out = np.empty(shape, dtype)
    rows = out.reshape(math.prod(shape[:lead_ndim]), *shape[lead_ndim:])
    for piece, request in zip(pieces, requests):
        if request is not None:
            _scatter_rows(rows, request[0], piece)
    return out


def _build_shuffle(params: da.Array, indices: da.Array, b: int, negative: bool, out_shape):
    """Lazy indices, large params: requests per params block, served once, reassembled."""
    c = indices.shape[-1]
    merged = b + c
    token = tokenize(params, indices, b, negative)
    split, request, serve, piece = (
        f"gather_nd-{part}-{token}" for part in ("split", "request", "serve", "piece")
    )
    name = f"gather_nd-{token}"
    lead_blocks = list(np.ndindex(*indices.numblocks[:-1]))
    params_blocks = list(np.ndindex(*params.numblocks[:merged]))
    slice_blocks = list(np.ndindex(*params.numblocks[merged:]))
    layer = {}
    for i, index in enumerate(lead_blocks):
        layer[(split, i)] = (
            _split_requests, (indices.name, *index, 0), params.shape, params.chunks[:merged],
            b, negative, _block_offsets(indices.chunks, index),
        )
        for h in range(len(params_blocks)):
            layer[(request, i, h)] = (dict.get, (split, i), h)
    for h, block in enumerate(params_blocks):
        for s in slice_blocks:
            layer[(serve, h, *s)] = (
                _serve, (params.name, *block, *s), *[(request, i, h) for i in range(len(lead_blocks))]
            )
            for i in range(len(lead_blocks)):
                layer[(piece, h, i, *s)] = (operator.getitem, (serve, h, *s), i)
    for i, index in enumerate(lead_blocks):
        shape_lead = tuple(indices.chunks[k][j] for k, j in enumerate(index))
        for s in slice_blocks:
            shape = shape_lead + tuple(params.chunks[merged + k][j] for k, j in enumerate(s))
            layer[(name, *index, *s)] = (
                _assemble_requests, shape, params.dtype, len(index),
                [(piece, h, i, *s) for h in range(len(params_blocks))],
                [(request, i, h) for h in range(len(params_blocks))],
            )
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[params, indices])
    chunks = (*indices.chunks[:-1], *params.chunks[merged:])
    return da.Array(graph, name, chunks=chunks, meta=_lazy.meta(len(out_shape), params.dtype))


def _block_rows(local: list[np.ndarray], blocks: list[np.ndarray], chunks) -> np.ndarray:
    """Each tuple's row within its params block with the merged dims flattened (C order)."""
    rows = np.zeros(len(local[0]) if local else 0, np.int64)
    for coord, block, axis_chunks in zip(local, blocks, chunks):
        rows = rows * np.asarray(axis_chunks, np.int64)[block] + coord
    return rows


#: Bytes a split task holds per index tuple (the indices, their coordinates, block numbers,
#: rows, sort keys and order, as int64): what sizes its run of indices blocks.
_SPLIT_BYTES_PER_TUPLE = 128


def _scratch_split(index_blocks, offsets, params_shape, params_chunks, b, negative, run, name,
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
    numblocks = tuple(len(axis) for axis in params_chunks)
    n_params, n_batches = math.prod(numblocks), len(batch_sizes)
    hit, local = _locate(coords, params_chunks)
    blocks = np.unravel_index(hit, numblocks) if len(hit) else [np.zeros(0, np.int64)] * len(numblocks)
    rows = _block_rows(local, list(blocks), params_chunks)
    del coords, local, blocks
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


def _rows_view(block: np.ndarray, merged: int) -> np.ndarray:
    view = _merged_view(block, merged)
    return view if view is not None else block.reshape(math.prod(block.shape[:merged]), *block.shape[merged:])


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


def _runs(items: np.ndarray, sizes: np.ndarray, limit: int):
    """``items`` in consecutive runs whose sizes add up to at most ``limit`` (a larger item
    alone): what one request of several byte ranges reads at a time."""
    first = 0
    while first < len(items):
        last, total = first + 1, sizes[first]
        while last < len(items) and total + sizes[last] <= limit:
            total += sizes[last]
            last += 1
        yield items[first:last]
        first = last


def _as_bytes(array: np.ndarray) -> memoryview:
    """The bytes of an array in C order (any dtype, including ml_dtypes' bfloat16)."""
    return memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))


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
    lead_blocks = list(np.ndindex(*indices.numblocks[:-1]))
    params_blocks = list(np.ndindex(*params.numblocks[:merged]))
    slice_blocks = list(np.ndindex(*params.numblocks[merged:]))
    row_bytes = math.prod(params.chunksize[merged:]) * params.dtype.itemsize
    read_rows = max(1, target // 8 // max(row_bytes, 1))
    block_bytes = math.prod(params.chunksize) * params.dtype.itemsize
    source = _block_reads.BlockReads.of(params)
    # Blocks a serve task reads itself, one at a time: a group of four times the chunk size.
    # Larger groups mean fewer requests to an object store, until a group's requests outgrow
    # one read of them and each block is read once per read of requests; blocks that come as
    # the task's arguments are all in its memory: half.
    group_size = max(1, (4 * target if source is not None else target // 2) // max(block_bytes, 1))
    request_budget = max(1, target // 8 // 8)
    block_tuples = math.prod(indices.chunksize[:-1])
    batch_size = max(1, target // 4 // max(block_tuples * row_bytes, 1))
    batches = [lead_blocks[first : first + batch_size] for first in range(0, len(lead_blocks), batch_size)]
    batches_per_file = max(1, target // 2 // _SPLIT_BYTES_PER_TUPLE // max(batch_size * block_tuples, 1))

    def tuples(index):
        return math.prod(indices.chunks[k][i] for k, i in enumerate(index))

    layer = {}
    files = range(0, len(batches), batches_per_file)
    for f, first in enumerate(files):
        run_batches = batches[first : first + batches_per_file]
        blocks = [index for batch in run_batches for index in batch]
        layer[(split, f)] = (
            _scratch_split, [(indices.name, *index, 0) for index in blocks],
            [_block_offsets(indices.chunks, index) for index in blocks], params.shape, params.chunks[:merged],
            b, negative, run, f, first, [sum(map(tuples, batch)) for batch in run_batches], group_size,
        )
    layer[(plan, 0)] = (_scratch_plan, run, group_size, *[(split, f) for f in range(len(files))])
    slice_names = {s: ".".join(map(str, s)) or "0" for s in slice_blocks}
    groups = range(0, len(params_blocks), group_size)
    for g, first in enumerate(groups):
        for s in slice_blocks:
            blocks = [
                (params.name, *block, *s) if source is None else source.reader((*block, *s))
                for block in params_blocks[first : first + group_size]
            ]
            row_shape = tuple(params.chunks[merged + k][i] for k, i in enumerate(s))
            layer[(serve, g, *s)] = (
                _scratch_serve, blocks, (plan, 0), run, g, group_size, merged, slice_names[s],
                math.prod(row_shape) * params.dtype.itemsize, read_rows, request_budget, batches_per_file,
            )
    layer[(served, 0)] = (_after_all, *[(serve, g, *s) for g in range(len(groups)) for s in slice_blocks])
    outputs = len(batches) * len(slice_blocks)
    for j, batch in enumerate(batches):
        for s in slice_blocks:
            row_shape = tuple(params.chunks[merged + k][i] for k, i in enumerate(s))
            layer[(assemble, j, *s)] = (
                _scratch_assemble, (served, 0), (plan, 0), run, j, row_shape, params.dtype, slice_names[s],
                read_rows, outputs,
            )
            start = 0
            for index in batch:
                shape_lead = tuple(indices.chunks[k][i] for k, i in enumerate(index))
                stop = start + math.prod(shape_lead)
                layer[(name, *index, *s)] = (_batch_block, (assemble, j, *s), start, stop, shape_lead + row_shape)
                start = stop
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[params, indices])
    chunks = (*indices.chunks[:-1], *params.chunks[merged:])
    return da.Array(graph, name, chunks=chunks, meta=_lazy.meta(len(out_shape), params.dtype))


# ---------------------------------------------------------------------------------------------
# Public function


def gather_nd(params, indices, *, batch_dims=0, negative_index_support=True):
    """Gather elements or slices of ``params`` at the index tuples in the last axis of ``indices``.

    Each tuple of ``c = indices.shape[-1]`` values selects one element (``c = r - b``) or
    one slice (``c < r - b``) of ``params``; with ``batch_dims = b`` the first b dims of
    both arrays are a shared batch (ONNX's and TensorFlow's ``batch_dims``). Negative
    values count from the end, as in ONNX, unless ``negative_index_support`` is False. The
    full reference is docs/operators.md.

    Parameters
    ----------
    params : numpy.ndarray or dask.array.Array
        Rank r >= 1, any supported dtype (bit-exact: elements are moved, not computed on).
    indices : numpy.ndarray or dask.array.Array
        int32 or int64, rank q >= 1, ``1 <= indices.shape[-1] <= r - batch_dims``. Lazy
        (Dask) indices are checked when computed; concrete ones before anything is built.
    batch_dims : int, default 0
        ``0 <= batch_dims < min(q, r)``; the first ``batch_dims`` dims of ``params`` and
        ``indices`` must be equal.
    negative_index_support : bool, default True
        True: values in ``[-s, s-1]`` for a dim of size s. False: ``[0, s-1]``.

    Returns
    -------
    numpy.ndarray or dask.array.Array
        ``indices.shape[:-1] + params.shape[batch_dims + c:]``, the dtype of ``params``.
        Dask: only the ``params`` blocks that the indices hit are read.

    Raises
    ------
    ops.InvalidArgument
        ``indices`` not int32/int64, a tuple length of 0 or more than ``r - batch_dims``, an
        invalid ``batch_dims`` or unequal batch dims, an unsupported ``params`` dtype.
    IndexError
        An index value outside its range (always so for a 0-sized dim); the message names
        its position, its value and the allowed range.

    Examples
    --------
    >>> import numpy as np, ops
    >>> params = np.array([[0, 1], [2, 3]])
    >>> ops.gather_nd(params, np.array([[0, 0], [1, 1]]))   # two elements
    array([0, 3])
    >>> ops.gather_nd(params, np.array([[1], [0]]))   # two rows
    array([[2, 3],
           [0, 1]])
    >>> ops.gather_nd(params, np.array([[-1, -2]]))   # negative values count from the end
    array([2])
    >>> ops.gather_nd(params, np.array([[-1, 0]]), negative_index_support=False)
    Traceback (most recent call last):
        ...
    IndexError: indices[0, 0] = -1 is out of range for dimension 0 of size 2 (allowed 0..1, negative_index_support=False)
    >>> cube = np.arange(8).reshape(2, 2, 2)
    >>> ops.gather_nd(cube, np.array([[1], [0]]), batch_dims=1)   # row 1 of cube[0], row 0 of cube[1]
    array([[2, 3],
           [4, 5]])
    """
    params, indices, p, out_shape = _validate_gather_nd(params, indices, batch_dims, negative_index_support)
    b, negative = p.batch_dims, p.negative_index_support
    lazy_params, lazy_indices = isinstance(params, da.Array), isinstance(indices, da.Array)
    if not lazy_indices and not lazy_params:
        return gather_nd_kernel(params, indices, b, negative)
    if not lazy_indices:
        if 0 in out_shape:
            check_index_values(indices, params.shape[b : b + indices.shape[-1]], negative, b)
            return _lazy.empty(out_shape, params.dtype)
        return _build_concrete(params, indices, b, negative, out_shape)
    if indices.numblocks[-1] > 1:
        indices = indices.rechunk({indices.ndim - 1: -1})
    if not lazy_params or params.nbytes <= _broadcast_limit():
        return _build_broadcast(params, indices, b, negative, out_shape)
    scratch = _scratch.configured()
    if scratch is not None:
        return _build_scratch(params, indices, b, negative, out_shape, scratch)
    return _build_shuffle(params, indices, b, negative, out_shape)
