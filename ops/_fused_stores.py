"""Writing the blocks of a multi-output task where they are made.

Some plans make several output blocks in one task: BatchToSpaceND's bundles read P source
chunks once and make the P output blocks they feed; SpaceToBatchND's windows on a chunked batch
axis make the P blocks of their groups at once. In a store graph (``da.store`` or
``to_zarr`` with ``compute=False``) each of those blocks is then written by a store task of
its own, so the bundle's whole result stays in the worker's memory, as one Dask result, until
the last of its store tasks has run. A worker near its spill line writes that result to disk
and reads it back for each store task. Inside ``fusing_stores`` Dask's optimization rewrites
such a graph so that the task writes each block as soon as it is made, with the very store
task Dask built for it, and holds no block once it is written: nothing is left to spill. A
block that other tasks take as well (or instead) is kept in the task's result for them.

A plan opts in by registering, for the function of its multi-output task, a function with the
same arguments that yields the blocks one at a time (``streams``). Any other graph, or a task
whose result something takes whole, is left as it is.

``fusing`` makes the collection the service and ``chunked-tensor-ops run`` compute: the store
graph as it is (rewritten and optimized where it is computed), waited on through a tree of
small tasks so that no task has to hold every written block's result.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import operator
import threading
from collections import defaultdict

import dask
import dask.array as da
import numpy as np
from dask.array.core import load_store_chunk
from dask.array.optimization import optimize as _array_optimize
from dask.base import tokenize
from dask.core import flatten
from dask.highlevelgraph import HighLevelGraph
from dask.optimization import cull

from ops import _annotations
from ops._lazy_layer import LazyLayer

try:  # Dask's task objects (2024.12+); private, so a Dask without them means "no rewrite"
    from dask._task_spec import Alias, DataNode, Task, TaskRef, convert_legacy_graph
except ImportError:  # pragma: no cover - depends on the installed Dask
    Task = None

#: A multi-output task's function -> the function with the same arguments yielding its blocks.
_BLOCKS_OF: dict = {}
#: The multi-output functions whose blocks after the stored ones are small (``streams``).
_SMALL_EXTRAS: set = set()


def streams(blocks, small_extras: bool = False):
    """Register ``blocks`` (a generator function) as the block-by-block form of the decorated
    multi-output function, whose result is ``tuple(blocks(*args))``.

    ``small_extras``: what ``blocks`` yields after the blocks that are stored is small (a few
    rows of a small block that other tasks take): a task that only waits for the stores may
    then take the task's result whole instead of a pick of one store's result.
    """

    def register(function):
        _BLOCKS_OF[function] = blocks
        if small_extras:
            _SMALL_EXTRAS.add(function)
        return function

    return register


def _store_as_made(blocks, stores, keep, small_extras: bool, *args):
    """Make the blocks with ``blocks(*args)`` and store each with its store tasks (``stores``:
    block position -> [(key the store task reads the block under, store task)]) as soon as it
    is made. Returns (the blocks at the positions ``keep``, which other tasks take, in that
    order; the store tasks' results, in the order of ``stores``). ``small_extras``: as the
    function was registered (``streams``), for ``_writer``."""
    results, kept = {}, {}
    for position, block in enumerate(blocks(*args)):
        for ref, store in stores.get(position, ()):
            results[store.key] = store({ref: block})
        if position in keep:
            kept[position] = block
        del block
    return (tuple(kept[p] for p in keep),
            tuple(results[store.key] for writes in stores.values() for _, store in writes))


def _kept(result, number: int):
    """The ``number``-th block a fused task kept for other tasks."""
    return result[0][number]


def _stored(result, number: int):
    """The result of the ``number``-th store task a fused task ran."""
    return result[1][number]


def _picked(node):
    """(task key, position) when ``node`` is ``getitem(<task>, <int>)``, else None."""
    if not isinstance(node, Task) or node.func is not operator.getitem or node.kwargs or len(node.args) != 2:
        return None
    ref, position = node.args
    if isinstance(position, DataNode):
        position = position.value
    if not isinstance(position, int):
        return None
    if isinstance(ref, TaskRef):  # a key in a task object
        return ref.key, position
    if isinstance(ref, Alias):  # a key in a legacy tuple, as Dask converts it
        return ref.target, position
    return None


def _store_source(node):
    """The key a ``da.store`` task writes, when ``node`` is one, else None."""
    if not isinstance(node, Task) or node.func is not load_store_chunk or not node.args:
        return None
    ref = node.args[0]
    if not isinstance(ref, TaskRef) or node.dependencies != {ref.key}:
        return None
    return ref.key


def _rewritten(graph, kept):
    """The tasks of ``graph`` (a Dask graph, high-level or not) with each registered
    multi-output task storing its own blocks, or None when nothing in it can be rewritten.
    ``kept``: the keys the caller asks for (never rewritten away)."""
    if Task is None:  # pragma: no cover - depends on the installed Dask
        return None
    layers = getattr(graph, "layers", {"": graph})
    if not any(f in _BLOCKS_OF for layer in layers.values() for f in _functions(layer)):
        return None
    tasks = convert_legacy_graph(dict(graph))
    dependents = defaultdict(set)
    for key, node in tasks.items():
        for dependency in node.dependencies:
            dependents[dependency].add(key)

    # multi-output task -> {position: [(picked block's key, store key)]}
    writes: dict = defaultdict(lambda: defaultdict(list))
    for key, node in tasks.items():
        source = _store_source(node)
        picked = _picked(tasks.get(source))
        if picked is None:
            continue
        multi, position = picked
        if getattr(tasks.get(multi), "func", None) in _BLOCKS_OF and dependents[source] == {key} and source not in kept:
            writes[multi][position].append((source, key))

    new = dict(tasks)
    for multi, by_position in writes.items():
        picks = {source for pairs in by_position.values() for source, _ in pairs}
        # The task's other dependents must be picks of its blocks too: those blocks it keeps.
        others = {key: _picked(tasks[key]) for key in dependents[multi] - picks}
        if multi in kept or any(p is None or p[0] != multi for p in others.values()):
            continue  # its result is needed whole: it must still be made so
        node = tasks[multi]
        stores = {p: [(source, tasks[key]) for source, key in pairs] for p, pairs in sorted(by_position.items())}
        order = [store.key for pairs in stores.values() for _, store in pairs]  # as _store_as_made returns them
        keep = tuple(sorted({position for _, position in others.values()}))
        # A new key: what the task computes now depends on the stores it serves. Dask may
        # optimize two collections that share the task one by one and merge the graphs; the
        # old key would then name two different tasks.
        fused = _fused_key(multi, order)
        run = functools.partial(_store_as_made, _BLOCKS_OF[node.func], stores, keep, node.func in _SMALL_EXTRAS)
        new[fused] = Task(fused, run, *node.args, **node.kwargs)
        for number, key in enumerate(order):
            new[key] = Task(key, _stored, TaskRef(fused), number)
        for key, (_, position) in others.items():
            new[key] = Task(key, _kept, TaskRef(fused), keep.index(position))
        for source in picks:
            del new[source]
        del new[multi]
    return new if len(new) != len(tasks) else None


def _optimize(dsk, keys, **kwargs):
    """Dask's array optimization, after the rewrite (in a thread inside ``fusing_stores``),
    keeping the layers' annotations (``ops._annotations``)."""
    annotations = _annotations.given(dsk)
    if not _FUSING.get():
        return _annotations.carried(annotations, (_replaced or _array_optimize)(dsk, keys, **kwargs))
    new = _rewritten(dsk, set(flatten(keys)))
    return _annotations.carried(annotations, _array_optimize(dsk if new is None else new, keys, **kwargs))


def _fusing_optimize(dsk, keys, **kwargs):
    """Dask's array optimization after the rewrite, always: the optimizer of ``fusing``'s
    collections, which travels with their graph (to the scheduler, under distributed). The
    layers' annotations are kept (``ops._annotations``)."""
    annotations = _annotations.given(dsk)
    new = _rewritten(dsk, set(flatten(keys)))
    optimized = _array_optimize(dsk if new is None else new, keys, **kwargs)
    return _annotations.carried(annotations, _waiting_on_writers(optimized, keys))


def _waiting_on_writers(tasks, keys):
    """``tasks`` (an optimized graph) with ``fusing``'s "done" tasks waiting on the tasks that
    write the blocks rather than on an alias or a pick of their result (``_writer``), and
    whatever nothing then takes culled.

    On a scheduler bound by its per-task cost that is one task less per block written: Dask
    leaves an alias under the store task's name when it fuses that task into the one before,
    and a rewritten multi-output task has one ``_stored`` pick per block it writes.
    """
    if Task is None or not isinstance(tasks, dict):  # not fused (Dask's optimization.fuse off)
        return tasks
    changed = False
    first_picks = {}  # a rewritten task -> the first pick of its store results
    for key, node in tasks.items():
        if getattr(node, "func", None) is _stored:
            first_picks.setdefault(next(iter(node.dependencies)), key)
    for key, node in list(tasks.items()):
        if getattr(node, "func", None) is not _done or not all(isinstance(a, TaskRef) for a in node.args):
            continue  # not a done task, or one Dask's fusion has changed
        waits = list(dict.fromkeys(_writer(tasks, ref.key, first_picks) for ref in node.args))
        if waits != [ref.key for ref in node.args]:
            tasks[key] = _task(key, _done, waits)
            changed = True
    return cull(tasks, list(flatten(keys)))[0] if changed else tasks


def _writer(tasks: dict, key, first_picks: dict):
    """The task that writes the block stored under ``key``: past an alias (Dask leaves one
    under the old name of each task it fuses, with the same result), and past a ``_stored``
    pick of a rewritten task's store results when that task keeps no block (or small extras
    only); a task that keeps blocks, through the first pick of its store results
    (``first_picks``), whichever block it is (it has run every store when that pick can
    run); else ``key``."""
    node = tasks.get(key)
    if isinstance(node, Alias):
        return _writer(tasks, node.target, first_picks)
    if not isinstance(node, Task) or node.func is not _stored:
        return key
    # Only a task that keeps no block for others, or keeps only small ones made after those it
    # stores: its result is then a tuple of None (and those), cheap to send to a done task on
    # another worker; a kept block would travel with it.
    (fused,) = node.dependencies
    run = getattr(tasks.get(fused), "func", None)
    if not isinstance(run, functools.partial) or run.func is not _store_as_made:
        return key
    _blocks, stores, keep, small_extras = run.args  # as ``_rewritten`` binds them
    if not keep or (small_extras and min(keep) > max(stores, default=-1)):
        return fused
    return first_picks.get(fused, key)


class _FusingArray(da.Array):
    """A Dask array whose graph is optimized by ``_fusing_optimize`` wherever it is computed."""

    __dask_optimize__ = staticmethod(_fusing_optimize)


#: Store tasks (or "done" tasks of the level below) that one "done" task waits on.
DONE_FAN_IN = 32


def fusing(stored: da.Array) -> da.Array:
    """``stored`` (a store graph, ``da.store(..., compute=False)``) as a collection whose
    multi-output tasks store their own blocks when it is computed, as inside
    ``fusing_stores``, with nothing optimized now: a graph of a million blocks is sent to a
    scheduler as it is, and rewritten and optimized there.

    The collection is one block, done when every store task is: a tree of "done" tasks, each
    waiting on ``DONE_FAN_IN`` store tasks (or done tasks). Computing the store graph itself
    would end in one task that takes every store task's result: the workers then hold all of
    them (``None``, but each held result keeps its task's state on the worker, about 10 KiB)
    until the very last block is written, and that task gathers them all from every worker.
    With the tree, a store task's result is let go as soon as its group is done. Where the
    graph is optimized, the tree waits on the tasks that write the blocks themselves, not on
    the aliases and picks of their results that Dask's fusion and the rewrite leave, one per
    block (``_waiting_on_writers``).
    """
    name = f"stored-done-{tokenize(stored.name, DONE_FAN_IN)}"
    layer = LazyLayer(name, (), _done_tasks, name, stored.name, stored.numblocks, DONE_FAN_IN)
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[stored])
    return _FusingArray(graph, name, (), meta=np.empty((), dtype=np.int8))


