"""The values of the accessor's new coordinates: even steps, refined and coarsened cell centres,
block-grid positions, merged and regrouped labels, and the GeoTransform of the new grid.

Plain arithmetic on 1-D label arrays and on a grid mapping's attrs; which coordinate gets which
rule, what is dropped and what is recorded for ``invert`` is ``ops.accessor.coords``'s business.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import xarray as xr

_JOIN = "|"


# ---------------------------------------------------------------------------------------------
# Even spacing


def _exact_kind(values: np.ndarray) -> bool:
    return values.dtype.kind in "iumM"


def _as_int64(values: np.ndarray) -> np.ndarray:
    return values.view("int64") if values.dtype.kind in "mM" else values.astype(np.int64)


def even_step(values: np.ndarray):
    """``(step, None)`` for an evenly spaced 1-D numeric coordinate, else ``(None, reason)``.

    Integer and datetime steps are exact ints (datetimes in their own unit); float steps are the
    endpoints' slope, accepted when no value strays from the line by more than the tolerance.
    """
    values = np.asarray(values)
    if values.dtype.kind not in "iufmM":
        return None, f"its dtype {values.dtype} is not numeric"
    if values.ndim != 1 or len(values) < 2:
        return None, "it has fewer than 2 values, so no step"
    if _exact_kind(values):
        if values.dtype.kind in "mM" and np.isnat(values).any():
            return None, "it holds NaT"
        steps = np.diff(_as_int64(values))
        if steps[0] == 0 or not (steps == steps[0]).all():
            bad = int(np.argmax(steps != steps[0])) if steps[0] != 0 else 0
            return None, f"its steps differ (step {steps[0]} at index 0, {steps[bad]} at index {bad})"
        return int(steps[0]), None
    numbers = values.astype(np.float64)
    if not np.isfinite(numbers).all():
        return None, "it holds NaN or infinite values"
    step = (numbers[-1] - numbers[0]) / (len(numbers) - 1)
    tolerance = max(16 * np.finfo(values.dtype).eps * np.abs(numbers).max(), 1e-5 * abs(step))
    off = np.abs(numbers - (numbers[0] + step * np.arange(len(numbers))))
    if step == 0 or off.max() > tolerance:
        worst = int(np.argmax(off))
        return None, (f"it is not evenly spaced: value {float(numbers[worst])!r} at index {worst} is "
                      f"{off[worst]:.3g} off the line from {float(numbers[0])!r} to {float(numbers[-1])!r} "
                      f"(tolerance {tolerance:.3g})")
    return float(step), None


def _shifted(anchors: np.ndarray, step, numerator: np.ndarray, denominator: int, dtype):
    """``anchors + step * numerator / denominator`` in the coordinate's own terms, or
    ``(None, reason)``: exact for integer and datetime coordinates (dtype kept when whole),
    float64 arithmetic rounded to the coordinate's float dtype otherwise."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iumM":
        scaled = int(step) * np.asarray(numerator, dtype=np.int64)
        if (scaled % denominator == 0).all():
            out = _as_int64(np.asarray(anchors)) + scaled // denominator
            return (out.view(dtype) if dtype.kind in "mM" else out.astype(dtype)), None
        if dtype.kind in "mM":
            return None, f"the new values are not whole units of {dtype}"
        return np.asarray(anchors, np.float64) + step * np.asarray(numerator) / denominator, None
    out = np.asarray(anchors, np.float64) + step * np.asarray(numerator, np.float64) / denominator
    return out.astype(dtype), None


def refined(values: np.ndarray, factor: int):
    """Centres of each cell split into ``factor`` cells: ``(values, None)`` or ``(None, reason)``."""
    values = np.asarray(values)
    step, reason = even_step(values)
    if step is None:
        return None, reason
    k = np.tile(np.arange(factor), len(values))
    # c + s * ((k + 0.5) / f - 0.5) = c + s * (2k + 1 - f) / (2f): integers stay exact.
    return _shifted(np.repeat(values, factor), step, 2 * k + 1 - factor, 2 * factor, values.dtype)


def coarsened(values: np.ndarray, factor: int):
    """Centres of cells merged ``factor`` at a time (the mean of their centres)."""
    values = np.asarray(values)
    step, reason = even_step(values)
    if step is None:
        return None, reason
    if len(values) % factor:
        return None, f"its length {len(values)} is not a multiple of {factor}"
    first = values[::factor]
    # mean of c0, c0 + s, ..., c0 + (f-1)s = c0 + s (f - 1) / 2, computed from the block's first
    # centre; float coordinates use the real mean (uneven within tolerance stays centred).
    if values.dtype.kind in "iumM":
        return _shifted(first, step, np.full(len(first), factor - 1), 2, values.dtype)
    return values.astype(np.float64).reshape(-1, factor).mean(axis=1).astype(values.dtype), None


def at_positions(values: np.ndarray, positions: np.ndarray):
    """Labels of cells at integer ``positions`` (may lie outside: extrapolated with the step)."""
    values = np.asarray(values)
    inside = (positions >= 0) & (positions < len(values))
    if inside.all():
        return values[positions], None
    step, reason = even_step(values)
    if step is None:
        return None, f"some blocks start in the padding and {reason}"
    anchors = values[np.clip(positions, 0, len(values) - 1)]
    distance = positions - np.clip(positions, 0, len(values) - 1)
    return _shifted(anchors, step, distance, 1, values.dtype)


