"""The argument checks of DepthToSpace and SpaceToDepth: parameters, rank, divisibility, output size."""

from __future__ import annotations

from ops import _validate
from ops.depth_space.kernel import _depth_shape, _space_shape
from ops.depth_space.plan import _channel_axes, _spatial_axes
from ops.errors import InvalidArgument
from schemas import DepthToSpaceParams, SpaceToDepthParams


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
    _validate.output_shape(_space_shape(x.shape, bs, p.data_format), x.dtype.itemsize, "depth_to_space")
    return x, p


def _validate_space_to_depth(x, block_size, data_format, mode):
    x, p, _ = _validated(SpaceToDepthParams, x, block_size, data_format, mode)
    for axis, label in zip(_spatial_axes(p.data_format), ("height", "width")):
        if x.shape[axis] % p.block_size:
            raise InvalidArgument(
                f"input {label} (x.shape[{axis}] = {x.shape[axis]}) must be divisible by "
                f"block_size {p.block_size}"
            )
    _validate.output_shape(_depth_shape(x.shape, p.block_size, p.data_format), x.dtype.itemsize,
                           "space_to_depth")
    return x, p
