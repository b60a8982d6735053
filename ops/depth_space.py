"""DepthToSpace and SpaceToDepth: the NumPy kernel and the Dask builder, side by side.

Both operators are one permutation of the same elements, read in opposite directions. The
kernel writes it as two views with equal shapes, one of the depth-side array and one of the
space-side array (``_paired_views``), and copies one onto the other with ``copy_into``.

Chunk plan: each output block comes from exactly one input block.
- DepthToSpace: batch/H/W keep their chunks and output H/W chunks are the input's times
  block_size. Channels: DCR needs every channel of a pixel together (one chunk); CRD only
  needs whole groups of block_size**2 channels, so its channel chunks are aligned to that.
- SpaceToDepth: H/W chunks aligned to multiples of block_size; channels one chunk for DCR,
  kept as they are for CRD (input channel c lands in output channels c*bs*bs .. +bs*bs-1).
- NCHW_VECT_C keeps the channel and vector axes in one chunk each.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
from dask.base import tokenize

from ops import _chunks, _lazy, _validate
from ops._copy import copy_into
from ops.errors import InvalidArgument
from schemas import DepthToSpaceParams, SpaceToDepthParams

# Axis letters: n batch, h/w the coarse (depth-side) spatial dims, i/j the offsets inside a
# block, c the space-side channel, o its outer part and v its inner part for NCHW_VECT_C.
# Each layout lists (depth-side axes, space-side axes); a reshape of each array to its letters
# and a transpose of the space side to the depth side's order pair every element with its image.
_LAYOUTS = {
    ("NHWC", "DCR"): ("nhwijc", "nhiwjc"),
    ("NHWC", "CRD"): ("nhwcij", "nhiwjc"),
    ("NCHW", "DCR"): ("nijchw", "nchiwj"),
    ("NCHW", "CRD"): ("ncijhw", "nchiwj"),
    ("NCHW_VECT_C", "DCR"): ("nijohwv", "nohiwjv"),
    # CRD interleaves the vector lane with the block offsets, which no view of the 5-D depth
    # array can express; the kernel goes through an NCHW copy of the depth side ("novijhw").
    ("NCHW_VECT_C", "CRD"): ("novijhw", "nohiwjv"),
}


def _sizes(space_shape: tuple[int, ...], bs: int, data_format: str) -> dict[str, int]:
    if data_format == "NHWC":
        n, hs, ws, c = space_shape
    elif data_format == "NCHW":
        n, c, hs, ws = space_shape
    else:
        n, o, hs, ws, _ = space_shape
        c = 4 * o
    return {"n": n, "h": hs // bs, "w": ws // bs, "i": bs, "j": bs, "c": c, "o": c // 4, "v": 4}


def _paired_views(depth: np.ndarray, space: np.ndarray, bs: int, data_format: str, mode: str):
    """(depth view, space view) of equal shape: element k of one is the image of element k of the other."""
    depth_axes, space_axes = _LAYOUTS[data_format, mode]
    sizes = _sizes(space.shape, bs, data_format)
    depth_view = depth.reshape([sizes[a] for a in depth_axes])
    space_view = space.reshape([sizes[a] for a in space_axes])
    return depth_view, space_view.transpose([space_axes.index(a) for a in depth_axes])


def _depth_as_nchw(depth_vect: np.ndarray) -> np.ndarray:
    """[N, C/4, H, W, 4] -> contiguous [N, C, H, W] (channel c = 4*outer + lane)."""
    n, o, h, w, v = depth_vect.shape
    nchw = np.empty((n, o * v, h, w), depth_vect.dtype)
    copy_into(nchw.reshape(n, o, v, h, w), depth_vect.transpose(0, 1, 4, 2, 3))
    return nchw


def _nchw_as_vect(nchw: np.ndarray) -> np.ndarray:
    n, c, h, w = nchw.shape
    vect = np.empty((n, c // 4, h, w, 4), nchw.dtype)
    copy_into(vect.transpose(0, 1, 4, 2, 3), nchw.reshape(n, c // 4, 4, h, w))
    return vect


def _space_shape(depth_shape, bs: int, data_format: str) -> tuple[int, ...]:
    if data_format == "NHWC":
        n, h, w, c = depth_shape
        return (n, h * bs, w * bs, c // (bs * bs))
    if data_format == "NCHW":
        n, c, h, w = depth_shape
        return (n, c // (bs * bs), h * bs, w * bs)
    n, o, h, w, v = depth_shape
    return (n, o // (bs * bs), h * bs, w * bs, v)


def _depth_shape(space_shape, bs: int, data_format: str) -> tuple[int, ...]:
    if data_format == "NHWC":
        n, h, w, c = space_shape
        return (n, h // bs, w // bs, c * bs * bs)
    if data_format == "NCHW":
        n, c, h, w = space_shape
        return (n, c * bs * bs, h // bs, w // bs)
    n, o, h, w, v = space_shape
    return (n, o * bs * bs, h // bs, w // bs, v)


def depth_to_space_kernel(x: np.ndarray, bs: int, data_format: str, mode: str) -> np.ndarray:
    """DepthToSpace of one NumPy array (a whole input or one Dask block)."""
    y = np.empty(_space_shape(x.shape, bs, data_format), x.dtype)
    if data_format == "NCHW_VECT_C" and mode == "CRD":
        x = _depth_as_nchw(x)
    depth_view, space_view = _paired_views(x, y, bs, data_format, mode)
    copy_into(space_view, depth_view)
    return y


def space_to_depth_kernel(x: np.ndarray, bs: int, data_format: str, mode: str) -> np.ndarray:
    """SpaceToDepth of one NumPy array (a whole input or one Dask block)."""
    depth_shape = _depth_shape(x.shape, bs, data_format)
    vect_crd = data_format == "NCHW_VECT_C" and mode == "CRD"
    if vect_crd:
        n, o, h, w, v = depth_shape
        depth_shape = (n, o * v, h, w)
    y = np.empty(depth_shape, x.dtype)
    depth_view, space_view = _paired_views(y, x, bs, data_format, mode)
    copy_into(depth_view, space_view)
    return _nchw_as_vect(y) if vect_crd else y


# ---------------------------------------------------------------------------------------------
# Validation


def _channel_axes(data_format: str) -> tuple[int, ...]:
    return {"NHWC": (3,), "NCHW": (1,), "NCHW_VECT_C": (1, 4)}[data_format]


def _spatial_axes(data_format: str) -> tuple[int, int]:
    return (1, 2) if data_format == "NHWC" else (2, 3)


def _check_layout(x, data_format: str) -> int:
    """The channel count of x under data_format (checking rank and the vector axis)."""
    if data_format == "NCHW_VECT_C":
        _validate.rank("x", x, "5 for NCHW_VECT_C ([N, C/4, H, W, 4])", x.ndim == 5)
        if x.shape[4] != 4:
            raise InvalidArgument(
                f"x.shape[4] must be 4 for NCHW_VECT_C ([N, C/4, H, W, 4]), got {x.shape[4]}"
            )
        return 4 * x.shape[1]
    _validate.rank("x", x, f"4 for {data_format}", x.ndim == 4)
    return x.shape[_channel_axes(data_format)[0]]


def _validated(model, x, block_size, data_format, mode):
    """(x, params, channel count): the checks both directions share."""
    p = _validate.params(
        model, block_size=_validate.integer("block_size", block_size), data_format=data_format, mode=mode
    )
    x = _validate.array("x", x)
    return x, p, _check_layout(x, p.data_format)


def _validate_depth_to_space(x, block_size, data_format, mode):
    x, p, channels = _validated(DepthToSpaceParams, x, block_size, data_format, mode)
    bs = p.block_size
    if channels % (bs * bs):
        raise InvalidArgument(
            f"input depth (channels) must be divisible by block_size**2 = {bs * bs}, "
            f"got {channels} channels"
        )
    if p.data_format == "NCHW_VECT_C" and (channels // (bs * bs)) % 4:
        raise InvalidArgument(
            f"output depth (channels / block_size**2 = {channels // (bs * bs)}) must be "
            f"divisible by 4 for NCHW_VECT_C"
        )
    _validate.output_shape(_space_shape(x.shape, bs, p.data_format), x.dtype.itemsize)
    return x, p


def _validate_space_to_depth(x, block_size, data_format, mode):
    x, p, _ = _validated(SpaceToDepthParams, x, block_size, data_format, mode)
    for axis, label in zip(_spatial_axes(p.data_format), ("height", "width")):
        if x.shape[axis] % p.block_size:
            raise InvalidArgument(
                f"input {label} (x.shape[{axis}] = {x.shape[axis]}) must be divisible by "
                f"block_size {p.block_size}"
            )
    _validate.output_shape(_depth_shape(x.shape, p.block_size, p.data_format), x.dtype.itemsize)
    return x, p


# ---------------------------------------------------------------------------------------------
# Dask builders


def depth_to_space_chunks(chunks, bs: int, data_format: str, mode: str):
    """(input chunks after rechunking, output chunks) for DepthToSpace: the plan, as a pure function."""
    chunks = [tuple(c) for c in chunks]
    channel_axes = _channel_axes(data_format)
    for axis in channel_axes:
        if mode == "CRD" and data_format != "NCHW_VECT_C":
            chunks[axis] = _chunks.align(chunks[axis], bs * bs)
        else:
            chunks[axis] = _chunks.single(chunks[axis])
    out = list(chunks)
    for axis in _spatial_axes(data_format):
        out[axis] = _chunks.scaled(chunks[axis], bs)
    out[channel_axes[0]] = _chunks.divided(chunks[channel_axes[0]], bs * bs)
    return tuple(chunks), tuple(out)


def space_to_depth_chunks(chunks, bs: int, data_format: str, mode: str):
    """(input chunks after rechunking, output chunks) for SpaceToDepth."""
    chunks = [tuple(c) for c in chunks]
    channel_axes = _channel_axes(data_format)
    if not (mode == "CRD" and data_format != "NCHW_VECT_C"):
        for axis in channel_axes:
            chunks[axis] = _chunks.single(chunks[axis])
    for axis in _spatial_axes(data_format):
        chunks[axis] = _chunks.align(chunks[axis], bs)
    out = list(chunks)
    for axis in _spatial_axes(data_format):
        out[axis] = _chunks.divided(chunks[axis], bs)
    out[channel_axes[0]] = _chunks.scaled(chunks[channel_axes[0]], bs * bs)
    return tuple(chunks), tuple(out)


def _blockwise(name, kernel, x: da.Array, plan, *args) -> da.Array:
    """One output block per input block: rechunk as planned, then map the kernel."""
    in_chunks, out_chunks = plan
    if in_chunks != x.chunks:
        x = x.rechunk(in_chunks)
    token = tokenize(x, *args)
    return x.map_blocks(
        kernel, *args,
        chunks=out_chunks,
        dtype=x.dtype,
        meta=_lazy.meta(x.ndim, x.dtype),
        name=f"{name}-{token}",
    )


# ---------------------------------------------------------------------------------------------
# Public functions


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
        plan = depth_to_space_chunks(x.chunks, *args)
        return _blockwise("depth_to_space", depth_to_space_kernel, x, plan, *args)
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
        plan = space_to_depth_chunks(x.chunks, *args)
        return _blockwise("space_to_depth", space_to_depth_kernel, x, plan, *args)
    return space_to_depth_kernel(x, *args)
