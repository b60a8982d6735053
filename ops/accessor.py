"""The xarray ``.ops`` accessor: every operator on named dims, lazily on Dask-backed data.

``import ops`` registers ``DataArray.ops`` and ``Dataset.ops``. The layout comes from dim
names (N: ``n``/``batch``/``sample``/``time``..., H: ``y``/``height``/``lat``..., W: ``x``/
``width``/``lon``..., C: ``c``/``channel``/``band``..., V: the NCHW_VECT_C lane) or from an
explicit ``dims={"N": ..., "H": ..., "W": ..., "C": ...}``. NHWC or NCHW is read from the order
of the dims; any other order is transposed internally and back, so callers never transpose.

Every method calls the plain ``ops`` function on ``.data`` and rebuilds the result: dims and
coordinates the operator does not touch are kept, evenly spaced H/W coordinates are refined
(DepthToSpace) or coarsened (SpaceToDepth) to stay true, every other coordinate on a touched
dim is dropped rather than left mislabelled, attrs are kept, and ``attrs["ops_history"]``
records the operator and its parameters so that ``.ops.invert()`` can undo it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np
import xarray as xr

from ops import _validate, registry
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


def _even_step(values: np.ndarray):
    """The constant step of a numeric 1-D coordinate, or None if it has none."""
    if values.ndim != 1 or len(values) < 2 or values.dtype.kind not in "iuf":
        return None
    steps = np.diff(values.astype(np.float64))
    if not np.allclose(steps, steps[0], rtol=1e-9, atol=0) or steps[0] == 0:
        return None
    return float(steps[0])


def _refined(values: np.ndarray, factor: int):
    """Centres of each cell split into ``factor`` equal cells (None if not evenly spaced)."""
    step = _even_step(values)
    if step is None:
        return None
    fine = step / factor
    return values[0] - step / 2 + fine / 2 + fine * np.arange(len(values) * factor)


def _coarsened(values: np.ndarray, factor: int):
    """Centres of cells merged ``factor`` at a time (None if not evenly spaced)."""
    step = _even_step(values)
    if step is None:
        return None
    return values[0] + step * (factor - 1) / 2 + step * factor * np.arange(len(values) // factor)


def _kept_coords(arr: xr.DataArray, touched, rescale=None) -> dict:
    """Coordinates that stay true: those on untouched dims, plus 1-D numeric coordinates of
    the dims in ``rescale`` ({dim: function(values) -> new values or None}); others dropped."""
    coords = {}
    for name, coord in arr.coords.items():
        dims = set(coord.dims)
        if not dims & set(touched):
            coords[name] = coord.variable
        elif rescale and len(coord.dims) == 1 and coord.dims[0] in rescale:
            values = rescale[coord.dims[0]](np.asarray(coord.values))
            if values is not None:
                coords[name] = xr.Variable(coord.dims, values, coord.attrs)
    return coords


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
    """``DataArray.ops``: the operators of ``ops`` on named dims. Holds no state."""

    def __init__(self, obj: xr.DataArray):
        self._obj = obj

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
        scale = (lambda v: _refined(v, factor)) if op == "depth_to_space" else (lambda v: _coarsened(v, factor))
        coords = _kept_coords(arr, {roles["H"], roles["W"], roles["C"], roles.get("V")},
                              {roles["H"]: scale, roles["W"]: scale})
        attrs = _history(arr, op, block_size=factor, mode=mode,
                         dims={r: d for r, d in roles.items() if d != _TEMPORARY_BATCH})
        out = xr.DataArray(data, dims=work.dims, coords=coords, attrs=attrs, name=arr.name)
        if _TEMPORARY_BATCH in out.dims:
            out = out.isel({_TEMPORARY_BATCH: 0}, drop=True)
        return out.transpose(*order)

    def depth_to_space(self, block_size, *, mode="DCR", dims=None) -> xr.DataArray:
        """DepthToSpace on the H, W and C dims (by name); N optional. See ``ops.depth_to_space``."""
        return self._depth("depth_to_space", block_size, mode, dims)

    def space_to_depth(self, block_size, *, mode="DCR", dims=None) -> xr.DataArray:
        """SpaceToDepth on the H, W and C dims (by name); N optional. See ``ops.space_to_depth``."""
        return self._depth("space_to_depth", block_size, mode, dims)

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
        coords = _kept_coords(arr, {roles["N"], *spatial})
        key = "paddings" if op == "space_to_batch_nd" else "crops"
        attrs = _history(arr, op, block_shape=_plain_ints(block_shape), **{key: _plain_ints(pairs)},
                         dims={"N": roles["N"]})
        out = xr.DataArray(data, dims=work.dims, coords=coords, attrs=attrs, name=arr.name)
        return out.transpose(*arr.dims)

    def space_to_batch_nd(self, block_shape: Mapping, paddings: Mapping | None = None, *, dims=None) -> xr.DataArray:
        """SpaceToBatchND with spatial dims by name: ``block_shape={"y": 2, "x": 2}``,
        ``paddings={"y": (1, 1)}`` (missing dims: no padding). The batch dim is N."""
        return self._batch("space_to_batch_nd", block_shape, paddings, dims)

    def batch_to_space_nd(self, block_shape: Mapping, crops: Mapping | None = None, *, dims=None) -> xr.DataArray:
        """BatchToSpaceND with spatial dims by name (``crops={"y": (1, 1)}``); batch dim N."""
        return self._batch("batch_to_space_nd", block_shape, crops, dims)

    def space_to_batch(self, block_size, paddings=((0, 0), (0, 0)), *, dims=None) -> xr.DataArray:
        """SpaceToBatch (the 4-D form) on the H and W dims: ``paddings`` [[top, bottom], [left, right]]
        (4 numbers in any of the SPEC's shapes)."""
        roles = find_dims(self._obj.dims, "space_to_batch", "NHW", "", dims)
        flat = np.asarray(paddings).reshape(-1) if np.size(paddings) == 4 else None
        if flat is None:
            raise InvalidArgument(f"paddings must have 4 elements, got {paddings!r}")
        return self._batch(
            "space_to_batch_nd",
            {roles["H"]: block_size, roles["W"]: block_size},
            {roles["H"]: tuple(flat[:2]), roles["W"]: tuple(flat[2:])},
            {"N": roles["N"]},
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
