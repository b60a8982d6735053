"""The xarray ``Dataset.ops`` accessor: each operator on every data variable that has the dims it
needs, by way of the ``DataArray.ops`` method of the same name (``ops.accessor``).
"""

from __future__ import annotations

import xarray as xr

from ops import _conventions
from ops.dims import ROLE_LABELS, find_dims
from ops.errors import DimensionError, NotApplicable


@xr.register_dataset_accessor("ops")
class OpsDatasetAccessor:
    """``Dataset.ops``: an operator applied to every data variable that has the dims it needs;
    the others are left untouched (and must not share a dim whose size changes).

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
            roles, problem = find_dims(tuple(self._obj.dims), "repr", "", "NHWCV"), None
        except DimensionError as error:
            roles, problem = None, str(error)
        text = _conventions.describe(self._obj, "Dataset", roles, problem, ROLE_LABELS)
        names = ", ".join(repr(n) for n in self._obj.data_vars) or "none"
        return text.replace("\nOperators:", f"\nData variables: {names} (each one that has the dims)\nOperators:", 1)

    def _apply(self, method: str, *args, keep_attrs=None, **kwargs) -> xr.Dataset:
        ds = self._obj
        done, untouched = {}, {}
        for name, var in ds.data_vars.items():
            try:
                done[name] = getattr(var.ops, method)(*args, keep_attrs=keep_attrs, **kwargs)
            except NotApplicable:
                untouched[name] = var
        if not done:
            raise DimensionError(f"{method}: no data variable of the Dataset has the dims it needs")
        sizes = {}
        for out in done.values():
            sizes.update(out.sizes)
        for name, var in untouched.items():
            clash = [d for d in var.dims if d in sizes and var.sizes[d] != sizes[d]]
            if clash:
                raise DimensionError(
                    f"{method}: data variable {name!r} lacks the dims the operator needs but shares "
                    f"{clash}, whose size changes; drop or transform it separately"
                )
        variables = {**done, **untouched}
        attrs = ds.attrs if _conventions.keep_attrs_default(keep_attrs) else {}
        return xr.Dataset({name: variables[name] for name in ds.data_vars}, attrs=attrs)

    def depth_to_space(self, block_size, *, mode="DCR", dims=None, keep_attrs=None) -> xr.Dataset:
        """DepthToSpace on every data variable with height, width and channel dims.

        Parameters
        ----------
        block_size : int
            Block edge, >= 2 (see ``DataArray.ops.depth_to_space``).
        mode : {"DCR", "CRD"}, default "DCR"
            Channel order.
        dims : dict of str to str, optional
            Roles to dim names for names that are not recognised.
        keep_attrs : bool, optional
            Keep attrs; default ``xr.set_options(keep_attrs=...)``, else True.

        Returns
        -------
        xarray.Dataset
            The transformed variables beside the untouched ones.

        Raises
        ------
        DimensionError
            If no variable has the dims, or an untouched one shares a dim whose size changes.
        InvalidArgument
            If a parameter is invalid for a variable that has the dims.

        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> ds = xr.Dataset({"t": (("y", "x", "band"), np.zeros((1, 1, 4))), "name": ((), "demo")})
        >>> dict(ds.ops.depth_to_space(2)["t"].sizes)
        {'y': 2, 'x': 2, 'band': 1}
        """
        return self._apply("depth_to_space", block_size, mode=mode, dims=dims, keep_attrs=keep_attrs)

    def space_to_depth(self, block_size, *, mode="DCR", dims=None, keep_attrs=None) -> xr.Dataset:
        """SpaceToDepth on every data variable with height, width and channel dims.

        Parameters
        ----------
        block_size : int
            Block edge, >= 2 (see ``DataArray.ops.space_to_depth``).
        mode : {"DCR", "CRD"}, default "DCR"
            Channel order.
        dims : dict of str to str, optional
            Roles to dim names for names that are not recognised.
        keep_attrs : bool, optional
            Keep attrs; default ``xr.set_options(keep_attrs=...)``, else True.

        Returns
        -------
        xarray.Dataset
            The transformed variables beside the untouched ones.

        Raises
        ------
        DimensionError
            If no variable has the dims, or an untouched one shares a dim whose size changes.
        InvalidArgument
            If a parameter is invalid for a variable that has the dims.

        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> ds = xr.Dataset({"t": (("y", "x", "band"), np.zeros((2, 2, 1)))})
        >>> dict(ds.ops.space_to_depth(2)["t"].sizes)
        {'y': 1, 'x': 1, 'band': 4}
        """
        return self._apply("space_to_depth", block_size, mode=mode, dims=dims, keep_attrs=keep_attrs)

    def space_to_batch(self, block_size, paddings=((0, 0), (0, 0)), *, dims=None, keep_attrs=None) -> xr.Dataset:
        """SpaceToBatch (square blocks of height and width) on every data variable with N, H, W dims.

        Parameters
        ----------
        block_size : int
            Block edge (>= 1) for height and width.
        paddings : array_like of int, default ((0, 0), (0, 0))
            ``[[top, bottom], [left, right]]``.
        dims : dict of str to str, optional
            Roles to dim names for names that are not recognised.
        keep_attrs : bool, optional
            Keep attrs; default ``xr.set_options(keep_attrs=...)``, else True.

        Returns
        -------
        xarray.Dataset
            The transformed variables beside the untouched ones.

        Raises
        ------
        DimensionError
            If no variable has the dims, or an untouched one shares a dim whose size changes.
        InvalidArgument
            If a parameter is invalid for a variable that has the dims.

        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> ds = xr.Dataset({"t": (("n", "y", "x"), np.zeros((1, 4, 4)))})
        >>> dict(ds.ops.space_to_batch(2)["t"].sizes)
        {'n': 4, 'y': 2, 'x': 2}
        """
        return self._apply("space_to_batch", block_size, paddings, dims=dims, keep_attrs=keep_attrs)

    def space_to_batch_nd(self, block_shape=None, paddings=None, *, dims=None, keep_attrs=None,
                          **block_shape_kwargs) -> xr.Dataset:
        """SpaceToBatchND on every data variable with the batch dim and the named spatial dims.

        Parameters
        ----------
        block_shape : dict of str to int, optional
            Block size per spatial dim, e.g. ``{"y": 2}``; or as keywords (not both).
        paddings : dict of str to (int, int), optional
            Zeros added (before, after) per spatial dim.
        dims : dict of str to str, optional
            The batch dim if its name is not recognised, e.g. ``{"N": "sample"}``.
        keep_attrs : bool, optional
            Keep attrs; default ``xr.set_options(keep_attrs=...)``, else True.
        **block_shape_kwargs : int
            The keyword form of ``block_shape``.

        Returns
        -------
        xarray.Dataset
            The transformed variables beside the untouched ones.

        Raises
        ------
        DimensionError
            If no variable has the dims, or an untouched one shares a dim whose size changes.
        InvalidArgument
            If a parameter is invalid, or both the mapping and the keyword form are given.

        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> ds = xr.Dataset({"t": (("time", "y", "x"), np.zeros((1, 4, 4)))})
        >>> dict(ds.ops.space_to_batch_nd(y=2)["t"].sizes)
        {'time': 2, 'y': 2, 'x': 4}
        """
        blocks = _conventions.either_dict_or_kwargs(block_shape, block_shape_kwargs, "block_shape", "space_to_batch_nd")
        return self._apply("space_to_batch_nd", blocks, paddings, dims=dims, keep_attrs=keep_attrs)

    def batch_to_space_nd(self, block_shape=None, crops=None, *, dims=None, keep_attrs=None,
                          **block_shape_kwargs) -> xr.Dataset:
        """BatchToSpaceND on every data variable with the batch dim and the named spatial dims.

        Parameters
        ----------
        block_shape : dict of str to int, optional
            Block size per spatial dim, e.g. ``{"y": 2}``; or as keywords (not both).
        crops : dict of str to (int, int), optional
            Entries removed (before, after) per spatial dim.
        dims : dict of str to str, optional
            The batch dim if its name is not recognised, e.g. ``{"N": "sample"}``.
        keep_attrs : bool, optional
            Keep attrs; default ``xr.set_options(keep_attrs=...)``, else True.
        **block_shape_kwargs : int
            The keyword form of ``block_shape``.

        Returns
        -------
        xarray.Dataset
            The transformed variables beside the untouched ones.

        Raises
        ------
        DimensionError
            If no variable has the dims, or an untouched one shares a dim whose size changes.
        InvalidArgument
            If a parameter is invalid, or both the mapping and the keyword form are given.

        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> ds = xr.Dataset({"t": (("time", "y", "x"), np.zeros((2, 2, 4)))})
        >>> dict(ds.ops.batch_to_space_nd(y=2)["t"].sizes)
        {'time': 1, 'y': 4, 'x': 4}
        """
        blocks = _conventions.either_dict_or_kwargs(block_shape, block_shape_kwargs, "block_shape", "batch_to_space_nd")
        return self._apply("batch_to_space_nd", blocks, crops, dims=dims, keep_attrs=keep_attrs)

    def gather_nd(self, indices, *, batch_dims=0, negative_index_support=True, keep_attrs=None) -> xr.Dataset:
        """GatherNd on every data variable that has the dims the ``indices`` name.

        Parameters
        ----------
        indices : xarray.DataArray
            Index tuples along its last dim (labels of that dim name the indexed dims).
        batch_dims : int, default 0
            Leading dims of ``indices`` shared with each variable.
        negative_index_support : bool, default True
            Whether ``-1`` counts from the end.
        keep_attrs : bool, optional
            Keep attrs; default ``xr.set_options(keep_attrs=...)``, else True.

        Returns
        -------
        xarray.Dataset
            The gathered variables beside the untouched ones.

        Raises
        ------
        DimensionError
            If no variable has the dims, or an untouched one shares a dim whose size changes.
        IndexError
            If an index is out of range.

        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> ds = xr.Dataset({"t": (("y", "x"), np.arange(6).reshape(2, 3))})
        >>> where = xr.DataArray([[1, 2]], dims=("point", "axis"), coords={"axis": ["y", "x"]})
        >>> ds.ops.gather_nd(where)["t"].values
        array([5])
        """
        return self._apply("gather_nd", indices, batch_dims=batch_dims,
                           negative_index_support=negative_index_support, keep_attrs=keep_attrs)

    def ascend_dequant(self, deq_scale, *, dst_dtype, calc_count=None, mode="single_row", policy=None,
                       group_size=None, align_output=False, keep_attrs=None) -> xr.Dataset:
        """AscendDequant on every data variable that has the scale's dims and a src dtype.

        Variables of another dtype (int32 is needed without a policy, int32 or float32 with
        one) or without the scale's dims are left untouched.

        Parameters
        ----------
        deq_scale : float, numpy.ndarray or xarray.DataArray
            The scale (see ``DataArray.ops.ascend_dequant``).
        dst_dtype : {"float16", "bfloat16", "float32"} or numpy.dtype
            The output dtype.
        calc_count : int, optional
            Columns (classic) or elements (policies) scaled.
        mode : {"single_row", "multi_row"}, default "single_row"
            The device's reading of a single row.
        policy : {None, "per_token", "per_group"}, default None
            How the scale maps onto the elements.
        group_size : int, optional
            Group length for ``policy="per_group"``.
        align_output : bool, default False
            Pad the column dim to a multiple of 32 bytes.
        keep_attrs : bool, optional
            Keep attrs; default ``xr.set_options(keep_attrs=...)``, else True.

        Returns
        -------
        xarray.Dataset
            The dequantised variables beside the untouched ones.

        Raises
        ------
        DimensionError
            If no variable fits, or an untouched one shares a dim whose size changes.
        InvalidArgument
            If a parameter is invalid for a variable that fits.

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

    def invert(self, *, keep_attrs=None) -> xr.Dataset:
        """Undo the last operator on every data variable that records one in ``ops_history``.

        Parameters
        ----------
        keep_attrs : bool, optional
            Keep attrs; default ``xr.set_options(keep_attrs=...)``, else True.

        Returns
        -------
        xarray.Dataset
            The variables before their last step, beside the untouched ones.

        Raises
        ------
        DimensionError
            If no variable has an ``ops_history``.
        InvalidArgument
            If a last step has no inverse.

        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> ds = xr.Dataset({"t": (("y", "x", "band"), np.arange(16.0).reshape(4, 4, 1))})
        >>> ds.ops.space_to_depth(2).ops.invert().equals(ds)
        True
        """
        return self._apply("invert", keep_attrs=keep_attrs)
