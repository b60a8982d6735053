"""Reading part of an input block straight from the array it was loaded from.

A Dask array made by ``da.from_array`` / ``da.from_zarr`` has one task per block,
``getter(source, block_slices)``. When an output block of an operator needs only part of an
input block, or parts of several, depending on the block's key makes the whole block a
result held in worker memory until every reader has run (and, with tight worker memory,
spilled to disk and read back, or sent to another worker). Reading the part from the source
inside the task that needs it (``getter(source, part_slices)``) has no such intermediate: the
task reads, rearranges and hands its result to the next step (a Zarr write) on its own. A
Zarr chunk is still decoded whole (from an object store, downloaded whole) for each part, so
callers read each chunk once where memory allows (SpaceToBatchND's blocks, BatchToSpaceND's
bundles of P chunks).

Any other input (a computed array, a from_array with fancy getters) gives ``None`` and the
caller depends on the block keys as usual.

Where a task reads several regions, it takes them as data (``BlockReads.regions``, one
``Regions`` value) and the source's key once (``BlockReads.ref``), not as a nested task per
read: on a distributed scheduler each nested task is an object of its own, with its own set of
dependencies and a reference to the source, held for as long as the graph runs (about a KiB
each); a million-chunk graph would hold gigabytes of them.
"""

from __future__ import annotations

import functools

import numpy as np
from dask.array.core import getter, getter_inline, getter_nofancy
from dask.base import tokenize
from dask.blockwise import Blockwise
from dask.core import istask
from dask.highlevelgraph import HighLevelGraph
from dask.layers import ArraySliceDep

try:  # Dask's task objects (2024.12+); private, so a Dask without them means "no region reads"
    from dask._task_spec import DataNode, GraphNode, Task, TaskRef
except ImportError:  # pragma: no cover - depends on the installed Dask
    DataNode = GraphNode = Task = TaskRef = None

_GETTERS = (getter, getter_nofancy, getter_inline)
_KWARGS = ("asarray", "lock")


def _plain_slices(value, ndim: int):
    """The tuple of ``ndim`` step-1 slices with explicit bounds in ``value``, or None."""
    if isinstance(value, DataNode):
        value = value.value
    if not isinstance(value, tuple) or len(value) != ndim:
        return None
    for s in value:
        if not isinstance(s, slice) or s.start is None or s.stop is None or s.step not in (None, 1):
            return None
    return value


def _parse(task, ndim: int, graph):
    """(getter function, source key, block slices, extra positional args) of a getter task."""
    if Task is None or not isinstance(task, Task) or task.func not in _GETTERS or len(task.args) != 2:
        return None
    if set(task.kwargs) - set(_KWARGS):
        return None
    ref, slices = task.args
    slices = _plain_slices(slices, ndim)
    if not isinstance(ref, TaskRef) or slices is None:
        return None
    if ref.key not in graph:
        return None
    source = graph[ref.key]
    # The source must be a value (the array object), not a computation or another key.
    if isinstance(source, GraphNode) and not isinstance(source, DataNode):
        return None
    if istask(source) or isinstance(source, (str, tuple, list, dict)):
        return None
    extra = tuple(task.kwargs.get(k, d) for k, d in zip(_KWARGS, (True, None)))
    return task.func, ref.key, slices, extra


