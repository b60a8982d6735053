"""A graph layer whose tasks are made only when something needs them.

Dask's own array operations scale because their graphs are symbolic: a ``Blockwise`` layer
says how to make the task of any block, and makes them all only when the graph is run. With
the distributed scheduler that happens on the scheduler: the client sends the layer as it is
(a few tuples), not a million tasks. ``LazyLayer`` gives the operators' own plans the same
property. A plan computes, at call time, only what is O(chunks along one axis) (its chunks
and which input rows each output chunk reads); the loop over every block that makes the
tasks is a module-level function the layer calls with those small arguments when the graph
is materialised (optimised, computed, or submitted and unpacked on the scheduler).
"""

from __future__ import annotations

import operator

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.core import keys_in_tasks
from dask.highlevelgraph import HighLevelGraph, Layer

# Dask's task objects (private, but in every Dask this project supports). The plans make their
# tasks as ``Task(key, function, *arguments)``, which takes arguments as they are: only a
# ``TaskRef`` argument is a dependency, and nothing else is searched for keys, so plain data
# (slices, offsets, read regions) needs no wrapping and no nested task.
from dask._task_spec import DataNode


def static(value):
    """``value`` (holding no key and no task) as a constant argument of a task.

    Dask searches every element of a task's arguments for keys and nested tasks when it
    optimizes a graph; for a plan's nested lists of slices, offsets and crops that search is
    most of the time optimization takes (and with a distributed scheduler, that time is the
    scheduler's, before any task runs). A constant is taken as it is.
    """
    return DataNode(None, value)


class LazyLayer(Layer):
    """The tasks ``make(*args)`` returns, made on first use.

    Parameters
    ----------
    name : str
        The name of the output array: its blocks are the keys ``(name, *index)``.
    numblocks : tuple of int
        The output array's blocks per axis.
    make : callable
        A module-level function returning the layer's tasks as a dict (key -> task). It may
        also return tasks under other names (intermediates); only the output blocks are
        what other layers depend on.
    *args
        Its arguments: small, picklable values (chunks, per-axis plans), never an array.
    annotations : dict, optional
        Dask annotations of its tasks (``dask.annotate``'s), a value or a callable of the key
        each; with none given, those of the ``dask.annotate`` context it is made in.
    """

    def __init__(self, name: str, numblocks, make, *args, annotations=None):
        super().__init__(annotations=annotations)
        self.name, self.numblocks = name, tuple(numblocks)
        self.make, self.args = make, args
        self._tasks = None

    @property
    def _dict(self) -> dict:
        if self._tasks is None:
            self._tasks = self.make(*self.args)
        return self._tasks

    @property
    def mapping(self) -> dict:
        """The tasks, as ``MaterializedLayer.mapping`` has them (made now if not yet)."""
        return self._dict

    def __getstate__(self):
        # Sent as the recipe, never as its tasks (nor the tasks' cached properties).
        state = dict(self.__dict__)
        state["_tasks"] = None
        state.pop("has_legacy_tasks", None)
        return state

    def is_materialized(self) -> bool:
        return self._tasks is not None

    def get_output_keys(self):
        return {(self.name, *index) for index in np.ndindex(*self.numblocks)}

    def get_dependencies(self, key, all_hlg_keys) -> set:
        # The layer's own intermediates (a window's edge pieces, a bundle) are dependencies
        # too, though no other layer takes them (``get_output_keys``): found among both.
        return keys_in_tasks(_Either(all_hlg_keys, self._dict), [self[key]])

    def __getitem__(self, key):
        return self._dict[key]

    def __iter__(self):
        return iter(self._dict)

    def __len__(self) -> int:
        return len(self._dict)

    def __contains__(self, key) -> bool:
        return key in self._dict

    def __repr__(self) -> str:
        state = "materialised" if self.is_materialized() else "lazy"
        return f"LazyLayer<{self.name}, {self.make.__name__}, {state}>"


def take_then(function, parts, args, *arrays):
    """``function(blocks, *args)`` of the blocks ``parts`` takes of ``arrays`` (a task's
    ``TaskRef`` arguments): ``(array number, slices)``, None for the whole array; a task's
    function for a computation that takes a list of blocks, its inputs made flat."""
    return function([arrays[n] if index is None else arrays[n][index] for n, index in parts], *args)


class _Either:
    """The keys of either of two collections, for membership tests."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def __contains__(self, key) -> bool:
        return key in self.first or key in self.second


def split(x, chunks, pieces):
    """x with ``chunks``, each a piece of one of x's blocks (``pieces``: per axis, each new
    chunk as (x's chunk index, local slice), as ``_block_reads.refined`` gives them): Dask's
    split-only rechunk, made lazily (``da.Array.rechunk`` makes its tasks at once, seconds
    for a million chunks)."""
    name = f"split-{tokenize(x, chunks)}"
    layer = LazyLayer(name, tuple(map(len, chunks)), _split_tasks, name, x.name, x.chunks, pieces)
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[x])
    return da.Array(graph, name, chunks=chunks, meta=x._meta)


def _split_tasks(name, x_name, x_chunks, pieces) -> dict:
    """The tasks of ``split``: a block that is a whole block of x is that block; a piece is
    sliced off it."""
    tasks = {}
    for index in np.ndindex(*map(len, pieces)):
        old = tuple(pieces[a][i][0] for a, i in enumerate(index))
        local = tuple(pieces[a][i][1] for a, i in enumerate(index))
        whole = all(s.start == 0 and s.stop == x_chunks[a][k] for a, (k, s) in enumerate(zip(old, local)))
        tasks[(name, *index)] = (x_name, *old) if whole else (operator.getitem, (x_name, *old), local)
    return tasks
