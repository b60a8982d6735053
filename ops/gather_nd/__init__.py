"""GatherNd: ``gather_nd`` checks its arguments and builds by the plan that fits them.

One concern per module, imports pointing down the list:
- ``graph``: the in-memory Dask graphs and the rule that picks a plan;
- ``in_memory``: params that are views of one NumPy array, gathered from that array;
- ``exchange``: the all-to-all inside the graph, through groups of blocks;
- ``scratch_graph``: the all-to-all through a scratch store;
- ``layer``: a graph layer whose tasks are made only when the graph is materialised;
- ``plan``: planning on chunk tuples and index arrays;
- ``kernel``: NumPy only, the kernel and the functions tasks run on blocks.
"""

from __future__ import annotations

import math

import dask.array as da
import numpy as np

from ops import _scratch, _validate
from ops.errors import InvalidArgument
from ops.gather_nd.graph import _choose_and_build
from ops.gather_nd.kernel import check_index_values, gather_nd_kernel
from schemas import GatherNdParams

__all__ = ["check_index_values", "gather_nd", "gather_nd_kernel"]


def _validate_gather_nd(params, indices, batch_dims, negative_index_support):
    p = _validate.params(
        GatherNdParams,
        batch_dims=_validate.integer("batch_dims", batch_dims),
        negative_index_support=negative_index_support,
    )
    params = _validate.array("params", params)
    if not isinstance(indices, (np.ndarray, da.Array)):
        indices = np.asarray(indices)
    if indices.dtype.newbyteorder("=") not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise InvalidArgument(f"indices dtype must be int32 or int64, got {indices.dtype}")
    if any(math.isnan(n) for n in indices.shape):
        raise InvalidArgument(
            f"indices has unknown chunk sizes {indices.shape}; call indices.compute_chunk_sizes() first"
        )
    r, q, b = params.ndim, indices.ndim, p.batch_dims
    if r < 1:
        raise InvalidArgument("params must have rank >= 1, got rank 0")
    if q < 1:
        raise InvalidArgument("indices must have rank >= 1, got rank 0")
    if b >= min(q, r):
        raise InvalidArgument(
            f"batch_dims must be < min(rank(indices), rank(params)) = {min(q, r)}, got {b}"
        )
    if params.shape[:b] != indices.shape[:b]:
        raise InvalidArgument(
            f"the first batch_dims = {b} dims of params and indices must be equal, got "
            f"{list(params.shape[:b])} and {list(indices.shape[:b])}"
        )
    c = indices.shape[-1]
    if not 1 <= c <= r - b:
        raise InvalidArgument(
            f"indices.shape[-1] (the index tuple length) must be in 1..rank(params) - batch_dims "
            f"= {r - b}, got {c}"
        )
    out_shape = (*indices.shape[:-1], *params.shape[b + c :])
    _validate.output_shape(out_shape, params.dtype.itemsize, "gather_nd")
    return params, indices, p, out_shape


def gather_nd(params, indices, *, batch_dims=0, negative_index_support=True, scratch=None):
    """Gather elements or slices of ``params`` at the index tuples in the last axis of ``indices``.

    Each tuple of ``c = indices.shape[-1]`` values selects one element (``c = r - b``) or
    one slice (``c < r - b``) of ``params``; with ``batch_dims = b`` the first b dims of
    both arrays are a shared batch (ONNX's and TensorFlow's ``batch_dims``). Negative
    values count from the end, as in ONNX, unless ``negative_index_support`` is False. The
    full reference is docs/operators.md.

    Parameters
    ----------
    params : numpy.ndarray or dask.array.Array
        Rank r >= 1, any supported dtype (bit-exact: elements are moved, not computed on).
    indices : numpy.ndarray or dask.array.Array
        int32 or int64, rank q >= 1, ``1 <= indices.shape[-1] <= r - batch_dims``. Lazy
        (Dask) indices are checked when computed; concrete ones before anything is built.
    batch_dims : int, default 0
        ``0 <= batch_dims < min(q, r)``; the first ``batch_dims`` dims of ``params`` and
        ``indices`` must be equal.
    negative_index_support : bool, default True
        True: values in ``[-s, s-1]`` for a dim of size s. False: ``[0, s-1]``.
    scratch : str, os.PathLike or mapping, optional
        Where lazy indices into params larger than a quarter of Dask's ``array.chunk-size``
        exchange their gathered rows: a directory every worker reaches or an fsspec URL, or
        ``{"url": ..., "storage_options": {...}}``. The graph then stays linear in the blocks
        with about one block per task, and a finished gather removes its files. Default: the
        store set with ``ops.scratch``, else none (the rows go through worker memory).

    Returns
    -------
    numpy.ndarray or dask.array.Array
        ``indices.shape[:-1] + params.shape[batch_dims + c:]``, the dtype of ``params``.
        Dask: only the ``params`` blocks that the indices hit are read.

    Raises
    ------
    ops.InvalidArgument
        ``indices`` not int32/int64, a tuple length of 0 or more than ``r - batch_dims``, an
        invalid ``batch_dims`` or unequal batch dims, an unsupported ``params`` dtype.
    IndexError
        An index value outside its range (always so for a 0-sized dim); the message names
        its position, its value and the allowed range.

    Examples
    --------
    >>> import numpy as np, ops
    >>> params = np.array([[0, 1], [2, 3]])
    >>> ops.gather_nd(params, np.array([[0, 0], [1, 1]]))   # two elements
    array([0, 3])
    >>> ops.gather_nd(params, np.array([[1], [0]]))   # two rows
    array([[2, 3],
           [0, 1]])
    >>> ops.gather_nd(params, np.array([[-1, -2]]))   # negative values count from the end
    array([2])
    >>> ops.gather_nd(params, np.array([[-1, 0]]), negative_index_support=False)
    Traceback (most recent call last):
        ...
    IndexError: indices[0, 0] = -1 is out of range for dimension 0 of size 2 (allowed 0..1, negative_index_support=False)
    >>> cube = np.arange(8).reshape(2, 2, 2)
    >>> ops.gather_nd(cube, np.array([[1], [0]]), batch_dims=1)   # row 1 of cube[0], row 0 of cube[1]
    array([[2, 3],
           [4, 5]])
    """
    params, indices, p, out_shape = _validate_gather_nd(params, indices, batch_dims, negative_index_support)
    store = _scratch.as_scratch(scratch) if scratch is not None else _scratch.configured()
    return _choose_and_build(params, indices, p.batch_dims, p.negative_index_support, out_shape, store)