def _done(*_results):
    """Nothing: the block of a "done" task (``fusing``), which only waits for its dependencies."""
    return np.zeros((), dtype=np.int8)


def _done_tasks(name, stored_name, numblocks, fan_in: int) -> dict:
    """The tasks of ``fusing``'s tree: level 1 waits on the store tasks in groups of
    ``fan_in`` (in block order, so that blocks written together are released together),
    each next level on groups of the level below, and ``(name,)`` on the last level."""
    keys = [(stored_name, *index) for index in np.ndindex(*numblocks)]
    tasks, level = {}, 0
    while True:
        level += 1
        groups = [keys[start:start + fan_in] for start in range(0, len(keys), fan_in)]
        last = len(groups) == 1
        made = [(name,) if last else (f"{name}-{level}", number) for number in range(len(groups))]
        for key, group in zip(made, groups):
            tasks[key] = _task(key, _done, group)
        if last:
            return tasks
        keys = made


def _task(key, function, dependencies):
    """A task calling ``function`` on the results of ``dependencies`` (Dask's task objects,
    or a legacy tuple where the installed Dask has none)."""
    if Task is None:  # pragma: no cover - depends on the installed Dask
        return (function, *dependencies)
    return Task(key, function, *map(TaskRef, dependencies))


def _fused_key(key, stores):
    """``key`` renamed for the task that also runs ``stores`` (deterministic, like Dask's names).

    A tuple key keeps one name for all the fused tasks of its layer that store into the same
    layers, and ends with a token of its own stores. The distributed scheduler files tasks by
    name (a task group each: a few KiB of its memory and a row of its dashboard), so a name
    per task made a group per task; the token still keeps two fused forms of one task apart.
    """
    token = tokenize(stores)
    if isinstance(key, tuple):
        layers = sorted({store[0] if isinstance(store, tuple) else store for store in stores})
        return (f"{key[0]}-stored-{tokenize(key[0], layers)}", *key[1:], token)
    return f"{key}-stored-{token}"


