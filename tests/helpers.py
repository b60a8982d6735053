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
