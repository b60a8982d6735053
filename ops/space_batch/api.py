"""The public SpaceToBatchND, SpaceToBatch and BatchToSpaceND: argument validation, then
the NumPy kernel for a NumPy array or the graph builder for a Dask array.

The ``_validate_*`` helpers live here, beside the functions whose arguments they check:
they turn the caller's arguments into validated parameters and raise
``ops.InvalidArgument`` with messages in the caller's terms.
"""

from __future__ import annotations

import math

import dask.array as da
import numpy as np

from ops import _lazy, _validate
from ops.errors import InvalidArgument
from ops.space_batch.graph_batch_to_space import _build_batch_to_space_nd
from ops.space_batch.graph_space_to_batch import _build_space_to_batch_nd
from ops.space_batch.kernel import _batch_shape, _space_shape, batch_to_space_nd_kernel, space_to_batch_nd_kernel
from ops.space_batch.padding import pad_fill, with_pad_value
from schemas import BatchToSpaceNDParams, SpaceToBatchNDParams, SpaceToBatchParams

# ---------------------------------------------------------------------------------------------
# Validation


def _validate_block_and_pairs(x, block_shape, pairs, pairs_name: str, model):
    x = _validate.array("x", x)
    shape, flat = _validate.integers("block_shape", block_shape)
    if len(shape) != 1:
        raise InvalidArgument(f"block_shape must be 1-D [M], got shape {list(shape)}")
    m = len(flat)
    rows = _validate.pairs(pairs_name, pairs, m) if m else []
    p = _validate.params(model, block_shape=flat, **{pairs_name: rows})
    if not 1 <= m < x.ndim or x.ndim > 8:
        raise InvalidArgument(
            f"x must have rank M+1..8 for block_shape of length M = {m}, "
            f"got rank {x.ndim} (shape {list(x.shape)})"
        )
    return x, p


def _validate_space_to_batch_nd(x, block_shape, paddings, pad_value=0):
    x, p = _validate_block_and_pairs(x, block_shape, paddings, "paddings", SpaceToBatchNDParams)
    fill = pad_fill(pad_value, x.dtype)
    for i, (b, (lo, hi)) in enumerate(zip(p.block_shape, p.paddings)):
        padded = x.shape[1 + i] + lo + hi
        if padded % b:
            raise InvalidArgument(
                f"padded size of spatial dim {i} (x.shape[{1 + i}] + paddings[{i}] = "
                f"{x.shape[1 + i]} + {lo} + {hi} = {padded}) must be divisible by "
                f"block_shape[{i}] = {b}"
            )
    _validate.output_shape(_batch_shape(x.shape, p.block_shape, p.paddings), x.dtype.itemsize,
                           "space_to_batch_nd")
    return x, p, fill


def _validate_batch_to_space_nd(x, block_shape, crops):
    x, p = _validate_block_and_pairs(x, block_shape, crops, "crops", BatchToSpaceNDParams)
    groups = math.prod(p.block_shape)
    if x.shape[0] % groups:
        raise InvalidArgument(
            f"batch size x.shape[0] = {x.shape[0]} must be divisible by prod(block_shape) = {groups}"
        )
    for i, (b, (lo, hi)) in enumerate(zip(p.block_shape, p.crops)):
        full = x.shape[1 + i] * b
        if lo + hi > full:
            raise InvalidArgument(
                f"crops[{i}] = [{lo}, {hi}] removes more than spatial dim {i} holds "
                f"(x.shape[{1 + i}] * block_shape[{i}] = {full})"
            )
    _validate.output_shape(_space_shape(x.shape, p.block_shape, p.crops), x.dtype.itemsize,
                           "batch_to_space_nd")
    return x, p


# ---------------------------------------------------------------------------------------------
# Public functions