# Whether the current thread (or task) is inside ``fusing_stores``. Dask's configuration is
# process-wide, and ``dask.config.set`` contexts entered and left by concurrent threads (two
# jobs of the service) restore each other's values out of order and can leave the rewrite on
# for good: so the rewriting optimization stays installed while any thread is inside, and
# rewrites only for the threads that asked for it.
_FUSING = contextvars.ContextVar("chunked_tensor_ops_fusing_stores", default=False)
_INSTALLED = threading.Lock()
_inside = 0
_replaced = None  # the array optimization installed before, if any
_installed = None  # the dask.config.set that installed ours (left when the last thread leaves)


@contextlib.contextmanager
def fusing_stores():
    """A context in which Dask's array optimization lets registered multi-output tasks store
    their own blocks.

    Dask optimizes a store graph when it is computed or persisted (``da.store(...,
    compute=False)``), and xarray's ``to_zarr(compute=False)`` optimizes its graph as it builds
    it: build or submit the graph inside the context. Graphs without such tasks are optimized
    exactly as Dask does. The context holds for the thread that enters it only: other threads
    keep Dask's own optimization meanwhile.

    Yields
    ------
    None

    Examples
    --------
    >>> import dask.array as da, zarr, ops
    >>> source = zarr.create_array(zarr.storage.MemoryStore(), shape=(8, 4, 4, 1), chunks=(1, 4, 4, 1),
    ...                            dtype="float32", fill_value=0)
    >>> y = ops.batch_to_space_nd(da.from_zarr(source), [2, 2], [[0, 0], [0, 0]])  # in bundles
    >>> z = zarr.create_array(zarr.storage.MemoryStore(), shape=y.shape, dtype=y.dtype, chunks=(1, 4, 8, 1))
    >>> with ops.fusing_stores():
    ...     da.store(y, z, lock=False)
    """
    global _inside, _replaced, _installed
    with _INSTALLED:
        if _inside == 0:
            _replaced = dask.config.get("array_optimize", None)
            _installed = dask.config.set(array_optimize=_optimize)
        _inside += 1
    token = _FUSING.set(True)
    try:
        yield
    finally:
        _FUSING.reset(token)
        with _INSTALLED:
            _inside -= 1
            if _inside == 0:
                _installed.__exit__(None, None, None)


def _functions(layer):
    """The functions of a materialized layer's tasks (legacy tuples or task objects); none
    for a layer that is not materialized (Blockwise layers are never multi-output tasks)."""
    mapping = layer if isinstance(layer, dict) else getattr(layer, "mapping", None)
    if not isinstance(mapping, dict):
        return ()
    return {
        node.func if isinstance(node, Task) else node[0]
        for node in mapping.values()
        if isinstance(node, Task) or (isinstance(node, tuple) and node and callable(node[0]))
    }
