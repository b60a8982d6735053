"""Task annotations kept through the operators' graph optimization.

Dask sends a layer's annotations (``dask.annotate``: priority, retries, resources, ...) to the
distributed scheduler with the layer, but its array optimization fuses the layers into one
plain graph and drops them. The optimization the operators' store graphs go through
(``ops._fused_stores``) puts them back: the annotations each layer gave its keys, on the keys
that are still in the optimized graph, as one layer of its own.
"""

from __future__ import annotations

import uuid
from collections import defaultdict

from dask.highlevelgraph import HighLevelGraph, MaterializedLayer


class ByKey:
    """An annotation as a callable of the key: the value given for that key, or None (not
    annotated). The scheduler calls it once for each task of the graph."""

    def __init__(self, values: dict):
        self.values = values

    def __call__(self, key):
        return self.values.get(key)


def given(graph) -> dict[str, dict]:
    """The annotations ``graph``'s layers give their keys, ``{kind: {key: value}}``; empty for
    a graph with no annotated layer (a plain dict too). Only annotated layers are walked."""
    found: dict[str, dict] = defaultdict(dict)
    for layer in getattr(graph, "layers", {}).values():
        for kind, value in (layer.annotations or {}).items():
            if callable(value):
                values = ((key, value(key)) for key in layer)
            else:
                values = ((key, value) for key in layer)
            found[kind].update((key, v) for key, v in values if v is not None)
    return {kind: values for kind, values in found.items() if values}


def carried(annotations: dict[str, dict], optimized):
    """``optimized`` (a graph, as an optimization returns it) with ``annotations`` (``given``'s,
    of the graph before it was optimized) on those of its keys that are still there: a
    ``HighLevelGraph`` of one annotated layer. ``optimized`` itself when there is nothing to
    carry or it is still a ``HighLevelGraph`` (whose layers kept their own)."""
    if not annotations or isinstance(optimized, HighLevelGraph):
        return optimized
    kept = {kind: ByKey({key: v for key, v in values.items() if key in optimized})
            for kind, values in annotations.items()}
    # A name of its own: the graphs of collections computed together, optimized one by one,
    # are merged by layer name.
    name = f"optimized-annotated-{uuid.uuid4().hex}"
    return HighLevelGraph({name: MaterializedLayer(optimized, annotations=kept)}, {name: set()})
