"""What the SpaceToBatchND and BatchToSpaceND graph builders share: the graph of a layer over
the input's tasks or over its source reads alone, and the input's largest block in bytes."""

from __future__ import annotations

import math

import dask.array as da
from dask.highlevelgraph import HighLevelGraph


def _graph(name: str, layer: dict, x: da.Array, reads) -> HighLevelGraph:
    """The graph of ``layer`` on top of x's; with region reads, on top of x's sources only
    (x's own block tasks are not used, and would only be culled)."""
    if reads is None:
        return HighLevelGraph.from_collections(name, layer, dependencies=[x])
    used = any(x.name in deps for deps in x.dask.dependencies.values())
    layers = {k: v for k, v in x.dask.layers.items() if k != x.name or used}
    dependencies = {k: set(v) for k, v in x.dask.dependencies.items() if k in layers}
    layers[name] = layer
    dependencies[name] = set(reads.layers)
    return HighLevelGraph(layers, dependencies)


def _largest_block_bytes(x: da.Array) -> int:
    """The bytes of x's largest block (its largest chunk on every axis)."""
    return math.prod(max(c) if c else 0 for c in x.chunks) * x.dtype.itemsize
