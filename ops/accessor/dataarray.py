"""``DataArray.ops``: every operator on named dims, lazily on Dask-backed data. This module holds
the accessor's public methods: their signatures and reference docstrings.

The layout comes from dim names (``ops.dims``) or an explicit ``dims={"N": ..., "H": ..., ...}``;
NHWC or NCHW is read from the order of the dims, any other order is transposed internally and
back, so callers never transpose. The work is done by the package's other modules:
``named_rearrange``, ``named_gather`` and ``named_dequant`` run the operators, ``coords`` keeps
the coordinates that stay true (dropping the others with a warning), ``history`` records each
step in ``attrs["ops_history"]`` for ``invert``, and ``conventions`` follows xarray's (keyword
forms, ``keep_attrs``, errors in dim names, the ``repr``).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from ops import registry
from ops.accessor import conventions, named_rearrange
from ops.accessor.history import undo_last, with_step
from ops.accessor.named_dequant import dequant_by_name
from ops.accessor.named_gather import gather_by_name
from ops.dims import ROLE_LABELS, ROLES, find_dims
from ops.errors import DimensionError


@xr.register_dataarray_accessor("ops")
class OpsAccessor:
    """``DataArray.ops``: the operators of ``ops`` on named dims. Holds no state.

    Dims are found by name (``time``/``y``/``x``/``band``, ...) or given with ``dims=``;
    ``repr(arr.ops)`` shows what was found. Every method is lazy on Dask-backed data, takes
    ``keep_attrs`` (default: ``xr.set_options(keep_attrs=...)``, else True) and records
    itself in ``attrs["ops_history"]`` for ``invert``.

    Examples
    --------
    >>> import numpy as np, xarray as xr, ops
    >>> arr = xr.DataArray(np.zeros((2, 4, 6, 8)), dims=("time", "y", "x", "band"))
    >>> print(repr(arr.ops).splitlines()[1])
    Layout: NHWC
    """

    def __init__(self, obj: xr.DataArray):
        self._obj = obj

    def __repr__(self) -> str:
        try:
            roles, problem = find_dims(self._obj.dims, "repr", "", "".join(ROLES)), None
        except DimensionError as error:
            roles, problem = None, str(error)
        return conventions.describe(self._obj, "DataArray", roles, problem, ROLE_LABELS)

    # For invert() and the registry's named calls, which resolve the dims' roles themselves
    # (once per call) and pass them on.
    def _depth_roles(self, op: str, dims) -> dict[str, str]:
        return named_rearrange.depth_roles(self._obj, op, dims)

    def _depth(self, op: str, block_size, mode, roles) -> xr.DataArray:
        return named_rearrange.depth(self._obj, op, block_size, mode, roles)

    def _batch(self, op: str, block_shape, pairs, batch_dim: str, pad_value=0) -> xr.DataArray:
        return named_rearrange.batch(self._obj, op, block_shape, pairs, batch_dim, pad_value)

    def _square_roles(self, dims) -> dict[str, str]:
        return named_rearrange.square_roles(self._obj, dims)

    def _space_to_batch(self, block_size, paddings, roles, pad_value=0) -> xr.DataArray:
        return named_rearrange.square_space_to_batch_on(self._obj, block_size, paddings, roles, None, pad_value)

    # --- DepthToSpace / SpaceToDepth ---------------------------------------------------------

    def depth_to_space(self, block_size, *, mode="DCR", dims=None, keep_attrs=None) -> xr.DataArray:
        """DepthToSpace on the height, width and channel dims, found by name.

        Moves ``block_size**2`` channel groups into ``block_size x block_size`` spatial blocks:
        H and W grow by ``block_size``, C shrinks by ``block_size**2``. The batch dim is
        optional (a single image); NHWC or NCHW is read from the order of the dims.

        Parameters
        ----------
        block_size : int
            Block edge, >= 2; the channel dim's size must be divisible by ``block_size**2``.
        mode : {"DCR", "CRD"}, default "DCR"
            Channel order: DCR (TensorFlow, ONNX default) or CRD (PyTorch ``pixel_shuffle``).
        dims : dict of str to str, optional
            Roles to dim names, e.g. ``{"H": "row", "W": "col", "C": "feature"}``, for dims
            whose names are not recognised (see ``repr(arr.ops)``).
        keep_attrs : bool, optional
            Keep ``attrs``; default ``xr.set_options(keep_attrs=...)``, else True.

        Returns
        -------
        xarray.DataArray
            Same dims in the same order, lazy if the input is Dask-backed.

        Raises
        ------
        DimensionError
            If the height, width or channel dim is missing or ambiguous.
        InvalidArgument
            If ``block_size`` or ``mode`` is invalid, or the channel dim does not divide.

        See Also
        --------
        ops.depth_to_space, space_to_depth, invert

        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> x = xr.DataArray(np.arange(8).reshape(1, 2, 4), dims=("y", "x", "band"))
        >>> y = x.ops.depth_to_space(2)
        >>> dict(y.sizes)
        {'y': 2, 'x': 4, 'band': 1}
        >>> y.values[..., 0]
        array([[0, 1, 4, 5],
               [2, 3, 6, 7]])
        """
        return named_rearrange.checked_depth(self._obj, "depth_to_space", block_size, mode, dims, keep_attrs)

    def space_to_depth(self, block_size, *, mode="DCR", dims=None, keep_attrs=None) -> xr.DataArray:
        """SpaceToDepth on the height, width and channel dims, found by name.

        The exact inverse of ``depth_to_space`` with the same parameters: each
        ``block_size x block_size`` spatial block becomes ``block_size**2`` channels.

        Parameters
        ----------
        block_size : int
            Block edge, >= 2; the height and width dims must be divisible by it.
        mode : {"DCR", "CRD"}, default "DCR"
            Channel order of the blocks (see ``depth_to_space``).
        dims : dict of str to str, optional
            Roles to dim names, e.g. ``{"H": "row", "W": "col", "C": "feature"}``.
        keep_attrs : bool, optional
            Keep ``attrs``; default ``xr.set_options(keep_attrs=...)``, else True.

        Returns
        -------
        xarray.DataArray
            Same dims in the same order, lazy if the input is Dask-backed.

        Raises
        ------
        DimensionError
            If the height, width or channel dim is missing or ambiguous.
        InvalidArgument
            If ``block_size`` or ``mode`` is invalid, or height or width does not divide.

        See Also
        --------
        ops.space_to_depth, depth_to_space, invert

        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> x = xr.DataArray(np.arange(8).reshape(2, 4, 1), dims=("y", "x", "band"))
        >>> y = x.ops.space_to_depth(2)
        >>> dict(y.sizes)
        {'y': 1, 'x': 2, 'band': 4}
        >>> y.values[0]
        array([[0, 1, 4, 5],
               [2, 3, 6, 7]])
        """
        return named_rearrange.checked_depth(self._obj, "space_to_depth", block_size, mode, dims, keep_attrs)

    # --- SpaceToBatch(ND) / BatchToSpaceND -----------------------------------------------------

    def space_to_batch_nd(self, block_shape=None, paddings=None, *, pad_value=0, dims=None, keep_attrs=None,
                          **block_shape_kwargs) -> xr.DataArray:
        """SpaceToBatchND with the spatial dims by name: blocks of each move to the batch dim.

        Each named spatial dim is padded, then cut into blocks of its block size; the
        block offsets become the batch dim (``N * prod(block sizes)`` entries) and the dims
        shrink to the number of blocks. Dims not named keep their size.

        Parameters
        ----------
        block_shape : dict of str to int, optional
            Block size (>= 1) per spatial dim, e.g. ``{"y": 2, "x": 2}``; or give them as
            keywords, ``.ops.space_to_batch_nd(y=2, x=2)`` (not both).
        paddings : dict of str to (int, int), optional
            Cells added (before, after) per spatial dim, e.g. ``{"y": (1, 1)}``; dims not
            listed are not padded. Each padded size must divide by the block size.
        pad_value : int, float or "NaN", default 0
            The value of the added cells, in the array's own values: NaN marks them missing
            (on packed integers read without decoding, their ``_FillValue``).
        dims : dict of str to str, optional
            The batch dim if its name is not recognised, e.g. ``{"N": "sample"}``.
        keep_attrs : bool, optional
            Keep ``attrs``; default ``xr.set_options(keep_attrs=...)``, else True.
        **block_shape_kwargs : int
            The keyword form of ``block_shape``.

        Returns
        -------
        xarray.DataArray
            Same dims in the same order, lazy if the input is Dask-backed.

        Raises
        ------
        DimensionError
            If there is no batch dim, or a named dim is not a dim of the array or is the batch dim.
        InvalidArgument
            If a block size or padding is not a valid integer, a padded size does not divide,
            the dtype cannot hold ``pad_value``, or both the mapping and the keyword form are given.

        See Also
        --------
        ops.space_to_batch_nd, batch_to_space_nd, invert

        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> x = xr.DataArray(np.arange(12).reshape(1, 3, 4), dims=("time", "y", "x"))
        >>> dict(x.ops.space_to_batch_nd(y=2, x=2, paddings={"y": (1, 0)}).sizes)
        {'time': 4, 'y': 2, 'x': 2}
        """
        blocks = conventions.either_dict_or_kwargs(block_shape, block_shape_kwargs, "block_shape", "space_to_batch_nd",
                                                   self._obj.dims, ("block_shape", "paddings", "pad_value", "dims",
                                                                    "keep_attrs"))
        return named_rearrange.checked_batch(self._obj, "space_to_batch_nd", blocks, paddings, dims, keep_attrs,
                                             pad_value)

    def batch_to_space_nd(self, block_shape=None, crops=None, *, dims=None, keep_attrs=None,
                          **block_shape_kwargs) -> xr.DataArray:
        """BatchToSpaceND with the spatial dims by name: the inverse of ``space_to_batch_nd``.

        The batch dim's ``prod(block sizes)`` groups go back into blocks of the named spatial
        dims, which grow by their block sizes; then ``crops`` are cut off.

        Parameters
        ----------
        block_shape : dict of str to int, optional
            Block size (>= 1) per spatial dim, e.g. ``{"y": 2, "x": 2}``; or give them as
            keywords, ``.ops.batch_to_space_nd(y=2, x=2)`` (not both).
        crops : dict of str to (int, int), optional
            Entries removed (before, after) per spatial dim, e.g. ``{"y": (1, 0)}``; dims not
            listed are not cropped.
        dims : dict of str to str, optional
            The batch dim if its name is not recognised, e.g. ``{"N": "sample"}``.
        keep_attrs : bool, optional
            Keep ``attrs``; default ``xr.set_options(keep_attrs=...)``, else True.
        **block_shape_kwargs : int
            The keyword form of ``block_shape``.

        Returns
        -------
        xarray.DataArray
            Same dims in the same order, lazy if the input is Dask-backed.

        Raises
        ------
        DimensionError
            If there is no batch dim, or a named dim is not a dim of the array or is the batch dim.
        InvalidArgument
            If a block size or crop is not a valid integer, the batch dim does not divide by
            the product of the block sizes, crops remove more than a dim holds, or both the
            mapping and the keyword form are given.

        See Also
        --------
        ops.batch_to_space_nd, space_to_batch_nd, invert

        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> x = xr.DataArray(np.arange(16).reshape(4, 2, 2), dims=("time", "y", "x"))
        >>> dict(x.ops.batch_to_space_nd(y=2, x=2, crops={"y": (1, 0)}).sizes)
        {'time': 1, 'y': 3, 'x': 4}
        """
        blocks = conventions.either_dict_or_kwargs(block_shape, block_shape_kwargs, "block_shape", "batch_to_space_nd",
                                                   self._obj.dims, ("block_shape", "crops", "dims", "keep_attrs"))
        return named_rearrange.checked_batch(self._obj, "batch_to_space_nd", blocks, crops, dims, keep_attrs)

    def space_to_batch(self, block_size, paddings=((0, 0), (0, 0)), *, pad_value=0, dims=None,
                       keep_attrs=None) -> xr.DataArray:
        """SpaceToBatch (the seed's 4-D form): square blocks of the height and width dims.

        ``space_to_batch_nd`` with the same block size for height and width, found by name.

        Parameters
        ----------
        block_size : int
            Block edge (>= 1) for both the height and the width dim.
        paddings : array_like of int, default ((0, 0), (0, 0))
            Four numbers ``[[top, bottom], [left, right]]`` (or flat, or ``[1, 4]``): cells
            added to the height and width dims.
        pad_value : int, float or "NaN", default 0
            The value of the added cells, as in ``space_to_batch_nd``.
        dims : dict of str to str, optional
            Roles to dim names (N, H, W) for names that are not recognised.
        keep_attrs : bool, optional
            Keep ``attrs``; default ``xr.set_options(keep_attrs=...)``, else True.

        Returns
        -------
        xarray.DataArray
            Same dims in the same order, lazy if the input is Dask-backed.

        Raises
        ------
        DimensionError
            If the batch, height or width dim is missing or ambiguous.
        InvalidArgument
            If ``block_size`` or ``paddings`` is invalid or a padded size does not divide.

        See Also
        --------
        ops.space_to_batch, space_to_batch_nd

        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> x = xr.DataArray(np.zeros((1, 4, 4, 3)), dims=("n", "y", "x", "c"))
        >>> dict(x.ops.space_to_batch(2).sizes)
        {'n': 4, 'y': 2, 'x': 2, 'c': 3}
        """
        return named_rearrange.square_space_to_batch(self._obj, block_size, paddings, dims, keep_attrs, pad_value)

    def gather_nd(self, indices: xr.DataArray, *, batch_dims=0, negative_index_support=True, scratch=None,
                  keep_attrs=None) -> xr.DataArray:
        """Gather at index tuples along the last dim of the ``indices`` DataArray.

        If that dim has a coordinate, its labels name the params dims the tuple components
        index (e.g. ``["y", "x"]``); otherwise they index the params dims in order, after the
        ``batch_dims`` leading dims (shared by name). The result has the indices' leading dims
        followed by the remaining params dims, with the indexed dims' coordinates gathered
        along (NumPy-backed indices).

        Parameters
        ----------
        indices : xarray.DataArray
            Integer (int32/int64) index tuples along its last dim; NumPy- or Dask-backed.
        batch_dims : int, default 0
            How many leading dims of ``indices`` are batch dims shared (by name) with params.
        negative_index_support : bool, default True
            Whether ``-1`` counts from the end; if False, negative indices are an error.
        scratch : str, os.PathLike or mapping, optional
            Where Dask-backed indices into large params exchange their gathered rows (see
            ``ops.gather_nd``).
        keep_attrs : bool, optional
            Keep params' ``attrs``; default ``xr.set_options(keep_attrs=...)``, else True.

        Returns
        -------
        xarray.DataArray
            Dims: the indices' leading dims, then params' dims that were not indexed.

        Raises
        ------
        DimensionError
            If the labels of the tuple dim do not name params dims, or batch dims are missing.
        InvalidArgument
            If ``indices`` is not a DataArray or ``batch_dims`` is out of range.
        IndexError
            If an index is out of range (for Dask indices: when computed).

        See Also
        --------
        ops.gather_nd

        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> grid = xr.DataArray(np.arange(12).reshape(3, 4), dims=("y", "x"))
        >>> where = xr.DataArray([[2, 0], [0, 3]], dims=("point", "axis"), coords={"axis": ["y", "x"]})
        >>> grid.ops.gather_nd(where).values
        array([8, 3])
        """
        out = gather_by_name(self._obj, indices, batch_dims=batch_dims, negative_index_support=negative_index_support,
                             scratch=scratch)
        return conventions.apply_keep_attrs(out, keep_attrs)

    def ascend_dequant(self, deq_scale, *, dst_dtype, calc_count=None, mode="single_row", policy=None,
                       group_size=None, align_output=False, keep_attrs=None) -> xr.DataArray:
        """AscendDequant, ``dst(f32(src) * f32(scale))``, with the scale matched by dim name.

        src may have any number of dims: the column dim is found from the scale (below) and
        all other dims are the rows, flattened in their order (lazily) and restored after, so
        ``(batch, token, channel)`` works as ``[batch * token, channel]``.

        - classic (``policy=None``): a number, or a 1-D DataArray whose dim is the column dim;
          a plain number or array applies along the last dim.
        - ``"per_token"``: a DataArray with every dim of src except the column dim.
        - ``"per_group"``: a DataArray with one group dim of its own and every dim of src except
          the grouped one: grouping the last dim is ``k_dim=1``; grouping the first dim of a
          2-D src is ``k_dim=0``.

        Labelled dims are aligned by label (``.sel``), so scales may come in any order.

        Parameters
        ----------
        deq_scale : float, numpy.ndarray or xarray.DataArray
            The scale. float16 output takes packed uint64 scales:
            ``deq_scale=ops.pack_deq_scale(scale)``.
        dst_dtype : {"float16", "bfloat16", "float32"} or numpy.dtype
            The output dtype.
        calc_count : int, optional
            Classic: columns scaled (the rest pass through); policies: elements scaled, a
            multiple of the column count, counted over the flattened rows.
        mode : {"single_row", "multi_row"}, default "single_row"
            The device's reading of a single row (see ``ops.ascend_dequant``).
        policy : {None, "per_token", "per_group"}, default None
            How the scale maps onto the elements (above).
        group_size : int, optional
            Group length for ``policy="per_group"`` (a multiple of 32).
        align_output : bool, default False
            Pad the column dim with zeros to a multiple of 32 bytes (its coordinates are then
            dropped).
        keep_attrs : bool, optional
            Keep ``attrs``; default ``xr.set_options(keep_attrs=...)``, else True.

        Returns
        -------
        xarray.DataArray
            src's dims in src's order, dtype ``dst_dtype``; lazy if src is Dask-backed.

        Raises
        ------
        DimensionError
            If the scale's dims do not fit src's as the policy requires.
        InvalidArgument
            If a dtype, shape or parameter is not supported (the message names the fix).

        See Also
        --------
        ops.ascend_dequant, ops.pack_deq_scale

        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> src = xr.DataArray(np.arange(12, dtype=np.int32).reshape(2, 3, 2), dims=("batch", "token", "channel"))
        >>> scale = xr.DataArray(np.array([0.5, 2.0], np.float32), dims="channel")
        >>> out = src.ops.ascend_dequant(scale, dst_dtype="float32")
        >>> out.dims, out.values[1, 2].tolist()
        (('batch', 'token', 'channel'), [5.0, 22.0])
        >>> src.ops.ascend_dequant(ops.pack_deq_scale(scale), dst_dtype="float16").dtype
        dtype('float16')
        """
        src = self._obj
        out = dequant_by_name(src, deq_scale, function=registry.get("ascend_dequant").function,
                              dst_dtype=dst_dtype, calc_count=calc_count, mode=mode, policy=policy,
                              group_size=group_size, align_output=align_output)
        out.attrs = with_step(src, "ascend_dequant", dst_dtype=str(np.dtype(out.dtype)), policy=policy)
        return conventions.apply_keep_attrs(out, keep_attrs)

    def invert(self, *, keep_attrs=None) -> xr.DataArray:
        """Undo the last operator recorded in ``attrs["ops_history"]``.

        DepthToSpace <-> SpaceToDepth with the same block size, mode and dims;
        SpaceToBatchND <-> BatchToSpaceND with crops = paddings. The result has the attrs
        from before the undone step.

        Parameters
        ----------
        keep_attrs : bool, optional
            Keep ``attrs``; default ``xr.set_options(keep_attrs=...)``, else True. False gives
            a result without attrs.

        Returns
        -------
        xarray.DataArray
            The array before the last step, lazy if the input is Dask-backed.

        Raises
        ------
        NotApplicable
            If ``attrs`` has no ``ops_history``.
        InvalidArgument
            If the last step has no inverse (GatherNd, AscendDequant).

        Examples
        --------
        >>> import numpy as np, xarray as xr, ops
        >>> x = xr.DataArray(np.arange(16).reshape(4, 4, 1), dims=("y", "x", "band"))
        >>> x.ops.space_to_depth(2).ops.invert().equals(x)
        True
        """
        return conventions.apply_keep_attrs(undo_last(self), keep_attrs, history=False)
