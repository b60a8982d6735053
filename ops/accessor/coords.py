"""Coordinates of the accessor's results: what each operator does to the labels of the dims it touches.

The rules (docs/accessor.md, "Coordinates"):

* Cells are centre-registered, as rioxarray writes them. DepthToSpace(f) splits a cell of
  step ``s`` centred at ``c`` into ``f`` cells of step ``s/f`` centred at
  ``c + s * ((k + 0.5) / f - 0.5)``, k = 0..f-1 (a 10 m pixel at ``c`` becomes 5 m pixels at
  ``c - 2.5`` and ``c + 2.5``). SpaceToDepth(f) merges ``f`` cells into one at the mean of their
  centres: the exact inverse.
* A coordinate is evenly spaced when every value lies within the dtype's rounding of a straight
  line (16 eps x the largest magnitude, or 1e-5 of the step if larger). Integer and datetime
  coordinates are exact: their steps must be equal, and their new values keep the dtype when
  they are whole numbers (whole units of the datetime); integer ones become float64 otherwise,
  datetime ones are dropped. Descending axes are just a negative step.
* SpaceToBatch(ND) labels the block grid: the coordinate of each block is that of its first cell
  (extrapolated with the step when the first cell is padding). The batch dim keeps its
  coordinates (repeated per block offset) and gains ``source_<batch>`` (which input entry) and
  ``block_offset_<dim>`` (which cell of the block) as integer non-dim coordinates.
* SpaceToDepth keeps channel labels repeated per phase and adds ``source_<channel>``,
  ``phase_<H>`` and ``phase_<W>``. Merging (DepthToSpace, BatchToSpaceND) keeps a label that is
  the same across each group, joins the group's labels as ``"a|b|c|d"`` for the dim's own
  index, and consumes the provenance coordinates above.
* Whatever cannot be kept true is dropped with a CoordinateDropped warning that says why; the
  original values are recorded (plain JSON, the ``"coords"`` and ``"drop_coords"`` keys of the
  step in ``attrs["ops_history"]``) whenever the inverse could not recompute them bit for bit,
  so ``.ops.invert()``, and the inverse operator called with the same parameters, restore
  coordinates exactly, also after a Zarr round trip (no warning for what the record restores).
* A CF grid mapping coordinate (rioxarray's ``spatial_ref``) with a ``GeoTransform`` gets the
  transform of the new grid; coordinate attrs (units, axis, standard_name, ...) are kept.

This module decides which rule each coordinate gets, drops what cannot stay true and records what
``invert`` needs; the arithmetic of the new values is ``ops.accessor.coord_values``'s. Both work
on the attrs and coordinates only: they never import rioxarray.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import xarray as xr

from ops import dtypes
from ops.accessor.coord_values import (
    at_positions,
    centre_maps_depth,
    channel_index,
    coarsened,
    fill_offsets,
    georeference,
    merged,
    refined,
)
from ops.accessor.history import HISTORY

MAX_RECORDED_VALUES = 10_000  # beyond this, a coordinate is not copied into attrs for invert()
_INVERSE = {
    "depth_to_space": "space_to_depth",
    "space_to_depth": "depth_to_space",
    "space_to_batch_nd": "batch_to_space_nd",
    "batch_to_space_nd": "space_to_batch_nd",
}


class CoordinateDropped(UserWarning):
    """A coordinate (or a per-channel attr, or a Dataset's variable) could not be kept true
    through an operator and was left out of the result (``ops.CoordinateDropped``; silence
    with ``warnings.simplefilter("ignore", ops.CoordinateDropped)``)."""


def _warn(message: str, category: type[Warning] = CoordinateDropped) -> None:
    """Warn at the first frame outside ops and xarray (the user's line)."""
    here = os.path.dirname(os.path.dirname(__file__))  # the ops package, not just ops/accessor
    inside = (here, os.path.dirname(xr.__file__))
    level, frame = 2, sys._getframe(1)  # stacklevel 1 would be this function
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


# ---------------------------------------------------------------------------------------------
# Plans


@dataclass
class CoordPlan:
    """The coordinates of an operator's result, and what to record so the inverse restores them."""

    coords: dict
    record: dict = field(default_factory=dict)
    drop: list = field(default_factory=list)
    attrs_update: dict = field(default_factory=dict)
    encoding: dict = field(default_factory=dict)

    def attrs(self, attrs: dict) -> dict:
        """The result's attrs (``history.with_step`` output): transform updates and the restore record."""
        attrs = {**attrs, **self.attrs_update}
        if "grid_mapping" in self.encoding:  # one place only: xarray refuses to write it from both
            attrs.pop("grid_mapping", None)
        if self.record or self.drop:
            steps = json.loads(attrs[HISTORY])
            if self.record:
                steps[-1]["coords"] = self.record
            if self.drop:
                steps[-1]["drop_coords"] = self.drop
            attrs[HISTORY] = json.dumps(steps)
        return attrs


def kept_coords(arr: xr.DataArray, touched) -> dict:
    """Coordinates on dims the operator does not touch (the rest is the plans' business)."""
    return {name: c.variable for name, c in arr.coords.items() if not set(c.dims) & set(touched)}


def _rearranged(dims, op: str) -> str:
    if len(dims) == 1:
        return f"it lies along {dims[0]!r}, whose entries {op} regroups so that no label stays true"
    return f"it spans dims {dims}, which {op} rearranges together"


def _warn_dropped(op: str, dropped: Mapping, plan: CoordPlan) -> None:
    for name, reason in dropped.items():
        if name not in plan.coords:
            _warn(f"{op}: coordinate {name!r} dropped: {reason}")


def _shape(arr: xr.DataArray, sizes: Mapping) -> xr.DataArray:
    """A stand-in of the result (no memory: a broadcast zero) for computing the inverse's coords."""
    shape = tuple(sizes[d] for d in arr.dims)
    return xr.DataArray(np.broadcast_to(np.int8(0), shape), dims=arr.dims)


def depth_plan(arr: xr.DataArray, roles: Mapping[str, str], op: str, factor: int, mode: str,
               record: bool = True) -> CoordPlan:
    """Coordinates of DepthToSpace / SpaceToDepth of ``arr`` (roles H, W, C, optional N, V)."""
    H, W, C, V = roles["H"], roles["W"], roles["C"], roles.get("V")
    touched = {H, W, C, V} - {None}
    f2 = factor * factor
    split = op == "space_to_depth"
    sizes = dict(arr.sizes)
    result_sizes = {**sizes, H: sizes[H] // factor if split else sizes[H] * factor,
                    W: sizes[W] // factor if split else sizes[W] * factor,
                    C: sizes[C] * f2 if split else sizes[C] // f2}
    coords = kept_coords(arr, touched)
    dropped = {}  # name: why; warned about unless the record of an inverse step restores it
    resample = coarsened if split else refined
    provenance = {f"source_{C}", f"phase_{H}", f"phase_{W}"}
    for name, coord in arr.coords.items():
        var = coord.variable
        if not set(var.dims) & touched:
            continue
        if var.dims in ((H,), (W,)):
            values, reason = resample(np.asarray(var.values), factor)
        elif var.dims == (C,) and V is not None:
            values, reason = None, "channel labels are not regrouped in the NCHW_VECT_C layout"
        elif var.dims == (C,) and split:
            source, _, _ = channel_index(op, mode, result_sizes[C], factor)
            values, reason = np.asarray(var.values)[source], None
        elif var.dims == (C,):
            if name in provenance:
                continue  # consumed: this merge undoes the split that made it
            groups = channel_index(op, mode, result_sizes[C], factor)
            values, reason = merged(name, C, np.asarray(var.values), groups)
        else:
            values, reason = None, _rearranged(var.dims, op)
        if values is None:
            dropped[name] = reason
            continue
        coords[name] = xr.Variable(var.dims, values, var.attrs)
    if split and V is None:
        source, row, col = channel_index(op, mode, result_sizes[C], factor)
        for name, values, what in ((f"source_{C}", source, f"position along {C!r} of the source channel"),
                                   (f"phase_{H}", row, f"row ({H}) of the pixel inside its {factor}x{factor} block"),
                                   (f"phase_{W}", col, f"column ({W}) of the pixel inside its {factor}x{factor} block")):
            coords[name] = xr.Variable((C,), values.astype(np.int64), {"long_name": what})
    plan = CoordPlan(coords)
    georeference(arr, centre_maps_depth(op, factor, roles), plan.coords, plan.encoding, plan.attrs_update)
    if record:
        apply_record(plan, arr, op, {"block_size": factor, "mode": mode}, result_sizes)
        _warn_dropped(op, dropped, plan)
        result = _shape(arr, result_sizes).assign_coords(plan.coords)
        inverse = depth_plan(result, roles, _INVERSE[op], factor, mode, record=False)
        record_for_inverse(plan, arr, inverse, touched)
    return plan


def batch_plan(arr: xr.DataArray, batch: str, spatial, blocks, pairs, op: str, record: bool = True) -> CoordPlan:
    """Coordinates of SpaceToBatchND (``pairs`` = paddings) or BatchToSpaceND (crops)."""
    spatial, blocks = list(spatial), [int(b) for b in blocks]
    pairs = [tuple(int(v) for v in p) for p in pairs]
    sizes = dict(arr.sizes)
    touched = {batch, *spatial}
    coords = kept_coords(arr, touched)
    dropped = {}  # name: why; warned about unless the record of an inverse step restores it
    count = int(np.prod(blocks))
    n_in = sizes[batch]
    split = op == "space_to_batch_nd"
    result_sizes = {**sizes, batch: n_in * count if split else n_in // count}
    for d, b, (before, after) in zip(spatial, blocks, pairs):
        result_sizes[d] = (sizes[d] + before + after) // b if split else sizes[d] * b - before - after
    offsets = np.stack(np.unravel_index(np.arange(count), blocks), axis=1) if spatial else np.zeros((1, 0), int)
    provenance = {f"source_{batch}", *(f"block_offset_{d}" for d in spatial)}
    maps = {}
    for d, b, (before, after) in zip(spatial, blocks, pairs):
        if op == "space_to_batch_nd":
            maps[d] = (float(-before), float(b))
        else:
            maps[d] = (before / b, 1.0 / b)
    for name, coord in arr.coords.items():
        var = coord.variable
        if not set(var.dims) & touched:
            continue
        values = np.asarray(var.values)
        if var.dims == (batch,):
            if op == "space_to_batch_nd":
                if name in provenance:
                    reason = "a previous SpaceToBatch's provenance is replaced by this one's"
                    new = None
                else:
                    new, reason = np.tile(values, count), None
            else:
                if name in provenance:
                    continue  # consumed
                groups = np.arange(n_in // count)[:, None] + (n_in // count) * np.arange(count)[None, :]
                new, reason = merged(name, batch, values, groups)
        elif len(var.dims) == 1 and var.dims[0] in spatial:
            k = spatial.index(var.dims[0])
            b, (before, after) = blocks[k], pairs[k]
            if op == "space_to_batch_nd":
                positions = np.arange((len(values) + before + after) // b) * b - before
                new, reason = at_positions(values, positions)
            else:
                positions = np.arange(len(values) * b - before - after) + before
                new, reason = fill_offsets(values, b, positions)
        else:
            new, reason = None, _rearranged(var.dims, op)
        if new is None:
            dropped[name] = reason
            continue
        coords[name] = xr.Variable(var.dims, new, var.attrs)
    if op == "space_to_batch_nd":
        coords[f"source_{batch}"] = xr.Variable(
            (batch,), np.tile(np.arange(n_in, dtype=np.int64), count),
            {"long_name": f"position along {batch!r} of the input entry this entry comes from"})
        for k, d in enumerate(spatial):
            coords[f"block_offset_{d}"] = xr.Variable(
                (batch,), np.repeat(offsets[:, k].astype(np.int64), n_in),
                {"long_name": f"offset along {d!r} of this entry's cells inside their {blocks[k]}-cell blocks"})
    plan = CoordPlan(coords)
    georeference(arr, maps, plan.coords, plan.encoding, plan.attrs_update)
    if record:
        key = {"block_shape": dict(zip(spatial, blocks)), "pairs": dict(zip(spatial, pairs))}
        apply_record(plan, arr, op, key, result_sizes)
        _warn_dropped(op, dropped, plan)
        result = _shape(arr, result_sizes).assign_coords(plan.coords)
        inverse = batch_plan(result, batch, spatial, blocks, pairs, _INVERSE[op], record=False)
        record_for_inverse(plan, arr, inverse, touched)
    return plan


# ---------------------------------------------------------------------------------------------
# Restoring exactly: record what the inverse could not recompute, use the record when inverting


def _encode(values: np.ndarray):
    """Nested lists of plain JSON values that ``_decode`` turns back into the same array."""
    if values.dtype.kind in "mM":
        return values.astype(str).tolist()
    if values.dtype.kind == "f":
        return values.astype(np.float64).tolist()  # JSON writes a float's repr: exact
    return values.tolist()


def _decode(item: dict) -> np.ndarray:
    return np.array(item["values"], dtype=dtypes.named(item["dtype"]))


def _jsonable(attrs: Mapping):
    try:
        json.dumps(dict(attrs))
        return dict(attrs)
    except (TypeError, ValueError):
        return None


def _same(a: xr.Variable, b: xr.Variable) -> bool:
    a_values, b_values = np.asarray(a.values), np.asarray(b.values)
    kinds = {a_values.dtype.kind, b_values.dtype.kind}
    return (a.dims == b.dims and a_values.shape == b_values.shape
            and (a_values.dtype == b_values.dtype or kinds <= {"U", "O", "S"})
            and bool((a_values == b_values).all()) and dict(a.attrs) == dict(b.attrs))


def record_for_inverse(plan: CoordPlan, arr: xr.DataArray, inverse_plan: CoordPlan, touched) -> None:
    """Put into ``plan.record`` every coordinate of ``arr`` on a touched dim that the inverse
    (``inverse_plan``, computed from ``plan.coords`` without warnings) does not restore bit for
    bit, as plain JSON. Past MAX_RECORDED_VALUES values in all, they are left out, with a warning."""
    record, total = {}, 0
    for name, coord in arr.coords.items():
        var = coord.variable
        if not set(var.dims) & set(touched):
            continue
        again = inverse_plan.coords.get(name)
        if again is not None and _same(again, var):
            continue
        values = np.asarray(var.values)
        item = None
        if values.dtype.kind in "biufmMUO" and total + values.size <= MAX_RECORDED_VALUES:
            item = {"dims": [str(d) for d in var.dims], "dtype": "O" if values.dtype.kind == "O" else values.dtype.str,
                    "values": _encode(values), "attrs": _jsonable(var.attrs)}
            if item["attrs"] is None or _jsonable({"values": item["values"]}) is None:
                item = None
        if item is None:
            _warn(f"coordinate {name!r} ({values.size} values of {values.dtype}) is not recorded in "
                  f"attrs[{HISTORY!r}] (past {MAX_RECORDED_VALUES} values, or not plain JSON): "
                  "invert() will not restore it")
            continue
        record[str(name)] = item
        total += values.size
    plan.record = record
    # Coordinates the inverse would add that ``arr`` did not have (SpaceToDepth's provenance
    # after a DepthToSpace of unlabelled phases): the inverse leaves them out.
    plan.drop = sorted(str(n) for n, v in inverse_plan.coords.items()
                       if n not in arr.coords and set(v.dims) & set(touched))


def _key(parameters: Mapping) -> str:
    """The parameters that must agree for two steps to undo each other, as canonical JSON:
    block size and mode, or block shape and paddings = crops (absent dims: no padding)."""
    if "block_size" in parameters:
        return json.dumps([int(parameters["block_size"]), parameters.get("mode")])
    blocks = {str(k): int(v) for k, v in parameters["block_shape"].items()}
    pairs = parameters.get("pairs", parameters.get("paddings", parameters.get("crops"))) or {}
    pairs = {str(k): [int(x) for x in v] for k, v in pairs.items()}
    return json.dumps([blocks, {d: pairs.get(d, [0, 0]) for d in blocks}], sort_keys=True)


def apply_record(plan: CoordPlan, arr: xr.DataArray, op: str, parameters: Mapping, sizes: Mapping) -> None:
    """When ``arr``'s last ops_history step is the inverse of ``op`` with the same parameters,
    put back the coordinates it recorded (those whose shape fits the result)."""
    try:
        steps = json.loads(arr.attrs.get(HISTORY, "[]"))
        last = steps[-1] if steps else {}
        if last.get("operator") != _INVERSE.get(op) or not {"coords", "drop_coords"} & set(last):
            return
        if _key(last.get("parameters", {})) != _key(parameters):
            return
    except (TypeError, ValueError, KeyError, AttributeError):
        return  # a history this module did not write: nothing to restore from
    for name in last.get("drop_coords", []):
        plan.coords.pop(name, None)
    for name, item in last.get("coords", {}).items():
        dims = tuple(item["dims"])
        values = _decode(item)
        if all(d in sizes for d in dims) and values.shape == tuple(sizes[d] for d in dims):
            plan.coords[name] = xr.Variable(dims, values, item.get("attrs") or {})
