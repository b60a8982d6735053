"""Dims by name: which dim of an array plays which role (batch N, height H, width W, channel C,
NCHW_VECT_C lane V) for an operator, from the dim names or an explicit ``dims`` mapping.

The accessor, the registry's named calls and the service's ``dims`` input all resolve roles
here, so a dim name means the same thing through every door.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import xarray as xr

from ops.errors import DimensionError, MissingDims

ROLE_NAMES = {
    "N": ("n", "b", "batch", "sample", "samples", "image", "images", "time"),
    "H": ("h", "y", "height", "row", "rows", "lat", "latitude"),
    "W": ("w", "x", "width", "col", "cols", "column", "columns", "lon", "longitude"),
    "C": ("c", "channel", "channels", "band", "bands", "feature", "features", "depth"),
    "V": ("v", "vect", "vector", "vec", "lane", "lanes", "c_inner"),
}
ROLE_LABELS = {"N": "batch", "H": "height", "W": "width", "C": "channel", "V": "vector lane"}
ROLES = tuple(ROLE_NAMES)  # the keys a ``dims`` mapping may use
_DEFAULT_DIM = re.compile(r"dim_\d+")
# A role an array may simply lack, and the dim of length 1 to add for it: (name, at the end).
_ADDED = {"N": ("batch", False), "C": ("channel", True)}


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
        needs = (f"{op} needs {', '.join(f'{ROLE_LABELS[r]} ({r})' for r in missing)} dim(s) among {dims}; "
                 f"recognised {found}.")
        if len(unassigned) == len(missing):  # the leftover dims are the likely answer
            raise MissingDims(f"{needs} Name them: .ops.{op}(..., dims={ {**roles, **dict(zip(missing, unassigned))}!r})")
        guesses = {r: f"<{ROLE_LABELS[r]} dim>" for r in missing}
        naming = f".ops.{op}(..., dims={ {**roles, **guesses}!r})"
        if set(missing) <= set(_ADDED):  # a batch or channel the data does not have: one of length 1
            added = ".".join(f"expand_dims({_ADDED[r][0]!r}, axis={len(dims) if _ADDED[r][1] else 0})"
                             for r in missing)
            raise MissingDims(f"{needs} Add it, of length 1: arr.{added}.ops.{op}(...)"
                              + (f"; or name the one it is: {naming}" if unassigned else ""))
        raise MissingDims(f"{needs} Name them: {naming}")
    return roles


def no_other_dims(arr: xr.DataArray, roles: Mapping[str, str], op: str) -> None:
    """DimensionError naming the dims of ``arr`` that play none of ``roles``, if any."""
    extra = [d for d in arr.dims if d not in roles.values()]
    if extra:
        raise DimensionError(
            f"{op}: dims {extra} are none of {'/'.join(roles)}; select or stack them first, "
            f"or assign them a role with dims={{...}} (found {dict(roles)})"
        )


def layout_of(dims, roles: Mapping[str, str]) -> str:
    """NHWC, NCHW or NCHW_VECT_C, as the operators read an array with these dims in this order
    (no batch dim: a batch of one in front); what is missing, for ``repr``, otherwise."""
    if not {"H", "W", "C"} <= set(roles):
        missing = "".join(r for r in "HWC" if r not in roles)
        return f"none for depth_to_space/space_to_depth (no {'/'.join(missing)} dim found; pass dims={{...}})"
    if "V" in roles:
        return "NCHW_VECT_C"
    c, h, w = (dims.index(roles[r]) for r in "CHW")
    n = dims.index(roles["N"]) if "N" in roles else -1  # no N: a batch of one in front
    return "NCHW" if n < c < h < w else "NHWC"


def is_named(arr) -> bool:
    """A DataArray with dim names of its own (not xarray's dim_0, dim_1, ...)."""
    return isinstance(arr, xr.DataArray) and not all(_DEFAULT_DIM.fullmatch(str(d)) for d in arr.dims)
