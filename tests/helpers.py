"""Test helpers: random arrays of every supported dtype, random chunkings, exact comparison."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
from hypothesis import strategies as st

from ops import dtypes

ALL_DTYPES = dtypes.SUPPORTED


def random_array(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Random bit patterns (NaN payloads, negative zeros, subnormals included); bools are 0/1."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    count = int(np.prod(shape))
    raw = rng.integers(0, 256, size=count * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def assert_same(actual, expected) -> None:
    """Same shape, same dtype, same bytes."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert np.ascontiguousarray(actual).tobytes() == np.ascontiguousarray(expected).tobytes()


def compute(array: da.Array) -> np.ndarray:
    """Compute a Dask result, checking that every block has the chunk shape the graph promised.

    The graph is optimized and run once, as ``array.compute()`` would, its blocks kept apart
    (``to_delayed``) and then joined (``np.block``). (Computing ``array.blocks[index]`` for
    every block, then the whole array again, cost most of the operators' property tests.)"""
    if array.ndim == 0:
        return array.compute(scheduler="sync")
    blocks = dask.compute(*array.to_delayed().ravel().tolist(), scheduler="sync")
    grid = np.empty(array.numblocks, dtype=object)
    for index, block in zip(np.ndindex(*array.numblocks), blocks):
        expected = tuple(array.chunks[axis][k] for axis, k in enumerate(index))
        assert block.shape == expected, (index, block.shape, expected)
        assert block.dtype == array.dtype
        grid[index] = block
    return np.block(grid.tolist())


@st.composite
def chunking(draw, length: int) -> tuple[int, ...]:
    """A random chunking of an axis of ``length``."""
    if length == 0:
        return (0,)
    cuts = draw(st.sets(st.integers(1, length - 1), max_size=min(length - 1, 4))) if length > 1 else set()
    points = [0, *sorted(cuts), length]
    return tuple(b - a for a, b in zip(points, points[1:]))


@st.composite
def chunkings(draw, shape) -> tuple[tuple[int, ...], ...]:
    return tuple(draw(chunking(n)) for n in shape)


dtype_strategy = st.sampled_from(ALL_DTYPES)


def stores_as_made(graph) -> list:
    """The keys of the tasks in ``graph`` (a collection's, as it is, not optimized again; or a
    mapping of tasks) that make several blocks and store each as it is made
    (``ops.fusing_stores``)."""
    import functools

    from dask._task_spec import Task, convert_legacy_graph

    from ops._fused_stores import _store_as_made

    tasks = convert_legacy_graph(dict(graph.__dask_graph__() if hasattr(graph, "__dask_graph__") else graph))
    return [key for key, task in tasks.items()
            if isinstance(task, Task) and isinstance(task.func, functools.partial) and task.func.func is _store_as_made]


def _nested_tasks(value) -> list:
    """Tasks (task objects, aliases, legacy task tuples) and references nested anywhere in a
    task's argument, below its top level."""
    from dask._task_spec import GraphNode, TaskRef

    if isinstance(value, (GraphNode, TaskRef)):
        return [value]
    if isinstance(value, tuple) and value and callable(value[0]):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [found for item in value for found in _nested_tasks(item)]
    return []


def assert_flat_layer(graph, name: str) -> int:
    """Assert that every task of layer ``name`` of ``graph`` is a key of the graph (an alias) or
    a task object whose arguments are plain data and ``TaskRef`` arguments at its top level, each
    key once (a distributed scheduler holds every nested task as an object of its own for the
    whole run); the number of tasks."""
    from dask._task_spec import Task, TaskRef

    layer = dict(graph.layers[name])
    for key, task in layer.items():
        if not isinstance(task, Task):
            try:
                alias = task in graph
            except TypeError:  # unhashable: a legacy task tuple with lists in it
                alias = False
            assert alias, (key, task)
            continue
        refs = [arg.key for arg in task.args if isinstance(arg, TaskRef)]
        assert len(refs) == len(set(refs)), (key, refs)
        assert not [found for arg in task.args if not isinstance(arg, TaskRef) for found in _nested_tasks(arg)], key
    return len(layer)
