"""GatherNd of in-memory Dask params, on a shared-memory scheduler.

``da.from_array`` of a NumPy array (what ``DataArray.chunk()`` of in-memory data calls too)
copies the array once and makes every block a view of that copy. When the graph will run on
threads (or synchronously) in this process, the gather does not need the blocks at all: each
output block is one ``np.take`` of its rows from the whole array, with no buckets by params
block to sort the tuples into and put back in order (a second pass over the gathered bytes),
so the two threads gather at the rate of NumPy's own take. With lazy indices, every indices
block gathers from the whole array in the same way, where larger params would otherwise be
exchanged between groups of blocks.

Elsewhere the bucketed plan (``concrete``) stays: a distributed or multi-process scheduler
would send the whole array to every worker that makes an output block, where the bucketed
plan sends each block to one task (and the exchange each block to one group).

Both plans are graph layers whose tasks are made when the graph is materialised.
"""

from __future__ import annotations

import functools
import itertools
import math

import dask
import dask.array as da
import dask.local
import dask.threaded
import numpy as np
from dask.base import get_scheduler, tokenize
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from ops import _chunks, _lazy, _lazy_layer, _limits
from ops.gather_nd.kernel import _coordinates, _merged_view, check_index_values, gather_nd_kernel
from ops.gather_nd.layer import Stage, StagedLayer, ravel
from ops.gather_nd.plan import _block_offsets, _graph_size, _lead_chunks, _run_bounds

try:  # Dask's task objects (2024.12+): a constant in a graph may come wrapped
    from dask._task_spec import DataNode
except ImportError:  # pragma: no cover - depends on the installed Dask
    DataNode = None


def shared_memory_scheduler() -> bool:
    """Whether the graph being built will run in this process's memory: the scheduler that
    ``compute`` would use now (a default ``distributed.Client``, a ``dask.config`` setting or
    Dask's default for arrays) is the threaded or the synchronous one."""
    return get_scheduler(cls=da.Array) in (dask.threaded.get, dask.local.get_sync)


def _value(task):
    return task.value if DataNode is not None and isinstance(task, DataNode) else task


def whole_array(x: da.Array) -> np.ndarray | None:
    """The C-contiguous NumPy array whose views x's blocks are, tiling it exactly in x's
    chunks; None when they are anything else (computed blocks, a Zarr read, separate arrays).

    Checked block by block (a graph whose blocks are arrays already holds one value per
    block): each must be an ndarray viewing the same array at its chunk's offset.
    """
    layer = x.dask.layers.get(x.name)
    # Only a layer of values: asking a lazy layer for a block would make all its tasks.
    if not isinstance(layer, MaterializedLayer) or x.npartitions == 0:
        return None
    first = _value(layer.get((x.name,) + (0,) * x.ndim))
    if type(first) is not np.ndarray:
        return None
    whole = first if first.base is None else first.base
    if (type(whole) is not np.ndarray or whole.shape != x.shape or whole.dtype != x.dtype
            or not whole.flags.c_contiguous):
        return None
    blocks = [_value(task) for task in map(layer.get, _block_keys(x))]
    if not all(type(block) is np.ndarray and (block is whole or block.base is whole) for block in blocks):
        return None
    # Where each block must start in whole, and its shape: outer sums and products per axis.
    starts = [np.cumsum((0, *c))[:-1] for c in x.chunks]
    offsets = functools.reduce(np.add.outer, [s * stride for s, stride in zip(starts, whole.strides)])
    shapes = np.stack(np.meshgrid(*[np.asarray(c) for c in x.chunks], indexing="ij"), axis=-1)
    addresses = np.fromiter((block.__array_interface__["data"][0] for block in blocks), np.int64, len(blocks))
    if not (np.array_equal(addresses - whole.__array_interface__["data"][0], np.ravel(offsets))
            and np.array_equal(np.array([block.shape for block in blocks]).reshape(shapes.shape), shapes)
            and all(block.strides == whole.strides for block in blocks if block.size)):
        return None
    return whole


def _block_keys(x: da.Array):
    """x's block keys in C order of the block grid."""
    return ((x.name, *index) for index in itertools.product(*map(range, x.numblocks)))


def _take_rows(whole: np.ndarray, merged: int, region: tuple[slice, ...], rows: np.ndarray, shape):
    """One output block: ``rows`` of ``whole`` with its first ``merged`` dims as one axis,
    within ``region`` of the other dims."""
    view = _merged_view(whole, merged)[(slice(None), *region)]
    return np.take(view, rows, axis=0).reshape(shape)


def _region(slice_bounds, s) -> tuple[slice, ...]:
    """Slice block ``s`` of the dims the tuples do not index, from their chunk boundaries."""
    return tuple(slice(int(bounds[k]), int(bounds[k + 1])) for bounds, k in zip(slice_bounds, s))


