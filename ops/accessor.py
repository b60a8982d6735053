"""The xarray ``.ops`` accessor: every operator on named dims, lazily on Dask-backed data.

``import ops`` registers ``DataArray.ops`` and ``Dataset.ops``. The layout comes from dim
names (N: ``n``/``batch``/``sample``/``time``..., H: ``y``/``height``/``lat``..., W: ``x``/
``width``/``lon``..., C: ``c``/``channel``/``band``..., V: the NCHW_VECT_C lane) or from an
explicit ``dims={"N": ..., "H": ..., "W": ..., "C": ...}``. NHWC or NCHW is read from the order
of the dims; any other order is transposed internally and back, so callers never transpose.

Every method calls the plain ``ops`` function on ``.data`` and rebuilds the result: dims and
coordinates the operator does not touch are kept, coordinates on the dims it touches follow the
rules of ``ops._coords`` (refined/coarsened grids, block grids with provenance coordinates,
channel labels, GeoTransform; what cannot stay true is dropped with a warning), attrs are kept, and ``attrs["ops_history"]``
records the operator and its parameters so that ``.ops.invert()`` can undo it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np
import xarray as xr

from ops import _conventions, _coords, _validate, registry
from ops._named_dequant import dequant_by_name
from ops.errors import InvalidArgument

ROLE_NAMES = {
    "N": ("n", "batch", "sample", "samples", "image", "images", "time"),
    "H": ("h", "y", "height", "row", "rows", "lat", "latitude"),
    "W": ("w", "x", "width", "col", "cols", "column", "columns", "lon", "longitude"),
    "C": ("c", "channel", "channels", "band", "bands", "feature", "features", "depth"),
    "V": ("v", "vect", "vector", "vec", "lane", "lanes", "c_inner"),
}
ROLE_LABELS = {"N": "batch", "H": "height", "W": "width", "C": "channel", "V": "vector lane"}
HISTORY = "ops_history"
_TEMPORARY_BATCH = "__ops_batch__"


class DimensionError(InvalidArgument):
    """The dims an operator needs are missing, ambiguous or named wrongly."""


class NotApplicable(InvalidArgument):
    """The operator does not apply to this array (a Dataset leaves such variables untouched)."""


class MissingDims(DimensionError, NotApplicable):
    """The array lacks a dim the operator needs."""


# ---------------------------------------------------------------------------------------------
# Dims by name


def find_dims(dims, op: str, required: str, optional: str = "", explicit=None) -> dict[str, str]:
    """Map roles (letters of ``required`` and ``optional``) to dim names.

    ``explicit`` (``{"H": "row", ...}``) wins; other roles are recognised by name
    (ROLE_NAMES, case-insensitive). Raises DimensionError with the ``dims=`` call that fixes it.
    """
    dims = tuple(dims)
    roles: dict[str, str] = {}
    for role, name in (explicit or {}).items():
        if role not in ROLE_NAMES:
            raise DimensionError(f"dims keys must be among {', '.join(ROLE_NAMES)}, got {role!r}")
        if name not in dims:
            raise DimensionError(f"dims[{role!r}] = {name!r} is not a dim of the array; its dims are {dims}")
        roles[role] = name
    taken = set(roles.values())
    for role in required + optional:
        if role in roles:
            continue
        matches = [d for d in dims if d not in taken and str(d).lower() in ROLE_NAMES[role]]
        if len(matches) > 1:
            raise DimensionError(
                f"{op}: dims {matches} all look like the {ROLE_LABELS[role]} dim ({role}); say which, "
                f"e.g. .ops.{op}(..., dims={{{role!r}: {matches[0]!r}}})"
            )
        if matches:
            roles[role] = matches[0]
            taken.add(matches[0])
    missing = [role for role in required if role not in roles]
    if missing:
        found = ", ".join(f"{r}={roles[r]!r}" for r in roles) or "none"
        unassigned = [d for d in dims if d not in taken]
        if len(unassigned) == len(missing):  # the leftover dims are the likely answer
            guesses = dict(zip(missing, unassigned))
        else:
            guesses = {r: f"<{ROLE_LABELS[r]} dim>" for r in missing}
        suggestion = {**roles, **guesses}
        raise MissingDims(
            f"{op} needs {', '.join(f'{ROLE_LABELS[r]} ({r})' for r in missing)} dim(s) among {dims}; "
            f"recognised {found}. Name them: .ops.{op}(..., dims={suggestion!r})"
        )
    return roles


def _no_other_dims(arr: xr.DataArray, roles: Mapping[str, str], op: str) -> None:
    extra = [d for d in arr.dims if d not in roles.values()]
    if extra:
        raise DimensionError(
            f"{op}: dims {extra} are none of {'/'.join(roles)}; select or stack them first, "
            f"or assign them a role with dims={{...}} (found {dict(roles)})"
        )


# ---------------------------------------------------------------------------------------------
# Coordinates and attrs


# Coordinate rules (refine/coarsen, block grids, provenance coords, channel labels, GeoTransform)
# live in ops._coords; the accessor only calls them.
_kept_coords = _coords.kept_coords


def _history(arr, operator: str, **parameters) -> dict:
    """attrs of the result: the input's, plus this step appended to ``ops_history``."""
    attrs = dict(arr.attrs)
    steps = json.loads(attrs.get(HISTORY, "[]"))
    steps.append({"operator": operator, "parameters": parameters})
    attrs[HISTORY] = json.dumps(steps)
    return attrs