def space_to_batch_nd(x, block_shape, paddings, pad_value=0):
    """Pad the spatial dims and move each offset inside a block into the batch (SpaceToBatchND).

    TensorFlow's N-D form. ``x`` is ``[B, s_1, ..., s_M, rest...]``; each spatial dim is
    padded with ``paddings[i]`` zeros before and after and cut into blocks of
    ``block_shape[i]``; the in-block offsets ``j_0..j_{M-1}`` of batch entry ``b`` go to
    output batch index ``((j_0*b_1 + j_1)*b_2 + ... + j_{M-1})*B + b`` (the input batch
    index varies fastest). Padding is ``pad_value``, by default the dtype's zero as in
    TensorFlow. The full reference is docs/operators.md.

    Parameters
    ----------
    x : numpy.ndarray or dask.array.Array
        ``[B, s_1, ..., s_M, rest...]``, rank <= 8, any supported dtype.
    block_shape : sequence of int or array of int
        ``M`` block sizes >= 1, ``1 <= M < x.ndim``.
    paddings : sequence of (int, int) or array of int
        ``[M, 2]``: cells added ``[before, after]`` each spatial dim, >= 0, with
        ``(s_i + before_i + after_i) % block_shape[i] == 0``.
    pad_value : int, float or "NaN", default 0
        The value of the added cells, representable in ``x``'s dtype: an integer in range
        for integer types, 0 or 1 for bool, any real number, NaN or an infinity for
        floating types (rounded to the nearest of the type), a real number for complex types
        (imaginary part 0). ``"NaN"`` is NaN, for JSON callers.

    Returns
    -------
    numpy.ndarray or dask.array.Array
        ``[B*prod(block_shape), (s_i + before_i + after_i) / block_shape[i]..., rest...]``,
        same dtype. Dask in: lazy; the padding costs no input reads (a ``pad_value`` other
        than zero, one more task per output block, which writes the padding cells only).

    Raises
    ------
    ops.InvalidArgument
        Block sizes < 1 or whose product overflows int64, ``paddings`` of the wrong shape or
        negative, a padded size not divisible by its block size, floats or booleans where
        integers are required, a ``pad_value`` the dtype cannot hold, an unsupported dtype.

    See Also
    --------
    batch_to_space_nd : the inverse.
    space_to_batch : the 4-D NHWC form with a square block.

    Examples
    --------
    >>> import numpy as np, ops
    >>> x = np.array([[1, 2, 3], [4, 5, 6]])   # B = 2 rows, one spatial dim of 3
    >>> y = ops.space_to_batch_nd(x, [2], [[1, 0]])   # pad one zero in front: [0 1 2 3], [0 4 5 6]
    >>> y   # rows: offset 0 of batch 0, of batch 1, then offset 1 of batch 0, of batch 1
    array([[0, 2],
           [0, 5],
           [1, 3],
           [4, 6]])
    """
    x, p, fill = _validate_space_to_batch_nd(x, block_shape, paddings, pad_value)
    out_shape = _batch_shape(x.shape, p.block_shape, p.paddings)
    if 0 in out_shape:  # nothing to move, however many block offsets there are
        return _lazy.empty(out_shape, x.dtype) if isinstance(x, da.Array) else np.zeros(out_shape, x.dtype)
    if isinstance(x, da.Array):
        return _build_space_to_batch_nd(x, p.block_shape, p.paddings, fill)
    return with_pad_value(space_to_batch_nd_kernel(x, p.block_shape, p.paddings), fill, x.shape, p.block_shape,
                          p.paddings)


def space_to_batch(x, block_size, paddings, pad_value=0):
    """Pad an NHWC image batch and move square spatial blocks into the batch (SpaceToBatch).

    The 4-D operator: with ``Hp = H + pad_top + pad_bottom`` and
    ``Wp = W + pad_left + pad_right``, both divisible by ``bs = block_size``, the result is
    ``[N*bs*bs, Hp/bs, Wp/bs, C]`` and ::

        n = n_out % N ; rem = n_out // N ; bh = rem // bs ; bw = rem % bs
        h_in = h_out*bs + bh - pad_top ; w_in = w_out*bs + bw - pad_left
        y[n_out, h_out, w_out, c] = x[n, h_in, w_in, c]  (pad_value outside x)

    It equals ``space_to_batch_nd(x, [bs, bs], np.reshape(paddings, (2, 2)), pad_value)``. The full
    reference is docs/operators.md.

    Parameters
    ----------
    x : numpy.ndarray or dask.array.Array
        ``[N, H, W, C]``, any supported dtype.
    block_size : int
        Integer >= 1 (1 is allowed, as in the Ascend description: only the padding applies).
    paddings : array_like of int
        4 integers >= 0, ``[pad_top, pad_bottom, pad_left, pad_right]``, given as shape
        ``[2, 2]``, ``[4]`` or ``[1, 4]``.
    pad_value : int, float or "NaN", default 0
        The value of the added cells, as in :func:`space_to_batch_nd`.

    Returns
    -------
    numpy.ndarray or dask.array.Array
        ``[N*bs*bs, Hp/bs, Wp/bs, C]``, same dtype; lazy for Dask input.

    Raises
    ------
    ops.InvalidArgument
        ``x`` not 4-D, ``block_size`` < 1 or not an integer, ``paddings`` not 4 integers >= 0,
        ``Hp`` or ``Wp`` not divisible by ``block_size``, a ``pad_value`` the dtype cannot
        hold, an unsupported dtype.

    See Also
    --------
    space_to_batch_nd : the N-D form.
    batch_to_space_nd : the inverse.

    Examples
    --------
    >>> import numpy as np, ops
    >>> x = np.arange(1, 7).reshape(1, 2, 3, 1)   # one 2 x 3 image: rows [1 2 3] and [4 5 6]
    >>> y = ops.space_to_batch(x, 2, [[0, 0], [0, 1]])   # one zero column on the right
    >>> y.shape
    (4, 1, 2, 1)
    >>> y[:, 0, :, 0]   # batch entries = offsets (0, 0), (0, 1), (1, 0), (1, 1) in each 2 x 2 block
    array([[1, 3],
           [2, 0],
           [4, 6],
           [5, 0]])
    """
    x = _validate.array("x", x)
    _validate.rank("x", x, "4 (NHWC)", x.ndim == 4)
    shape, flat = _validate.integers("paddings", paddings)
    if shape not in ((2, 2), (4,), (1, 4)):
        raise InvalidArgument(
            f"paddings must have 4 elements as shape [2, 2], [4] or [1, 4], got shape {list(shape)}"
        )
    pairs = ((flat[0], flat[1]), (flat[2], flat[3]))
    p = _validate.params(
        SpaceToBatchParams, block_size=_validate.integer("block_size", block_size), paddings=pairs
    )
    return space_to_batch_nd(x, [p.block_size] * 2, [list(pair) for pair in p.paddings], pad_value)