def fill_offsets(values: np.ndarray, block: int, positions: np.ndarray):
    """Labels of padded-grid positions ``positions`` from the block grid's labels ``values``."""
    values = np.asarray(values)
    blocks, offsets = positions // block, positions % block
    if (offsets == 0).all():
        return values[blocks], None
    step, reason = even_step(values)
    if step is None:
        return None, reason
    return _shifted(values[blocks], step, offsets, block, values.dtype)



# ---------------------------------------------------------------------------------------------
# Grouping along the batch or channel dim


def merged(name: str, dim: str, values: np.ndarray, groups: np.ndarray):
    """Labels of merged entries: ``groups`` is (entries, members), member 0 the offset-(0, 0) one.
    A label shared by the whole group is kept; the dim's own labels are joined ``"a|b"``."""
    picked = values[groups]
    if (picked == picked[:, :1]).all():
        return values[groups[:, 0]], None
    if name == dim:
        return np.array([_JOIN.join(str(v) for v in row) for row in picked]), None
    return None, f"its values differ within the groups of entries merged along {dim!r}"



def channel_index(op: str, mode: str, channels_out: int, factor: int):
    """For the split (space_to_depth) direction: per result channel, (source channel, row
    phase, column phase); for the merge direction: groups (result channels x f^2 members)."""
    f2 = factor * factor
    if op == "space_to_depth":  # channels_out = C * f^2
        k = np.arange(channels_out)
        if mode == "DCR":
            c, phase = k % (channels_out // f2), k // (channels_out // f2)
        else:
            c, phase = k // f2, k % f2
        return c, phase // factor, phase % factor
    c = np.arange(channels_out)[:, None]
    phase = np.arange(f2)[None, :]
    return (phase * channels_out + c) if mode == "DCR" else (c * f2 + phase)


# ---------------------------------------------------------------------------------------------
# CF grid mapping / rioxarray GeoTransform


def centre_maps_depth(op: str, factor: int, roles) -> dict:
    """{dim: (a, s)}: result centre index i sits at input centre index a + s * i."""
    if op == "depth_to_space":
        m = (0.5 / factor - 0.5, 1.0 / factor)
    else:
        m = ((factor - 1) / 2, float(factor))
    return {roles["H"]: m, roles["W"]: m}


def _spatial_xy(arr: xr.DataArray):
    """rioxarray's choice of x and y dims (x/y, longitude/latitude, then CF axis/standard_name)."""
    dims = arr.dims
    if "x" in dims and "y" in dims:
        return "x", "y"
    if "longitude" in dims and "latitude" in dims:
        return "longitude", "latitude"
    x = y = None
    for name, coord in arr.coords.items():
        if coord.dims != (name,):
            continue
        axis, standard = str(coord.attrs.get("axis", "")).upper(), str(coord.attrs.get("standard_name", "")).lower()
        if axis == "X" or standard in ("longitude", "projection_x_coordinate"):
            x = name
        elif axis == "Y" or standard in ("latitude", "projection_y_coordinate"):
            y = name
    return x, y


def georeference(arr: xr.DataArray, maps: Mapping, coords: dict, encoding: dict, attrs_update: dict) -> None:
    """Give the grid mapping coordinate in ``coords`` (and a legacy ``transform`` attr, put in
    ``attrs_update``) the new grid's transform, and keep the grid mapping in ``encoding``; all
    three are the result's and are updated in place. ``maps`` = {dim: (a, s)}: result centre i
    sits at input centre index a + s * i."""
    gm = arr.encoding.get("grid_mapping", arr.attrs.get("grid_mapping"))
    if gm is not None:
        encoding["grid_mapping"] = gm
    gm = gm or "spatial_ref"
    x, y = _spatial_xy(arr)
    if x is None or y is None or not ({x, y} & set(maps)):
        return
    # In corner terms: input col = ox + sx * result col (o = a + 0.5 - s/2).
    (ax, sx), (ay, sy) = maps.get(x, (0.0, 1.0)), maps.get(y, (0.0, 1.0))
    ox, oy = ax + 0.5 - sx / 2, ay + 0.5 - sy / 2

    def moved(c, a, b, f, d, e):
        return (c + a * ox + b * oy, a * sx, b * sy, f + d * ox + e * oy, d * sx, e * sy)

    if gm in coords and "GeoTransform" in coords[gm].attrs:
        var = coords[gm]
        try:
            gt = [float(v) for v in str(var.attrs["GeoTransform"]).split()]
        except ValueError:
            gt = []
        if len(gt) == 6:
            new = moved(*gt)  # GDAL order: c, a, b, f, d, e
            attrs = {**var.attrs, "GeoTransform": " ".join(repr(float(v)) for v in new)}
            coords[gm] = xr.Variable(var.dims, var.values, attrs)
    legacy = arr.attrs.get("transform")
    if legacy is not None and np.size(legacy) >= 6:
        a, b, c, d, e, f = (float(v) for v in np.asarray(legacy).ravel()[:6])
        c2, a2, b2, f2, d2, e2 = moved(c, a, b, f, d, e)
        attrs_update["transform"] = (a2, b2, c2, d2, e2, f2)