class BlockReads:
    """Tasks that read a region of a block of an array from its source; build with ``of(x)``.

    Holds no Dask array and no task per block: what a read needs (the getter, the source's
    key, the array's chunk boundaries) is a few tuples, so a lazy graph layer can carry it
    to where its tasks are made (the scheduler) at no cost.
    """

    def __init__(self, func, source, bounds, extra, layers):
        self.func, self.source, self.extra = func, source, extra
        #: Per axis, the array's chunk boundaries (0, c0, c0 + c1, ...).
        self.bounds = bounds
        #: The graph layers the read tasks depend on (the sources), besides x's own.
        self.layers = layers

    @classmethod
    def of(cls, x):
        """``BlockReads`` for ``x``, or None when x's blocks are not plain source reads.

        A Blockwise read layer (``da.from_array``, ``da.from_zarr``) makes every block with
        the same getter from one slice dependency: its first and last blocks, made alone,
        show the pattern. A layer of materialised tasks is checked block by block (it is
        as large as that already).
        """
        graph = x.dask
        layer = graph.layers.get(x.name)
        if layer is None or x.npartitions == 0:
            return None
        sources = graph.dependencies.get(x.name, set())
        values = {}
        for name in sources:
            values.update(graph.layers[name])
        bounds = tuple(tuple(int(b) for b in np.cumsum((0, *c))) for c in x.chunks)
        last = tuple(n - 1 for n in x.numblocks)
        if isinstance(layer, Blockwise):
            if not any(isinstance(dep, ArraySliceDep) for dep in layer.io_deps.values()):
                return None
            samples = list(dict.fromkeys([(0,) * x.ndim, last]))
            tasks = dict(layer._cull(set(samples)))
            tasks = {index: tasks.get((x.name, *index)) for index in samples}
        else:
            tasks = {index: layer.get((x.name, *index)) for index in np.ndindex(*x.numblocks)}
        first = None
        for index, task in tasks.items():
            parsed = _parse(task, x.ndim, values)
            if parsed is None:
                return None
            func, source, slices, extra = parsed
            if first is None:
                first = (func, source, extra)
            expected = _block_slices(bounds, index)
            if (func, source, extra) != first or [(s.start, s.stop) for s in slices] != [
                    (s.start, s.stop) for s in expected]:
                return None
        return cls(*first[:2], bounds, first[2], set(sources))

    def read(self, index, local=None):
        """A task (legacy tuple) reading block ``index``, restricted to the slices ``local``
        (relative to the block; None: the whole block)."""
        return (self.func, self.source, self._region(index, local), *self.extra)

    def _region(self, index, local=None) -> tuple[slice, ...]:
        """The slices, in the source, of block ``index`` restricted to ``local`` (None: whole)."""
        slices = _block_slices(self.bounds, index)
        if local is None:
            return slices
        return tuple(
            slice(s.start + (lo.start or 0), s.start + (s.stop - s.start if lo.stop is None else lo.stop))
            for s, lo in zip(slices, local)
        )

    def whole(self):
        """A task (legacy tuple) reading the whole array in one read, whatever its chunks."""
        return (self.func, self.source, tuple(slice(b[0], b[-1]) for b in self.bounds), *self.extra)

    def graph(self, x, name: str, layer) -> HighLevelGraph:
        """The graph of ``layer`` (named ``name``), whose tasks read x's blocks from the source
        themselves: on top of x's sources only (x's own block tasks are kept only if another
        layer of x's graph uses them; else they would only be culled)."""
        used = any(x.name in deps for deps in x.dask.dependencies.values())
        layers = {k: v for k, v in x.dask.layers.items() if k != x.name or used}
        dependencies = {k: set(v) for k, v in x.dask.dependencies.items() if k in layers}
        layers[name] = layer
        dependencies[name] = set(self.layers)
        return HighLevelGraph(layers, dependencies)

    def ref(self):
        """The source's key as a task argument (a ``TaskRef``): the array the regions of
        ``regions`` are read from."""
        return TaskRef(self.source)

    def regions(self, blocks, locals_=None) -> Regions:
        """The reads of blocks ``blocks`` (each restricted to its slices in ``locals_``,
        relative to the block; None: whole blocks) as one ``Regions`` value."""
        locals_ = locals_ or [None] * len(blocks)
        # Regions of neighbouring tasks share most of their slices (the same rows on an axis):
        # one slice object each, not one per region. The tasks hold them for the whole run.
        shared = self.__dict__.setdefault("_shared_slices", {})
        slices = []
        for block, local in zip(blocks, locals_):
            region = self._region(block, local)
            slices.append(tuple(shared.setdefault((s.start, s.stop), s) for s in region))
        return Regions(self.func, tuple(slices), self.extra)

    def __getstate__(self):
        # The shared slices are made where the tasks are; they never travel.
        state = dict(self.__dict__)
        state.pop("_shared_slices", None)
        return state

    def reader(self, index):
        """A task whose value is a function of no arguments that reads block ``index``: for a
        task that reads several blocks one at a time."""
        return (functools.partial, *self.read(index))


class Regions:
    """Regions of one source array that a task reads, as plain data: the getter, its extra
    arguments, and the slices of each region.

    A task takes it with the source's key (``BlockReads.ref``) and reads region ``k`` with
    ``regions.read(source, k)``, when it needs it (one at a time, if it holds one at a time).
    """

    __slots__ = ("func", "slices", "extra")

    def __init__(self, func, slices: tuple, extra: tuple):
        self.func, self.slices, self.extra = func, slices, extra

    def __len__(self) -> int:
        return len(self.slices)

    def read(self, source, k: int) -> np.ndarray:
        """Region ``k`` of ``source`` (the array behind the source key)."""
        return self.func(source, self.slices[k], *self.extra)

    def read_all(self, source) -> list:
        """Every region of ``source``, in order."""
        return [self.read(source, k) for k in range(len(self.slices))]

    def __reduce__(self):
        return Regions, (self.func, self.slices, self.extra)

    def __dask_tokenize__(self):
        return ("Regions", tokenize(self.func, self.slices, self.extra))

    def __repr__(self) -> str:
        return f"Regions({getattr(self.func, '__name__', self.func)}, {len(self.slices)} regions)"


def read_then(function, source, regions: Regions, args):
    """``function(arrays, *args)`` of the arrays ``regions`` reads from ``source``: a task's
    function for a computation that takes a list of blocks, its reads made flat."""
    return function(regions.read_all(source), *args)


def _block_slices(bounds, index) -> tuple[slice, ...]:
    """The slices of block ``index`` of an array whose chunk boundaries are ``bounds``."""
    return tuple(slice(b[k], b[k + 1]) for b, k in zip(bounds, index))


def refined(chunks, new_chunks):
    """For each axis, each new chunk as (old chunk index, local slice) when ``new_chunks``
    only splits ``chunks`` (every old boundary is a new one); else None."""
    result = []
    for old, new in zip(chunks, new_chunks):
        starts = np.cumsum((0, *old))
        pieces = []
        position = 0
        k = 0
        for n in new:
            while k < len(old) - 1 and position >= starts[k + 1]:
                k += 1
            if position + n > starts[k + 1] and n:
                return None
            pieces.append((k, slice(int(position - starts[k]), int(position - starts[k] + n))))
            position += n
        result.append(pieces)
    return result