def batch_to_space_nd(x, block_shape, crops):
    """Move batch groups back into spatial blocks, then crop (BatchToSpaceND).

    The inverse of :func:`space_to_batch_nd` (TensorFlow). With
    ``B = x.shape[0] / prod(block_shape)``::

        y[b, s_1*b_0 + j_0 - c_00, ..., s_M*b_{M-1} + j_{M-1} - c_{M-1,0}, rest...]
            = x[((j_0*b_1 + j_1)*... + j_{M-1})*B + b, s_1, ..., s_M, rest...]

    The full reference is docs/operators.md.

    Parameters
    ----------
    x : numpy.ndarray or dask.array.Array
        ``[B*prod(block_shape), s_1, ..., s_M, rest...]``, rank 2..8, any supported dtype.
    block_shape : sequence of int or array of int
        ``M`` block sizes >= 1, ``1 <= M < x.ndim``.
    crops : sequence of (int, int) or array of int
        ``[M, 2]``: elements removed ``[before, after]`` each spatial dim, >= 0, never more
        than ``x.shape[i+1] * block_shape[i]``.

    Returns
    -------
    numpy.ndarray or dask.array.Array
        ``[B, x.shape[i+1]*block_shape[i] - before_i - after_i..., rest...]``, same dtype.
        Dask in: lazy; each output block interleaves one block of every group. Read from
        Zarr with large chunks, each chunk is read once through the scratch store of
        ``ops.scratch`` when one is set (docs/operators.md, BatchToSpaceND's Dask section).

    Raises
    ------
    ops.InvalidArgument
        ``x.shape[0]`` not divisible by ``prod(block_shape)``, crops larger than the dim,
        wrong shapes, negative or non-integer block sizes or crops, a rank outside 2..8.

    See Also
    --------
    space_to_batch_nd : the inverse.

    Examples
    --------
    >>> import numpy as np, ops
    >>> y = np.array([[0, 2], [0, 5], [1, 3], [4, 6]])   # space_to_batch_nd([[1, 2, 3], [4, 5, 6]], [2], [[1, 0]])
    >>> ops.batch_to_space_nd(y, [2], [[1, 0]])   # interleave the 2 groups, crop the leading 0
    array([[1, 2, 3],
           [4, 5, 6]])
    """
    x, p = _validate_batch_to_space_nd(x, block_shape, crops)
    out_shape = _space_shape(x.shape, p.block_shape, p.crops)
    if 0 in out_shape:  # nothing to move, however many block offsets there are
        return _lazy.empty(out_shape, x.dtype) if isinstance(x, da.Array) else np.zeros(out_shape, x.dtype)
    if isinstance(x, da.Array):
        return _build_batch_to_space_nd(x, p.block_shape, p.crops, out_shape)
    return batch_to_space_nd_kernel(x, p.block_shape, p.crops)