def _plain_ints(mapping: Mapping) -> dict:
    """{dim: int or (int, int)} as JSON-friendly values (NumPy ints included)."""
    return {str(k): (int(v) if np.ndim(v) == 0 else [int(x) for x in v]) for k, v in mapping.items()}


# ---------------------------------------------------------------------------------------------
# DataArray accessor


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
            roles, problem = find_dims(self._obj.dims, "repr", "", "NHWCV"), None
        except DimensionError as error:
            roles, problem = None, str(error)
        return _conventions.describe(self._obj, "DataArray", roles, problem, ROLE_LABELS)

    # --- DepthToSpace / SpaceToDepth ---------------------------------------------------------

    def _depth(self, op: str, block_size, mode, dims):
        arr = self._obj
        roles = find_dims(arr.dims, op, "HWC", "NV", dims)
        _no_other_dims(arr, roles, op)
        work, order = arr, arr.dims
        if "N" not in roles:  # a single image: a batch of one, for the operator's sake
            work = work.expand_dims(_TEMPORARY_BATCH)
            roles = {**roles, "N": _TEMPORARY_BATCH}
        data_format = "NCHW_VECT_C" if "V" in roles else _layout(work.dims, roles)
        layout = {"NHWC": "NHWC", "NCHW": "NCHW", "NCHW_VECT_C": "NCHWV"}[data_format]
        work = work.transpose(*(roles[r] for r in layout))
        data = registry.get(op).function(work.data, block_size, data_format=data_format, mode=mode)
        factor = int(block_size)
        plan = _coords.depth_plan(arr, roles, op, factor, mode)
        attrs = _history(arr, op, block_size=factor, mode=mode,
                         dims={r: d for r, d in roles.items() if d != _TEMPORARY_BATCH})
        out = xr.DataArray(data, dims=work.dims, coords=plan.coords, attrs=plan.attrs(attrs), name=arr.name)
        out.encoding.update(plan.encoding)
        if _TEMPORARY_BATCH in out.dims:
            out = out.isel({_TEMPORARY_BATCH: 0}, drop=True)
        return out.transpose(*order)

    def _checked_depth(self, op: str, block_size, mode, dims, keep_attrs) -> xr.DataArray:
        """``_depth`` after checking block_size and the dim sizes in dim names."""
        size = _conventions.block_size(op, block_size)
        roles = find_dims(self._obj.dims, op, "HWC", "NV", dims)
        _no_other_dims(self._obj, roles, op)
        _conventions.check_depth(op, self._obj, roles, size)
        return _conventions.apply_keep_attrs(self._depth(op, size, mode, dims), keep_attrs)

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
        return self._checked_depth("depth_to_space", block_size, mode, dims, keep_attrs)

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
        return self._checked_depth("space_to_depth", block_size, mode, dims, keep_attrs)

    # --- SpaceToBatch(ND) / BatchToSpaceND -----------------------------------------------------

    def _batch(self, op: str, block_shape: Mapping, pairs: Mapping | None, dims):
        arr = self._obj
        if not isinstance(block_shape, Mapping):
            raise InvalidArgument(
                f"block_shape must map spatial dim names to block sizes, e.g. {{'y': 2, 'x': 2}}, "
                f"got {block_shape!r}"
            )
        roles = find_dims(arr.dims, op, "N", "", dims)
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
        data = registry.get(op).function(work.data, blocks, rows)
        plan = _coords.batch_plan(arr, roles["N"], spatial, blocks, rows, op)
        key = "paddings" if op == "space_to_batch_nd" else "crops"
        attrs = _history(arr, op, block_shape=_plain_ints(block_shape), **{key: _plain_ints(pairs)},
                         dims={"N": roles["N"]})
        out = xr.DataArray(data, dims=work.dims, coords=plan.coords, attrs=plan.attrs(attrs), name=arr.name)
        out.encoding.update(plan.encoding)
        return out.transpose(*arr.dims)

    def _checked_batch(self, op: str, block_shape, pairs, dims, keep_attrs, method: str | None = None):
        """``_batch`` after checking block sizes, paddings/crops and divisibility in dim names."""
        method = method or op
        key = "paddings" if op == "space_to_batch_nd" else "crops"
        if not block_shape:
            raise InvalidArgument(
                f"{method} needs a block size per spatial dim, by name: .ops.{method}(y=2, x=2) or "
                f"block_shape={{'y': 2, 'x': 2}}"
            )
        blocks = _conventions.block_sizes(method, block_shape)
        if pairs is not None and not isinstance(pairs, Mapping):
            raise InvalidArgument(
                f"{method}: {key} must map spatial dim names to (before, after), e.g. {key}={{'y': (1, 1)}}, "
                f"got {pairs!r}"
            )
        rows = _conventions.pairs(method, key, pairs or {})
        batch = find_dims(self._obj.dims, op, "N", "", dims)["N"]
        known = {d: b for d, b in blocks.items() if d in self._obj.dims and d != batch}  # _batch names the rest
        if op == "space_to_batch_nd":
            _conventions.check_space_to_batch(self._obj, known, rows)
        else:
            _conventions.check_batch_to_space(self._obj, batch, known, rows)
        try:
            out = self._batch(op, blocks, rows, dims)
        except DimensionError:
            raise
        except InvalidArgument as error:  # a rule checked only below: say it in dim names too
            raise type(error)(_conventions.in_dim_terms(str(error), (batch, *blocks))) from None
        return _conventions.apply_keep_attrs(out, keep_attrs)

    def space_to_batch_nd(self, block_shape=None, paddings=None, *, dims=None, keep_attrs=None,
                          **block_shape_kwargs) -> xr.DataArray:
        """SpaceToBatchND with the spatial dims by name: blocks of each move to the batch dim.

        Each named spatial dim is zero-padded, then cut into blocks of its block size; the
        block offsets become the batch dim (``N * prod(block sizes)`` entries) and the dims
        shrink to the number of blocks. Dims not named keep their size.

        Parameters
        ----------
        block_shape : dict of str to int, optional
            Block size (>= 1) per spatial dim, e.g. ``{"y": 2, "x": 2}``; or give them as
            keywords, ``.ops.space_to_batch_nd(y=2, x=2)`` (not both).
        paddings : dict of str to (int, int), optional
            Zeros added (before, after) per spatial dim, e.g. ``{"y": (1, 1)}``; dims not
            listed are not padded. Each padded size must divide by the block size.
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
            or both the mapping and the keyword form are given.

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
        blocks = _conventions.either_dict_or_kwargs(block_shape, block_shape_kwargs, "block_shape", "space_to_batch_nd")
        return self._checked_batch("space_to_batch_nd", blocks, paddings, dims, keep_attrs)

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
        blocks = _conventions.either_dict_or_kwargs(block_shape, block_shape_kwargs, "block_shape", "batch_to_space_nd")
        return self._checked_batch("batch_to_space_nd", blocks, crops, dims, keep_attrs)

    def space_to_batch(self, block_size, paddings=((0, 0), (0, 0)), *, dims=None, keep_attrs=None) -> xr.DataArray:
        """SpaceToBatch (the seed's 4-D form): square blocks of the height and width dims.

        ``space_to_batch_nd`` with the same block size for height and width, found by name.

        Parameters
        ----------
        block_size : int
            Block edge (>= 1) for both the height and the width dim.
        paddings : array_like of int, default ((0, 0), (0, 0))
            Four numbers ``[[top, bottom], [left, right]]`` (or flat, or ``[1, 4]``): zeros
            added to the height and width dims.
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
        roles = find_dims(self._obj.dims, "space_to_batch", "NHW", "", dims)
        flat = np.asarray(paddings, dtype=object).reshape(-1) if np.size(paddings) == 4 else None
        if flat is None:
            raise InvalidArgument(
                f"space_to_batch: paddings must have 4 elements [[top, bottom], [left, right]], got {paddings!r}"
            )
        size = _conventions.block_size("space_to_batch", block_size, minimum=1)
        return self._checked_batch(
            "space_to_batch_nd",
            {roles["H"]: size, roles["W"]: size},
            {roles["H"]: tuple(flat[:2]), roles["W"]: tuple(flat[2:])},
            {"N": roles["N"]},
            keep_attrs,
            method="space_to_batch",
        )

    # --- GatherNd ---------------------------------------------------------------------------

    def gather_nd(self, indices: xr.DataArray, *, batch_dims=0, negative_index_support=True) -> xr.DataArray:
        """Gather at index tuples along the last dim of the ``indices`` DataArray.

        If that dim has a coordinate, its labels name the params dims the tuple components
        index (e.g. ``["y", "x"]``); otherwise they index the params dims in order, after the
        ``batch_dims`` leading dims (shared by name). The result has the indices' leading dims
        followed by the remaining params dims, with the indexed dims' coordinates gathered
        along (NumPy-backed indices).
        """
        params = self._obj
        if not isinstance(indices, xr.DataArray):
            raise InvalidArgument("indices must be a DataArray whose last dim holds the index tuples "
                                  "(use ops.gather_nd for plain arrays)")
        tuple_dim, lead = indices.dims[-1], indices.dims[:-1]
        b = _validate.integer("batch_dims", batch_dims)
        if not 0 <= b < len(indices.dims):
            raise InvalidArgument(f"batch_dims must be in 0..{len(indices.dims) - 1} (the indices' leading dims), got {b}")
        batch = list(lead[:b])
        for name in batch:
            if name not in params.dims:
                raise MissingDims(f"gather_nd: batch dim {name!r} of indices is not a dim of params {params.dims}")
        if tuple_dim in indices.coords:
            indexed = [str(v) for v in np.asarray(indices[tuple_dim].values)]
            absent = [d for d in indexed if d not in params.dims]
            if absent:
                raise MissingDims(f"gather_nd: params has no dims {absent} (named by indices dim {tuple_dim!r}); its dims are {params.dims}")
            if set(indexed) & set(batch) or len(set(indexed)) != len(indexed):
                raise DimensionError(
                    f"gather_nd: the labels of indices dim {tuple_dim!r} must name distinct, non-batch "
                    f"params dims {params.dims}; got {indexed}"
                )
        else:
            indexed = [d for d in params.dims if d not in batch][: indices.sizes[tuple_dim]]
        rest = [d for d in params.dims if d not in batch and d not in indexed]
        clash = set(rest) & set(lead)
        if clash:
            raise DimensionError(f"gather_nd: dims {sorted(clash)} are in both the indices' leading dims and the result's params dims")
        work = params.transpose(*batch, *indexed, *rest)
        data = registry.get("gather_nd").function(work.data, indices.data, batch_dims=batch_dims,
                                                  negative_index_support=negative_index_support)
        coords = {name: c.variable for name, c in indices.coords.items() if tuple_dim not in c.dims}
        for name, coord in params.coords.items():
            if set(coord.dims) <= set(rest) and name not in coords:
                coords[name] = coord.variable
        if isinstance(indices.data, np.ndarray):
            for k, dim in enumerate(indexed):
                if dim in params.indexes and dim not in coords:
                    picked = np.take(params.indexes[dim].to_numpy(), indices.data[..., k])
                    coords[dim] = xr.Variable(lead, picked, params[dim].attrs)
        attrs = _history(params, "gather_nd", batch_dims=b, negative_index_support=negative_index_support,
                         indexed_dims=indexed)
        return xr.DataArray(data, dims=(*lead, *rest), coords=coords, attrs=attrs, name=params.name)

    # --- AscendDequant ----------------------------------------------------------------------

    def ascend_dequant(self, deq_scale, *, dst_dtype, calc_count=None, mode="single_row", policy=None,
                       group_size=None, align_output=False) -> xr.DataArray:
        """AscendDequant of a 1-D or 2-D src; scales are numbers or DataArrays aligned by dim name.

        Classic: a vector scale's dim names the column dim. per_token: the scale's dim names
        the row (token) dim. per_group: the scale shares one dim with src; the other src dim is
        the grouped one (k_dim is read from it). Rows/columns may come in either order.
        """
        src = self._obj
        if src.ndim not in (1, 2):
            raise DimensionError(f"ascend_dequant: src must have 1 or 2 dims, got {src.dims}")
        if src.ndim == 1:
            src = src.expand_dims(_TEMPORARY_BATCH)
        scale = deq_scale
        rows, cols = src.dims
        k_dim = 1
        if isinstance(scale, xr.DataArray) and scale.ndim:
            shared = [d for d in scale.dims if d in src.dims]
            if policy == "per_group":
                if len(shared) != 1 or scale.ndim != 2:
                    raise DimensionError(
                        f"ascend_dequant: a per_group scale must share exactly one dim with src {src.dims} "
                        f"and have one group dim, got {scale.dims}"
                    )
                grouped = next(d for d in src.dims if d not in shared)
                group = next(d for d in scale.dims if d not in shared)
                k_dim = src.dims.index(grouped)
                scale = scale.transpose(*((group, shared[0]) if k_dim == 0 else (shared[0], group)))
            else:
                if len(shared) != 1 or scale.ndim != 1:
                    raise DimensionError(
                        f"ascend_dequant: the scale must have one dim of src {src.dims}, got {scale.dims}"
                    )
                if policy == "per_token":
                    rows, cols = shared[0], next(d for d in src.dims if d != shared[0])
                else:
                    cols, rows = shared[0], next(d for d in src.dims if d != shared[0])
            scale = _aligned(scale, src, shared[0])
        work = src.transpose(rows, cols)
        values = scale.data if isinstance(scale, xr.DataArray) else scale
        data = registry.get("ascend_dequant").function(work.data, values, dst_dtype=dst_dtype, calc_count=calc_count, mode=mode,
                              policy=policy, group_size=group_size,
                              k_dim=k_dim if policy == "per_group" else 1, align_output=align_output)
        padded = data.shape[1] != work.shape[1]
        coords = _kept_coords(src, {cols} if padded else set())
        attrs = _history(self._obj, "ascend_dequant", dst_dtype=str(np.dtype(data.dtype)), policy=policy)
        out = xr.DataArray(data, dims=work.dims, coords=coords, attrs=attrs, name=self._obj.name)
        out = out.transpose(*src.dims)
        return out.isel({_TEMPORARY_BATCH: 0}, drop=True) if _TEMPORARY_BATCH in out.dims else out

    # --- Inverse ------------------------------------------------------------------------------

    def invert(self) -> xr.DataArray:
        """Undo the last operator recorded in ``attrs["ops_history"]`` (DepthToSpace <->
        SpaceToDepth, SpaceToBatchND <-> BatchToSpaceND with crops = paddings)."""
        arr = self._obj
        steps = json.loads(arr.attrs.get(HISTORY, "[]"))
        if not steps:
            raise NotApplicable("invert: attrs has no ops_history; nothing to undo")
        last = steps[-1]
        operator, p = last["operator"], last["parameters"]
        if operator in ("depth_to_space", "space_to_depth"):
            inverse = "space_to_depth" if operator == "depth_to_space" else "depth_to_space"
            out = self._depth(inverse, p["block_size"], p["mode"], p["dims"])
        elif operator in ("space_to_batch_nd", "batch_to_space_nd"):
            pairs = p.get("paddings", p.get("crops"))
            if operator == "space_to_batch_nd":
                out = self.batch_to_space_nd(p["block_shape"], pairs, dims=p["dims"])
            else:
                out = self.space_to_batch_nd(p["block_shape"], pairs, dims=p["dims"])
        else:
            raise InvalidArgument(f"invert: {operator} has no inverse")
        # The result is new: give it the attrs from before the undone step.
        out.attrs = {k: v for k, v in out.attrs.items() if k != HISTORY}
        if steps[:-1]:
            out.attrs[HISTORY] = json.dumps(steps[:-1])
        return out


def _layout(dims, roles) -> str:
    """NHWC or NCHW from the order of the named dims; NHWC (after a transpose) otherwise."""
    position = {r: dims.index(roles[r]) for r in "NHWC"}
    if position["N"] < position["C"] < position["H"] < position["W"]:
        return "NCHW"
    return "NHWC"


def _aligned(scale: xr.DataArray, src: xr.DataArray, dim: str) -> xr.DataArray:
    """The scale reordered to src's labels along ``dim`` when both are labelled."""
    if dim in scale.indexes and dim in src.indexes:
        try:
            return scale.sel({dim: src.indexes[dim]})
        except KeyError as error:
            raise InvalidArgument(f"ascend_dequant: deq_scale has no value for {dim}={error}") from None
    return scale


# ---------------------------------------------------------------------------------------------
# Dataset accessor


@xr.register_dataset_accessor("ops")
class OpsDatasetAccessor:
    """``Dataset.ops``: an operator applied to every data variable that has the dims it needs;
    the others are left untouched (and must not share a dim whose size changes)."""

    def __init__(self, obj: xr.Dataset):
        self._obj = obj

    def _apply(self, method: str, *args, **kwargs) -> xr.Dataset:
        ds = self._obj
        done, untouched = {}, {}
        for name, var in ds.data_vars.items():
            try:
                done[name] = getattr(var.ops, method)(*args, **kwargs)
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
        return xr.Dataset({name: variables[name] for name in ds.data_vars}, attrs=ds.attrs)

    def depth_to_space(self, block_size, *, mode="DCR", dims=None) -> xr.Dataset:
        return self._apply("depth_to_space", block_size, mode=mode, dims=dims)

    def space_to_depth(self, block_size, *, mode="DCR", dims=None) -> xr.Dataset:
        return self._apply("space_to_depth", block_size, mode=mode, dims=dims)

    def space_to_batch(self, block_size, paddings=((0, 0), (0, 0)), *, dims=None) -> xr.Dataset:
        return self._apply("space_to_batch", block_size, paddings, dims=dims)

    def space_to_batch_nd(self, block_shape, paddings=None, *, dims=None) -> xr.Dataset:
        return self._apply("space_to_batch_nd", block_shape, paddings, dims=dims)

    def batch_to_space_nd(self, block_shape, crops=None, *, dims=None) -> xr.Dataset:
        return self._apply("batch_to_space_nd", block_shape, crops, dims=dims)

    def gather_nd(self, indices, *, batch_dims=0, negative_index_support=True) -> xr.Dataset:
        return self._apply("gather_nd", indices, batch_dims=batch_dims, negative_index_support=negative_index_support)

    def invert(self) -> xr.Dataset:
        return self._apply("invert")


# ---------------------------------------------------------------------------------------------
# Dims by name for the registry: each adapter runs the accessor on DataArray inputs whose dims
# it recognises, or returns None so the plain function runs positionally (ops.registry.apply).


def _named(arr) -> bool:
    return registry._is_named(arr)


def _depth_adapter(op: str):
    def call(arrays, kwargs, dims):
        x = arrays["x"]
        if not isinstance(x, xr.DataArray) or not (_named(x) or dims):
            return None
        try:
            roles = find_dims(x.dims, op, "HWC", "NV", dims)
        except MissingDims:
            if dims:
                raise
            return None  # names the accessor does not know: positional, by data_format
        layout = "NCHW_VECT_C" if "V" in roles else _layout(("__n__", *x.dims), {"N": "__n__", **roles})
        asked = kwargs.get("data_format")
        if asked is not None and asked != layout:
            raise InvalidArgument(
                f"data_format {asked!r} disagrees with the dims of x {tuple(x.dims)}, which say {layout}; "
                "omit data_format to go by the dim names, or pass dims"
            )
        return x.ops._depth(op, kwargs["block_size"], kwargs.get("mode", "DCR"), dims)

    return call


def _batch_nd_adapter(op: str, pairs_name: str):
    def call(arrays, kwargs, dims):
        x = arrays["x"]
        if not isinstance(x, xr.DataArray) or not (_named(x) or dims):
            return None
        batch = (dims or {}).get("N", x.dims[0])
        spatial = [d for d in x.dims if d != batch]
        blocks, rows = kwargs.get("block_shape"), kwargs.get(pairs_name)
        blocks = blocks.tolist() if isinstance(blocks, np.ndarray) else blocks
        rows = rows.tolist() if isinstance(rows, np.ndarray) else rows
        # Shapes the mapping form cannot express: the plain function names the broken rule.
        if not isinstance(blocks, list) or len(blocks) > len(spatial):
            return None
        if rows is not None and (not isinstance(rows, list) or len(rows) != len(blocks)):
            return None
        pairs = None if rows is None else dict(zip(spatial, rows))
        return x.ops._batch(op, dict(zip(spatial, blocks)), pairs, {"N": batch})

    return call


def _space_to_batch_adapter(arrays, kwargs, dims):
    x = arrays["x"]
    if not isinstance(x, xr.DataArray) or not (_named(x) or dims):
        return None
    try:
        find_dims(x.dims, "space_to_batch", "NHW", "", dims)
    except MissingDims:
        if dims:
            raise
        return None
    return x.ops.space_to_batch(kwargs["block_size"], kwargs["paddings"], dims=dims)


def _gather_adapter(arrays, kwargs, dims):
    params, indices = arrays["params"], arrays["indices"]
    if not (_named(params) and isinstance(indices, xr.DataArray)):
        return None
    return params.ops.gather_nd(indices, **kwargs)


NAMED_DIMS = {
    "depth_to_space": _depth_adapter("depth_to_space"),
    "space_to_depth": _depth_adapter("space_to_depth"),
    "space_to_batch": _space_to_batch_adapter,
    "space_to_batch_nd": _batch_nd_adapter("space_to_batch_nd", "paddings"),
    "batch_to_space_nd": _batch_nd_adapter("batch_to_space_nd", "crops"),
    "gather_nd": _gather_adapter,
}
