"""The xarray ``Dataset.ops`` accessor: each operator on every data variable that has the dims it
needs, by way of the ``DataArray.ops`` method of the same name (``ops.accessor.dataarray``).

The methods' docstrings are made from the DataArray methods' (``ops.accessor.docstrings``);
each method here writes only its Examples and, where the rule is not just "has the dims", which
variables it applies to.
"""

from __future__ import annotations

import warnings

import xarray as xr

from ops.accessor import conventions
from ops.accessor.coords import _warn
from ops.accessor.dataarray import OpsAccessor
from ops.accessor.docstrings import from_dataarray
from ops.dims import ROLE_LABELS, ROLES, find_dims
from ops.errors import DimensionError, NotApplicable


@xr.register_dataset_accessor("ops")
class OpsDatasetAccessor:
    """``Dataset.ops``: an operator applied to every data variable that has the dims it needs;
    the others are left untouched, except those that share a dim whose size changes, which are
    left out with one ``CoordinateDropped`` warning naming them.

    Each method takes the parameters of the ``DataArray.ops`` method of the same name and
    returns a Dataset; ``keep_attrs`` applies to the Dataset's attrs and each variable's.

    Examples
    --------
    >>> import numpy as np, xarray as xr, ops
    >>> ds = xr.Dataset({"t": (("y", "x", "band"), np.zeros((2, 2, 4)))})
    >>> print(repr(ds.ops).splitlines()[1])
    Layout: NHWC
    """

    def __init__(self, obj: xr.Dataset):
        self._obj = obj

    def __repr__(self) -> str:
        try:
            roles, problem = find_dims(tuple(self._obj.dims), "repr", "", "".join(ROLES)), None
        except DimensionError as error:
            roles, problem = None, str(error)
        text = conventions.describe(self._obj, "Dataset", roles, problem, ROLE_LABELS)
        names = ", ".join(repr(n) for n in self._obj.data_vars) or "none"
        return text.replace("\nOperators:", f"\nData variables: {names} (each one that has the dims)\nOperators:", 1)

    def _apply(self, method: str, *args, keep_attrs=None, **kwargs) -> xr.Dataset:
        ds = self._obj
        done, untouched = {}, {}
        with warnings.catch_warnings(record=True) as seen:  # the variables share coords: warn once
            warnings.simplefilter("always")
            for name, var in ds.data_vars.items():
                try:
                    done[name] = getattr(var.ops, method)(*args, keep_attrs=keep_attrs, **kwargs)
                except NotApplicable:
                    untouched[name] = var
        for category, message in dict.fromkeys((w.category, str(w.message)) for w in seen):
            _warn(message, category)
        if not done:
            raise DimensionError(f"{method}: no data variable of the Dataset has the dims it needs")
        sizes = {}
        for out in done.values():
            sizes.update(out.sizes)
        clashing = {name: [d for d in var.dims if d in sizes and var.sizes[d] != sizes[d]]
                    for name, var in untouched.items()}
        clashing = {name: dims for name, dims in clashing.items() if dims}
        if clashing:  # they cannot stay as they are beside dims of another size, nor be transformed
            shared = sorted({d for dims in clashing.values() for d in dims})
            _warn(f"{method}: data variables {sorted(clashing)} left out: they lack the dims the operator "
                  f"needs but share {shared}, whose size changes; transform them separately")
        variables = {**done, **{k: v for k, v in untouched.items() if k not in clashing}}
        attrs = ds.attrs if conventions.keep_attrs_default(keep_attrs) else {}
        return xr.Dataset({name: variables[name] for name in ds.data_vars if name in variables}, attrs=attrs)

    @from_dataarray(OpsAccessor.depth_to_space, applies_to="has height, width and channel dims")
    def depth_to_space(self, block_size, *, mode="DCR", dims=None, keep_attrs=None) -> xr.Dataset:
        """
        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> ds = xr.Dataset({"t": (("y", "x", "band"), np.zeros((1, 1, 4))), "name": ((), "demo")})
        >>> dict(ds.ops.depth_to_space(2)["t"].sizes)
        {'y': 2, 'x': 2, 'band': 1}
        """
        return self._apply("depth_to_space", block_size, mode=mode, dims=dims, keep_attrs=keep_attrs)

    @from_dataarray(OpsAccessor.space_to_depth, applies_to="has height, width and channel dims")
    def space_to_depth(self, block_size, *, mode="DCR", dims=None, keep_attrs=None) -> xr.Dataset:
        """
        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> ds = xr.Dataset({"t": (("y", "x", "band"), np.zeros((2, 2, 1)))})
        >>> dict(ds.ops.space_to_depth(2)["t"].sizes)
        {'y': 1, 'x': 1, 'band': 4}
        """
        return self._apply("space_to_depth", block_size, mode=mode, dims=dims, keep_attrs=keep_attrs)

    @from_dataarray(OpsAccessor.space_to_batch, applies_to="has batch, height and width dims")
    def space_to_batch(self, block_size, paddings=((0, 0), (0, 0)), *, pad_value=0, dims=None,
                       keep_attrs=None) -> xr.Dataset:
        """
        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> ds = xr.Dataset({"t": (("n", "y", "x"), np.zeros((1, 4, 4)))})
        >>> dict(ds.ops.space_to_batch(2)["t"].sizes)
        {'n': 4, 'y': 2, 'x': 2}
        """
        return self._apply("space_to_batch", block_size, paddings, pad_value=pad_value, dims=dims,
                           keep_attrs=keep_attrs)

    @from_dataarray(OpsAccessor.space_to_batch_nd, applies_to="has the batch dim and the named spatial dims")
    def space_to_batch_nd(self, block_shape=None, paddings=None, *, pad_value=0, dims=None, keep_attrs=None,
                          **block_shape_kwargs) -> xr.Dataset:
        """
        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> ds = xr.Dataset({"t": (("time", "y", "x"), np.zeros((1, 4, 4)))})
        >>> dict(ds.ops.space_to_batch_nd(y=2)["t"].sizes)
        {'time': 2, 'y': 2, 'x': 4}
        """
        blocks = conventions.either_dict_or_kwargs(block_shape, block_shape_kwargs, "block_shape", "space_to_batch_nd")
        return self._apply("space_to_batch_nd", blocks, paddings, pad_value=pad_value, dims=dims,
                           keep_attrs=keep_attrs)

    @from_dataarray(OpsAccessor.batch_to_space_nd, applies_to="has the batch dim and the named spatial dims")
    def batch_to_space_nd(self, block_shape=None, crops=None, *, dims=None, keep_attrs=None,
                          **block_shape_kwargs) -> xr.Dataset:
        """
        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> ds = xr.Dataset({"t": (("time", "y", "x"), np.zeros((2, 2, 4)))})
        >>> dict(ds.ops.batch_to_space_nd(y=2)["t"].sizes)
        {'time': 1, 'y': 4, 'x': 4}
        """
        blocks = conventions.either_dict_or_kwargs(block_shape, block_shape_kwargs, "block_shape", "batch_to_space_nd")
        return self._apply("batch_to_space_nd", blocks, crops, dims=dims, keep_attrs=keep_attrs)

    @from_dataarray(OpsAccessor.gather_nd, applies_to="has the dims the ``indices`` name")
    def gather_nd(self, indices, *, batch_dims=0, negative_index_support=True, scratch=None,
                  keep_attrs=None) -> xr.Dataset:
        """
        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> ds = xr.Dataset({"t": (("y", "x"), np.arange(6).reshape(2, 3))})
        >>> where = xr.DataArray([[1, 2]], dims=("point", "axis"), coords={"axis": ["y", "x"]})
        >>> ds.ops.gather_nd(where)["t"].values
        array([5])
        """
        return self._apply("gather_nd", indices, batch_dims=batch_dims,
                           negative_index_support=negative_index_support, scratch=scratch, keep_attrs=keep_attrs)

    @from_dataarray(OpsAccessor.ascend_dequant, applies_to="has the scale's dims and a src dtype")
    def ascend_dequant(self, deq_scale, *, dst_dtype, calc_count=None, mode="single_row", policy=None,
                       group_size=None, align_output=False, keep_attrs=None) -> xr.Dataset:
        """A src dtype is int32 without a policy, int32 or float32 with one.

        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> ds = xr.Dataset({"acc": (("token", "channel"), np.full((2, 2), 4, np.int32)),
        ...                  "mask": (("token",), np.array([True, False]))})
        >>> out = ds.ops.ascend_dequant(0.5, dst_dtype="float32")
        >>> out["acc"].values.tolist(), out["mask"].dtype
        ([[2.0, 2.0], [2.0, 2.0]], dtype('bool'))
        """
        return self._apply("ascend_dequant", deq_scale, dst_dtype=dst_dtype, calc_count=calc_count, mode=mode,
                           policy=policy, group_size=group_size, align_output=align_output, keep_attrs=keep_attrs)

    @from_dataarray(OpsAccessor.invert, applies_to="records a step in ``ops_history``")
    def invert(self, *, keep_attrs=None) -> xr.Dataset:
        """
        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> ds = xr.Dataset({"t": (("y", "x", "band"), np.arange(16.0).reshape(4, 4, 1))})
        >>> ds.ops.space_to_depth(2).ops.invert().equals(ds)
        True
        """
        return self._apply("invert", keep_attrs=keep_attrs)
