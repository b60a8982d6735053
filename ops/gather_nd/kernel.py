"""GatherNd in NumPy: the kernel, its index check, and the functions graph tasks run on blocks.

An index tuple of length ``c`` selects an element (``c == r - batch_dims``) or a slice of
``params`` within its batch. The kernel turns every tuple into coordinates along the first
``batch_dims + c`` dims of params (the *merged* dims) and takes those rows.
"""

from __future__ import annotations

import math

import numpy as np

# ---------------------------------------------------------------------------------------------
# The kernel


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
# What tasks run on blocks


def _gather_block(params, indices, b: int, negative: bool, offset):
    return gather_nd_kernel(params, indices, b, negative, offset)


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


def _rows_view(block: np.ndarray, merged: int) -> np.ndarray:
    view = _merged_view(block, merged)
    return view if view is not None else block.reshape(math.prod(block.shape[:merged]), *block.shape[merged:])


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


# ---------------------------------------------------------------------------------------------
# The grouped exchange (``exchange``): lazy indices, params too large to send to every block.
# Requests travel index group -> params group -> params block, rows come back the same way;
# each function below is one stage's task.


def _exchange_requests(grid, params_shape, b: int, negative: bool, group_size: int, groups: int,
                       index_blocks, offsets):
    """One group of consecutive indices blocks: its tuples checked, located in params, and
    sorted by the params block they hit (stably: within a block, in the group's own order).

    Returns ``(hit, rows, dest, group_starts)``: the params block and the row in it (merged
    dims flattened) of every request, where its row goes among the group's output rows (the
    blocks' tuples one block after the other, each in C order), and where each group of
    ``group_size`` params blocks starts among the requests.
    """
    coords = []
    for indices, offset in zip(index_blocks, offsets):
        check_index_values(indices, params_shape[b : b + indices.shape[-1]], negative, b, offset)
        coords.append([np.ascontiguousarray(x).reshape(-1) for x in _coordinates(indices, params_shape, b, offset)])
    coords = [np.concatenate(axis) for axis in zip(*coords)]
    hit, rows = grid.locate(coords)
    # A stable sort of small integer keys is a radix sort in NumPy: linear time.
    order = np.argsort(hit.astype(np.uint16) if grid.blocks <= 2**16 else hit, kind="stable")
    hit = hit[order]
    group_starts = np.searchsorted(hit, np.arange(groups + 1, dtype=np.int64) * group_size)
    return hit, rows[order], order, group_starts


def _exchange_request_piece(requests, g: int):
    """The requests of one indices group for params group ``g``: (hit, rows)."""
    hit, rows, _, starts = requests
    return hit[starts[g] : starts[g + 1]], rows[starts[g] : starts[g + 1]]


def _exchange_route(first: int, count: int, *pieces):
    """Every request for params blocks ``first .. first + count - 1``, from each indices group
    in turn: (rows, where each block's rows start, requests per block and indices group)."""
    hit = np.concatenate([p[0] for p in pieces]) - first
    rows = np.concatenate([p[1] for p in pieces])
    source = np.repeat(np.arange(len(pieces), dtype=np.int64), [len(p[0]) for p in pieces])
    # By block, then indices group, then request (a radix sort for small keys).
    order = np.argsort(hit.astype(np.uint16) if count <= 2**16 else hit, kind="stable")
    starts = np.searchsorted(hit[order], np.arange(count + 1, dtype=np.int64))
    counts = np.bincount(hit * len(pieces) + source, minlength=count * len(pieces)).reshape(count, len(pieces))
    return rows[order], starts, counts


def _exchange_route_piece(routed, k: int):
    """The requests for the ``k``-th block of a params group: (rows, counts per indices group)."""
    rows, starts, counts = routed
    return rows[starts[k] : starts[k + 1]], counts[k]


def _exchange_serve(block: np.ndarray, merged: int, request):
    """One params block's rows for its requests, in their order, and their counts."""
    rows, counts = request
    return np.take(_rows_view(block, merged), rows, axis=0), counts


def _exchange_collect(*served):
    """A params group's served rows reordered by indices group (then block, then request):
    (rows, where each indices group's rows start). Each block's rows are already by indices
    group, so one scatter per block puts them in place (no concatenation first)."""
    counts = np.stack([s[1] for s in served])  # [block, indices group]
    group_rows = counts.sum(axis=0)
    group_starts = np.concatenate([[0], np.cumsum(group_rows)])
    # Where block k's rows for indices group j start: after the group's rows of blocks < k.
    within = np.cumsum(counts, axis=0) - counts
    first = served[0][0]
    out = np.empty((int(group_rows.sum()), *first.shape[1:]), first.dtype)
    for k, (rows, n) in enumerate(served):
        if len(rows):
            starts = group_starts[:-1] + within[k]
            positions = np.repeat(starts - (np.cumsum(n) - n), n) + np.arange(len(rows))
            _scatter_rows(out, positions, rows)
    return out, group_starts


def _exchange_response_piece(collected, j: int):
    """The rows a params group serves to indices group ``j``."""
    rows, starts = collected
    return rows[starts[j] : starts[j + 1]]


def _exchange_gather(requests, row_shape, dtype, *pieces):
    """An indices group's output rows: the pieces of every params group, in params block
    order, are its requests' rows in their sorted order; each goes to its destination."""
    dest = requests[2]
    out = np.empty((len(dest), *row_shape), dtype)
    start = 0
    for piece in pieces:
        if len(piece):
            _scatter_rows(out, dest[start : start + len(piece)], piece)
            start += len(piece)
    return out


def _rows_block(rows: np.ndarray, start: int, stop: int, shape) -> np.ndarray:
    """One output block of a group of rows: its rows, in its shape (a view)."""
    return rows[start:stop].reshape(shape)