def _make_block(source_key, merged, lead_chunks, slice_bounds, run_bounds, rows, index):
    lead, s = index[: len(lead_chunks)], index[len(lead_chunks) :]
    o = ravel(lead, tuple(map(len, lead_chunks)))
    region = _region(slice_bounds, s)
    shape = tuple(lead_chunks[k][i] for k, i in enumerate(lead)) + tuple(r.stop - r.start for r in region)
    piece = rows[run_bounds[o] : run_bounds[o + 1]]
    return (_take_rows, source_key, merged, _lazy_layer.static(region), piece, _lazy_layer.static(shape))


def build_in_memory(whole: np.ndarray, params: da.Array, indices: np.ndarray, b: int, negative: bool, out_shape):
    """Dask params that are views of ``whole`` (``whole_array``), NumPy indices: one task per
    output block takes its rows from ``whole``; output chunks as the bucketed plan's."""
    c = indices.shape[-1]
    merged = b + c
    check_index_values(indices, params.shape[b:merged], negative, b)
    lead = indices.shape[:-1]
    rows = None  # each tuple's row of whole's first `merged` dims as one axis (C order)
    for coord, size in zip(_coordinates(indices, params.shape, b), params.shape[:merged]):
        rows = coord.reshape(-1) if rows is None else rows * size + coord.reshape(-1)
    if np.may_share_memory(rows, indices):  # the graph keeps its own, whatever the caller does next
        rows = rows.copy()
    slice_chunks = params.chunks[merged:]
    row_bytes = math.prod(params.shape[merged:]) * params.dtype.itemsize
    lead_chunks = _lead_chunks(lead, row_bytes, _chunks.target_bytes())
    blocks, tasks = _graph_size("in_memory", math.prod(map(len, lead_chunks)), 0, math.prod(map(len, slice_chunks)))
    _limits.check("gather_nd", blocks, tasks, "give params and indices larger chunks (fewer blocks)")
    run_bounds = _run_bounds(lead_chunks)
    token = tokenize(params, indices, b, negative)
    name, source_key = f"gather_nd-{token}", f"gather_nd-array-{token}"
    slice_bounds = tuple(np.cumsum((0, *chunks)) for chunks in slice_chunks)
    make = functools.partial(_make_block, source_key, merged, lead_chunks, slice_bounds, run_bounds, rows)
    layer = StagedLayer(
        [Stage(name, (*map(len, lead_chunks), *map(len, slice_chunks)), make)],
        literals={source_key: whole},
    )
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[])
    return da.Array(graph, name, chunks=(*lead_chunks, *slice_chunks), meta=_lazy.meta(len(out_shape), params.dtype))


def _gather_region(whole, indices, b: int, negative: bool, offset, region: tuple[slice, ...]):
    """GatherNd of one indices block from ``whole``, within ``region`` of the slice dims."""
    merged = b + indices.shape[-1]
    return gather_nd_kernel(whole[(slice(None),) * merged + region], indices, b, negative, offset)


def _make_region_gather(source_key, indices_name, indices_chunks, lead_ndim, b, negative, slice_bounds, index):
    lead, s = index[:lead_ndim], index[lead_ndim:]
    region = _region(slice_bounds, s)
    return (_gather_region, source_key, (indices_name, *lead, 0), b, negative,
            _lazy_layer.static(_block_offsets(indices_chunks, lead)), _lazy_layer.static(region))


def build_lazy_indices(whole: np.ndarray, params: da.Array, indices: da.Array, b: int, negative: bool, out_shape):
    """Dask params that are views of ``whole``, lazy indices (whole tuples per block): every
    indices block gathers from ``whole``, one task per slice block; the output's chunks are
    those of the exchange (the indices' leading chunks, then params' slice chunks)."""
    merged = b + indices.shape[-1]
    slice_chunks = params.chunks[merged:]
    slice_bounds = tuple(np.cumsum((0, *chunks)) for chunks in slice_chunks)
    token = tokenize(params, indices, b, negative)
    name, source_key = f"gather_nd-{token}", f"gather_nd-array-{token}"
    make = functools.partial(_make_region_gather, source_key, indices.name, indices.chunks, indices.ndim - 1,
                             b, negative, slice_bounds)
    layer = StagedLayer(
        [Stage(name, (*indices.numblocks[:-1], *map(len, slice_chunks)), make)],
        literals={source_key: whole},
    )
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[indices])
    chunks = (*indices.chunks[:-1], *slice_chunks)
    return da.Array(graph, name, chunks=chunks, meta=_lazy.meta(len(out_shape), params.dtype))
