"""GatherNd's grouped exchange: the plan for lazy indices into Dask params too large to send
to every indices block, when no scratch store is set (the rows go through worker memory).

Which params block a tuple hits is known only when its indices block is computed, so every
indices block may need every params block. A task per (indices block, params block) pair
makes a graph of their product (8 million tasks for 16,384 x 250 blocks); here the requests
travel through groups instead. With P params blocks in G groups and I indices blocks in J
groups (``plan._exchange_groups``: (G + 1)(J + 1) <= P + I, G and J about sqrt(P + I)):

    requests[j]        per indices group: its tuples checked, located, sorted by params block
    request-piece[j,g]   its requests for params group g
    route[g]           per params group: the requests of every indices group, by block
    route-piece[p]       those for params block p
    serve[p,s]         per params block (and slice block): its rows, for every request
    collect[g,s]       per params group: its blocks' rows, by indices group
    response[g,j,s]      those for indices group j
    gather[j,s]        per indices group: the rows of its output blocks, in place
    <output>[i,s]      per output block: a view of its group's rows

Tasks: 1 + J(1 + G) + G + P + S(P + G + GJ + J + I), at most 4 (P + I) + 4 for one slice block
(``plan.exchange_tasks``); edges at most 8 (P + I) (4 per params block, 4 per pair of
groups), the largest fan-in max(G, J, P/G, I/J), about sqrt(P + I): a task per pair of
blocks would be 2 P I tasks. A task waiting on all I indices blocks would be as many edges
but one task; here no task waits on more than about sqrt(P + I) others, so the scheduler
never holds one task's long list of inputs, and the pair tasks keep every transfer to what
its receiver uses (a dependency sends its whole result). A group task holds about 1/sqrt(P + I) of the requests or of the output
rows; under a memory limit smaller than that, set a scratch store (``scratch_graph``).

The stages are a ``layer.StagedLayer``: calling ``gather_nd`` builds no task (it costs the
chunks along each axis), and the tasks are made when the graph is optimised or run.

Scheduling an all-to-all has one more cost that grows with a product: Dask orders a graph
(``dask.order``, on the client's scheduler or the distributed scheduler) in about roots x
output blocks steps, and in an all-to-all every root reaches every output block. Params
read from their source (Zarr, ``_block_reads``) are read inside the serve tasks, so the
roots are the source and the indices blocks; other params bring a root per block.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from ops import _block_reads, _lazy
from ops.gather_nd.kernel import (
    _exchange_collect,
    _exchange_gather,
    _exchange_request_piece,
    _exchange_requests,
    _exchange_response_piece,
    _exchange_route,
    _exchange_route_piece,
    _exchange_serve,
    _rows_block,
)
from ops.gather_nd.layer import Stage, StagedLayer, unravel
from ops.gather_nd.plan import BlockGrid, _exchange_groups, output_rows


@dataclass(frozen=True, eq=False)
class _Plan:
    """What the stages' tasks are made from: names, block counts, and chunks (all small: the
    chunks along each axis, and the tuples per indices block)."""

    names: dict
    indices_name: str
    params_name: str
    source: object  # _block_reads.BlockReads when params' blocks are plain reads, else None
    params_shape: tuple[int, ...]
    b: int
    negative: bool
    merged: int
    dtype: np.dtype
    lead_numblocks: tuple[int, ...]
    lead_chunks: tuple[tuple[int, ...], ...]
    lead_starts: tuple[np.ndarray, ...]
    tuple_starts: np.ndarray  # where each indices block's tuples start, flat block order
    params_numblocks: tuple[int, ...]  # of the merged dims
    slice_chunks: tuple[tuple[int, ...], ...]
    groups: int
    per_group: int
    index_groups: int
    per_index_group: int

    @property
    def params_blocks(self) -> int:
        return math.prod(self.params_numblocks)

    @property
    def index_blocks(self) -> int:
        return math.prod(self.lead_numblocks)

    def index_group(self, j: int) -> range:
        return range(j * self.per_index_group, min((j + 1) * self.per_index_group, self.index_blocks))

    def params_group(self, g: int) -> range:
        return range(g * self.per_group, min((g + 1) * self.per_group, self.params_blocks))

    def row_shape(self, s) -> tuple[int, ...]:
        return tuple(self.slice_chunks[k][i] for k, i in enumerate(s))


# One function per stage: index -> task. Module level (with the plan bound by partial), so a
# layer pickles as its recipe.


def _make_requests(p: _Plan, index):
    (j,) = index
    keys, offsets = [], []
    for f in p.index_group(j):
        lead = unravel(f, p.lead_numblocks)
        keys.append((p.indices_name, *lead, 0))
        offsets.append([int(p.lead_starts[k][i]) for k, i in enumerate(lead)])
    return (_exchange_requests, p.names["grid"], p.params_shape, p.b, p.negative, p.per_group, p.groups,
            keys, offsets)


def _make_request_piece(p: _Plan, index):
    j, g = index
    return (_exchange_request_piece, (p.names["requests"], j), g)


def _make_route(p: _Plan, index):
    (g,) = index
    blocks = p.params_group(g)
    return (_exchange_route, blocks.start, len(blocks),
            *[(p.names["request-piece"], j, g) for j in range(p.index_groups)])


def _make_route_piece(p: _Plan, index):
    (h,) = index
    return (_exchange_route_piece, (p.names["route"], h // p.per_group), h % p.per_group)


def _make_serve(p: _Plan, index):
    h, *s = index
    block = (*unravel(h, p.params_numblocks), *s)
    # A block read from its source is read inside the serve task: params' blocks are then no
    # roots of the graph, each connected to every output block (the scheduler orders a
    # graph in about roots x outputs steps).
    read = (p.params_name, *block) if p.source is None else p.source.read(block)
    return (_exchange_serve, read, p.merged, (p.names["route-piece"], h))


def _make_collect(p: _Plan, index):
    g, *s = index
    return (_exchange_collect, *[(p.names["serve"], h, *s) for h in p.params_group(g)])


def _make_response(p: _Plan, index):
    g, j, *s = index
    return (_exchange_response_piece, (p.names["collect"], g, *s), j)


def _make_gather(p: _Plan, index):
    j, *s = index
    return (_exchange_gather, (p.names["requests"], j), p.row_shape(s), p.dtype,
            *[(p.names["response"], g, j, *s) for g in range(p.groups)])


def _make_output(p: _Plan, index):
    j, s, start, stop, shape = output_rows(p, index, p.per_index_group)
    return (_rows_block, (p.names["gather"], j, *s), start, stop, shape)


def _build_exchange(params: da.Array, indices: da.Array, b: int, negative: bool, out_shape):
    """Lazy indices (whole tuples per block), large Dask params: the grouped exchange."""
    merged = b + indices.shape[-1]
    token = tokenize(params, indices, b, negative)
    name = f"gather_nd-{token}"
    stages = ("grid", "requests", "request-piece", "route", "route-piece", "serve", "collect", "response", "gather")
    names = {stage: f"gather_nd-{stage}-{token}" for stage in stages}
    lead_chunks = indices.chunks[:-1]
    params_numblocks = params.numblocks[:merged]
    groups, per_group, index_groups, per_index_group = _exchange_groups(
        math.prod(params_numblocks), math.prod(indices.numblocks[:-1])
    )
    # Tuples per indices block, flat (C order): an outer product of the chunks along each axis.
    tuples = functools.reduce(np.multiply.outer, [np.asarray(c, np.int64) for c in lead_chunks], np.int64(1))
    plan = _Plan(
        names=names, indices_name=indices.name, params_name=params.name,
        source=_block_reads.BlockReads.of(params), params_shape=params.shape, b=b,
        negative=negative, merged=merged, dtype=params.dtype, lead_numblocks=indices.numblocks[:-1],
        lead_chunks=lead_chunks,
        lead_starts=tuple(np.concatenate([[0], np.cumsum(c)]).astype(np.int64) for c in lead_chunks),
        tuple_starts=np.concatenate([[0], np.cumsum(np.ravel(tuples))]).astype(np.int64),
        params_numblocks=params_numblocks, slice_chunks=params.chunks[merged:], groups=groups,
        per_group=per_group, index_groups=index_groups, per_index_group=per_index_group,
    )
    slices = params.numblocks[merged:]
    P, G, J = plan.params_blocks, groups, index_groups

    def stage(key, shape, make):
        return Stage(names[key] if key else name, tuple(shape), functools.partial(make, plan))

    layer = StagedLayer(
        [
            stage("requests", (J,), _make_requests),
            stage("request-piece", (J, G), _make_request_piece),
            stage("route", (G,), _make_route),
            stage("route-piece", (P,), _make_route_piece),
            stage("serve", (P, *slices), _make_serve),
            stage("collect", (G, *slices), _make_collect),
            stage("response", (G, J, *slices), _make_response),
            stage("gather", (J, *slices), _make_gather),
            stage(None, (*plan.lead_numblocks, *slices), _make_output),
        ],
        literals={names["grid"]: BlockGrid.of(params.chunks[:merged])},
    )
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[params, indices])
    chunks = (*lead_chunks, *params.chunks[merged:])
    return da.Array(graph, name, chunks=chunks, meta=_lazy.meta(len(out_shape), params.dtype))
