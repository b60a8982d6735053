"""GatherNd's in-memory Dask graphs, and the rule that picks a plan (``_choose_and_build``).

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
  * larger Dask params with a scratch store set (``ops.scratch``): the exchange goes through
    files (``scratch_graph._build_scratch``);
  * larger Dask params without one (``exchange._build_exchange``): the same exchange inside
    the graph, through groups of indices blocks and groups of params blocks, linear in the
    blocks, the rows in worker memory.
"""

from __future__ import annotations

import math

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from ops import _chunks, _lazy, _limits
from ops.gather_nd import exchange, scratch_graph
from ops.gather_nd.kernel import (
    _assemble,
    _coordinates,
    _gather_block,
    _gather_bucket,
    check_index_values,
    gather_nd_kernel,
)
from ops.gather_nd.plan import (
    _block_offsets,
    _broadcast_limit,
    _buckets,
    _graph_size,
    _lead_chunks,
    _locate,
)


def _choose_and_build(params, indices, b: int, negative: bool, out_shape, scratch=None):
    """GatherNd of validated arguments, by the plan for what is lazy and how large params is.

    - NumPy params and indices: the NumPy kernel, now.
    - Concrete indices (Dask params): ``_build_concrete``; an empty output is checked and
      built without a read.
    - Lazy indices, params NumPy or at most ``_broadcast_limit()`` bytes: ``_build_broadcast``.
    - Lazy indices, larger params, a scratch store (``scratch``, a Scratch): ``scratch_graph._build_scratch``.
    - Lazy indices, larger params, no scratch store: ``exchange._build_exchange``.
    """
    lazy_params, lazy_indices = isinstance(params, da.Array), isinstance(indices, da.Array)
    if not lazy_indices and not lazy_params:
        return gather_nd_kernel(params, indices, b, negative)
    if not lazy_indices:
        if 0 in out_shape:
            check_index_values(indices, params.shape[b : b + indices.shape[-1]], negative, b)
            return _lazy.empty(out_shape, params.dtype)
        return _build_concrete(params, indices, b, negative, out_shape)
    # The lazy plans take whole tuples from one indices block.
    if indices.numblocks[-1] > 1:
        indices = indices.rechunk({indices.ndim - 1: -1})
    lead = math.prod(indices.numblocks[:-1])
    if not lazy_params or params.nbytes <= _broadcast_limit():
        _check_size("broadcast", lead, params.npartitions if lazy_params else 1, 1)
        return _build_broadcast(params, indices, b, negative, out_shape)
    merged = b + indices.shape[-1]
    plan = "scratch" if scratch is not None else "exchange"
    _check_size(plan, lead, math.prod(params.numblocks[:merged]), math.prod(params.numblocks[merged:]))
    if scratch is not None:
        return scratch_graph._build_scratch(params, indices, b, negative, out_shape, scratch)
    return exchange._build_exchange(params, indices, b, negative, out_shape)


def _check_size(plan: str, lead: int, params: int, slices: int, hits: int = 0) -> None:
    """Refuse (``_limits.check``) a graph of ``plan`` past the call's limits, from its block
    counts (``plan._graph_size``), before any loop over its blocks."""
    blocks, tasks = _graph_size(plan, lead, params, slices, hits)
    _limits.check("gather_nd", blocks, tasks, "give params and indices larger chunks (fewer blocks)")


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
    _check_size("concrete", math.prod(map(len, lead_chunks)), 0, math.prod(map(len, slice_chunks)), len(hits))
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
