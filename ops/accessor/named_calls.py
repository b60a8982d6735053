"""Named calls for the registry: each adapter runs the ``.ops`` accessor on DataArray inputs
with dim names of their own (or a ``dims`` mapping), or returns None so that the plain
function runs positionally (``ops.registry.apply``) on arrays whose dims are xarray's
``dim_0, dim_1, ...``. Names the accessor cannot map to the operator's roles are refused with
its message (which says how to name them), never read by position.

The registry imports this module, and ``ops.accessor.dataarray`` imports the registry: so the
adapters reach the accessor through ``DataArray.ops`` (registered by ``import ops``), not by
importing it, and this module imports nothing of its package.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import xarray as xr

from ops.dims import find_dims, is_named, layout_of
from ops.errors import InvalidArgument


def _depth_adapter(op: str):
    def call(arrays, kwargs, dims):
        x = arrays["x"]
        if not isinstance(x, xr.DataArray) or not (is_named(x) or dims):
            return None
        roles = x.ops._depth_roles(op, dims)  # names it does not know: refused, never read by position
        found = layout_of(x.dims, roles)
        asked = kwargs.get("data_format")
        if asked is not None and asked != found:
            raise InvalidArgument(
                f"data_format {asked!r} disagrees with the dims of x {tuple(x.dims)}, which say {found}; "
                "omit data_format to go by the dim names, or pass dims"
            )
        return x.ops._depth(op, kwargs["block_size"], kwargs.get("mode", "DCR"), roles)

    return call


def _batch_nd_adapter(op: str, pairs_name: str):
    def call(arrays, kwargs, dims):
        x = arrays["x"]
        if not isinstance(x, xr.DataArray) or not (is_named(x) or dims):
            return None
        batch = find_dims(x.dims, op, "N", "", dims)["N"]  # by name, as the accessor finds it
        spatial = [d for d in x.dims if d != batch]
        blocks, rows = kwargs.get("block_shape"), kwargs.get(pairs_name)
        padding = {"pad_value": kwargs["pad_value"]} if "pad_value" in kwargs else {}
        if isinstance(blocks, Mapping):  # the accessor's own form, {"lat": 2, "lon": 2}: by name
            return getattr(x.ops, op)(blocks, rows, dims=dims, **padding)
        blocks = blocks.tolist() if isinstance(blocks, np.ndarray) else blocks
        rows = rows.tolist() if isinstance(rows, np.ndarray) else rows
        # Shapes the mapping form cannot express: the plain function names the broken rule.
        if not isinstance(blocks, list) or len(blocks) > len(spatial):
            return None
        if rows is not None and (not isinstance(rows, list) or len(rows) != len(blocks)):
            return None
        # the accessor's form: only the dims that have padding or crops (none: not listed)
        pairs = None if rows is None else {d: r for d, r in zip(spatial, rows) if r not in ([0, 0], (0, 0))}
        return x.ops._batch(op, dict(zip(spatial, blocks)), pairs, batch, **padding)

    return call


def _space_to_batch_adapter(arrays, kwargs, dims):
    x = arrays["x"]
    if not isinstance(x, xr.DataArray) or not (is_named(x) or dims):
        return None
    roles = x.ops._square_roles(dims)
    return x.ops._space_to_batch(kwargs["block_size"], kwargs["paddings"], roles, kwargs.get("pad_value", 0))


def _gather_adapter(arrays, kwargs, dims):
    params, indices = arrays["params"], arrays["indices"]
    if not is_named(params):
        return None
    if not isinstance(indices, xr.DataArray):
        # Plain index tuples (a JSON list, an NPY payload): the points along "point", their
        # components along "index", as the accessor reads an unlabelled index dim: the params
        # dims in order (after the batch dims), so the points' labels come along as coordinates.
        leading = np.ndim(indices) - 1
        if leading < 0:
            return None  # a scalar: the plain function says what it needs
        names = ("point",) if leading == 1 else tuple(f"point_{k}" for k in range(leading))
        indices = xr.DataArray(indices, dims=(*names, "index"))
    return params.ops.gather_nd(indices, **kwargs)


def _dequant_adapter(arrays, kwargs, dims):
    src, scale = arrays["src"], arrays["deq_scale"]
    if not is_named(src) or "k_dim" in kwargs:  # k_dim is positional: the accessor derives it from names
        return None
    if isinstance(scale, xr.DataArray) and not is_named(scale):
        scale = scale.data  # no names to align by: a plain vector, along the channel dim
    return src.ops.ascend_dequant(scale, **kwargs)


NAMED_DIMS = {
    "depth_to_space": _depth_adapter("depth_to_space"),
    "space_to_depth": _depth_adapter("space_to_depth"),
    "space_to_batch": _space_to_batch_adapter,
    "space_to_batch_nd": _batch_nd_adapter("space_to_batch_nd", "paddings"),
    "batch_to_space_nd": _batch_nd_adapter("batch_to_space_nd", "crops"),
    "gather_nd": _gather_adapter,
    "ascend_dequant": _dequant_adapter,
}
