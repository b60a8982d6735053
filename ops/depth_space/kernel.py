"""DepthToSpace and SpaceToDepth of one NumPy array (a whole input or one Dask block).

Both operators are one permutation of the same elements, read in opposite directions. The
kernel writes it as two views with equal shapes, one of the depth-side array and one of the
space-side array (``_paired_views``), and copies one onto the other with ``copy_into``.
"""

from __future__ import annotations

import numpy as np

from ops._copy import copy_into

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
