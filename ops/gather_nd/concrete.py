"""GatherNd of Dask params at NumPy indices: the exact plan, since the indices are known now.

The indices are checked now; tuples are bucketed by the params block they hit, one task per
hit block (and slice block) gathers its bucket, and one task per output block puts the pieces
back in the original order. Params blocks that no tuple hits are never read: a gather of a
few points from a huge array touches a few blocks. Output blocks along the tuples are runs of
consecutive tuples (``plan._lead_chunks``).

Planning is NumPy on the tuples (a sort by hit block, then the cuts where a bucket meets an
output run), no Python loop over blocks or pairs of them; the tasks are a
``layer.StagedLayer``, made when the graph is materialised.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from ops import _chunks, _lazy, _limits
from ops.gather_nd.kernel import _assemble, _coordinates, _gather_bucket, check_index_values
from ops.gather_nd.layer import Stage, StagedLayer, ravel
from ops.gather_nd.plan import _buckets, _graph_size, _lead_chunks, _locate, _run_bounds


@dataclass(frozen=True, eq=False)
class _Plan:
    """The buckets and the pieces, as flat arrays.

    Bucket ``h`` (hit block ``hit_blocks[h]``) is ``local[:, starts[h]:starts[h + 1]]``.
    Piece ``k`` is the rows ``lo[k]:hi[k]`` of bucket ``bucket[k]``, going to the rows
    ``positions[lo[k] + starts[bucket[k]] : ...]`` of its output run; output run ``o`` has the
    pieces ``run_pieces[o]:run_pieces[o + 1]``.
    """

    gather_name: str
    params_name: str
    dtype: np.dtype
    hit_blocks: tuple[np.ndarray, ...]  # per merged axis, the hit blocks' indices
    local: tuple[np.ndarray, ...]  # per merged axis, coordinates in the block, bucket by bucket
    starts: np.ndarray
    bucket: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    positions: np.ndarray  # per sorted tuple, its place in its output run
    run_pieces: np.ndarray
    lead_chunks: tuple[tuple[int, ...], ...]
    slice_chunks: tuple[tuple[int, ...], ...]


def _make_bucket(p: _Plan, index):
    h, *s = index
    start, stop = p.starts[h], p.starts[h + 1]
    block = tuple(int(axis[h]) for axis in p.hit_blocks)
    return (_gather_bucket, (p.params_name, *block, *s), [coord[start:stop] for coord in p.local])


def _make_output(p: _Plan, index):
    lead, s = index[: len(p.lead_chunks)], index[len(p.lead_chunks) :]
    o = ravel(lead, tuple(map(len, p.lead_chunks)))
    shape = tuple(p.lead_chunks[k][i] for k, i in enumerate(lead))
    shape += tuple(p.slice_chunks[k][i] for k, i in enumerate(s))
    pieces = []
    for k in range(p.run_pieces[o], p.run_pieces[o + 1]):
        h, lo, hi = int(p.bucket[k]), int(p.lo[k]), int(p.hi[k])
        first = int(p.starts[h])
        # Lists, not tuples: Dask replaces keys inside lists with their values.
        pieces.append([(p.gather_name, h, *s), lo, hi, p.positions[first + lo : first + hi]])
    return (_assemble, shape, p.dtype, len(lead), pieces)


def _build_concrete(params: da.Array, indices: np.ndarray, b: int, negative: bool, out_shape):
    """Dask params, NumPy indices: bucket tuples by hit block; read only the hit blocks."""
    c = indices.shape[-1]
    merged = b + c
    check_index_values(indices, params.shape[b:merged], negative, b)
    lead = indices.shape[:-1]
    coords = [np.ascontiguousarray(x).reshape(-1) for x in _coordinates(indices, params.shape, b)]
    hit, local = _locate(coords, params.chunks[:merged])
    del coords
    order, hits, starts, stops = _buckets(hit, math.prod(params.numblocks[:merged]))
    slice_chunks = params.chunks[merged:]
    row_bytes = math.prod(params.shape[merged:]) * params.dtype.itemsize
    lead_chunks = _lead_chunks(lead, row_bytes, _chunks.target_bytes())
    blocks, tasks = _graph_size("concrete", math.prod(map(len, lead_chunks)), 0,
                                math.prod(map(len, slice_chunks)), len(hits))
    _limits.check("gather_nd", blocks, tasks, "give params and indices larger chunks (fewer blocks)")

    run_bounds = _run_bounds(lead_chunks)
    # In bucket order (by hit block, ids ascending within), a piece is a stretch of one bucket
    # and one output run: it starts where either changes.
    starts = np.append(starts, len(order)).astype(np.int64)
    bucket_of = np.repeat(np.arange(len(hits), dtype=np.int64), np.diff(starts))
    run_of = np.searchsorted(run_bounds, order, side="right") - 1
    new = np.ones(len(order), bool)
    new[1:] = (bucket_of[1:] != bucket_of[:-1]) | (run_of[1:] != run_of[:-1])
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(order))
    bucket, run = bucket_of[first], run_of[first]
    by_run = np.argsort(run, kind="stable")  # an output run gathers its pieces in bucket order
    token = tokenize(params, indices, b, negative)
    name = f"gather_nd-{token}"
    plan = _Plan(
        gather_name=f"gather_nd-bucket-{token}", params_name=params.name, dtype=params.dtype,
        hit_blocks=tuple(np.unravel_index(hits, params.numblocks[:merged])),
        local=tuple(coord[order] for coord in local), starts=starts, bucket=bucket[by_run],
        lo=(first - starts[bucket])[by_run], hi=(last - starts[bucket])[by_run],
        positions=order - run_bounds[run_of],
        run_pieces=np.searchsorted(run[by_run], np.arange(len(run_bounds), dtype=np.int64)),
        lead_chunks=lead_chunks, slice_chunks=slice_chunks,
    )
    slices = tuple(map(len, slice_chunks))
    layer = StagedLayer([
        Stage(plan.gather_name, (len(hits), *slices), functools.partial(_make_bucket, plan)),
        Stage(name, (*map(len, lead_chunks), *slices), functools.partial(_make_output, plan)),
    ])
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[params])
    return da.Array(graph, name, chunks=(*lead_chunks, *slice_chunks), meta=_lazy.meta(len(out_shape), params.dtype))
