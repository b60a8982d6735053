"""GatherNd's in-memory Dask graphs, and the rule that picks a plan (``_choose_and_build``).

Plans, by what is lazy:
- NumPy params and indices: eager.
- Dask params that are views of one NumPy array (``da.from_array``), concrete indices, a
  threaded or synchronous scheduler (``in_memory.build_in_memory``): one ``np.take`` per
  output block from that array.
- Other Dask params, concrete indices (``concrete._build_concrete``): the indices are checked now;
  tuples are bucketed by the params block they hit, one task per hit block gathers its
  bucket, and one task per output block puts the pieces back in the original order. Params
  blocks that no tuple hits are never read.
- Lazy (Dask) indices, output chunked like the indices' leading dims; index values are checked
  when computed, with the same IndexError:
  * params up to a quarter of ``dask.config["array.chunk-size"]``, or NumPy params
    (``_build_broadcast``): params as one block (the array its blocks are views of, or read
    whole by one task when it is stored: ``_one_block``), read by every indices block (a
    cluster sends it once to each worker);
  * larger params of views of one NumPy array, on a threaded or synchronous scheduler and
    without a scratch store (``in_memory.build_lazy_indices``): every indices block gathers
    from that array;
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

from ops import _block_reads, _lazy, _limits
from ops.gather_nd import concrete, exchange, in_memory, scratch_graph
from ops.gather_nd.kernel import _gather_block, check_index_values, gather_nd_kernel
from ops.gather_nd.plan import _block_offsets, _broadcast_limit, _graph_size


def _choose_and_build(params, indices, b: int, negative: bool, out_shape, scratch=None):
    """GatherNd of validated arguments, by the plan for what is lazy and how large params is.

    - NumPy params and indices: the NumPy kernel, now.
    - Concrete indices, Dask params that are views of one NumPy array, a shared-memory
      scheduler: ``in_memory.build_in_memory``.
    - Other concrete indices (Dask params): ``concrete._build_concrete``; an empty output is
      checked and built without a read.
    - Lazy indices, params NumPy or at most ``_broadcast_limit()`` bytes: ``_build_broadcast``.
    - Lazy indices, larger params of views of one NumPy array, no scratch store, a
      shared-memory scheduler: ``in_memory.build_lazy_indices``.
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
        whole = in_memory.whole_array(params) if in_memory.shared_memory_scheduler() else None
        if whole is not None:
            return in_memory.build_in_memory(whole, params, indices, b, negative, out_shape)
        return concrete._build_concrete(params, indices, b, negative, out_shape)
    # The lazy plans take whole tuples from one indices block.
    if indices.numblocks[-1] > 1:
        indices = indices.rechunk({indices.ndim - 1: -1})
    lead = math.prod(indices.numblocks[:-1])
    if not lazy_params or params.nbytes <= _broadcast_limit():
        _check_size("broadcast", lead, params.npartitions if lazy_params else 1, 1)
        return _build_broadcast(params, indices, b, negative, out_shape)
    merged = b + indices.shape[-1]
    whole = in_memory.whole_array(params) if scratch is None and in_memory.shared_memory_scheduler() else None
    if whole is not None:  # every indices block gathers from the array in memory: no exchange
        _check_size("in_memory", lead, 0, math.prod(params.numblocks[merged:]))
        return in_memory.build_lazy_indices(whole, params, indices, b, negative, out_shape)
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


def _one_block(params: da.Array) -> da.Array:
    """``params`` as one block: the NumPy array its blocks are views of (``da.from_array`` of
    a NumPy array), read whole in one task where its blocks are plain reads of a source
    (``da.from_zarr``, ``da.from_array`` of other arrays), else Dask's rechunk.

    Why one read rather than a rechunk of its blocks: every indices block's task takes the
    one block, and Dask orders a graph (on the client's scheduler, or on the distributed
    scheduler when a job is submitted) keeping, for every task, the set of the graph's roots
    upstream of it. Behind a rechunk each indices block's task has its own set of every
    params block's read plus its indices block: params blocks x indices blocks entries, which
    took the scheduler to 10.5 GiB at 200,000 x 1,000 blocks. One read is one root. Params
    computed some other way still bring their blocks' roots.
    """
    name = f"gather_nd-params-{tokenize(params)}"
    key = (name,) + (0,) * params.ndim
    chunks = tuple((n,) for n in params.shape)
    whole = in_memory.whole_array(params)
    if whole is not None:  # no copy, and the blocks (and their keys) are not needed at all
        return da.Array(HighLevelGraph.from_collections(name, {key: whole}), name, chunks=chunks, meta=params._meta)
    reads = _block_reads.BlockReads.of(params)
    if reads is None:
        return params.rechunk(params.shape)
    return da.Array(reads.graph(params, name, {key: reads.whole()}), name, chunks=chunks, meta=params._meta)


def _build_broadcast(params, indices: da.Array, b: int, negative: bool, out_shape):
    """Lazy indices, small params: params in one block, gathered from by each indices block."""
    if isinstance(params, np.ndarray):
        params = da.from_array(params, chunks=params.shape)
    elif params.npartitions > 1:
        params = _one_block(params)
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
