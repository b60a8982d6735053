"""DepthToSpace and SpaceToDepth: the public functions, for NumPy and Dask arrays.

The per-block kernel is in ``kernel``, the chunk plans in ``plan``, the Dask graph in
``graph`` and the argument checks in ``validate``.
"""

from __future__ import annotations

import dask.array as da

from ops.depth_space.graph import depth_to_space_graph, space_to_depth_graph
from ops.depth_space.kernel import depth_to_space_kernel, space_to_depth_kernel
from ops.depth_space.plan import depth_to_space_chunks, space_to_depth_chunks
from ops.depth_space.validate import _validate_depth_to_space, _validate_space_to_depth

__all__ = [
    "depth_to_space",
    "depth_to_space_chunks",
    "depth_to_space_kernel",
    "space_to_depth",
    "space_to_depth_chunks",
    "space_to_depth_kernel",
]


def depth_to_space(x, block_size, *, data_format="NHWC", mode="DCR"):
    """Rearrange channel groups into ``block_size x block_size`` spatial blocks (DepthToSpace).

    Each input pixel's ``C`` channels become a ``block_size x block_size`` block of output
    pixels with ``C / block_size**2`` channels each. In NHWC indexing, with
    ``bs = block_size``, ``C' = C / bs**2`` and ``0 <= i, j < bs``::

        DCR: y[n, h*bs + i, w*bs + j, c] = x[n, h, w, (i*bs + j)*C' + c]
        CRD: y[n, h*bs + i, w*bs + j, c] = x[n, h, w, c*bs*bs + i*bs + j]

    NCHW and NCHW_VECT_C apply the same map to their own axes. Elements are moved, never
    computed on, so the result is bit-exact for every supported dtype (bool, integers,
    float16, bfloat16, float32/64, complex32/64/128). The full reference, with the choices
    where TensorFlow and ONNX differ, is docs/operators.md.

    Parameters
    ----------
    x : numpy.ndarray or dask.array.Array
        ``[N, H, W, C]`` (NHWC), ``[N, C, H, W]`` (NCHW) or ``[N, C/4, H, W, 4]``
        (NCHW_VECT_C, channel ``c = 4*c_outer + c_inner``). C must be divisible by
        ``block_size**2`` (for NCHW_VECT_C, ``C / block_size**2`` by 4 as well).
    block_size : int
        Integer >= 2 (1 is refused, as TensorFlow does).
    data_format : {"NHWC", "NCHW", "NCHW_VECT_C"}, default "NHWC"
        Layout of ``x`` and of the result.
    mode : {"DCR", "CRD"}, default "DCR"
        ``"DCR"``: TensorFlow, ONNX's default. ``"CRD"``: ONNX CRD, PyTorch ``pixel_shuffle``.

    Returns
    -------
    numpy.ndarray or dask.array.Array
        NHWC ``[N, H*bs, W*bs, C']``, NCHW ``[N, C', H*bs, W*bs]`` or NCHW_VECT_C
        ``[N, C'/4, H*bs, W*bs, 4]``, same dtype. NumPy in: computed. Dask in: lazy, each
        output block computed from exactly one input block.

    Raises
    ------
    ops.InvalidArgument
        ``block_size`` < 2 or not an integer, an unknown ``data_format`` or ``mode``, the
        wrong rank, channels not divisible by ``block_size**2``, an unsupported dtype; the
        message names the parameter, the rule and the value.

    See Also
    --------
    space_to_depth : the exact inverse.

    Examples
    --------
    >>> import numpy as np, ops
    >>> x = np.arange(8).reshape(1, 1, 1, 8)   # NHWC: one pixel with 8 channels
    >>> y = ops.depth_to_space(x, 2)
    >>> y.shape
    (1, 2, 2, 2)
    >>> y[0, :, :, 0]   # DCR: channel (i*2 + j)*2 + c lands on pixel (i, j), channel c
    array([[0, 2],
           [4, 6]])
    >>> ops.depth_to_space(x, 2, mode="CRD")[0, :, :, 0]   # CRD: channel c*4 + i*2 + j
    array([[0, 1],
           [2, 3]])
    """
    x, p = _validate_depth_to_space(x, block_size, data_format, mode)
    args = (p.block_size, p.data_format, p.mode)
    if isinstance(x, da.Array):
        return depth_to_space_graph(x, *args)
    return depth_to_space_kernel(x, *args)


def space_to_depth(x, block_size, *, data_format="NHWC", mode="DCR"):
    """Move ``block_size x block_size`` spatial blocks into channels (SpaceToDepth).

    The exact inverse of :func:`depth_to_space` with the same parameters: ``[N, H, W, C]``
    becomes ``[N, H/bs, W/bs, C*bs*bs]`` (NHWC; NCHW and NCHW_VECT_C likewise), and
    ``depth_to_space(space_to_depth(x, bs), bs)`` is ``x`` bit for bit. The full
    reference is docs/operators.md.

    Parameters
    ----------
    x : numpy.ndarray or dask.array.Array
        ``[N, H, W, C]`` (NHWC), ``[N, C, H, W]`` (NCHW) or ``[N, C/4, H, W, 4]``
        (NCHW_VECT_C). H and W must be divisible by ``block_size``.
    block_size : int
        Integer >= 2.
    data_format : {"NHWC", "NCHW", "NCHW_VECT_C"}, default "NHWC"
        Layout of ``x`` and of the result.
    mode : {"DCR", "CRD"}, default "DCR"
        Channel order of the result, as in :func:`depth_to_space`.

    Returns
    -------
    numpy.ndarray or dask.array.Array
        Same dtype. Dask in: lazy; H/W chunks are aligned to multiples of ``block_size``
        first, so each output block comes from one input block.

    Raises
    ------
    ops.InvalidArgument
        ``block_size`` < 2 or not an integer, an unknown ``data_format`` or ``mode``, the
        wrong rank, H or W not divisible by ``block_size``, an unsupported dtype.

    See Also
    --------
    depth_to_space : the exact inverse.

    Examples
    --------
    >>> import numpy as np, ops
    >>> x = np.arange(1, 17).reshape(1, 4, 4, 1)   # a 4 x 4 image: rows 1..4, 5..8, 9..12, 13..16
    >>> z = ops.space_to_depth(x, 2)
    >>> z.shape
    (1, 2, 2, 4)
    >>> z[0, 0, 0]   # the top-left 2 x 2 block, row by row
    array([1, 2, 5, 6])
    >>> bool((ops.depth_to_space(z, 2) == x).all())
    True
    """
    x, p = _validate_space_to_depth(x, block_size, data_format, mode)
    args = (p.block_size, p.data_format, p.mode)
    if isinstance(x, da.Array):
        return space_to_depth_graph(x, *args)
    return space_to_depth_kernel(x, *args)
