"""DepthToSpace/SpaceToDepth and SpaceToBatchND/BatchToSpaceND on a DataArray, dims by name.

Each operator runs the registry's plain function on ``.data`` in the layout it needs (a single
image gets a batch of one, other orders are transposed there and back) and rebuilds the result:
coordinates by ``ops.accessor.coords``, attrs plus an ``ops_history`` step. The ``checked_``
forms check the arguments first and word every error in dim names (``DataArray.ops`` methods);
the plain forms are what ``invert`` and the registry's named calls use.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import xarray as xr

from ops import registry
from ops._limits import LimitExceeded
from ops.accessor import conventions, coords
from ops.accessor.history import plain_ints, with_step
from ops.dims import find_dims, layout_of, no_other_dims
from ops.errors import DimensionError, InvalidArgument, MissingDims

_TEMPORARY_BATCH = "__ops_batch__"


# ---------------------------------------------------------------------------------------------
# DepthToSpace / SpaceToDepth


def depth_roles(arr: xr.DataArray, op: str, dims) -> dict[str, str]:
    """The H, W, C (and N, V) dims of ``arr`` for ``op``; no other dims allowed."""
    roles = find_dims(arr.dims, op, "HWC", "NV", dims)
    no_other_dims(arr, roles, op)
    return roles


def depth(arr: xr.DataArray, op: str, block_size, mode, roles: Mapping[str, str]) -> xr.DataArray:
    """``op`` (depth_to_space or space_to_depth) on the dims ``roles`` (``depth_roles``) names."""
    work, order = arr, arr.dims
    if "N" not in roles:  # a single image: a batch of one, for the operator's sake
        work = work.expand_dims(_TEMPORARY_BATCH)
        roles = {**roles, "N": _TEMPORARY_BATCH}
    data_format = layout_of(work.dims, roles)
    layout = {"NHWC": "NHWC", "NCHW": "NCHW", "NCHW_VECT_C": "NCHWV"}[data_format]
    work = work.transpose(*(roles[r] for r in layout))
    data = registry.get(op).function(work.data, block_size, data_format=data_format, mode=mode)
    factor = int(block_size)
    plan = coords.depth_plan(arr, roles, op, factor, mode)
    attrs = with_step(arr, op, block_size=factor, mode=mode,
                      dims={r: d for r, d in roles.items() if d != _TEMPORARY_BATCH})
    out = xr.DataArray(data, dims=work.dims, coords=plan.coords, attrs=plan.attrs(attrs))
    if roles["N"] in arr.dims:  # a per-band list, with the bands as the batch (not an added batch of one)
        out.attrs = per_channel_attrs(arr, out, roles["N"], op)
    out.name = conventions.name_of(arr)  # not a Dask key, which xarray takes for a name
    out.encoding.update({**conventions.cf_encoding(arr), **plan.encoding})
    out.attrs = per_channel_attrs(arr, out, roles["C"], op)
    if _TEMPORARY_BATCH in out.dims:
        out = out.isel({_TEMPORARY_BATCH: 0}, drop=True)
    return out.transpose(*order)


def per_channel_attrs(arr: xr.DataArray, out: xr.DataArray, channel: str, op: str) -> dict:
    """``out``'s attrs with those holding one entry per channel of ``arr`` (rioxarray's
    ``long_name=('B02', 'B03', ...)``) regrouped with the channels, through the result's
    ``source_<channel>`` coordinate where each new channel has one source; dropped with a
    warning where it has several (a raster writer refuses a per-band attr of the wrong length)."""
    before, after = arr.sizes[channel], out.sizes[channel]
    attrs = dict(out.attrs)
    if before == after or before < 2:
        return attrs
    source = out.coords.get(f"source_{channel}")
    for key, value in arr.attrs.items():
        if key not in attrs or key == "transform" or isinstance(value, str) or np.ndim(value) != 1 \
                or len(value) != before:  # (an affine transform is no per-channel list)
            continue
        if source is not None and source.dims == (channel,):
            attrs[key] = type(value)(value[int(i)] for i in source.values) if isinstance(value, (list, tuple)) \
                else np.asarray(value)[source.values]
        else:
            del attrs[key]
            coords._warn(f"{op}: attribute {key!r} dropped: it holds one entry per {channel} ({before}), and each "
                         f"of the {after} {channel}s of the result comes from several")
    return attrs


def checked_depth(arr: xr.DataArray, op: str, block_size, mode, dims, keep_attrs) -> xr.DataArray:
    """``depth`` after checking block_size and the dim sizes in dim names."""
    size = conventions.block_size(op, block_size)
    roles = depth_roles(arr, op, dims)
    conventions.check_depth(op, arr, roles, size)
    try:
        out = depth(arr, op, size, mode, roles)
    except (DimensionError, LimitExceeded):  # already in the caller's terms
        raise
    except InvalidArgument as error:  # a rule checked only below (the NCHW_VECT_C lane): in dim names
        order = {"NCHW": "NCHW", "NCHW_VECT_C": "NCHWV"}.get(layout_of(arr.dims, roles), "NHWC")
        axes = tuple(roles.get(r, "(batch of one)") for r in order)
        raise type(error)(conventions.in_dim_terms(str(error), axes)) from None
    return conventions.apply_keep_attrs(out, keep_attrs)


# ---------------------------------------------------------------------------------------------
# SpaceToBatch(ND) / BatchToSpaceND


def batch(arr: xr.DataArray, op: str, block_shape: Mapping, pairs: Mapping | None, batch_dim: str,
          pad_value=0) -> xr.DataArray:
    """``op`` (space_to_batch_nd or batch_to_space_nd) with the spatial dims ``block_shape`` names
    and the batch dim ``batch_dim``; SpaceToBatchND pads with ``pad_value`` (``conventions.pad_value``:
    NaN on packed integers is their fill value)."""
    if not isinstance(block_shape, Mapping):
        raise InvalidArgument(
            f"block_shape must map spatial dim names to block sizes, e.g. {{'y': 2, 'x': 2}}, "
            f"got {block_shape!r}"
        )
    roles = {"N": batch_dim}
    spatial = list(block_shape)
    pairs = dict(pairs or {})
    for name in [*spatial, *pairs]:
        if name not in arr.dims:
            raise MissingDims(f"{op}: {name!r} is not a dim of the array; its dims are {arr.dims}")
        if name == roles["N"]:
            raise DimensionError(f"{op}: {name!r} is the batch dim (N), not a spatial dim")
    if set(pairs) - set(spatial):
        raise DimensionError(f"{op}: paddings/crops name dims {sorted(set(pairs) - set(spatial))} that have no block size")
    rest = [d for d in arr.dims if d != roles["N"] and d not in spatial]
    work = arr.transpose(roles["N"], *spatial, *rest)
    blocks = [block_shape[d] for d in spatial]
    rows = [pairs.get(d, (0, 0)) for d in spatial]  # ops checks their shape and values
    padding = {}
    if op == "space_to_batch_nd":
        padding = {"pad_value": conventions.pad_value(arr, pad_value)}
    try:
        data = registry.get(op).function(work.data, blocks, rows, **padding)
    except LimitExceeded:
        raise
    except InvalidArgument as error:  # its rules in positions (x.shape[1]): say them in dim names
        raise type(error)(conventions.in_dim_terms(str(error), work.dims)) from None
    plan = coords.batch_plan(arr, roles["N"], spatial, blocks, rows, op)
    key = "paddings" if op == "space_to_batch_nd" else "crops"
    shown = {"pad_value": conventions.json_number(pad_value)} if padding and padding["pad_value"] != 0 else {}
    attrs = with_step(arr, op, block_shape=plain_ints(block_shape), **{key: plain_ints(pairs)},
                      dims={"N": roles["N"]}, **shown)
    out = xr.DataArray(data, dims=work.dims, coords=plan.coords, attrs=plan.attrs(attrs))
    if roles["N"] in arr.dims:  # a per-band list, with the bands as the batch (not an added batch of one)
        out.attrs = per_channel_attrs(arr, out, roles["N"], op)
    out.name = conventions.name_of(arr)  # not a Dask key, which xarray takes for a name
    out.encoding.update({**conventions.cf_encoding(arr), **plan.encoding})
    return out.transpose(*arr.dims)


def checked_batch(arr: xr.DataArray, op: str, block_shape, pairs, dims, keep_attrs, pad_value=0) -> xr.DataArray:
    """``batch`` after checking block sizes, paddings/crops and divisibility in dim names."""
    batch_dim = find_dims(arr.dims, op, "N", "", dims)["N"]
    return _checked_batch(arr, op, block_shape, pairs, batch_dim, keep_attrs, op, pad_value)


def _checked_batch(arr: xr.DataArray, op: str, block_shape, pairs, batch_dim: str, keep_attrs,
                   method: str, pad_value=0) -> xr.DataArray:
    key = "paddings" if op == "space_to_batch_nd" else "crops"
    if not block_shape:
        raise InvalidArgument(
            f"{method} needs a block size per spatial dim, by name: .ops.{method}(y=2, x=2) or "
            f"block_shape={{'y': 2, 'x': 2}}"
        )
    blocks = conventions.block_sizes(method, block_shape)
    if pairs is not None and not isinstance(pairs, Mapping):
        raise InvalidArgument(
            f"{method}: {key} must map spatial dim names to (before, after), e.g. {key}={{'y': (1, 1)}}, "
            f"got {pairs!r}"
        )
    rows = conventions.pairs(method, key, pairs or {})
    known = {d: b for d, b in blocks.items() if d in arr.dims and d != batch_dim}  # batch() names the rest
    if op == "space_to_batch_nd":
        conventions.check_space_to_batch(arr, known, rows)
    else:
        conventions.check_batch_to_space(arr, batch_dim, known, rows)
    try:
        out = batch(arr, op, blocks, rows, batch_dim, pad_value)
    except (DimensionError, LimitExceeded):  # already in the caller's terms
        raise
    except InvalidArgument as error:  # a rule checked only below: say it in dim names too
        raise type(error)(conventions.in_dim_terms(str(error), (batch_dim, *blocks))) from None
    return conventions.apply_keep_attrs(out, keep_attrs)


def square_space_to_batch(arr: xr.DataArray, block_size, paddings, dims, keep_attrs, pad_value=0) -> xr.DataArray:
    """SpaceToBatch: ``checked_batch`` with one block size for the H and W dims, paddings as
    ``[[top, bottom], [left, right]]``."""
    return square_space_to_batch_on(arr, block_size, paddings, square_roles(arr, dims), keep_attrs, pad_value)


def square_roles(arr: xr.DataArray, dims) -> dict[str, str]:
    """The N, H and W dims of ``arr`` for SpaceToBatch."""
    return find_dims(arr.dims, "space_to_batch", "NHW", "", dims)


def square_space_to_batch_on(arr: xr.DataArray, block_size, paddings, roles: Mapping[str, str],
                             keep_attrs, pad_value=0) -> xr.DataArray:
    """``square_space_to_batch`` on the N, H and W dims ``roles`` (``square_roles``) names."""
    flat = np.asarray(paddings, dtype=object).reshape(-1) if np.size(paddings) == 4 else None
    if flat is None:
        raise InvalidArgument(
            f"space_to_batch: paddings must have 4 elements [[top, bottom], [left, right]], got {paddings!r}"
        )
    size = conventions.block_size("space_to_batch", block_size, minimum=1)
    return _checked_batch(
        arr,
        "space_to_batch_nd",
        {roles["H"]: size, roles["W"]: size},
        {roles["H"]: tuple(flat[:2]), roles["W"]: tuple(flat[2:])},
        roles["N"],
        keep_attrs,
        method="space_to_batch",
        pad_value=pad_value,
    )
