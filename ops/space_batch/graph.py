"""What the SpaceToBatchND and BatchToSpaceND graph builders share: the input as a plan sees
it, the lazy output array of a plan's tasks, and the input's largest block in bytes."""

from __future__ import annotations

import dataclasses
import math

import dask.array as da
import numpy as np
from dask.highlevelgraph import HighLevelGraph

from ops import _lazy
from ops._lazy_layer import LazyLayer


@dataclasses.dataclass(frozen=True)
class _Input:
    """What a plan's tasks need of the input array: its name (the keys of its blocks), chunks
    and dtype. Small and picklable, unlike the array and its graph."""

    name: str
    chunks: tuple
    dtype: np.dtype

    @classmethod
    def of(cls, x: da.Array) -> _Input:
        return cls(x.name, x.chunks, x.dtype)

    @property
    def numblocks(self) -> tuple[int, ...]:
        return tuple(map(len, self.chunks))

    @property
    def ndim(self) -> int:
        return len(self.chunks)


def _lazy_array(name: str, chunks, x: da.Array, reads, make, *args, annotations=None) -> da.Array:
    """The array ``name`` with ``chunks`` whose tasks ``make(*args)`` makes when the graph is
    materialised (``LazyLayer``, with ``annotations``): on top of x's graph, or with region
    reads on top of x's sources only (x's own block tasks are not used, and would only be
    culled)."""
    layer = LazyLayer(name, tuple(map(len, chunks)), make, *args, annotations=annotations)
    if reads is None:
        graph = HighLevelGraph.from_collections(name, layer, dependencies=[x])
    else:
        graph = reads.graph(x, name, layer)
    return da.Array(graph, name, chunks=chunks, meta=_lazy.meta(x.ndim, x.dtype))


def _largest_block_bytes(x) -> int:
    """The bytes of x's largest block (its largest chunk on every axis)."""
    return math.prod(max(c) if c else 0 for c in x.chunks) * x.dtype.itemsize


#: Task results up to this size are taken whole by the tasks that need a part of them (the part
#: cut out inside the taker): below it, sending the whole result to the taker's worker costs
#: less than a task of its own that cuts the part out (about a millisecond of the scheduler's
#: time each), and with tiny blocks task counts are what bounds a run.
SMALL_RESULT_BYTES = 1 << 20


def taken_whole(nbytes: int) -> bool:
    """Whether a task result of ``nbytes`` is small enough to be taken whole (``SMALL_RESULT_BYTES``)."""
    return nbytes <= SMALL_RESULT_BYTES
